"""No statistic of a peer leaves it outside the DP mechanism, through any sink.

A peer's shard size, sampling rate, epsilon (a function of the rate), training loss, label
histogram and accuracy on its own data are functions of its private data computed outside the
mechanism. Unless `release_peer_statistics: true`, none of them may reach another peer or rank 0's
output: stdout, stderr, an experiment tracker (TensorBoard, W&B, MLflow: fakes here record every
value the real ones would be given), a file of the run directory that every peer shares
(summary.json, summary.md, config.yaml), a collective (all-reduce, all-gather: what carries the
text of an error from one peer to all), or the text of an error. Each peer's own figures go to its
own files only (peers/rank-K.json, metrics/rank-K.jsonl, secrets/rank-K/).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm.local import LocalCommunicator
from gossip_powersgd.training import extensions
from gossip_powersgd.training.config import TrainConfig
from gossip_powersgd.training.trainer import train

pytest.importorskip("opacus")

#: Shard sizes no other figure of these runs takes (137 = 8 x 17 + 1: a batch of 17 leaves one).
SIZES = [137 + 41 * k for k in range(4)]
TESTS = [23 + 4 * k for k in range(4)]  # each peer's own test set


def own_data(rank, num_peers, seed=0):
    """Peer `rank`'s own training data (SIZES[rank] samples) and its own test set."""
    rng = np.random.default_rng([seed, rank])
    n, t = SIZES[rank], TESTS[rank]
    x = rng.standard_normal((n + t, 20))
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] + 0.5 * rng.standard_normal(n + t) > 0)
    return x[:n], y[:n], x[n:], y[n:]


def batchnorm_net(input_shape, num_classes):
    return nn.Sequential(
        nn.Linear(int(np.prod(input_shape)), 8), nn.BatchNorm1d(8), nn.Linear(8, num_classes)
    )


BASE = TrainConfig(
    topology="ring:4",
    dataset="tests.privacy.test_training_leaks:own_data",
    partition="local",
    public_train_size=sum(SIZES),
    model="logreg",
    lr=0.5,
    batch_size=32,
    epochs=2,
    log_every=3,
    quiet=False,
    checkpoint_every=1,
    algorithm="exact",
    dp_target_epsilon=3.0,
    dp_max_grad_norm=1.0,
    dp_public_randomness=True,  # a deterministic run: what is printed is the same every time
    loggers=["tensorboard", "wandb", "mlflow"],
)

CASES = {
    # every sink of a private run whose sigma is solved for a target epsilon
    "target epsilon": {},
    # a batch larger than peer 0's shard (137): today's error names the size on every peer
    "batch above a shard": {
        "batch_size": 150,
        "dp_target_epsilon": None,
        "dp_noise_multiplier": 1.0,
    },
    # a BatchNorm model whose last batch on peer 0 holds one sample (137 = 8 x 17 + 1): the
    # refusal, shared with every peer, names that peer's shard size today (DP off: partition:
    # local keeps the statistics private too)
    "one-sample batch": {
        "model": "tests.privacy.test_training_leaks:batchnorm_net",
        "batch_size": 17,
        "dp_target_epsilon": None,
        "dp_max_grad_norm": None,
        "dp_public_randomness": False,
    },
}


class FakeTrackers:
    """Every value the three trackers are given: their `open`, `write` and `finish` replaced by
    recorders (the base class's `on_record`, which decides what reaches them, runs as it is)."""

    def __init__(self, monkeypatch):
        self.values, self.opened = [], []
        values, opened = self.values, self.opened

        def fake_open(tracker, context, run_dir):
            opened.append(tracker.name)
            values.append(("config", context.config.to_dict()))

        def fake_write(tracker, scalars, step):
            values.append((tracker.name, dict(scalars), step))

        def fake_finish(tracker, summary):  # the summary a tracker ends its run with is a sink too
            values.append((tracker.name, dict(summary or {}), "summary"))

        for cls in extensions.TRACKERS.values():
            monkeypatch.setattr(cls, "check_installed", classmethod(lambda c: None))
            monkeypatch.setattr(cls, "open", fake_open)
            monkeypatch.setattr(cls, "write", fake_write)
            monkeypatch.setattr(cls, "finish", fake_finish)


class Collectives:
    """What every collective carried, as the peers passed it in."""

    def __init__(self, monkeypatch):
        self.payloads = []
        allreduce, allgather = LocalCommunicator.allreduce_, LocalCommunicator.allgather_bytes
        payloads = self.payloads

        def spy_allreduce(comm, tensor, *args, **kwargs):
            payloads.append(tensor.detach().double().reshape(-1).clone())
            return allreduce(comm, tensor, *args, **kwargs)

        def spy_allgather(comm, data, *args, **kwargs):
            payloads.append(bytes(data))
            return allgather(comm, data, *args, **kwargs)

        monkeypatch.setattr(LocalCommunicator, "allreduce_", spy_allreduce)
        monkeypatch.setattr(LocalCommunicator, "allgather_bytes", spy_allgather)


def _numbers(obj):
    """Every number in a JSON value."""
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _numbers(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _numbers(value)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def private_figures(run_dir, summaries):
    """Each peer's own figures, read from its own files: (shard sizes, floats, histograms)."""
    floats, histograms = set(), []
    for rank in range(4):
        path = run_dir / "peers" / f"rank-{rank}.json"
        if path.exists():
            peer = json.loads(path.read_text())
            histograms.append(peer.get("label_histogram", []))
            for key in ("epsilon", "epsilon_pld", "sample_rate", "final_train_loss_local"):
                if isinstance(peer.get(key), float):
                    floats.add(peer[key])
    floats.update(32 / n for n in SIZES)  # each peer's sampling rate at batch 32
    for s in summaries or []:
        for record in s["history"]:
            for key, value in record.items():
                if key.endswith("_local") or key == "epsilon":
                    floats.add(float(value))
    floats = {v for v in floats if math.isfinite(v) and v not in (0.0, 1.0)}
    return set(SIZES), floats, [h for h in histograms if h]


def shows_histogram(text, histograms) -> bool:
    """Whether a peer's label histogram appears in `text` as consecutive integers."""
    tokens = [int(t) for t in re.findall(r"(?<![\w.])\d+(?![\w.])", text)]
    return any(
        tokens[i : i + len(h)] == h for h in histograms for i in range(len(tokens) - len(h) + 1)
    )


def _rounds(value: float, digits: int, token: float) -> bool:
    """Whether `value` (or 100 x it, a percentage) shows as `token` at `digits` significant digits."""
    return any(float(f"{scale * value:.{digits}g}") == token for scale in (1.0, 100.0))


def leaks_in_text(text, integers, floats, public=()):
    """The private figures a text shows: its integer tokens among `integers`; its decimal tokens
    of >= 3 significant digits (rank 0's progress line printed its epsilon as "ε 2.24") that
    round a private float to the token's own precision and no `public` one (a public figure that
    happens to round like a private one, sigma 1.27 and a loss of 1.2702, is no leak)."""
    # times (set-up phases, steps/s, the wall time) are no figure of the data, and vary
    text = re.sub(r"\d+(?:\.\d+)? (?:s|steps/s|min|h)\b", "", text)
    found = []
    for token in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])", text):
        if "." not in token and "e" not in token:
            if int(token) in integers:
                found.append(token)
            continue
        digits = len(token.split("e")[0].replace(".", "").lstrip("0"))
        if digits < 3:
            continue
        value = float(token)
        if any(_rounds(v, digits, value) for v in floats) and not any(
            _rounds(v, digits, value) for v in public
        ):
            found.append(token)
    return found


def without_paths(text, tmp_path):
    """`text` without pytest's temporary directory: pytest numbers its runs' directories
    (/tmp/pytest-of-root/pytest-219/...; --basetemp on the command line, which the run's provenance
    records), and a number in a path the user chose is no figure of a peer's data (the clean-clone
    CI once drew pytest-219, peer 2's shard size)."""
    for path in (tmp_path, tmp_path.resolve()):
        numbered = [p for p in (path, *path.parents) if re.fullmatch(r"pytest-\d+", p.name)]
        for root in numbered or [path]:
            text = text.replace(str(root), "<basetemp>")
    return text


def public_figures(run_dir, summaries, private):
    """The numbers a run may show: its config's, its summary's and rank 0's records' values over
    all peers or public (each of them checked exactly against the private figures on its own)."""
    values = set()
    path = run_dir / "summary.json"
    if path.exists():
        values.update(_numbers(json.loads(path.read_text())))
    for record in (summaries or [{}])[0].get("history", []):
        values.update(
            _numbers(
                {
                    k: v
                    for k, v in record.items()
                    if not k.endswith("_local") and k not in ("epsilon", "epsilon_bound")
                }
            )
        )
    values.update(_numbers(BASE.to_dict()))
    return {float(v) for v in values if math.isfinite(v)} - private


@pytest.mark.parametrize("case", list(CASES))
def test_no_peer_statistic_reaches_any_sink(tmp_path, monkeypatch, capsys, case):
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = FakeTrackers(monkeypatch)
    collectives = Collectives(monkeypatch)
    run_dir = tmp_path / "run"
    config = BASE.replace(out_dir=str(run_dir), **CASES[case])
    error, summaries = None, None
    try:
        summaries = LocalCluster(topologies.parse("ring:4"), timeout=120).run(train, config)
    except Exception as exc:  # noqa: BLE001 - its text is a sink like any other
        error = exc
    out = capsys.readouterr()
    integers, floats, histograms = private_figures(run_dir, summaries)
    public = public_figures(run_dir, summaries, integers | floats)
    if case == "target epsilon":
        assert error is None and summaries is not None
        assert len(trackers.values) > 3  # the trackers were given records
        assert "epoch 2/2" in out.out  # rank 0 printed its progress
    shared = {
        "stdout": out.out,
        "stderr": out.err,
        "error": "" if error is None else str(error),
    }
    for name in ("summary.json", "summary.md", "config.yaml"):
        if (run_dir / name).exists():
            shared[name] = (run_dir / name).read_text()
    for sink, text in shared.items():
        text = without_paths(text, tmp_path)
        assert not leaks_in_text(text, integers, floats, public), (sink, text)
        assert not shows_histogram(text, histograms), (sink, text)
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert not set(_numbers(summary)) & (integers | floats)
    for value in trackers.values:
        numbers = set(_numbers(value[1]))
        assert not numbers & (integers | floats), (value, numbers & (integers | floats))
        assert not shows_histogram(json.dumps(value[1]), histograms), value
    for payload in collectives.payloads:
        if isinstance(payload, torch.Tensor):
            assert not set(payload.tolist()) & (integers | floats), payload
            assert not shows_histogram(" ".join(f"{v:g}" for v in payload.tolist()), histograms)
        else:
            text = payload.rstrip(b"\0").decode("utf-8", errors="replace")
            text = without_paths(text, tmp_path)
            assert not leaks_in_text(text, integers, floats, public), text
            assert not shows_histogram(text, histograms), text


# ---- the accountant a guarantee may come from -------------------------------------------------------


def test_gdp_is_refused_in_one_line_naming_the_valid_accountants():
    """Opacus' GDP accountant (a CLT approximation) understates epsilon: on one peer's
    schedule it reports less than dp-accounting's PLD, itself an upper bound. It is refused as a
    source of a guarantee, with the accountants that give one."""
    from gossip_powersgd.privacy.accounting import make_accountant, pld_epsilon
    from gossip_powersgd.training.config import validate_config

    history = [(1.0, 32 / 500, 64)]
    from opacus.accountants import GaussianAccountant

    with pytest.warns(UserWarning, match="can underestimate"):  # Opacus' own warning says so
        gdp = GaussianAccountant()
    gdp.history = list(history)
    # 2.77 against PLD's 3.71 (an upper bound): GDP's figure is no bound
    assert gdp.get_epsilon(delta=1e-5) < 0.8 * pld_epsilon(history, 1e-5)
    for attempt in (
        lambda: make_accountant("gdp"),
        lambda: validate_config(BASE.replace(dp_accountant="gdp")),
    ):
        with pytest.raises(ValueError) as info:
            attempt()
        message = str(info.value)
        assert "\n" not in message and "rdp" in message and "prv" in message, message


# ---- the noise of a target epsilon ------------------------------------------------------------------

DIRICHLET = TrainConfig(
    topology="ring:4",
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    partition="dirichlet:0.5",
    model="logreg",
    lr=0.5,
    batch_size=32,
    epochs=2,
    quiet=True,
    checkpoint_every=0,
    algorithm="exact",
    dp_target_epsilon=2.0,
    dp_max_grad_norm=1.0,
)


def local(config: TrainConfig, **kwargs):
    return LocalCluster(topologies.parse(config.topology), timeout=120).run(train, config, **kwargs)


def test_the_sigma_of_a_target_epsilon_does_not_depend_on_the_shard_size():
    """A neighbour reads a peer's noise scale off its messages (sigma C / batch per coordinate):
    with a sigma solved for the peer's own sampling rate it estimates the shard size from one
    message. Here four Dirichlet shards of different sizes use one sigma, solved for the public
    rate batch / (public total / peers); every peer still ends at or below the target, by Opacus'
    RDP and by dp-accounting's PLD."""
    from gossip_powersgd.privacy.accounting import pld_epsilon

    summaries = local(DIRICHLET)
    peers = [s["peer"] for s in summaries]
    assert len({p["shard_size"] for p in peers}) == 4  # four different shard sizes
    sigmas = {p["noise_multiplier"] for p in peers}
    assert len(sigmas) == 1, sigmas
    assert summaries[0]["noise_multiplier"] == sigmas.pop()  # public: in the summary
    for p in peers:
        history = [(p["noise_multiplier"], p["sample_rate"], p["steps"])]
        assert p["epsilon"] <= 2.0 and pld_epsilon(history, p["delta"]) <= 2.0
        # the peer samples at its own rate, never above the public one the sigma is solved for
        assert (
            p["sample_rate"] <= 32 / (2000 * 0.8 // 4) + 1e-12
            or p["sample_rate"] <= 32 / (p["shard_size"])
        )


# ---- which bound a printed epsilon is ---------------------------------------------------------------


def test_the_network_bounds_are_not_given_as_guarantees_for_training():
    """Muffliato's and ZIP-DL's network bounds assume gradients that do not depend on the noisy
    models and ignore the evaluation's all-reduce of the average model: for training they are
    reported beside DP-SGD's bound, labelled, never as the epsilon."""
    from gossip_powersgd.privacy.mechanisms import muffliato, zipdl

    ring = topologies.ring(8)
    assert not muffliato.network_applies("exact", 0.0, "constant", 0.0)
    for rows in (
        muffliato.muffliato_epsilons(ring, 12, 1.0, 0.1, 1e-5, observer=0, network=True),
        zipdl.zipdl_epsilons(ring, 12, 1.0, 0.1, 1e-5, 0, ratio=2.0, network=True),
    ):
        far = rows[4]
        assert far["network"] < far["local"]  # the network figure is the smaller one here ...
        assert far["epsilon"] == far["local"]  # ... and still not the guarantee
        assert far["network_label"] == muffliato.NETWORK_LABEL
        assert "not valid for adaptive training" in far["network_label"]
        assert far["epsilon_label"].startswith("ε (local DP-SGD, add/remove")


def test_the_summary_names_the_bound_and_the_adjacency_of_every_epsilon():
    from gossip_powersgd.training.report import format_summary

    for mechanism in ("local", "muffliato"):
        s = local(
            DIRICHLET.replace(
                dp_mechanism=mechanism,
                release_peer_statistics=True,
                dp_target_epsilon=None,
                dp_noise_multiplier=1.0,
            )
        )[0]
        table = format_summary(s)
        epsilon_rows = [line for line in table.splitlines() if "ε" in line]
        assert epsilon_rows
        for line in epsilon_rows:  # every epsilon names its bound and its adjacency
            assert ("local DP-SGD" in line or "network bound" in line) and (
                "replace-one" in line or "add/remove" in line
            ), line
        if mechanism == "muffliato":
            assert "network bound (not valid for adaptive training)" in table
        assert "tuning" in table and "dp_tuning" in s  # the tuning runs' cost is stated


# ---- replace-one where the sizes are released --------------------------------------------------------


def test_released_sizes_make_replace_one_the_reported_epsilon():
    """With release_peer_statistics the shard sizes are public, so add/remove-one (which assumes
    a secret size) is not the relation the peers' records get: the epsilon reported is
    replace-one's, by dp-accounting's PLD; add/remove's is kept beside it, labelled. Checked
    against dp-accounting directly and against group privacy of Opacus' add/remove RDP
    (replace-one = remove then add: epsilon at most 2 epsilon_ar(delta')) at delta' with
    (1 + e^epsilon_ar) delta' = delta."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from gossip_powersgd.privacy.accounting import epsilon as opacus_epsilon, make_accountant

    s = local(
        DIRICHLET.replace(
            release_peer_statistics=True, dp_target_epsilon=None, dp_noise_multiplier=1.0
        )
    )[0]
    assert s["dp_adjacency"].startswith("replace one record")
    for rank in range(4):
        history = [(1.0, s["sample_rate"][rank], s["steps"])]
        accountant = pld_privacy_accountant.PLDAccountant(
            dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
        )
        accountant.compose(
            dp_accounting.PoissonSampledDpEvent(
                s["sample_rate"][rank], dp_accounting.GaussianDpEvent(1.0)
            ),
            s["steps"],
        )
        assert s["epsilon"][rank] == pytest.approx(accountant.get_epsilon(s["delta"]), rel=1e-9)
        rdp = make_accountant("rdp")
        rdp.history = history
        ar = opacus_epsilon(rdp, s["delta"])
        assert s["epsilon_add_remove"][rank] == pytest.approx(ar, rel=1e-12)
        low = opacus_epsilon(rdp, s["delta"] / (1 + math.exp(2 * ar)))
        # PLD add/remove < PLD replace-one <= group privacy of add/remove
        assert s["epsilon_pld"][rank] < s["epsilon"][rank] <= 2 * low


def test_a_target_epsilon_with_released_sizes_is_met_under_replace_one():
    s = local(DIRICHLET.replace(release_peer_statistics=True))[0]
    assert max(s["epsilon"]) <= 2.0 and max(s["epsilon"]) >= 0.95 * 2.0


# ---- where a run_dir key lives ------------------------------------------------------------------------


def test_run_dir_keys_live_in_per_peer_folders_with_a_loud_warning(tmp_path, capsys):
    import os
    import stat

    run_dir = tmp_path / "run"
    local(DIRICHLET.replace(out_dir=str(run_dir), dp_secret="run_dir", checkpoint_every=1))
    keys = []
    for rank in range(4):
        folder = run_dir / "secrets" / f"rank-{rank}"
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        (path,) = folder.iterdir()  # one file: this peer's key
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        keys.append(path.read_bytes())
    assert len(set(keys)) == 4
    err = capsys.readouterr().err
    assert "shares the noise" in err and "checkpoint" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "checkpoint" in summary["dp_randomness_note"] and "key" in summary["dp_randomness_note"]
