"""What the pages that train whole configs share (`python -m experiments PAGE`: the engine):
`runs` (one training run on every peer, a row's numbers, the recipes `BASE` and `QUICK_BASE`) and
`tables` (markdown and CSV from the rows, the pages' header line).

Every peer runs as a thread of this one process (`backend: local`, through `gossip_powersgd.run`);
the MPI transport runs the very same algorithm code and its equality with the local one is tested
in tests/ (not here).

Projected wall time (per peer) = measured compute time (forward/backward/optimizer + the algorithm's
own compression arithmetic, means over peers) + projected communication time, where projected
communication = rounds x latency + critical_bytes / bandwidth, from the transport's counters
(`CommStats.projected_seconds`: one round per exchange costing its largest message, a ring
all-reduce 2(n-1) rounds of 1/n of the tensor). Latency 50 us, bandwidth 1 and 10 Gbit/s. Bytes
always come from the counters, never a formula.
"""
