"""What the pages that train whole configs share (`python -m experiments PAGE`: the engine):
`runs` (one training run on every peer, a row's numbers, the recipes `BASE` and `QUICK_BASE`) and
`tables` (markdown and CSV from the rows, the pages' header line).

Every peer runs as a thread of this one process (`backend: local`; MPI ≡ local is tested in
tests/). Projected wall time per peer = measured compute time (means over peers) + rounds x
latency (50 us) + critical bytes / bandwidth (1 and 10 Gbit/s), from the transport's counters
(`CommStats.projected_seconds`): bytes always come from the counters, never a formula.
"""
