"""What a run reports: model evaluation, the log and eval records, and the run's summary.

Every all-reduce here is metric traffic (`metric=True`), never charged to the algorithm. The record
builders are collective: every peer calls them at the same step, in the same order.

Records (one JSON object per line in `RUN_DIR/metrics/rank-K.jsonl`, and in the summary's
`history`): `kind: "log"` every `log_every` steps (training loss, consensus distance, traffic), and
`kind: "eval"` every `eval_every` epochs (each peer's local test accuracy/loss with the mean, min
and max over peers, the averaged model's, the consensus distance, traffic, timers, the model's
sha256). `summary.json` is `report.run_summary`'s dict; `report.format_summary` prints it as a table.

Under differential privacy and under `partition: local`
(`features.peer_statistics_private`) the builders are called with ``private=True``:
a peer's training loss and label histogram are functions of its private data outside the DP
mechanism, so they are not all-reduced; each record keeps this peer's own `train_loss_local` (in
its own metrics file), and `peer_report` is what the peer writes to its own
`RUN_DIR/peers/rank-K.json`. Under `partition: local` with its own test set, each peer's test accuracy
is on its own data: with private statistics nothing computed on a test set is all-reduced, and
the records hold this peer's own figures only. `shareable` is what of a record may leave its peer (trackers,
rank 0's progress line): with private statistics, none of its own keys (`own_key`: ``*_local``,
its epsilon).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, TextIO

import torch
import torch.nn.functional as F

from ..metrics import consensus_distance
from .batches import stream_rows
from .batchnorm import refresh_batch_norm
from .features import eval_text


if TYPE_CHECKING:
    from ..comm.base import Comm

#: Record keys that depend on timing, not on the computation (left out when comparing runs).
TIMING_KEYS = ("time_compute", "time_gossip_compute", "time_communication", "wall_time")


# ---- models ----------------------------------------------------------------------------------------


def model_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's state (parameters and buffers, in order): equal iff bit-identical."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(
            tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    return h.hexdigest()


def flat_logits(logits: torch.Tensor, target: torch.Tensor):
    """(logits, targets) with one row per prediction: a language model predicts every token of
    its (batch, bptt) input, so (batch, bptt, vocabulary) logits become (batch x bptt, vocabulary)
    rows; a classifier's (batch, classes) logits are returned as they are."""
    if logits.ndim > 2:
        return logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
    return logits, target


def evaluate_model(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024):
    """(accuracy, mean cross-entropy) of `model` on (x, y), in eval mode, without gradients; with
    a target per token (a language model) both are per token (perplexity = exp(cross-entropy)).
    A model that carries its hidden state across batches (`zoo.LSTMLanguageModel.carry_state`,
    trained by truncated BPTT) reads the test windows, which are consecutive, as `EVAL_STREAMS`
    parallel streams from a zero state, as it was trained; its training state is kept aside."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    streaming = getattr(model, "carry_state", False)
    if streaming:
        kept = model.get_state()
        model.reset_state()
    with torch.no_grad():
        steps = stream_rows(len(y), EVAL_STREAMS, x.device) if streaming else _chunks(len(y), batch)
        for rows in steps:
            out, target = flat_logits(model(x[rows]), y[rows])
            loss_sum += float(F.cross_entropy(out, target, reduction="sum"))
            correct += int((out.argmax(dim=1) == target).sum())
    if streaming:
        model.set_state(kept)
    model.train(was_training)
    return correct / max(1, y.numel()), loss_sum / max(1, y.numel())


#: How many parallel streams a stateful language model is evaluated with (PyTorch's word-language-
#: model example evaluates with 10).
EVAL_STREAMS = 10


def _chunks(n: int, batch: int):
    return (slice(start, start + batch) for start in range(0, n, batch))


def average_state_into(model: torch.nn.Module, target: torch.nn.Module, comm: Comm) -> None:
    """`target` <- the peers' average of `model` (floating parameters and buffers; metric traffic).

    Integer buffers (e.g. BatchNorm's num_batches_tracked) are copied from this peer.
    """
    state = model.state_dict()
    floating = [k for k, v in state.items() if v.is_floating_point()]
    if floating:
        flat = torch.cat([state[k].detach().reshape(-1).to(torch.float64) for k in floating])
        comm.allreduce_(flat, op="mean", metric=True)
    new_state, offset = {}, 0
    for key, value in state.items():
        if key in floating:
            n = value.numel()
            new_state[key] = flat[offset : offset + n].view(value.shape).to(value.dtype)
            offset += n
        else:
            new_state[key] = value
    target.load_state_dict(new_state)


# ---- records ---------------------------------------------------------------------------------------


class RecordLog:
    """The run's records: appended to `history` and, when a file is given, one JSON line each."""

    def __init__(self, history: List[Dict[str, Any]], file: Optional[TextIO] = None):
        self.history = history
        self.file = file

    def write(self, record: Dict[str, Any]) -> None:
        """Append `record`; flushed at once, so an interrupted run keeps every record written."""
        self.history.append(record)
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def own_key(key: str) -> bool:
    """Whether a record's `key` holds this peer's own figure (its training loss, its accuracy and
    loss, its epsilon), as opposed to a value over all peers or a public one."""
    return key.endswith("_local") or key in ("epsilon", "epsilon_bound")


def shareable(record: Dict[str, Any], private: bool) -> Dict[str, Any]:
    """`record` without this peer's own figures when the peers' statistics are `private`."""
    if not private:
        return record
    return {k: v for k, v in record.items() if not own_key(k)}


def traffic_means(comm: Comm) -> torch.Tensor:
    """[bytes, messages] sent for training, each the mean over peers (collective)."""
    t = torch.tensor([comm.stats.bytes_sent, comm.stats.messages_sent], dtype=torch.float64)
    return comm.allreduce_(t, op="mean", metric=True)


def log_record(
    comm: Comm,
    model: torch.nn.Module,
    *,
    step: int,
    steps_per_epoch: int,
    lr: float,
    train_loss_local: Optional[float],
    timers: Callable[[], Dict[str, float]],
    private: bool = False,
) -> Dict[str, Any]:
    """The `kind: "log"` record of `step` (collective): `train_loss_local` is this peer's mean
    training loss since the previous log record (None: none of its steps had a loss); the record
    holds the mean over the peers that had one (`train_loss`: `peers_train_loss`), or with
    `private` this peer's own only (`train_loss_local`)."""
    if private:
        losses = {"train_loss_local": train_loss_local}
    else:
        loss = torch.tensor([_or_nan(train_loss_local)], dtype=torch.float64)
        comm.allreduce_(loss, op="mean", metric=True)
        losses = {"train_loss": peers_train_loss(comm, train_loss_local, float(loss[0]))}
    traffic = traffic_means(comm)
    return {
        "kind": "log",
        "epoch": step / steps_per_epoch,
        "step": step,
        "lr": lr,
        **losses,
        "consensus_distance": consensus_distance(model.parameters(), comm),
        "bytes_sent": comm.stats.bytes_sent,
        "messages_sent": comm.stats.messages_sent,
        "mb_sent_per_peer": float(traffic[0]) / 1e6,
        **timers(),
    }


def _or_nan(loss: Optional[float]) -> float:
    return math.nan if loss is None else loss


def peers_train_loss(comm: Comm, mine: Optional[float], mean: float) -> Optional[float]:
    """The peers' mean training loss, from `mean`, the all-reduced mean of their losses with NaN
    for a peer whose window had none (every batch empty: DP's Poisson sampling): where a peer had
    none (the mean is NaN on every peer, a training loss is finite), the mean is over those that
    had one, by a second all-reduce of (sum, count) (collective); None where no peer had one."""
    if not math.isnan(mean):
        return mean
    totals = torch.tensor([0.0, 0.0] if mine is None else [mine, 1.0], dtype=torch.float64)
    comm.allreduce_(totals, op="sum", metric=True)
    return float(totals[0] / totals[1]) if totals[1] else None


def eval_record(
    comm: Comm,
    model: torch.nn.Module,
    averaged: torch.nn.Module,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    epoch: int,
    step: int,
    lr: float,
    train_loss_local: Optional[float],
    timers: Callable[[], Dict[str, float]],
    pooled: bool = False,
    private: bool = False,
    own_test: bool = False,
    bn_inputs: Optional[Callable[[], Iterable[torch.Tensor]]] = None,
) -> Dict[str, Any]:
    """The `kind: "eval"` record after `epoch` (collective).

    `averaged` is a scratch copy of the model's architecture: it is overwritten with the peers'
    average and evaluated. `train_loss_local` is this peer's mean training loss since the previous
    evaluation. `pooled` (partition: local): the mean local and the averaged-model accuracy and
    loss are over all peers' test samples together, combined from each peer's counts, so no test
    sample leaves its peer. `private`: the training loss is not all-reduced (the record has this
    peer's `train_loss_local` only); with `own_test` too (each peer's test set is its own data)
    nothing computed on a test set is all-reduced either (an all-reduce hands a peer's value to
    the peers that sum it first): the record has this peer's own figures only (``*_local``).
    `bn_inputs`: this peer's batches for `refresh_batch_norm` of the averaged model (None: the
    averaged model keeps the peers' mean BatchNorm statistics, as where the peers' statistics are
    private, under DP or `partition: local`: a peer's batch statistics would leave it).
    """
    average_state_into(model, averaged, comm)
    if bn_inputs is not None:
        refresh_batch_norm(averaged, bn_inputs(), comm)
    if private and own_test:
        figures = _own_test_figures(model, averaged, x_test, y_test)
    else:
        figures = _test_figures(
            comm, model, averaged, x_test, y_test, pooled, private, train_loss_local
        )
    distance = consensus_distance(model.parameters(), comm)
    traffic = traffic_means(comm)
    return {
        "kind": "eval",
        "epoch": epoch,
        "step": step,
        "lr": lr,
        **figures,
        "train_loss_local": train_loss_local,
        "consensus_distance": distance,
        "bytes_sent": comm.stats.bytes_sent,
        "messages_sent": comm.stats.messages_sent,
        "mb_sent_per_peer": float(traffic[0]) / 1e6,
        "messages_sent_per_peer": float(traffic[1]),
        "metric_bytes_sent": comm.stats.metric_bytes_sent,
        **timers(),
        "model_sha256": model_digest(model),
    }


def _own_test_figures(model, averaged, x_test, y_test) -> Dict[str, Any]:
    """This peer's model's and the averaged model's accuracy and loss on its own test set."""
    acc, loss = evaluate_model(model, x_test, y_test)
    avg_acc, avg_loss = evaluate_model(averaged, x_test, y_test)
    figures = {
        "test_acc_avg_model_local": avg_acc,
        "test_loss_avg_model_local": avg_loss,
        "test_acc_local": acc,
        "test_loss_local": loss,
    }
    if y_test.ndim > 1:  # a target per token: perplexity, exp(per-token cross-entropy), too
        figures.update(
            test_perplexity_avg_model_local=_perplexity(avg_loss),
            test_perplexity_local=_perplexity(loss),
        )
    return figures


def _test_figures(
    comm: Comm, model, averaged, x_test, y_test, pooled: bool, private: bool, train_loss
) -> Dict[str, Any]:
    """The test figures over all peers (collective): means (pooled under `partition: local`),
    min and max, the averaged model's, and the mean training loss unless `private`."""
    acc, loss = evaluate_model(model, x_test, y_test)
    local = torch.tensor([acc, loss], dtype=torch.float64)
    shared = [acc, loss] if private else [acc, loss, _or_nan(train_loss)]
    means = comm.allreduce_(torch.tensor(shared, dtype=torch.float64), op="mean", metric=True)
    if pooled:
        means[:2] = pooled_means(comm, [acc, loss], len(y_test))
    lows = comm.allreduce_(local.clone(), op="min", metric=True)
    highs = comm.allreduce_(local.clone(), op="max", metric=True)
    avg_acc, avg_loss = evaluate_model(averaged, x_test, y_test)
    if pooled:
        avg_acc, avg_loss = (float(v) for v in pooled_means(comm, [avg_acc, avg_loss], len(y_test)))
    losses = {} if private else {"train_loss": peers_train_loss(comm, train_loss, float(means[2]))}
    if y_test.ndim > 1:  # a target per token: perplexity, exp(per-token cross-entropy), too
        losses.update(
            test_perplexity_avg_model=_perplexity(avg_loss),
            test_perplexity_local=_perplexity(loss),
            test_perplexity_mean=_perplexity(float(means[1])),
        )  # of the mean loss
    return {
        **losses,
        "test_acc_avg_model": avg_acc,
        "test_loss_avg_model": avg_loss,
        "test_acc_mean": float(means[0]),
        "test_acc_min": float(lows[0]),
        "test_acc_max": float(highs[0]),
        "test_loss_mean": float(means[1]),
        "test_loss_min": float(lows[1]),
        "test_loss_max": float(highs[1]),
        "test_acc_local": acc,
        "test_loss_local": loss,
    }


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # exp overflows a float past ~709


def pooled_means(comm: Comm, per_sample_means, count: int) -> torch.Tensor:
    """Means over every peer's samples together, from each peer's means over its `count` samples.

    Collective, scalars only: sum(mean_k x count_k) / sum(count_k) for each value.
    """
    totals = torch.tensor(
        [*(float(v) * count for v in per_sample_means), float(count)], dtype=torch.float64
    )
    comm.allreduce_(totals, op="sum", metric=True)
    return totals[:-1] / max(1.0, float(totals[-1]))


def eval_line(record: Dict[str, Any], epochs: int) -> str:
    """The progress line rank 0 prints for an eval record: with the peers' mean training loss
    where it is released, and what each feature adds (`Feature.eval_text`: under DP, ε)."""
    r = record
    loss = f"  train loss {r['train_loss']:.4f}" if r.get("train_loss") is not None else ""
    if "test_perplexity_avg_model" in r:
        loss += f"  avg-model perplexity {r['test_perplexity_avg_model']:.4g}"
    if "test_acc_mean" in r:
        accuracy = (
            f"avg-model acc {100 * r['test_acc_avg_model']:.2f}%  local acc "
            f"{100 * r['test_acc_mean']:.2f}% [{100 * r['test_acc_min']:.2f}, "
            f"{100 * r['test_acc_max']:.2f}]"
        )
    else:  # each peer's test set is its own private data: nothing of it to show
        accuracy = "test accuracy private (each peer's own test set)"
    return (
        f"epoch {r['epoch']}/{epochs}{loss}  {accuracy}  "
        f"consensus {r['consensus_distance']:.3g}  {r['mb_sent_per_peer']:.3g} MB/peer"
        + eval_text(r)
    )


__all__ = [
    "TIMING_KEYS",
    "RecordLog",
    "average_state_into",
    "eval_line",
    "eval_record",
    "evaluate_model",
    "log_record",
    "model_digest",
    "pooled_means",
    "own_key",
    "shareable",
    "traffic_means",
]
