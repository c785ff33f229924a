"""Seeds for the privacy random streams, derived from the run's seed and the peer's rank.

The Poisson sampler and the noise generator each get their own stream (a different tag), so that
changing one never shifts the other, and every peer's streams differ from every other peer's.
"""

from __future__ import annotations

import numpy as np

#: Tags that keep the sampler's and the noise's streams apart for the same (seed, rank).
SAMPLER_STREAM = 0x5A3B1E
NOISE_STREAM = 0x9015E


def derive_seed(seed: int, rank: int, stream: int, *counters: int) -> int:
    """A 64-bit seed for ``torch.Generator.manual_seed`` from (seed, rank, stream, counters...).

    SeedSequence hashes the whole tuple, so nearby inputs (rank 1 vs 2, step 9 vs 10) give
    unrelated seeds, which a plain ``seed + rank`` would not.
    """
    values = [int(seed), int(rank), int(stream), *(int(c) for c in counters)]
    if any(v < 0 for v in values):
        raise ValueError(f"seed, rank and counters must be non-negative, got {values}")
    return int(np.random.SeedSequence(values).generate_state(1, np.uint64)[0])
