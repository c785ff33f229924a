"""training/evaluation.py: model digests, evaluation, the peers' averaged model and the records (the
run summary's table: tests/training/test_report.py)."""

import json

import pytest
import torch
import torch.nn.functional as F

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.training.evaluation import (
    EVAL_STREAMS,
    RecordLog,
    average_state_into,
    eval_line,
    eval_record,
    evaluate_model,
    flat_logits,
    log_record,
    model_digest,
    own_key,
    pooled_means,
    shareable,
)
from gossip_powersgd.training.models import build_model


FLOAT32_EPS = torch.finfo(torch.float32).eps


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )


# ---- models ----------------------------------------------------------------------------------------


def test_model_digest_is_equal_iff_the_state_is_bit_identical():
    a, b = _net(0), _net(0)
    assert model_digest(a) == model_digest(b)
    with torch.no_grad():
        b[0].bias[0] = torch.nextafter(b[0].bias[0], torch.tensor(2.0))  # one ulp
    assert model_digest(a) != model_digest(b)
    # +0.0 and -0.0 compare equal but differ in their bits: the digest tells them apart
    c, d = _net(0), _net(0)
    with torch.no_grad():
        c[0].bias[0], d[0].bias[0] = 0.0, -0.0
    assert model_digest(c) != model_digest(d)
    # a buffer counts too (BatchNorm's step counter, an integer buffer)
    e = _net(0)
    e[1].num_batches_tracked += 1
    assert model_digest(e) != model_digest(a)


def test_model_digest_covers_the_dtype_not_only_the_bytes():
    """Two states with the same bytes and names but other dtypes are different models."""
    f = torch.nn.Module()
    f.register_buffer("t", torch.zeros(2, dtype=torch.float32))
    i = torch.nn.Module()
    i.register_buffer("t", torch.zeros(2, dtype=torch.int32))
    assert f.t.numpy().tobytes() == i.t.numpy().tobytes()
    assert model_digest(f) != model_digest(i)


def test_flat_logits_makes_one_row_per_token_and_leaves_a_classifier_alone():
    logits, target = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    rows, targets = flat_logits(logits, target)
    assert rows.shape == (10, 7) and targets.shape == (10,)
    assert torch.equal(rows[6], logits[1, 1]) and targets[6] == target[1, 1]
    classifier, labels = torch.randn(4, 3), torch.tensor([0, 2, 1, 1])
    out = flat_logits(classifier, labels)
    assert out[0] is classifier and out[1] is labels


def test_evaluate_model_is_the_accuracy_and_mean_cross_entropy_in_eval_mode():
    """Against one forward over the whole set in eval mode (closed form); chunking (batch=7 over 50
    samples) changes only the order of the float32 sums; the training mode is given back."""
    model = _net(1)
    model.train()
    x, y = torch.randn(50, 3), torch.randint(0, 2, (50,))
    with torch.no_grad():
        out = model.eval()(x)
    model.train()
    accuracy = float((out.argmax(1) == y).sum()) / 50
    loss = float(F.cross_entropy(out, y))
    got_acc, got_loss = evaluate_model(model, x, y, batch=7)
    assert model.training  # given back as it was
    assert got_acc == accuracy
    # 8 float32 chunk sums of 50 losses ~1 added in float64: each off by <= 50 ulps of the sum
    assert got_loss == pytest.approx(loss, rel=50 * FLOAT32_EPS)
    assert evaluate_model(model, x[:0], y[:0]) == (0.0, 0.0)  # no sample: no division by zero


def test_a_stateful_lm_is_evaluated_as_streams_from_a_zero_state():
    """evaluate_model reads a carrying LSTM's consecutive test windows as EVAL_STREAMS streams:
    the loss equals, stream by stream, one forward over the stream's windows joined (closed
    form); the training state is left as it was."""
    model = build_model("lstm_lm:layers=1,hidden=8,dropout=0", (4,), 30, seed=1)
    tokens = torch.randint(0, 30, (25 * 4 + 1,))
    x, y = tokens[:-1].view(25, 4), tokens[1:].view(25, 4)
    model.carry_state = True
    model(x[:3])  # a training state to keep
    kept = model.get_state()
    _, loss = evaluate_model(model, x, y)
    assert all(torch.equal(a, b) for a, b in zip(model.get_state(), kept, strict=True))
    model.carry_state = False
    total, start = 0.0, 0
    for k in range(EVAL_STREAMS):  # 25 windows: streams of 3 (5 of them), then 2
        n = 3 if k < 25 - 2 * EVAL_STREAMS else 2
        with torch.no_grad():
            logits = model.eval()(x[start : start + n].reshape(1, -1))
        total += float(
            F.cross_entropy(logits[0], y[start : start + n].reshape(-1), reduction="sum")
        )
        start += n
    assert start == 25
    # float32 LSTM over 12 tokens, summed over 100: a few ulps of a loss ~ 3.4 per token
    assert loss == pytest.approx(total / 100, rel=1e-5)


# ---- collective pieces, on three in-process peers --------------------------------------------------


def test_average_state_into_is_the_peers_mean_with_this_peers_integer_buffers():
    """Floating parameters and buffers become the mean over peers (summed in float64, then cast:
    within one float32 rounding of the float64 mean); integer buffers stay this peer's own."""
    nets = [_net(rank) for rank in range(3)]
    for rank, net in enumerate(nets):
        net[1].num_batches_tracked.fill_(10 + rank)
        net[1].running_mean.normal_()

    targets = [_net(99) for _ in range(3)]  # built here: peer threads share the global RNG

    def peer(comm):
        target = targets[comm.rank]
        average_state_into(nets[comm.rank], target, comm)
        return target.state_dict()

    states = LocalCluster(topologies.ring(3), cooperative=False).run(peer)
    for rank, state in enumerate(states):
        for key, value in state.items():
            if value.is_floating_point():
                mean = torch.stack([n.state_dict()[key].double() for n in nets]).mean(0)
                torch.testing.assert_close(value, mean.float(), rtol=FLOAT32_EPS, atol=0)
            else:
                assert torch.equal(value, nets[rank].state_dict()[key])
        assert int(state["1.num_batches_tracked"]) == 10 + rank


def test_pooled_means_weigh_each_peer_by_its_sample_count():
    """sum_k(mean_k count_k) / sum_k(count_k), not the mean of the means (closed form)."""
    means = [[0.5, 2.0], [1.0, 4.0], [0.0, 1.0]]
    counts = [10, 30, 60]

    def peer(comm):
        return pooled_means(comm, means[comm.rank], counts[comm.rank]).tolist()

    results = LocalCluster(topologies.ring(3), cooperative=False).run(peer)
    expected = [
        sum(m[i] * c for m, c in zip(means, counts)) / sum(counts) for i in range(2)
    ]  # [0.35, 2.2]; the mean of means would be [0.5, 2.33]
    for result in results:
        assert result == pytest.approx(expected, rel=1e-15)


def _timers():
    return {"time_compute": 0.0}


def test_eval_record_figures_over_peers_and_private_own_test_figures():
    """Shared figures: each peer's `test_acc_local` is evaluate_model's, the mean/min/max are over
    the peers' own, the averaged model is evaluated too. Private with its own test set: only this
    peer's figures (``*_local``), none over peers, and `shareable` keeps none of them."""
    nets = [_net(rank) for rank in range(3)]
    scratch = [_net(7) for _ in range(3)]  # built here: peer threads share the global RNG
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))

    def peer(comm, private, own_test):
        return eval_record(
            comm,
            nets[comm.rank],
            scratch[comm.rank],
            x,
            y,
            epoch=1,
            step=5,
            lr=0.1,
            train_loss_local=float(comm.rank),
            timers=_timers,
            private=private,
            own_test=own_test,
        )

    shared = LocalCluster(topologies.ring(3), cooperative=False).run(peer, False, False)
    own = [evaluate_model(net, x, y) for net in nets]
    for rank, record in enumerate(shared):
        assert record["kind"] == "eval" and record["step"] == 5
        assert (record["test_acc_local"], record["test_loss_local"]) == own[rank]
        assert record["train_loss"] == pytest.approx(1.0, rel=1e-15)  # mean of 0, 1, 2
        assert record["test_acc_min"] == min(a for a, _ in own)
        assert record["test_acc_max"] == max(a for a, _ in own)
        assert record["test_acc_mean"] == pytest.approx(sum(a for a, _ in own) / 3, rel=1e-15)
        assert record["model_sha256"] == model_digest(nets[rank])
        assert shareable(record, private=False) is record
    assert len({r["test_acc_avg_model"] for r in shared}) == 1  # one averaged model

    private = LocalCluster(topologies.ring(3), cooperative=False).run(peer, True, True)
    for rank, record in enumerate(private):
        test_keys = {k for k in record if k.startswith("test_")}
        assert test_keys == {
            "test_acc_local",
            "test_loss_local",
            "test_acc_avg_model_local",
            "test_loss_avg_model_local",
        }
        assert "train_loss" not in record and record["train_loss_local"] == rank
        assert not any(own_key(k) for k in shareable(record, private=True))
        assert "test accuracy private" in eval_line(record, epochs=3)


@pytest.mark.parametrize(
    "losses, expected",
    [((2.0, None, 4.5), 3.25), ((None, None, None), None), ((1.0, 2.0, 4.5), 7.5 / 3)],
    ids=["one-peer-without-a-loss", "none-with-a-loss", "every-peer-with-one"],
)
def test_the_peers_training_loss_is_over_the_peers_that_had_one(losses, expected):
    """A peer whose window had no loss (every batch empty, DP's Poisson sampling) counted as a
    loss of 0.0: the record said 0.0 where no peer had one, and halved the mean where one had
    none. Where every peer has one the value is the all-reduced mean, as before."""
    nets, scratch = [_net(rank) for rank in range(3)], [_net(7) for _ in range(3)]
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))

    def peer(comm, kind):
        mine = losses[comm.rank]
        if kind == "log":
            args = dict(steps_per_epoch=10)
            return log_record(comm, nets[comm.rank], step=5, lr=0.1, **args, **_loss(mine))
        if kind == "eval":
            args = dict(x_test=x, y_test=y, epoch=1, step=5, lr=0.1)
            return eval_record(comm, nets[comm.rank], scratch[comm.rank], **args, **_loss(mine))
        reduced = torch.tensor([mine], dtype=torch.float64)  # what the records held before
        return float(comm.allreduce_(reduced, op="mean", metric=True)[0])

    for kind in ("log", "eval"):
        for record in LocalCluster(topologies.ring(3), cooperative=False).run(peer, kind):
            # exact: the losses and their sums are dyadic, every division exact
            assert record["train_loss"] == expected, (kind, record["train_loss"])
    if None not in losses:  # bit for bit the plain all-reduced mean
        assert (
            LocalCluster(topologies.ring(3), cooperative=False).run(peer, "old") == [expected] * 3
        )
    private = LocalCluster(topologies.ring(3), cooperative=False).run(
        lambda comm: log_record(
            comm,
            nets[comm.rank],
            step=5,
            steps_per_epoch=10,
            lr=0.1,
            private=True,
            **_loss(losses[comm.rank]),
        )
    )
    assert [r["train_loss_local"] for r in private] == list(losses)
    assert all("train_loss" not in r for r in private)


def _loss(mine):
    return dict(train_loss_local=mine, timers=_timers)


def test_own_key_names_the_peers_own_figures():
    assert own_key("train_loss_local") and own_key("epsilon") and own_key("epsilon_bound")
    assert not own_key("train_loss") and not own_key("epsilon_delta") and not own_key("local")


def test_record_log_keeps_every_record_in_history_and_on_disk_at_once(tmp_path):
    history = []
    path = tmp_path / "rank-0.jsonl"
    log = RecordLog(history, path.open("w"))
    log.write({"kind": "log", "step": 1})
    # flushed at once: an interrupted run keeps it
    assert [json.loads(line) for line in path.read_text().splitlines()] == [history[0]]
    log.write({"kind": "eval", "step": 2})
    log.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == history
    RecordLog([]).write({"kind": "log"})  # without a file: history only
