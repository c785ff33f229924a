"""Peers that leave and join mid-training: the config keys, and the training loop's side of it.

Keys (a config-driven feature, `features.py`):

* ``on_peer_loss: abort | continue`` (default abort: the first lost peer ends every peer's run,
  as always). With ``continue`` the run goes on through membership changes (`membership`): the
  survivors switch to the repaired graph at an agreed step, joiners are handed their state. The
  in-process backend (local) runs it from a churn schedule; backend torch from the peers its
  liveness monitor finds lost (stopped, killed, hung, unreachable), agreed by the survivors through
  the rendezvous store (`membership.detected`: gloo, CPU); backend mpi is refused (MPICH is
  fail-stop: a dead rank ends the job). A removed peer restarted with ``gossip-train --rejoin ID``
  is admitted back (`comm.torch_rejoin`, `membership.detected`; ChurnRun places its loop).
* ``churn``: the schedule of an in-process run (`membership.churn`: ``leave:3@200,join:3@400`` or
  ``rate=0.02,down=50,seed=1``); needs ``on_peer_loss: continue`` and backend local.
* ``churn_join: average | copy``: a joiner's model, optimizer state and step counter are the mean
  of its surviving neighbours' (``average``) or the lowest one's copy (``copy``).

Refused with continue, in one line each: an algorithm that cannot carry its state over a change
(the all-reduce baselines), a directed topology, and the privacy features bound to one fixed
graph: dp_mechanism other than local (muffliato's network epsilon, `privacy.network_dp`, is the
view of one fixed graph; zipdl's and decor's noise is per edge of it), dp_exchanged_subspace and
observers (they hold the algorithm instance that a change replaces). Each peer's own DP-SGD
epsilon still holds: its accountant counts the steps it trained, whatever graph its messages went
over (a joiner's steps from its join; a peer back from an absence, its steps before and after).

The loop's side of a membership change (skipping, leaving, joining, the away files): `churn_run`.
"""

from __future__ import annotations

from typing import Any, Dict, List

from ..comm.transports import TRANSPORTS
from .churn_run import ChurnRun, TrainingState, call, churn_run  # noqa: F401 (re-exported)
from .features import Feature, Key, register

__all__ = ["CHURN", "ChurnRun", "call", "churn_run", "supporting_backends", "JOIN_MODES"]


def supporting_backends() -> tuple:
    """The backends whose transport supports `on_peer_loss: continue` (`Transport.peer_loss`)."""
    return tuple(t.name for t in TRANSPORTS if t.peer_loss)


JOIN_MODES = ("average", "copy")
POLICIES = ("abort", "continue")


def _validate(config) -> None:
    policy = config.on_peer_loss
    if policy not in POLICIES:
        raise ValueError(f"bad value for 'on_peer_loss': {policy!r} (valid: abort, continue)")
    if config.churn_join not in JOIN_MODES:
        raise ValueError(
            f"bad value for 'churn_join': {config.churn_join!r} (valid: {', '.join(JOIN_MODES)})"
        )
    if config.churn is not None and policy != "continue":
        raise ValueError(
            "churn needs on_peer_loss: continue (with abort the first peer to leave ends "
            "the run): set on_peer_loss: continue"
        )
    if config.churn_join != "average" and policy != "continue":
        raise ValueError(
            "churn_join is for on_peer_loss: continue (with abort no peer joins again): set "
            "that, or drop the key"
        )
    if policy != "continue":
        return
    transport = TRANSPORTS.get(config.backend)
    if transport.peer_loss is None:
        raise ValueError(
            f"on_peer_loss: continue is not supported on backend {config.backend}"
            f"{transport.peer_loss_note}; backends that support it: "
            f"{', '.join(supporting_backends())}"
        )
    if transport.peer_loss == "detected" and config.churn is not None:
        raise ValueError(
            f"churn (a schedule) drives an in-process run: use backend local; on backend "
            f"{config.backend} the membership changes when the liveness monitor finds a peer lost"
        )
    devices, kind = transport.peer_loss_devices, str(config.device).split(":")[0]
    auto = kind == "auto"
    if auto:  # what the run will use on this machine (`setup.resolve_device`)
        import torch

        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if devices is not None and kind not in devices:
        raise ValueError(
            f"on_peer_loss: continue on backend {config.backend} moves CPU tensors over gloo in "
            f"this version{' (device auto is cuda on this machine)' if auto else ''}: use device "
            "cpu, or on_peer_loss: abort"
        )
    _refuse_what_a_change_breaks(config)


def _refuse_what_a_change_breaks(config) -> None:
    from ..membership.algorithm import refuse_unsupported
    from ..membership.churn import parse_churn
    from .validation import _has_size, resolve_topology

    try:
        refuse_unsupported(config.algorithm)
    except ValueError as exc:
        raise ValueError(f"on_peer_loss: continue: {exc}") from None
    size = None
    if _has_size(config.topology) or config.peers is not None:
        topology = resolve_topology(config)
        size = topology.size
        if topology.is_directed:
            raise ValueError(
                f"on_peer_loss: continue: topology {config.topology!r} is directed, and a "
                "directed graph has no repair rule here; use an undirected topology"
            )
    if config.churn is not None:
        try:
            parse_churn(config.churn, size)
        except ValueError as exc:
            raise ValueError(f"bad value for 'churn': {exc}") from None
    mechanism = getattr(config, "dp_mechanism", "local")
    if mechanism != "local":
        raise ValueError(
            f"dp_mechanism: {mechanism} is bound to one fixed graph (its network epsilon or its "
            "per-edge noise), which a membership change replaces: use dp_mechanism: local "
            "(each peer's own DP-SGD epsilon holds whatever the graph), or on_peer_loss: abort"
        )
    for key in ("dp_exchanged_subspace", "observers"):
        if getattr(config, key, None):
            raise ValueError(
                f"{key} holds the algorithm instance that a membership change replaces: drop "
                f"{key}, or use on_peer_loss: abort"
            )


def _churn_meaning(spec: str, size: int) -> tuple:
    """What a churn spec does, whatever its spelling (its options' order, a default written out):
    its events, or its random churn's rate, down time and seed."""
    from ..membership.churn import parse_churn

    schedule = parse_churn(spec, size)
    return schedule.events, schedule.rate, schedule.down, schedule.seed


def _eval_text(record: Dict[str, Any]) -> str:
    if "live_peers" not in record:
        return ""
    return f"  live {record['live_peers']} (changes {record['membership_changes']})"


def _summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    if "membership_changes" not in summary:
        return []
    return [
        (
            "membership",
            f"{summary['membership_changes']} changes, {summary['live_peers_at_end']} live at "
            f"the end; members' average moved {summary['average_shift_total']:.4g} at the "
            f"changes; {summary['transfer_mb_sent']:.3f} MB of state handed to joiners",
        )
    ]


CHURN = register(
    Feature(
        name="churn",
        keys=[
            Key(
                "on_peer_loss",
                "str",
                "abort",
                recording=True,
                doc="What the other peers do when a peer leaves: abort (every peer's run ends, "
                "naming it) | continue (the survivors repair the graph at an agreed step and "
                "train on; backend local with a churn schedule, or backend torch: lost peers).",
            ),
            Key(
                "churn",
                "Optional[str]",
                None,
                doc="Churn schedule of an in-process run (on_peer_loss: continue, backend "
                "local): leave:3@200,join:3@400 (peer 3 leaves at step 200, rejoins at 400) or "
                "rate=0.02,down=50,seed=1 (each step a live peer leaves with probability rate "
                "and comes back down steps later). null: no churn.",
                meaning=_churn_meaning,
            ),
            Key(
                "churn_join",
                "str",
                "average",
                doc="A joining peer's model, optimizer state and step counter: average (the "
                "mean of its surviving neighbours') | copy (the lowest-id one's).",
            ),
        ],
        validate=_validate,
        summary_rows=_summary_rows,
        eval_text=_eval_text,
    )
)
