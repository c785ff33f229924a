"""Reliability III, POOR inputs: each gives one line naming the problem and the fix (see the table
in test_reliability's module docstring, rows from 28 on): DP keys while DP is off, an absurd noise
multiplier and divergence under DP, dp_fix_model on a local class, checkpoints renamed, pickled or
missing after a full disk, --resume with another out_dir, and string keys given as YAML dates.
(Exact/compressed gamma on a schedule: test_algorithm_inputs.)"""

from __future__ import annotations

import hashlib
import io
import pickle
import shutil

import numpy as np
import pytest
import torch
from torch import nn

from gossip_powersgd.training import checkpoint as ckpt
from gossip_powersgd.training.config import load_config

from tests.conftest import ROOT, errors_on_every_rank, no_space_for

TINY = ROOT / "experiments" / "configs" / "tiny.yaml"


def tiny(*overrides, deep=False):
    return load_config(TINY, ["quiet=true", *overrides], deep=deep)


every_rank = errors_on_every_rank


def one_error(errors):
    """The one line every rank reported (the same on all of them)."""
    assert len(set(errors)) == 1 and errors[0] != "ok", errors
    assert "\n" not in errors[0]
    return errors[0]


def cli(argv, capsys):
    from experiments.train import main

    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    return info.value.code, capsys.readouterr().err.strip().splitlines()


# ---- DP keys while DP is off -------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        "dp_max_grad_norm=1",
        "dp_secure_noise=true",
        "dp_delta=1e-5",
        "dp_accountant=prv",
        "dp_fix_model=true",
    ],
)
def test_a_dp_key_while_dp_is_off_is_refused_naming_it(setting, capsys, tmp_path):
    key = setting.split("=")[0]
    expected = (
        f"{key} is set but differential privacy is off (neither dp_noise_multiplier nor "
        "dp_target_epsilon is set): set one of them to turn DP on (e.g. "
        f"dp_noise_multiplier: 1.0), or drop {key}"
    )
    with pytest.raises(ValueError) as info:
        tiny(setting)
    assert str(info.value) == expected
    code, lines = cli(
        ["--config", TINY, "--set", setting, "--set", f"out_dir={tmp_path / 'r'}"], capsys
    )
    assert code != 0 and lines == [f"error: {expected}"] and not (tmp_path / "r").exists()
    # with DP on, the same key is what it was for
    assert getattr(tiny(setting, "dp_noise_multiplier=1.0", "dp_max_grad_norm=1"), key) is not None


# ---- noise: an absurd multiplier, and divergence under DP ---------------------------------------


def test_noise_beyond_any_signal_is_refused_at_the_bound():
    pytest.importorskip("opacus")
    from gossip_powersgd.privacy.training import check_noise_scale

    bound = 32 * np.sqrt(39 * 4)  # batch x sqrt(steps x peers)
    check_noise_scale(bound, 32, 39, 4)  # at the bound: allowed
    with pytest.raises(
        ValueError,
        match=rf"^dp_noise_multiplier={np.nextafter(bound, 1e9):g} is "
        rf"too large to learn anything: .* = {bound:.4g}, batch 32",
    ):
        check_noise_scale(np.nextafter(bound, 1e9), 32, 39, 4)
    with pytest.raises(
        ValueError,
        match=r"^dp_target_epsilon=1e-06 needs dp_noise_multiplier "
        r"1e\+04, .*raise dp_target_epsilon",
    ):
        check_noise_scale(1e4, 32, 39, 4, target_epsilon=1e-6)


def test_an_absurd_noise_multiplier_is_one_line_on_every_rank_not_a_divergence(tmp_path):
    pytest.importorskip("opacus")
    out = tmp_path / "run"
    # tiny: 3 epochs of 13 steps on 4 peers, batch 32
    error = one_error(
        every_rank(tiny("dp_noise_multiplier=1e30", "dp_max_grad_norm=1", f"out_dir={out}"))
    )
    assert error == (
        "ValueError: dp_noise_multiplier=1e+30 is too large to learn anything: over "
        "the run's 39 steps on 4 peers its noise exceeds the largest signal the "
        "clipped gradients can carry (sigma must be at most batch x sqrt(steps x "
        f"peers) = {32 * np.sqrt(39 * 4):.4g}, batch 32 the expected batch size); "
        "lower dp_noise_multiplier (or train longer)"
    )
    assert not out.exists()


def test_a_divergence_under_dp_names_the_noise():
    pytest.importorskip("opacus")
    # sigma 200 is below tiny's bound for one epoch (32 x sqrt(13 x 4) = 231); with lr 1e6 the
    # loss is about 20 x the divergence limit, whatever the noise's draws. Under DP no training
    # loss is shared (peer statistics stay private): the epoch's eval record's test loss is it.
    error = one_error(
        every_rank(tiny("dp_noise_multiplier=200", "dp_max_grad_norm=1", "lr=1e6", "epochs=1"))
    )
    assert error.startswith("NonFiniteError: the run diverged: ")
    # sigma x C / B = 200 x 1 / 32
    assert error.endswith(
        "; DP is on and its noise is a likely cause: its std sigma x C / B is 6.25 "
        "on each coordinate of the gradient, 6.25 x the clipping norm C = 1 that "
        "bounds the whole clipped gradient (B = 32, the batch size): lower "
        "dp_noise_multiplier (or raise dp_target_epsilon)"
    ), error


# ---- dp_fix_model on a class defined in a function -----------------------------------------------


def _batchnorm_layers(d, classes):
    return [nn.Linear(d, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, classes)]


def local_class_net(input_shape, num_classes):
    class Local(nn.Module):  # defined here: pickle cannot name it
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*_batchnorm_layers(int(np.prod(input_shape)), num_classes))

        def forward(self, x):
            return self.body(x.flatten(1))

    return Local()


def test_dp_fix_model_fixes_a_locally_defined_class_without_pickling_it():
    pytest.importorskip("opacus")
    from opacus.validators import ModuleValidator

    from gossip_powersgd.privacy import validate_model

    net = local_class_net((20,), 4)
    with pytest.raises((pickle.PicklingError, AttributeError)):  # "Can't pickle local object"
        pickle.dumps(net)  # what Opacus' fix does (torch.save) and fails on
    fixed = validate_model(net, fix=True)
    assert isinstance(fixed.body[1], nn.GroupNorm) and isinstance(net.body[1], nn.BatchNorm1d)
    # the same replacement as Opacus' own fix, on a model it can pickle
    torch.manual_seed(0)
    plain = nn.Sequential(*_batchnorm_layers(20, 4))
    ours, theirs = validate_model(plain, fix=True), ModuleValidator.fix(plain)
    assert str(ours) == str(theirs)
    assert all(
        torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values())
    )
    s = every_rank(
        tiny(
            "model=test_reliability_inputs:local_class_net",
            "dp_noise_multiplier=1",
            "dp_max_grad_norm=1",
            "dp_fix_model=true",
            "epochs=1",
        )
    )
    assert s == ["ok"] * 4


# ---- checkpoints: renamed, pickled, missing after a full disk -------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A finished 2-epoch tiny run: every rank holds epochs 1 and 2."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert every_rank(tiny(f"out_dir={out}", "epochs=2")) == ["ok"] * 4
    return out


def copy_run(reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    return out


def test_an_older_checkpoint_renamed_to_the_newest_epoch_is_named(reference, tmp_path):
    out = copy_run(reference, tmp_path)
    newest = ckpt.checkpoint_path(out, 2, 2)
    shutil.copyfile(ckpt.checkpoint_path(out, 2, 1), newest)
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    assert error == (
        f"ValueError: checkpoint {newest} holds epoch 1 (step 13), not epoch 2 as its "
        "name says: it was renamed or copied over; restore the right file, or delete "
        "it to resume from the previous epoch"
    )
    newest.unlink()  # as the message says: the run resumes from epoch 1
    assert every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True) == ["ok"] * 4


class _Foreign:
    """Any class: a file holding it is a pickle of Python objects, not of tensors."""


def _pickled(kind):
    buffer = io.BytesIO()
    if kind == "plain pickle":
        pickle.dump({"header": _Foreign()}, buffer)
    else:
        torch.save({"header": _Foreign()}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["torch file", "plain pickle", "payload"])
def test_a_pickled_checkpoint_is_refused_in_our_own_words(reference, tmp_path, kind):
    out = copy_run(reference, tmp_path)
    path = ckpt.checkpoint_path(out, 1, 2)
    if kind == "payload":  # a valid header and digest around a pickled payload
        payload = _pickled("torch file")
        record = torch.load(path, weights_only=True)
        record["payload"] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        record["sha256"] = hashlib.sha256(payload).hexdigest()
        torch.save(record, path)
    else:
        path.write_bytes(_pickled(kind))
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    what = {
        "torch file": "the file holds pickled Python objects",
        "plain pickle": "the file is a pickle, not torch's zip format",
        "payload": "its payload holds pickled Python objects",
    }[kind]
    assert error == (
        f"ValueError: checkpoint {path} is not a weights-only checkpoint of this "
        f"project: {what}, which is never loaded; it was not written by gossip_powersgd "
        "(or was replaced): restore the file, or delete it to resume from the previous "
        "epoch"
    )


def test_garbage_is_still_corrupt_and_torch_advice_is_never_quoted(reference, tmp_path):
    out = copy_run(reference, tmp_path)
    path = ckpt.checkpoint_path(out, 1, 2)
    path.write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(ValueError) as info:
        ckpt.read_checkpoint(path)
    assert (
        str(info.value)
        == f"checkpoint {path} is corrupt or truncated (the file is not a torch file)"
    )


def test_resume_after_a_full_disk_at_the_first_checkpoint_gives_the_real_reason(
    tmp_path, monkeypatch
):
    out = tmp_path / "run"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-1.pt")
    assert "No space left on device" in one_error(every_rank(tiny(f"out_dir={out}", "epochs=2")))
    monkeypatch.undo()
    assert [ckpt.available_epochs(out, k) for k in range(4)] == [[1], [], [1], [1]]
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2"), resume=True))
    assert error == (
        f"ValueError: cannot resume {out}: {out / 'checkpoints'} has checkpoint files "
        "for rank(s) 0,2-3 but rank(s) 1 have none, so some files are missing or "
        "incomplete, most likely from an interrupted write (a full disk or a job killed "
        "while writing its first checkpoint); no epoch can be resumed on every rank: "
        "restore the missing files, or start the run again"
    )


# ---- the command line: --resume with out_dir, string keys -----------------------------------------


def test_resume_with_another_out_dir_is_refused(reference, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    code, lines = cli(["--resume", reference, "--set", f"out_dir={elsewhere}"], capsys)
    assert code != 0 and lines == [
        f"error: --resume {reference} continues the run in {reference}, so --set out_dir="
        f"{elsewhere} would be ignored: drop --set out_dir (or copy the run directory there and "
        "--resume that copy)"
    ]
    assert not elsewhere.exists()


def test_a_string_key_takes_the_set_text_as_typed(tmp_path):
    # YAML would read these as a date, a timestamp, a boolean and a number
    for text in ("2024-01-01", "2024-01-01T10:00:00", "yes", "1e3"):
        assert tiny(f"out_dir={tmp_path / 'x' / '..' / text}").out_dir.endswith(f"/{text}")
        assert tiny(f"out_dir={text}").out_dir == text
    assert tiny("out_dir=null").out_dir is None
    path = tmp_path / "dated.yaml"
    path.write_text(TINY.read_text() + "out_dir: 2024-01-01\n")  # in a file YAML types still hold
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == (
        "bad value for 'out_dir': datetime.date(2024, 1, 1) is not a string or "
        "null; quote it in the YAML file: out_dir: '2024-01-01'"
    )


# ---- Reliability IV: a full disk at the first checkpoint -------------------------------------------


def test_a_full_disk_at_the_first_checkpoint_does_not_advise_resume(tmp_path, monkeypatch):
    """No rank can resume when the first checkpoint failed: the line says to start again; a full
    disk at a later checkpoint, once every rank holds an earlier one, says --resume."""
    out = tmp_path / "run"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-1.pt")
    error = one_error(every_rank(tiny(f"out_dir={out}", "epochs=2")))
    assert "--resume" not in error
    assert error.endswith(
        "no checkpoint is held by every rank yet, so the run cannot be resumed: free space, "
        f"then start it again (in a new run directory, or after emptying {out})"
    )
    monkeypatch.undo()
    later = tmp_path / "later"
    no_space_for(monkeypatch, ckpt, "rank-1-epoch-2.pt")
    error = one_error(every_rank(tiny(f"out_dir={later}", "epochs=2")))
    assert error.endswith("the previous checkpoints are intact (free space, then --resume)")


@pytest.mark.parametrize(
    "setting, words",
    [
        (
            "out_dir=",
            "--set out_dir= gives no value: give one (out_dir=DIR), or out_dir=null for its "
            "default",
        ),
        ("out_dir=runs/a\nb", "bad value for 'out_dir': 'runs/a\\nb' (a line break or control"),
    ],
)
def test_an_empty_or_multi_line_out_dir_is_refused(tmp_path, capsys, monkeypatch, setting, words):
    """`out_dir=` used to become runs/<config name> without a word, and a line break in it a
    space (YAML folds a multi-line plain scalar)."""
    monkeypatch.chdir(tmp_path)
    code, lines = cli(["--config", TINY, "--set", setting], capsys)
    assert code != 0 and len(lines) == 1 and lines[0].startswith(f"error: {words}"), lines
    assert not (tmp_path / "runs").exists()
