"""What every metric a run records means, and how each tracker names it: the one naming table.

Where the numbers are. Every peer writes its records to ``RUN_DIR/metrics/rank-K.jsonl``: a
``log`` record every ``log_every`` steps and an ``eval`` record every ``eval_every`` epochs (and at
the end). Rank 0 (the lowest member, after churn) writes ``summary.json`` (the run's final
figures) and each peer its own figures to ``peers/rank-K.json``. The trackers (``loggers:``) log
the records of the lowest member (rank 0's, unless it left under ``on_peer_loss: continue``) and
the summary, each number under one name in every tracker (TensorBoard, W&B, MLflow alike)::

    <kind>/<key>        a record's number at the record's step: eval/test_acc_avg_model, log/lr
    summary/<key>       a summary.json number, once, at the run's last step

Units. An accuracy is a fraction in [0, 1] in every file and every tracker; only the text printed
for people (the progress lines, the summary table, summary.md) writes it as a percentage with a
``%`` sign. A loss is the mean cross-entropy in nats; bytes are bytes and MB are 10^6 bytes; times
are seconds.

Whose number. A key ending in ``_local`` (and ``bytes_sent``, ``messages_sent``,
``metric_bytes_sent``, ``epsilon``) is the figure of the peer that wrote the record, so what the
trackers show under that name is their holder's (rank 0's unless it left); ``_mean``, ``_min``,
``_max`` and ``_per_peer`` are over all peers; ``_avg_model`` is the averaged model's, the mean of
all peers' parameters (what gossip converges to). Where the peers' statistics are private
(differential privacy, ``partition: local``, unless ``release_peer_statistics: true``) the records
hold no mean training loss, and a peer's own figures are for its own files only.

===========================  ====================================================================
key                          meaning
===========================  ====================================================================
step                         optimizer steps done (the x-axis of every tracker)
epoch                        epochs done (a log record's is fractional: step / steps per epoch)
lr                           the learning rate of the last step
train_loss                   mean over peers of each peer's mean training loss since the previous
                             record of the same kind, over the peers whose steps had one (null
                             where none had: every batch empty, DP's Poisson sampling; absent
                             where peer statistics are private)
train_loss_local             the writing peer's own mean training loss over the same steps (null
                             where none of them had one)
test_acc_avg_model           accuracy of the averaged model on the test set (fraction)
test_loss_avg_model          its loss
test_acc_mean                accuracy of each peer's own model on the test set, mean over peers
test_acc_min, _max           the same, lowest and highest peer
test_loss_mean, _min, _max   each peer's own model's test loss, mean / lowest / highest over peers
test_acc_local               accuracy of the writing peer's own model (fraction)
test_loss_local              its test loss
test_perplexity_avg_model    exp(test_loss_avg_model), for language models (and _mean, _local)
consensus_distance           mean over peers of ||x_i - x_bar||^2, all parameters (0: all equal)
bytes_sent                   training bytes the writing peer sent so far (the algorithm's messages)
messages_sent                training messages the writing peer sent so far
mb_sent_per_peer             training MB sent so far, mean over peers (what compares algorithms)
messages_sent_per_peer       training messages sent so far, mean over peers
metric_bytes_sent            bytes the writing peer sent so far for these records' all-reduces
                             (evaluation and consensus distance), never counted in bytes_sent
time_compute                 seconds of forward, backward and optimizer steps so far (the peer's)
time_gossip_compute          seconds the algorithm computed (compression, mixing) so far
time_communication           seconds the algorithm spent exchanging messages so far
wall_time                    seconds since training started (set-up and loading not counted)
epsilon                      differential privacy: the writing peer's epsilon so far, at delta
epsilon_bound                differential privacy: what the epsilon bounds, as text (adjacency and
                             accountant, e.g. replace-one by PLD; in the files only, not a number)
delta                        differential privacy: the delta of every epsilon (public)
epsilon_max                  the largest epsilon over peers (only with release_peer_statistics;
                             under churn over the members at this evaluation: a peer away then
                             has its own in its metrics file and its peers/rank-K.json)
live_peers                   churn: peers in the run at this evaluation
membership_epoch             churn: the number of the membership of the moment
membership_changes           churn: membership changes so far
average_shift_total          churn: summed norms of the jumps of the members' average at changes
observed_bytes               observers: message bytes the writing peer's views recorded so far
===========================  ====================================================================

``summary/<key>`` names summary.json's numbers: ``final_test_acc_avg_model``,
``final_test_acc_local_mean`` / ``_min`` / ``_max`` (an eval record's ``test_acc_avg_model``,
``test_acc_mean``, ``test_acc_min``, ``test_acc_max`` at the end), ``final_train_loss``,
``final_consensus_distance``, ``mb_sent_per_peer``, ``messages_sent_per_peer``,
``exact_gossip_mb_per_peer_formula`` (what exact gossip would send: model bytes x mean degree x
rounds, a formula; after membership changes, model bytes x each member's neighbours in the graph in
force at each round it took part in (none in a round whose gossip a lost peer interrupted on it),
averaged over the members at the end as mb_sent_per_peer is; the string ``exact_gossip_formula``
says which), ``compression_ratio`` (that formula /
mb_sent_per_peer), ``wall_time_s`` (the slowest peer's), ``time_compute_s``,
``time_gossip_compute_s``, ``time_communication_s`` (means over peers), ``steps``, ``epochs_done``,
``parameters``, ``bytes_per_step``, ``communication_rounds``.
"""

from __future__ import annotations

import math
from typing import Any, Dict

#: Every record key of the table above (``model_sha256`` and ``epsilon_bound``, strings, are in
#: the files only: trackers log numbers).
RECORD_KEYS = (
    "step epoch lr train_loss train_loss_local test_acc_avg_model test_loss_avg_model "
    "test_acc_mean test_acc_min test_acc_max test_loss_mean test_loss_min test_loss_max "
    "test_acc_local test_loss_local test_perplexity_avg_model test_perplexity_mean "
    "test_perplexity_local consensus_distance bytes_sent messages_sent mb_sent_per_peer "
    "messages_sent_per_peer metric_bytes_sent time_compute time_gossip_compute "
    "time_communication wall_time epsilon epsilon_bound delta epsilon_max live_peers membership_epoch "
    "membership_changes average_shift_total observed_bytes"
).split()
#: The record keys that are accuracies (fractions in [0, 1]).
ACCURACY_KEYS = tuple(k for k in RECORD_KEYS if "_acc_" in k)


def tracked_name(kind: str, key: str) -> str:
    """The name every tracker logs a number under: ``eval/<key>``, ``log/<key>``,
    ``summary/<key>``."""
    return f"{kind}/{key}"


def _number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def record_scalars(record: Dict[str, Any]) -> Dict[str, float]:
    """A record's finite numbers by tracked name (its step is the axis, its kind the prefix)."""
    kind = record.get("kind", "record")
    return {
        tracked_name(kind, k): float(v)
        for k, v in record.items()
        if k not in ("kind", "step") and _number(v)
    }


def summary_scalars(summary: Dict[str, Any]) -> Dict[str, float]:
    """summary.json's finite numbers by tracked name (``summary/<key>``)."""
    return {tracked_name("summary", k): float(v) for k, v in summary.items() if _number(v)}


__all__ = [
    "RECORD_KEYS",
    "ACCURACY_KEYS",
    "tracked_name",
    "record_scalars",
    "summary_scalars",
]
