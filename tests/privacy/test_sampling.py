"""`privacy.sampling`: Poisson batches — the expected size on average, empty batches, each record
included at rate q independently, a pure function of the peer's key, resumed bit for bit."""

from __future__ import annotations

import math
import secrets

import torch

from gossip_powersgd.privacy import PoissonBatches
from gossip_powersgd.privacy.seeds import Randomness
from dp_fixtures import data, one_line_error, weights_only_round_trip


def test_poisson_batches_have_the_expected_size_on_average_and_vary():
    n, q, steps = 400, 0.05, 200
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    batches = PoissonBatches(x, torch.arange(n), q, seed=1, rank=3)
    assert len(batches) == 20
    sizes, seen = [], torch.zeros(n)
    while len(sizes) < steps:
        for xb, yb in batches:
            assert torch.equal(xb[:, 0].long(), yb)
            assert len(torch.unique(yb)) == len(yb)  # without replacement within a step
            sizes.append(len(yb))
            seen[yb] += 1
    total = sum(sizes)
    mean, sd = n * steps * q, math.sqrt(n * steps * q * (1 - q))  # Binomial(n * steps, q)
    assert abs(total - mean) < 5 * sd
    assert len(set(sizes)) > 5
    assert batches.epoch == steps // 20


def test_poisson_batches_can_be_empty_and_depend_on_the_key_only():
    x, y = data(30)
    sizes = [len(yb) for _ in range(3) for _, yb in PoissonBatches(x, y, 0.01, seed=0, rank=0)]
    assert 0 in sizes
    key = secrets.token_bytes(32)
    first = [yb for _, yb in PoissonBatches(x, y, 0.3, randomness=Randomness(key, "run_dir"))]
    same = [
        yb
        for _, yb in PoissonBatches(
            x, y, 0.3, seed=5, rank=2, randomness=Randomness(key, "run_dir")
        )
    ]
    other = [yb for _, yb in PoissonBatches(x, y, 0.3)]  # a fresh OS-entropy key
    assert all(torch.equal(a, b) for a, b in zip(first, same))
    assert any(not torch.equal(a, b) for a, b in zip(first, other))


def test_each_record_is_included_at_rate_q_independently_of_the_others():
    # 60 steps x 500 records at q = 0.1 from a fixed key. Per record the count is Binomial(60, q);
    # over records the counts' variance is 60 q (1 - q) = 5.4, whose sample estimate from 500
    # records has relative standard error sqrt(2 / 499) (about 6.3 %): 5 of them is a 32 % band.
    n, q, steps = 500, 0.1, 60
    batches = PoissonBatches(
        torch.zeros(n, 1), torch.arange(n), q, randomness=Randomness(bytes(32), "run_dir")
    )
    counts = torch.zeros(n)
    for _ in range(steps // len(batches)):
        for _, yb in batches:
            counts[yb] += 1
    mean, var = steps * q, steps * q * (1 - q)
    assert abs(counts.mean().item() - mean) < 5 * math.sqrt(var / n)
    assert abs(counts.var().item() / var - 1) < 5 * math.sqrt(2 / (n - 1))


def test_sampler_resume_is_bit_exact_across_an_epoch_boundary():
    x, y = data(50)
    key = secrets.token_bytes(32)
    batches = PoissonBatches(x, y, 0.2, randomness=Randomness(key, "run_dir"))  # 5 steps/epoch
    taken = 0
    while taken < 7:  # stop mid-epoch, holding a batch, as a checkpoint after it would
        for _ in batches:
            taken += 1
            if taken == 7:
                break
    state = weights_only_round_trip(batches.state_dict())
    resumed = PoissonBatches(x, y, 0.2, randomness=Randomness(key, "run_dir"))
    resumed.load_state_dict(state)

    def take(sampler, count):
        out = []
        while len(out) < count:
            out.extend(sampler)
        return out[:count]

    for (xa, ya), (xb, yb) in zip(take(batches, 9), take(resumed, 9)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    one_line_error(
        resumed.load_state_dict,
        {"epoch": 0, "position": 5, "seed": 7},
        match="invalid PoissonBatches state",
    )


def test_the_rate_is_batch_over_shard_and_an_impossible_one_names_the_fix():
    from gossip_powersgd.privacy import poisson_rate

    assert poisson_rate(32, 1000) == 0.032 and poisson_rate(10, 10) == 1.0
    for batch in (0, -3, 2.5, True):
        one_line_error(poisson_rate, batch, 100, match="batch_size must be a positive integer")
    one_line_error(poisson_rate, 4, 0, match="a peer's shard must hold at least one sample")
    text = one_line_error(poisson_rate, 11, 10, match="larger than a peer's shard of 10")
    assert text.endswith("lower batch_size to at most 10")
    # an epoch is round(1 / q) steps; the private sum is divided by q |D| whatever a batch holds
    batches = PoissonBatches(torch.zeros(50, 1), torch.arange(50), 0.3)
    assert len(batches) == 3 and batches.expected_batch_size == 0.3 * 50
