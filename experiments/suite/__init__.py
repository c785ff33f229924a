"""What the pages that train whole configs share: `runs` (one training run on every peer, as threads
of this process; a row's numbers; the recipes `BASE` and `QUICK_BASE`; projected wall time =
compute + rounds x latency + critical bytes / bandwidth, from the transport's counters) and
`tables` (markdown and CSV from the rows, the pages' header line)."""
