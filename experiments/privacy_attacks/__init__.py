"""What a curious neighbour learns, measured: `python -m experiments.privacy_attacks` trains with an
observer recording its views (`measure`), attacks a neighbour (reconstruction over time, LOSS
membership inference with four models), computes the pairwise network-DP matrices, and writes
privacy_attacks.md with its CSV, JSON and plots into --out (default runs/privacy-attacks; the
committed page: --out experiments/results) (`report`, `driver`)."""
