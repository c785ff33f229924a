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
