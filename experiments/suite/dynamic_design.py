"""The design of the dynamic-topologies page (`dynamic.py` runs it, `dynamic_plots.py` draws it):
the graphs, the algorithms, the budgets and targets."""

#: The graphs compared: two static, two changing every step.
TOPOLOGIES = ("ring:16", "torus:4x4", "one_peer_exponential:16", "matchings:16")
SCHEDULES = ("one_peer_exponential:16", "matchings:16")
#: (label, consensus spec, training spec) run on every graph of TOPOLOGIES.
ALGORITHMS = (
    ("exact gossip", "exact", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1,warm=true", "powergossip:rank=1,iters=1"),
)
#: Push-sum runs on the directed schedule only (the symmetric algorithms refuse a directed graph).
PUSHSUM = ("directed_exponential:16", "push-sum", "pushsum", "pushsum")
POWERGOSSIP = ALGORITHMS[1][0]
#: Consensus: bit budgets per peer for the matched-bits table, relative errors for bits-to-reach.
BUDGETS = (1e5, 1e6, 1e7)
TARGETS = (1e-2, 1e-4)
#: Consensus: a run stops past this many bits per peer, after this many steps, or at the smallest
#: target halved (so that the crossing of the target is bracketed by logged steps).
MAX_BITS, MAX_STEPS = 1e7, 4000
TRAINING_EPOCHS = 30
