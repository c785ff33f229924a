"""The shared spec parsing of gossip_powersgd.specs: booleans, typed values, name:args, nested
options, bring-your-own imports, seeds, every kind's spec refusing a malformed one in one style, user
code that exits (the grammar they all parse through, topologies.grammar:
tests/topologies/test_grammar.py); and the shared low-rank pieces the algorithms are built from
(compressed gossip's: tests/algorithms/test_compressed.py)."""

import re

import numpy as np
import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster, specs
from gossip_powersgd.algorithms import registry
from gossip_powersgd.algorithms.lowrank import (
    MatrixStack,
    compressible_matrices,
    matrix_stacks,
    orthonormalize_,
)
from gossip_powersgd.specs import (
    accepts,
    import_object,
    parse_bool,
    parse_optional_float,
    parse_options,
    parse_typed,
    split_name,
    split_spec,
)
from gossip_powersgd.training.trainer import train
from tests.conftest import TINY, cli
from tests.privacy.test_views_reliability import tiny


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
    ],
)
def test_parse_bool_accepts_the_usual_words(text, value):
    assert parse_bool(text) is value


def test_parse_bool_refuses_anything_else():
    with pytest.raises(ValueError, match="expected true/false, got 'maybe'"):
        parse_bool("maybe")


def test_parse_optional_float():
    assert parse_optional_float("0.25") == 0.25
    assert [parse_optional_float(t) for t in ("none", "AUTO", "default")] == [None, None, None]
    with pytest.raises(ValueError):
        parse_optional_float("fast")


def test_parse_typed_converts_and_names_the_option():
    assert parse_typed("3", int, "levels") == 3
    assert parse_typed("0.5", float, "ratio") == 0.5
    assert parse_typed("off", bool, "scaled") is False  # not bool("off"), which is True
    for text, kind, message in [
        ("1.5", int, "levels must be an integer, got '1.5'"),
        ("abc", float, "ratio must be a number, got 'abc'"),
        ("maybe", bool, "scaled must be true or false, got 'maybe'"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_typed(text, kind, message.split()[0])


def test_split_name():
    assert split_name(" mlp : 100,100 ") == ("mlp", "100,100")
    assert split_name("logreg") == ("logreg", None)
    assert split_name("pkg.mod:fn") == ("pkg.mod", "fn")
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="non-empty string"):
            split_name(bad)


def test_split_spec_names_what_it_parses():
    assert split_spec("Choco:compressor=[randomk:0.1,seed=3], gamma = 0.4", "algorithm spec") == (
        "choco",
        {"compressor": "randomk:0.1,seed=3", "gamma": "0.4"},
    )
    with pytest.raises(ValueError, match=r"^widget 'w:a=\[1': unbalanced square brackets$"):
        split_spec("w:a=[1", "widget")
    with pytest.raises(ValueError, match=r"^widget 'w:a': option 'a' is not key=value$"):
        split_spec("w:a", "widget")


def test_registry_keeps_its_spec_helpers():
    assert registry.split_spec("exact:gamma=0.5") == ("exact", {"gamma": "0.5"})
    assert registry.parse_bool is parse_bool
    with pytest.raises(ValueError, match="^algorithm spec 'x:y': option 'y' is not key=value$"):
        registry.split_spec("x:y")


def test_parse_options_converts_and_refuses_typos():
    types = {"n": int, "noise": float, "shuffle": bool}
    assert parse_options("s", "n=3, noise=0.5,shuffle=no", types) == {
        "n": 3,
        "noise": 0.5,
        "shuffle": False,
    }
    assert parse_options("s", None, types) == {} and parse_options("s", "", types) == {}
    for text, message in [
        ("m=3", "^spec 's': unknown option 'm'; valid: n, noise, shuffle$"),
        ("n", "^spec 's': expected key=value, got 'n'"),
        ("n=three", "^spec 's': n must be an integer, got 'three'$"),
        ("shuffle=2", "^spec 's': shuffle must be true or false, got '2'$"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_options("s", text, types)


def test_import_object_resolves_and_explains():
    assert import_object("byo_fixtures:linear_data", ["builtin"]).__name__ == "linear_data"
    for spec, message in [
        ("nomodule", "unknown spec 'nomodule': valid are builtin"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("byo_fixtures:missing", "has no attribute 'missing'"),
        ("byo_fixtures:NOT_CALLABLE", "is not callable"),
    ]:
        with pytest.raises(ValueError, match=message):
            import_object(spec, ["builtin"])


def test_accepts():
    def f(a, *, seed=0):
        return a

    def g(**kwargs):
        return kwargs

    def h(*args):
        return args

    assert accepts(f, "seed") and accepts(f, "a") and not accepts(f, "rank")
    assert accepts(g, "anything") and not accepts(h, "seed")


# ---- low-rank pieces ---------------------------------------------------------------------------
def test_compressible_matrices_groups_by_shape_in_order():
    tensors = [
        torch.zeros(8, 6),
        torch.zeros(5),
        torch.zeros(8, 3, 2),
        torch.zeros(2, 2),
        torch.zeros(0, 4),
        torch.zeros(4, 10),
    ]
    assert compressible_matrices(tensors, 1, 1.0) == {(8, 6): [0, 2], (4, 10): [5]}
    # rate 0 compresses every matrix, even the 2 x 2 one
    assert list(compressible_matrices(tensors, 1, 0.0)) == [(8, 6), (2, 2), (4, 10)]


def test_matrix_stacks_clip_the_rank_and_index_blocks():
    stacks = matrix_stacks(MatrixStack, [torch.zeros(8, 6), torch.zeros(3, 40)], 4, 0.0)
    assert [(s.indices, s.rows, s.cols, s.rank, s.batch) for s in stacks] == [
        ([0], 8, 6, 4, 1),
        ([1], 3, 40, 3, 1),
    ]
    factors = torch.arange(2 * 9 * 5).reshape(2, 9, 5)
    assert torch.equal(stacks[1].block(factors, 2), factors[:, 6:9, :])


@pytest.mark.parametrize("rank", [1, 3, 6])
def test_orthonormalize_gives_orthonormal_vectors_and_keeps_zeros(rank):
    g = torch.Generator().manual_seed(rank)
    factor = torch.randn(3, rank, 20, generator=g, dtype=torch.float64)
    orthonormalize_(factor)
    gram = factor @ factor.transpose(1, 2)
    assert torch.allclose(gram, torch.eye(rank, dtype=torch.float64).expand_as(gram), atol=1e-6)
    zeros = torch.zeros(1, min(rank, 4), 7)
    assert torch.equal(orthonormalize_(zeros), torch.zeros_like(zeros))


# ---- repeated keys and seeds ----------------------------------------------------------------------
def test_split_spec_refuses_a_repeated_key():
    with pytest.raises(ValueError, match=r"option 'rank' is given twice; give it once"):
        specs.split_spec("powergossip:rank=1,rank=2", "algorithm spec")


def test_parse_options_refuses_a_repeated_key():
    with pytest.raises(ValueError, match=r"option 'd' is given twice; give it once"):
        specs.parse_options("synthetic_logreg:d=5,d=6", "d=5,d=6", {"d": int})


@pytest.mark.parametrize("value", [-1, specs.SEED_MAX + 1, 1.5, True, "3"])
def test_check_seed_names_the_valid_range(value):
    with pytest.raises(
        ValueError, match=rf"^seed must be an integer in \[0, {specs.SEED_MAX}\], got "
    ):
        specs.check_seed(value)


def test_parse_seed_accepts_the_whole_range():
    assert specs.parse_seed("0") == 0 and specs.parse_seed(str(specs.SEED_MAX)) == specs.SEED_MAX
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, "):
        specs.parse_seed("99999999999999999999999")


def _compressor(spec):
    from gossip_powersgd.compressors import parse_compressor

    return parse_compressor(spec)


def _model(spec):
    from gossip_powersgd.training.models import build_model

    return build_model(spec, (6,), 3)


def _dataset(spec):
    from gossip_powersgd.training.data import load_dataset

    return load_dataset(spec, seed=0)


def _partition(spec):
    from gossip_powersgd.training.data import partition

    return partition(np.arange(40) % 4, 4, spec, seed=0)


#: One well-formed spec per kind, as (what its errors call it, parser, name, separator, items).
_KINDS = [
    ("algorithm spec", registry.algorithm_kwargs, "powergossip", ",", ["rank=1", "seed=2"]),
    ("compressor spec", _compressor, "randomk", ",", ["0.1", "seed=2"]),
    ("topology spec", topologies.parse, "small_world", ":", ["16", "4", "0.2"]),
    ("dataset spec", _dataset, "synthetic_logreg", ",", ["d=5", "n=100"]),
    ("model spec", _model, "mlp", ",", ["8", "4"]),
    ("partition spec", _partition, "dirichlet", ",", ["alpha=0.5"]),
]


@pytest.mark.parametrize("kind", _KINDS, ids=[k[0] for k in _KINDS])
@pytest.mark.parametrize(
    "malformed, problem",
    [
        (lambda items: items + ["[x"], "unbalanced square brackets$"),
        (lambda items: items[:1] + [""] + items[1:], "empty item "),
        (lambda items: items + ["bogus=1"], "unknown option 'bogus'; valid: "),
    ],
    ids=["unbalanced bracket", "empty option", "unknown key"],
)
def test_every_kind_refuses_a_malformed_spec_in_one_style(kind, malformed, problem):
    what, parse, name, sep, items = kind
    parse(f"{name}:{sep.join(items)}")  # the well-formed spec parses
    spec = f"{name}:{sep.join(malformed(list(items)))}"
    with pytest.raises(ValueError) as info:
        parse(spec)
    message = str(info.value)
    assert "\n" not in message
    assert re.match(rf"^{re.escape(what)} {re.escape(repr(spec))}: {problem}", message), message


EXIT_HINT = (
    "; a dataset or model function must return its result (or raise an exception), never "
    "exit the process"
)


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "dataset=exit_fixtures:data_exit0",
            "'exit_fixtures:data_exit0': the user code called sys.exit/exit(0) while calling it",
        ),
        (
            "dataset=exit_fixtures:data_exit1",
            "'exit_fixtures:data_exit1': the user code called sys.exit/exit(1) while calling it",
        ),
        ("dataset=sys:exit", "'sys:exit': the user code called sys.exit/exit() while calling it"),
        (
            "model=builtins:exit",
            "'builtins:exit': the user code called sys.exit/exit() while calling it",
        ),
        (
            "dataset=exit_on_import:data",
            "'exit_on_import:data': the user code called sys.exit/exit(0) "
            "while importing module 'exit_on_import'",
        ),
        (
            "model=exit_fixtures:model_exit_in_forward",
            "'exit_fixtures:model_exit_in_forward': the user "
            "code called sys.exit/exit() while running the model on the dataset's inputs",
        ),
    ],
)
def test_user_code_calling_sys_exit_is_an_error_naming_the_spec(tmp_path, capsys, override, line):
    code, lines = cli(
        ["--config", TINY, "--set", override, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    key = override.split("=")[0]  # the CLI's deep config check loads and runs them first
    assert code == 1 and lines == [f"error: bad value for {key!r}: {line}{EXIT_HINT}"]
    assert not (tmp_path / "run").exists()


def test_user_code_calling_sys_exit_fails_on_every_rank():
    def peer(comm, config):
        try:
            train(comm, config)
        except ValueError as exc:
            return str(exc)
        return "trained"

    for spec, partition in [
        ("exit_fixtures:data_exit0", "iid"),
        ("exit_fixtures:local_data_exit", "local"),
    ]:
        extra = ["public_train_size=64"] if partition == "local" else []  # sizes stay private
        config = tiny(f"dataset={spec}", f"partition={partition}", "checkpoint_every=0", *extra)
        lines = LocalCluster(topologies.ring(4), timeout=60).run(peer, config)
        assert len(set(lines)) == 1 and "the user code called sys.exit/exit(" in lines[0], lines
