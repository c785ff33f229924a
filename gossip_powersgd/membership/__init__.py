"""Membership: peers that leave and join a run, and the rest going on. The rules, in one place.

**Epochs.** A run's membership is a sequence of epochs (number, step, live peers): epoch 0 is every
peer from step 0; each later one takes effect at an agreed training step, before any work of that
step, on every peer (`epochs.Membership`). Peer ids are stable (the topology's node ids; a peer
that leaves keeps its id and gets it back). The in-process backend fills the sequence from the
churn schedule (`churn`: ``leave:3@200,join:3@400`` or ``rate=0.02,down=50,seed=1``); the torch
transport, whose liveness monitor detects lost peers, appends the survivors' agreed decisions
through the same `Membership.append` (`detected`: the store protocol, the step in flight).

**The graph.** The members of an epoch gossip on `topologies.repair(topology, live)`: the same ids,
absent peers isolated, the live ones linked by the rule of the topology's kind (rebuilt on the
survivors for ring, complete, star, exponential; the departed peers' live neighbours linked for
every other static kind; schedules per kind; see `topologies/repair.py`), weights recomputed by
the topology's own scheme, and the consensus step of the new graph (a γ given in the spec is
checked again against its stable range).

**What each peer does at a change** (`peer.PeerMembership.advance`): members switch their
communicator (`comm.membership.MemberCommunicator`: exchanges over the new graph, collectives over
the live peers only); each joiner is handed its state by the survivors (`transfer`: live, raw
tensors, its surviving neighbours' mean or the lowest one's copy); the members' average shift is
measured; the algorithm is built again on the new graph, carrying this peer's own state and the
state of every edge that stays (`algorithm`). Every other edge starts fresh at both ends; a new
edge is seeded from (seed, min(i, j), max(i, j)) of the stable ids.

**The invariant.** From the step after a change on, the members' average is preserved exactly
(to float rounding) by every algorithm that supports churn — exact gossip, PowerGossip (any rank
and number of half-steps), Choco-SGD, DeepSqueeze, push-sum on undirected graphs — since each
edge of the new graph still adds opposite amounts at its two ends, with state that both ends
agree on (tests/membership/test_peer.py, with the float bound derived there).

**The departed share.** A leaving peer takes its model with it: its share of the average leaves
the run. With members S before and leavers D, the average jumps at the change from
x̄_old = (Σ_S x + Σ_D x) / (|S| + |D|) to x̄_S = Σ_S x / |S|, i.e. by (x̄_S − x̄_D) |D| / (|S| + |D|)
(x̄_D the leavers' mean). A joiner adds its handed model: with joiners J the average becomes
(|S| x̄_S + Σ_J x_J) / (|S| + |J|); in mode "average" x_J is the mean of J's surviving neighbours.
Nothing else moves it: gossip after the change keeps it. That is a scheduled (cooperative) change;
a peer lost mid-step (`detected`) also leaves the terms of its last step that one end of an edge
applied and the other did not: no closed form, no shift measured; the invariant holds from the
change on all the same.

**Who cannot follow a change** (`algorithm.refuse_unsupported`): the all-reduce baselines
(allreduce, powersgd) average over every peer in one collective at every step; they are refused,
not paused, since a pause would not end while a peer stays away. Directed topologies have no
repair rule. The training side (`training/churn.py`) also refuses the privacy features bound to
one fixed graph.
"""

from .churn import ChurnSchedule, churn_membership, parse_churn
from .epochs import Membership, MembershipEpoch
from .peer import Change, ParamsState, PeerMembership

__all__ = [
    "Change",
    "ChurnSchedule",
    "Membership",
    "MembershipEpoch",
    "ParamsState",
    "PeerMembership",
    "churn_membership",
    "parse_churn",
]
