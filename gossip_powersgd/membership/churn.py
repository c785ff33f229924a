"""The churn schedule of an in-process run: which peers leave and join at which steps.

Config key ``churn``, parsed by the project's one spec grammar (`topologies.grammar`): either a
list of events ::

    leave:3@200,join:3@400        peer 3 leaves at step 200 and rejoins at step 400
    leave:3@200,leave:5@200       two peers leave at the same step

or random churn ::

    rate=0.02,down=50,seed=1      at every step each live peer leaves with probability rate and
                                  comes back `down` steps later (seed: default 0)

A step is a training step (0-based); a change takes effect at the start of its step, before any
work of that step, on every peer. Random draws are a pure function of (seed, step): at step t each
live peer, in id order, draws a uniform number from the generator of SeedSequence([seed, t]) and
leaves if it is below `rate`; if that would leave no member, the lowest-id one stays (a
membership is never empty, and some member always stays to hand the state to a joiner).

Every bad spec is one line in the grammar's style (``churn spec '<spec>': <problem>``): an unknown
event or option, a peer that is not one of the run's, a negative step or step 0, a join of a peer
that has not left, a second leave without a join between, two events of one peer at one step,
every peer leaving, every member leaving while others join, a rate outside [0, 1), a `down` below
1, a step past the run's last step (checked when the run's length is known).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from ..specs import parse_items, parse_spec, spec_error, unknown_name, unknown_option
from .epochs import Membership

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = ["ChurnSchedule", "parse_churn", "churn_membership", "schedule_figures"]

WHAT = "churn spec"
EVENTS = ("leave", "join")
OPTIONS = ("rate", "down", "seed")


@dataclasses.dataclass(frozen=True)
class ChurnSchedule:
    """A parsed churn spec: explicit `events` (kind, peer, step), or random churn (`rate`,
    `down`, `seed`)."""

    spec: str
    events: Tuple[Tuple[str, int, int], ...] = ()
    rate: Optional[float] = None
    down: int = 0
    seed: int = 0

    @property
    def is_random(self) -> bool:
        return self.rate is not None

    def changes(self, size: int, steps: int) -> List[Tuple[int, Tuple[int, ...]]]:
        """(step, live peers from that step) of every change in a run of `steps` steps on `size`
        peers; a one-line ValueError for an event past the run's last step."""
        if self.is_random:
            return _random_changes(self, size, steps)
        late = [e for e in self.events if e[2] >= steps]
        if late:
            kind, peer, step = late[0]
            raise spec_error(
                WHAT,
                self.spec,
                f"{kind}:{peer}@{step} is past the run's last step {steps - 1} (its {steps} "
                "steps are epochs x steps per epoch): give it an earlier step",
            )
        live, out = set(range(size)), []
        for step in sorted({e[2] for e in self.events}):
            for kind, peer, at in self.events:
                if at == step:
                    (live.discard if kind == "leave" else live.add)(peer)
            out.append((step, tuple(sorted(live))))
        return out


def _int(text: str, spec: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise spec_error(WHAT, spec, f"{what} {text!r} is not a whole number") from None
    if value < minimum:
        raise spec_error(WHAT, spec, f"{what} {value} must be >= {minimum}")
    return value


def _event(item: str, spec: str, size: Optional[int]) -> Tuple[str, int, int]:
    parsed = parse_spec(item, WHAT, separator=":", imports=False)
    if parsed.name not in EVENTS:
        raise unknown_name(WHAT, spec, parsed.name, EVENTS)
    if len(parsed.positional) != 1 or parsed.options or "@" not in parsed.positional[0]:
        raise spec_error(
            WHAT, spec, f"event {item!r} is not {parsed.name}:PEER@STEP (e.g. leave:3@200)"
        )
    peer_text, _, step_text = parsed.positional[0].partition("@")
    peer = _int(peer_text.strip(), spec, "peer", 0)
    try:
        step = int(step_text)
    except ValueError:
        raise spec_error(WHAT, spec, f"step {step_text!r} is not a whole number") from None
    if step < 1:
        raise spec_error(
            WHAT,
            spec,
            f"{item}: step {step} is {'negative' if step < 0 else 'the start'}; a change "
            "takes effect at a step >= 1 (at step 0 every peer begins)",
        )
    if size is not None and peer >= size:
        raise spec_error(
            WHAT, spec, f"{item}: peer {peer} is not one of the run's {size} (ids 0..{size - 1})"
        )
    return parsed.name, peer, step


def _check_events(events, spec: str, size: Optional[int]) -> None:
    seen: Dict[Tuple[int, int], str] = {}
    for kind, peer, step in events:
        if (peer, step) in seen:
            raise spec_error(
                WHAT, spec, f"peer {peer} has two events at step {step}: give them distinct steps"
            )
        seen[(peer, step)] = kind
    away: Dict[int, int] = {}
    live = set(range(size)) if size is not None else None
    for step in sorted({e[2] for e in events}):
        now = [(k, p) for k, p, s in events if s == step]
        for kind, peer in now:
            if kind == "join" and peer not in away:
                raise spec_error(
                    WHAT,
                    spec,
                    f"join:{peer}@{step} comes before peer {peer} left: a peer joins "
                    "only after it left (add leave:PEER@STEP before it)",
                )
            if kind == "leave" and peer in away:
                raise spec_error(
                    WHAT,
                    spec,
                    f"leave:{peer}@{step}: peer {peer} already left at step "
                    f"{away[peer]} and has not joined since",
                )
        stayed = live - {p for k, p in now if k == "leave"} if live is not None else None
        for kind, peer in now:
            if kind == "leave":
                away[peer] = step
            else:
                del away[peer]
        if live is None:
            continue
        joining = sorted(p for k, p in now if k == "join")
        if not stayed:
            problem = (
                f"at step {step} every member leaves while peers {joining} join: one member "
                "must stay to hand them the state"
                if joining
                else f"at step {step} every peer has left: at least one must stay"
            )
            raise spec_error(WHAT, spec, problem)
        live = stayed | set(joining)


def _random(options: Dict[str, str], spec: str) -> ChurnSchedule:
    for key in options:
        if key not in OPTIONS:
            raise unknown_option(WHAT, spec, key, OPTIONS)
    if "rate" not in options:
        raise spec_error(WHAT, spec, "random churn needs rate=R (e.g. rate=0.02,down=50)")
    try:
        rate = float(options["rate"])
    except ValueError:
        raise spec_error(WHAT, spec, f"rate {options['rate']!r} is not a number") from None
    if not 0.0 <= rate < 1.0:
        raise spec_error(
            WHAT,
            spec,
            f"rate={rate:g} must be in [0, 1) (the probability that a live peer leaves at a step)",
        )
    if "down" not in options:
        raise spec_error(WHAT, spec, "random churn needs down=D, the steps a peer stays away")
    down = _int(options["down"], spec, "down", 1)
    seed = _int(options.get("seed", "0"), spec, "seed", 0)
    return ChurnSchedule(spec, rate=rate, down=down, seed=seed)


def parse_churn(spec: str, size: Optional[int] = None) -> ChurnSchedule:
    """The `ChurnSchedule` of `spec` for a run of `size` peers (None: peer ids unchecked)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{WHAT} must be a non-empty string, got {spec!r}")
    positional, options = parse_items(spec, WHAT, spec)
    if positional and options:
        raise spec_error(
            WHAT,
            spec,
            "give either events (leave:3@200,join:3@400) or random churn "
            "(rate=0.02,down=50,seed=1), not both",
        )
    if options:
        return _random(options, spec)
    events = tuple(_event(item, spec, size) for item in positional)
    _check_events(events, spec, size)
    return ChurnSchedule(spec, events=events)


def _random_changes(schedule: ChurnSchedule, size: int, steps: int):
    live, back, out = set(range(size)), {}, []
    for step in range(1, steps):
        joining = back.pop(step, [])
        draws = np.random.default_rng(np.random.SeedSequence([schedule.seed, step])).random(size)
        leaving = [k for k in sorted(live) if draws[k] < schedule.rate]
        if leaving and len(leaving) == len(live):
            leaving = leaving[1:]  # the lowest-id member stays
        for k in leaving:
            live.discard(k)
            back.setdefault(step + schedule.down, []).append(k)
        live.update(joining)
        if leaving or joining:
            out.append((step, tuple(sorted(live))))
    return out


def churn_membership(schedule, topology: AnyTopology, steps: int) -> Membership:
    """The `Membership` of a run of `steps` steps on `topology` under `schedule` (a spec or a
    `ChurnSchedule`): every epoch the schedule makes, each graph repaired (and checked) now."""
    if isinstance(schedule, str):
        schedule = parse_churn(schedule, topology.size)
    return Membership(topology, schedule.changes(topology.size, steps))


def schedule_figures(schedule, size: int, steps: int) -> Dict[str, Any]:
    """What `schedule` (a spec or a `ChurnSchedule`) does to a run of `size` peers and `steps`
    steps, from the same changes the run applies: ``departures`` (leave events), ``returns``,
    ``scheduled_changes`` (steps at which the membership changes) and ``away_share`` (the share
    of peer-steps spent away)."""
    if isinstance(schedule, str):
        schedule = parse_churn(schedule, size)
    changes = schedule.changes(size, steps)
    live, departures, returns, away, last = set(range(size)), 0, 0, 0, 0
    for step, members in changes:
        away += (size - len(live)) * (step - last)
        departures += len(live - set(members))
        returns += len(set(members) - live)
        live, last = set(members), step
    away += (size - len(live)) * (steps - last)
    return {
        "departures": departures,
        "returns": returns,
        "scheduled_changes": len(changes),
        "away_share": away / (size * steps),
    }
