"""Config files (training/yaml_loader.py): duplicate keys, alias bombs, a file far larger than
a config, a file that is not UTF-8."""

import time

import pytest


def test_duplicate_yaml_keys_are_an_error_not_last_one_wins(tmp_path):
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "dup.yaml"
    path.write_text("lr: 0.1\nepochs: 2\nlr: 0.5\n")
    with pytest.raises(ValueError, match=r"duplicate key 'lr' \(lines 1 and 3\)"):
        load_config(path)


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    from gossip_powersgd.training.config import load_config

    levels = "abcdefghi"
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip(levels, levels[1:])]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(ValueError, match="alias bomb"):
        load_config(path)
    assert time.monotonic() - started < 10  # refused from the node graph, never expanded


def test_a_file_far_larger_than_a_config_is_refused(tmp_path):
    from gossip_powersgd.training.config import load_config
    from gossip_powersgd.training.yaml_loader import MAX_CONFIG_BYTES

    path = tmp_path / "huge.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ValueError, match="far more than a config holds"):
        load_config(path)


def test_yaml_anchors_within_limits_still_work(tmp_path):
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "ok.yaml"
    path.write_text("schedule: step\nmilestones: &m [3, 6]\nepochs: 8\n")
    assert load_config(path, deep=False).milestones == [3, 6]


def test_a_config_file_that_is_not_utf8_is_named_with_its_byte_and_the_fix(tmp_path, capsys):
    """Python's own message named neither the file nor the fix ('utf-8' codec can't decode...)."""
    from gossip_powersgd.cli.train import main
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "latin1.yaml"
    path.write_bytes("lr: 0.1\n# d\u00e9j\u00e0 vu\n".encode("latin-1"))
    expected = (
        f"config file {str(path)!r} is not UTF-8 text (byte 0xe9 at offset 11): save it as UTF-8"
    )
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == expected
    with pytest.raises(SystemExit) as code:
        main(["--config", str(path), "--quiet", "--set", f"out_dir={tmp_path / 'run'}"])
    assert code.value.code != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {expected}"


@pytest.mark.parametrize(
    "text, kind, read",
    [
        ("1:30", "a base-60 (sexagesimal) number", "90"),
        ("1:30.5", "a base-60 (sexagesimal) number", "90.5"),
        ("010", "an octal number", "8"),
        ("0x10", "a hexadecimal number", "16"),
        ("0b10", "a binary number", "2"),
    ],
)
def test_a_number_not_in_decimal_is_refused_naming_its_key(tmp_path, text, kind, read):
    """YAML 1.1 read `lr: 1:30` as 90 and `peers: 010` as 8 without a word; a config's numbers are
    now decimal, in a file and in --set alike."""
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"epochs: 2\nlr: {text}\n")
    advice = (
        f"a config's numbers are decimal: write the number you mean, or quote '{text}' for text"
    )
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: lr: {text} is {kind} in YAML 1.1, read as {read} (line 2); {advice}"
    )
    path.write_text("epochs: 2\n")
    with pytest.raises(ValueError) as info:
        load_config(path, [f"lr={text}"])
    assert (
        str(info.value)
        == f"--set lr={text}: {text} is {kind} in YAML 1.1, read as {read}; {advice}"
    )


def test_a_number_not_in_decimal_is_named_inside_a_list_and_a_section(tmp_path):
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("schedule: step\nepochs: 8\nmilestones: [3, 1:05]\n")
    with pytest.raises(ValueError, match=r"milestones: 1:05 is a base-60 .* read as 65 \(line 3\)"):
        load_config(path)
    path.write_text("dp:\n  noise_multiplier: 0x1\n")
    with pytest.raises(
        ValueError, match=r"dp\.noise_multiplier: 0x1 is a hexadecimal .* read as 1 \(line 2\)"
    ):
        load_config(path)


def test_decimal_numbers_and_quoted_or_string_key_text_still_load(tmp_path):
    """Only the spelling in another base is refused: decimal numbers (a zero, a sign, an exponent,
    underscores) load as before, quoted text stays text, and a string key's --set takes the text as
    typed (a directory named 12:30)."""
    from gossip_powersgd.training.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "epochs: 1_0\nlr: 0.5\nweight_decay: 0\nmomentum: 0.0\nseed: +7\n"
        "schedule: step\nmilestones: [1e0, 2.5]\nalgorithm: 'exact'\ndataset: '12:30'\n"
    )
    config = load_config(path, ["out_dir=12:30", "decay=1e-1"], deep=False)
    assert (config.epochs, config.lr, config.seed, config.milestones) == (10, 0.5, 7, [1.0, 2.5])
    assert (config.dataset, config.out_dir, config.decay) == ("12:30", "12:30", 0.1)
