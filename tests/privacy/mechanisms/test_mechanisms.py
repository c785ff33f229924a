"""Muffliato, ZIP-DL and DECOR: the invariants they promise, DECOR's pair secrets, accountants.

Threat model: a peer knows the whole config (the seed too), the code and every byte it receives.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import topologies
from gossip_powersgd import ExactGossip, LocalCluster, PowerGossip
from gossip_powersgd.privacy import network_dp
from gossip_powersgd.privacy.mechanisms import decor, muffliato, pair_secrets, zipdl
from gossip_powersgd.privacy.seeds import Randomness

U64 = 2.0**-53  # float64 unit roundoff
SHAPES = [(12, 9), (6, 3, 2, 2), (12,), (2, 2)]


def peer_tensors(comm, seed=7):
    g = torch.Generator().manual_seed(seed + comm.rank)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


# ---- ZIP-DL --------------------------------------------------------------------------------------


def test_zero_sum_noise_sums_to_zero_with_the_weights_and_differs_per_neighbour():
    weights = [0.29, 0.17, 0.2, 0.2, 0.14]
    noise = zipdl.zero_sum_noise(Randomness.os_entropy(), 3, weights, 4000, sigma=2.0)
    w = torch.tensor(weights, dtype=torch.float64)
    residual = (w[:, None] * noise).sum(0).abs().max()
    # The centre is a float64 weighted mean of deg terms (error <= deg u sum|w g| / sum w), and
    # the weighted sum of the deg centred rows adds as much again: bound 2 deg u sigma max|g| sum w.
    bound = 2 * len(weights) * U64 * float(noise.abs().max() + 2.0 * 9) * float(w.sum())
    assert residual <= bound
    # every row is noisy, each its own: std as `message_std` says, rows not equal
    for row, std in zip(noise, zipdl.message_std(weights, 2.0)):
        assert abs(float(row.std()) / std - 1) < 5 / math.sqrt(2 * 4000)  # 5 standard errors
    assert not torch.allclose(noise[0], noise[1])


def zipdl_run(comm, kind, steps, sigma, centred):
    x = peer_tensors(comm)
    before = [t.clone() for t in x]
    gossip = ExactGossip(x, comm) if kind == "exact" else PowerGossip(x, comm, rank=1)
    noise = zipdl.ZeroSumNoise(Randomness.os_entropy(), sigma)
    if not centred:  # the control: independent noise per message, not zero-sum

        def noise(counter, neighbors, weights, rows, _r=Randomness.os_entropy()):
            rows.add_(sigma * _r.normals(zipdl.ZIPDL_STREAM, counter, n=rows.numel()).view_as(rows))

    gossip.edge_noise = noise
    largest = 0.0
    for _ in range(steps):
        gossip.step()
        largest = max(largest, max(float(t.abs().max()) for t in x))
    return before, x, largest


@pytest.mark.parametrize("kind", ["exact", "powergossip"])
@pytest.mark.parametrize("spec", ["ring:8", "small_world:8:4:0.5"])
def test_zipdl_leaves_the_network_average_unchanged(kind, spec):
    topology, steps, sigma = topologies.parse(spec), 30, 0.5
    results = LocalCluster(topology).run(zipdl_run, kind, steps, sigma, True)
    largest = max(r[2] for r in results) + 10 * sigma  # models and noisy messages
    deg = max(len(list(topology.neighbors(i))) for i in range(topology.size))
    # Per step and coordinate each peer's mix rounds deg + 2 float64 terms of size <= largest,
    # and the noise's centring leaves <= 2 deg u sigma 10 (first test): the average drifts by
    # at most steps (deg + 2) u largest (plus the centring's share, inside `largest`).
    bound = steps * (deg + 2) * 2 * U64 * largest
    for k in range(len(SHAPES)):
        before = torch.stack([r[0][k] for r in results]).mean(0)
        after = torch.stack([r[1][k] for r in results]).mean(0)
        assert float((after - before).abs().max()) <= bound, (k, bound)
    # The control, independent noise per message, moves the average by ~ sigma gamma w / sqrt(n)
    # per step: far above the bound, so the assertion above can fail.
    control = LocalCluster(topology).run(zipdl_run, kind, steps, sigma, False)
    moved = max(
        float(
            (
                torch.stack([r[1][k] for r in control]).mean(0)
                - torch.stack([r[0][k] for r in control]).mean(0)
            )
            .abs()
            .max()
        )
        for k in range(len(SHAPES))
    )
    assert moved > 1e6 * bound


def test_zipdl_messages_differ_per_neighbour():
    def run(comm):
        x = peer_tensors(comm)
        gossip = ExactGossip(x, comm)
        gossip.edge_noise = zipdl.ZeroSumNoise(Randomness.os_entropy(), 0.1)
        sent = {}
        original = comm.exchange

        def spy(send, recv, *args):
            sent.update({j: t.clone() for j, t in send.items()})
            return original(send, recv, *args)

        comm.exchange = spy
        gossip.step()
        return sent

    sent = LocalCluster(topologies.ring(4)).run(run)
    a, b = sent[0].values()
    assert not torch.equal(a, b)
    assert torch.allclose(
        a + b, 2 * torch.cat([t.reshape(-1) for t in peer_tensors(type("C", (), {"rank": 0}))])
    )


# ---- DECOR: pair secrets ------------------------------------------------------------------------


def miller_rabin(n: int, bases=(2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_group_is_rfc_3526s_safe_prime():
    p = pair_secrets.MODP_2048
    assert p.bit_length() == 2048 and miller_rabin(p) and miller_rabin((p - 1) // 2)
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 700  # 2^1918 pi needs ~578 decimal digits
    floor = int(mpmath.floor(mpmath.mpf(2) ** 1918 * mpmath.pi))
    assert p == 2**2048 - 2**1984 - 1 + 2**64 * (floor + 124476)


def recording_agreement(comm, kind, seed, run_dir=None):
    """agree_pair_keys, recording every byte this peer receives."""
    received = []
    original = comm.exchange

    def spy(send, recv, *args):
        original(send, recv, *args)
        received.extend(bytes(t.numpy().tobytes()) for t in recv.values())

    comm.exchange = spy
    keys = pair_secrets.agree_pair_keys(comm, kind, seed=seed, run_dir=run_dir)
    return keys, received


@pytest.mark.parametrize("kind", ["os", "public"])
def test_a_third_peer_cannot_cancel_a_pairs_noise(kind):
    """complete:3: peer 0 sees both 1 and 2, knows the config and every byte it received, and
    tries every key it can form for the pair {1, 2}. With DH keys none reproduces v_12; with public
    keys (the control) the first one does, exactly."""
    seed, sigma, numel = 3, 2.0, 5000
    results = LocalCluster(topologies.parse("complete:3")).run(recording_agreement, kind, seed)
    keys = {r: results[r][0] for r in range(3)}
    assert keys[1][2] == keys[2][1]  # the two ends agree
    assert keys[1][2] not in (keys[0][1], keys[0][2])
    truth = decor.PairwiseNoise(1, keys[1], sigma, 1.0, kind).pair_noise(2, 5, 0, numel)
    candidates = [
        pair_secrets.public_pair_key(seed, 1, 2),
        Randomness.public(seed, 1)._key,
        Randomness.public(seed, 2)._key,
        keys[0][1],
        keys[0][2],
    ]
    import hashlib

    for message in results[0][1]:
        candidates += [hashlib.sha256(message).digest(), hashlib.sha256(message[1:]).digest()]
    residuals = []
    for key in candidates:
        guess = sigma * Randomness(key, kind).normals(decor.DECOR_STREAM, 5, 0, n=numel)
        residuals.append(float((truth - guess).var() / truth.var()))
    if kind == "public":
        assert residuals[0] == 0.0  # the seed-derived key cancels the noise exactly
    else:
        # An unrelated stream leaves var(truth - guess) = 2 var(truth): no subtraction helps.
        assert min(residuals) > 2 - 6 * math.sqrt(8 / numel)  # 6 standard errors of the ratio


def test_pairwise_noise_cancels_in_the_sum_and_is_fresh_every_step():
    sigma, numel = 3.0, 2000
    topology = topologies.parse("small_world:8:4:0.5")

    def run(comm):
        keys = pair_secrets.agree_pair_keys(comm, "os")
        noise = decor.PairwiseNoise(comm.rank, keys, sigma, 1.0, "os")
        like = torch.zeros(numel)
        return [noise(t, 0, like) for t in range(2)]

    results = LocalCluster(topology).run(run)
    edges = len(list(topology.edges()))
    for t in range(2):
        total = torch.stack([r[t] for r in results]).sum(0)
        largest = max(float(r[t].abs().max()) for r in results)
        # 2|E| float64 draws of size <= 8.6 sigma, each peer's sum rounded, then n sums rounded
        assert float(total.abs().max()) <= (2 * edges + 8) * U64 * max(largest, 8.6 * sigma)
    for r, rank in zip(results, range(8)):
        deg = len(list(topology.neighbors(rank)))
        assert abs(float(r[0].std()) / (sigma * math.sqrt(deg)) - 1) < 5 / math.sqrt(2 * numel)
        corr = float(torch.corrcoef(torch.stack([r[0], r[1]]))[0, 1])
        assert abs(corr) < 5 / math.sqrt(numel)  # a fresh draw each step, not the same one


# ---- DECOR: the SecLDP accountant ----------------------------------------------------------------


def complete_closed_form(n, a, b):
    """[Sigma^-1]_ii for K_n, Sigma = a I + b (n I - J): eigenvalue a on 1, a + b n on 1-perp."""
    return (1 - 1 / n) / (a + b * n) + 1 / (a * n)


def ring_closed_form(n, a, b):
    """[Sigma^-1]_ii for the ring C_n: (1/n) sum_k 1 / (a + b (2 - 2 cos(2 pi k / n)))."""
    return sum(1 / (a + b * (2 - 2 * math.cos(2 * math.pi * k / n))) for k in range(n)) / n


def path_closed_form(m, a, b, i):
    """[Sigma^-1]_ii for the path P_m (the ring without one node): Laplacian eigenvalues
    2 - 2 cos(pi k / m), eigenvectors cos(pi k (i + 1/2) / m), normalised."""
    total = 0.0
    for k in range(m):
        v = np.cos(np.pi * k * (np.arange(m) + 0.5) / m)
        v /= np.linalg.norm(v)
        total += v[i] ** 2 / (a + b * (2 - 2 * math.cos(math.pi * k / m)))
    return total


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("sigma_ind, sigma_cor", [(1.0, 0.5), (0.3, 4.0)])
def test_secldp_closed_forms_on_the_complete_graph_and_the_ring(n, sigma_ind, sigma_cor):
    a, b, clip = sigma_ind**2, sigma_cor**2, 0.7
    # A linear solve's relative error is <= ~ n u cond(Sigma), cond = (a + b lambda_max) / a.
    for spec, form, lam in (
        (f"complete:{n}", complete_closed_form(n, a, b), n),
        (f"ring:{n}", ring_closed_form(n, a, b), 4),
    ):
        tol = 10 * n * U64 * (a + b * lam) / a
        adjacency = decor.adjacency_of(topologies.parse(spec))
        assert decor.decor_rdp(adjacency, sigma_ind, sigma_cor, clip) == pytest.approx(
            2 * clip**2 * form, rel=tol
        )
    # Against a peer that holds its own keys: K_n loses a node (K_{n-1}), the ring becomes a path.
    ring = decor.adjacency_of(topologies.parse(f"ring:{n}"))
    tol = 10 * n * U64 * (a + 4 * b) / a
    for victim in range(1, n):
        z = decor.effective_noise(ring, sigma_ind, sigma_cor, victim, adversary=0)
        assert 1 / z**2 == pytest.approx(path_closed_form(n - 1, a, b, victim - 1), rel=tol)
    complete = decor.adjacency_of(topologies.parse(f"complete:{n}"))
    z = decor.effective_noise(complete, sigma_ind, sigma_cor, 1, adversary=0)
    assert 1 / z**2 == pytest.approx(complete_closed_form(n - 1, a, b), rel=tol)


def test_secldp_limits_and_cross_check_with_dp_accounting():
    ring = decor.adjacency_of(topologies.parse("ring:8"))
    # No correlated noise: local DP-SGD (z = sigma_ind); a lot: the 7 others' noise averaged.
    assert decor.effective_noise(ring, 0.8, 0.0, 2, 1) == pytest.approx(0.8, rel=1e-14)
    # (the remainder, sum over the path's other eigenvalues of v^2 / (b lambda) with lambda_1 =
    # 2 - 2 cos(pi / 7) ~ 0.2, is ~ 1e-7 relative; the solve's error ~ 7 u cond, cond ~ 6e8)
    assert decor.effective_noise(ring, 0.8, 1e4, 2, 1) == pytest.approx(
        0.8 * math.sqrt(7), rel=1e-5
    )
    rdp = decor.secldp_epsilon(ring, 0.5, 2.0, 2, 1, 0.05, 300, 1e-5, "rdp")
    pld = decor.secldp_epsilon(ring, 0.5, 2.0, 2, 1, 0.05, 300, 1e-5, "pld")
    # PLD is tighter than RDP's conversion, by 8-21 % on DP-SGD settings (privacy reference)
    assert 0.7 * rdp <= pld <= rdp


# ---- Muffliato -------------------------------------------------------------------------------------


def test_muffliato_gaussian_conversion_matches_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    for mu in (0.3, 1.0, 2.5):
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
        pld = accountant.get_epsilon(1e-5)
        exact = network_dp.gaussian_epsilon(mu, 1e-5)
        # PLD discretises pessimistically: above the exact value, by about the interval
        assert exact <= pld + 1e-9 and pld - exact < 5e-3 * max(1.0, exact)


def test_muffliato_pairwise_epsilon_on_a_ring():
    ring = topologies.ring(8)
    out = muffliato.muffliato_epsilons(ring, 12, 1.0, 0.1, 1e-5, observer=0, network=True)
    local = out[1]["local"]
    assert all(v["epsilon"] == local for v in out.values())  # the guarantee: DP-SGD's
    far, near = out[4]["network"], out[1]["network"]
    assert far < near  # amplification by mixing grows with the distance
    # never above local DP without subsampling (mu <= sqrt(T) / sigma: the view is a function of
    # the T noisy updates)
    assert near <= network_dp.gaussian_epsilon(math.sqrt(12), 1e-5) + 1e-9
    assert muffliato.hops(ring, 0).tolist() == [0, 1, 2, 3, 4, 3, 2, 1]


# ---- in training, and through the CLI --------------------------------------------------------------

MECHANISM_KEYS = {
    "zipdl": {"dp_zipdl_sigma": 0.01},
    "decor": {"dp_decor_sigma_cor": 1.0},
    "muffliato": {},
}


def small_config(**changes):
    from gossip_powersgd.training.config import TrainConfig

    base = TrainConfig(
        topology="ring:4",
        dataset="synthetic_logreg:d=20,classes=4,n=2000",
        model="logreg",
        lr=0.5,
        batch_size=32,
        epochs=1,
        quiet=True,
        checkpoint_every=0,
        algorithm="exact",
        partition="iid",
        dp_noise_multiplier=0.5,
        dp_max_grad_norm=1.0,
    )
    return base.replace(**changes)


@pytest.mark.parametrize("mechanism", sorted(MECHANISM_KEYS))
@pytest.mark.parametrize("algorithm", ["exact", "powergossip:rank=1"])
def test_each_mechanism_trains_on_both_algorithms(mechanism, algorithm):
    from gossip_powersgd.training.trainer import train

    config = small_config(algorithm=algorithm, dp_mechanism=mechanism, **MECHANISM_KEYS[mechanism])
    results = LocalCluster(topologies.ring(4), timeout=60).run(train, config)
    assert results[0]["dp_mechanism"] == mechanism
    # learned something: synthetic logreg with 4 classes, chance 25 %
    assert results[0]["final_test_acc_avg_model"] > 0.4


def cli(tmp_path, *sets):
    args = [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        "experiments/configs/tiny.yaml",
        "--quiet",
        "--set",
        "epochs=1",
        "--set",
        f"out_dir={tmp_path}/run",
        "--set",
        "dp_noise_multiplier=0.5",
        "--set",
        "dp_max_grad_norm=1",
    ]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_a_mechanism_trains_through_the_cli_and_is_refused_elsewhere_in_one_line(tmp_path):
    import json

    done = cli(
        tmp_path, "algorithm=powergossip:rank=1", "dp_mechanism=decor", "dp_decor_sigma_cor=3"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dp_mechanism"] == "decor"
    done = cli(
        tmp_path / "refused", "algorithm=allreduce", "dp_mechanism=zipdl", "dp_zipdl_sigma=0.1"
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: dp_mechanism: zipdl works with algorithm exact or powergossip, not allreduce"
    ), done.stderr


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            dict(algorithm="pushsum", dp_mechanism="decor", dp_decor_sigma_cor=1.0),
            "dp_mechanism: decor works with algorithm exact or powergossip or choco, not pushsum",
        ),
        (dict(dp_mechanism="decor"), "dp_mechanism: decor needs dp_decor_sigma_cor"),
        (dict(dp_mechanism="zipdl"), "dp_mechanism: zipdl needs dp_zipdl_sigma"),
        (dict(dp_mechanism="secure_aggregation"), "dp_mechanism must be one of local, muffliato"),
        (dict(dp_decor_sigma_cor=1.0), "dp_decor_sigma_cor is for dp_mechanism: decor"),
        (
            dict(dp_mechanism="muffliato", dp_noise_multiplier=None, dp_max_grad_norm=None),
            "dp_mechanism: muffliato runs on DP-SGD",
        ),
    ],
)
def test_bad_mechanism_settings_are_one_line_errors(changes, words):
    from gossip_powersgd.privacy.mechanisms import validate_mechanism_config

    with pytest.raises(ValueError, match=words):
        validate_mechanism_config(small_config(**changes))


def test_zipdl_on_a_schedule_is_refused_on_every_rank():
    from gossip_powersgd.training.trainer import train

    config = small_config(
        topology="one_peer_exponential:4", dp_mechanism="zipdl", dp_zipdl_sigma=0.1
    )
    with pytest.raises(Exception, match="zipdl needs a static topology"):
        LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)


def test_decor_pair_keys_resume_bit_for_bit(tmp_path):
    from gossip_powersgd.training.trainer import train

    config = small_config(
        epochs=2,
        checkpoint_every=1,
        algorithm="powergossip:rank=1",
        dp_secret="run_dir",
        dp_mechanism="decor",
        dp_decor_sigma_cor=3.0,
    )

    def local(c, **kw):
        return LocalCluster(topologies.ring(4), timeout=60).run(train, c, **kw)

    reference = local(config.replace(out_dir=str(tmp_path / "a")))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for path in (tmp_path / "b" / "checkpoints").glob("rank-*-epoch-2.pt"):
        path.unlink()
    for name in ("summary.json", "summary.md"):
        (tmp_path / "b" / name).unlink()
    resumed = local(config.replace(out_dir=str(tmp_path / "b")), resume=True)
    assert resumed[0]["model_sha256"] == reference[0]["model_sha256"]
    keys = {
        (k, j): pair_secrets.pair_key_path(tmp_path / "a", k, j).read_bytes()
        for k in range(4)
        for j in ((k + 1) % 4, (k - 1) % 4)
    }
    assert all(keys[(k, j)] == keys[(j, k)] for k, j in keys)
    assert len(set(keys.values())) == 4  # one key per edge


# ---- a decaying learning rate (cosine schedule) -------------------------------------------------


@pytest.mark.parametrize("mechanism", ["local", "decor"])
def test_update_noise_scales_with_the_step_lr_exactly_as_the_sensitivity(mechanism):
    """DP-SGD's and DECOR's noise is on the clipped gradient sum: the model moves by -lr_t times
    (clipped sum + noise) / batch, so noise and a record's shift lr_t C / batch scale alike and
    their ratio, which the accountant prices, is the same at every lr_t (a schedule changes no
    epsilon). Fails if a mechanism's noise entered the model with a fixed, lr-free scale."""
    from gossip_powersgd.privacy.dpsgd import DPSGD

    key, pair_key = bytes(range(32)), bytes(range(1, 33))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)
    start = torch.nn.Linear(5, 3)

    def update_over_lr(lr, sigma):
        model = torch.nn.Linear(5, 3)
        model.load_state_dict(start.state_dict())
        dp = DPSGD(sigma, 1.0, sample_rate=16 / 64, shard_size=64, randomness=Randomness(key, "os"))
        if mechanism == "decor":
            dp.extra_noise = decor.PairwiseNoise(0, {1: pair_key}, 4 * sigma, 1.0, "os")
        wrapped = dp.wrap(model)
        torch.nn.functional.cross_entropy(wrapped(x), y).backward()
        dp.privatize(wrapped, len(x))
        torch.optim.SGD(wrapped.parameters(), lr=lr).step()
        moved = [
            (p.detach() - p0.detach()).flatten()
            for p, p0 in zip(model.parameters(), start.parameters())
        ]
        return torch.cat(moved) / lr

    for lr in (0.5, 0.5 * 0.5 * (1 + math.cos(math.pi * 0.9))):  # cosine's start and 90 %
        signal = update_over_lr(lr, 0.0)  # -(clipped sum) / batch
        noise = update_over_lr(lr, 1.5) - signal  # -(noise) / batch
        if lr == 0.5:
            first = (signal, noise)
        # float32 parameters: p - p0 carries the rounding of p and of the difference, each at most
        # half an ulp of a value below 4 here (init <= 0.45, moves of a few noise stds), so the
        # difference is exact to 4 * 2^-23 and (p - p0) / lr to that over lr
        tol = 4 * 2.0**-23 / lr
        assert float((signal - first[0]).abs().max()) <= tol
        assert float((noise - first[1]).abs().max()) <= tol
        assert float(noise.abs().max()) > 0.1  # the noise is there, in gradient units


# ---- Reliability IV: the two ends of an edge hold the same pair key -------------------------------


def agree_or_error(comm, run_dir, resume):
    """agree_pair_keys on every peer; this peer's error text, or its keys."""
    try:
        return pair_secrets.agree_pair_keys(comm, "run_dir", run_dir=run_dir, resume=resume)
    except ValueError as exc:
        return f"error: {exc}"


def ring4_agreement(run_dir, resume):
    return LocalCluster(topologies.ring(4), timeout=30).run(agree_or_error, run_dir, resume)


def test_pair_keys_are_confirmed_by_both_ends_without_revealing_them(tmp_path):
    """Each end sends a keyed digest of its pair key over the edge (never the key): both ends
    compute the same one, and a key changed at one end is refused by both ends, naming the
    edge, never used (its pair noise would not cancel)."""
    first = ring4_agreement(tmp_path, resume=False)
    assert first[0][1] == first[1][0]
    confirm = pair_secrets.key_confirmation(first[0][1], 0, 1)
    assert confirm == pair_secrets.key_confirmation(first[1][0], 1, 0)
    assert confirm != first[0][1] and len(confirm) == 32
    assert pair_secrets.key_confirmation(first[0][3], 0, 3) != confirm  # per edge
    assert ring4_agreement(tmp_path, resume=True)[2] == first[2]  # resumed: the stored keys
    pair_secrets.pair_key_path(tmp_path, 1, 0).write_bytes(bytes(32))  # one end's key changed
    seen = ring4_agreement(tmp_path, resume=True)
    for rank in (0, 1):
        assert seen[rank].startswith("error: the two ends of edge 0-1 hold different DECOR pair")
        assert "\n" not in seen[rank]
    assert seen[2] == first[2] and seen[3][2] == first[3][2]  # edges 1-2.. 2-3 untouched


@pytest.mark.parametrize("removed", ["folder", "one end", "both ends"])
def test_a_removed_pair_key_is_refused_on_resume_never_regenerated(tmp_path, removed):
    ring4_agreement(tmp_path, resume=False)
    folder = tmp_path / "secrets"
    if removed == "folder":
        shutil.rmtree(folder)
    else:
        pair_secrets.pair_key_path(tmp_path, 2, 3).unlink()
        if removed == "both ends":
            pair_secrets.pair_key_path(tmp_path, 3, 2).unlink()

    def held():
        return sorted(p.name for p in folder.glob("*")) if folder.exists() else None

    before = held()
    seen = ring4_agreement(tmp_path, resume=True)
    errors = [s for s in seen if isinstance(s, str)]
    # the end without its file says so; its neighbour, which still has one, sees it is alone
    assert any("is missing" in e and "not made anew" in e for e in errors), seen
    assert all("is missing" in e or "at one end of the edge only" in e for e in errors), seen
    assert held() == before  # nothing written: a new key would not continue the pair's noise


def decor_run_dir_config(out_dir, **changes):
    return small_config(
        out_dir=str(out_dir),
        epochs=1,
        checkpoint_every=1,
        dp_secret="run_dir",
        dp_mechanism="decor",
        dp_decor_sigma_cor=3.0,
        **changes,
    )


def test_a_changed_pair_key_stops_the_resumed_run_on_every_rank(tmp_path):
    from tests.conftest import errors_on_every_rank
    from gossip_powersgd.training.trainer import train

    config = decor_run_dir_config(tmp_path / "run")
    LocalCluster(topologies.ring(4), timeout=60).run(train, config)
    key = pair_secrets.pair_key_path(tmp_path / "run", 0, 1)
    key.write_bytes(bytes(b ^ 1 for b in key.read_bytes()))
    errors = errors_on_every_rank(config, resume=True)
    assert len(set(errors)) == 1 and len(errors) >= 2, errors
    assert "the two ends of edge 0-1 hold different DECOR pair keys" in errors[0]


@pytest.mark.mpi
def test_a_changed_pair_key_is_refused_under_mpiexec(tmp_path):
    from tests.conftest import run_mpi

    run = tmp_path / "run"
    args = [
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        "experiments/configs/tiny.yaml",
        "--quiet",
        "--set",
        "backend=mpi",
        "--set",
        "epochs=1",
        "--set",
        "algorithm=exact",
        "--set",
        "dp_noise_multiplier=0.5",
        "--set",
        "dp_max_grad_norm=1",
        "--set",
        "dp_mechanism=decor",
        "--set",
        "dp_decor_sigma_cor=3",
        "--set",
        "dp_secret=run_dir",
        "--set",
        f"out_dir={run}",
    ]
    done = run_mpi(4, args, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    key = pair_secrets.pair_key_path(run, 1, 0)
    key.write_bytes(bytes(b ^ 1 for b in key.read_bytes()))
    resumed = run_mpi(4, ["-m", "gossip_powersgd.cli.train", "--resume", run], timeout=180)
    assert resumed.returncode != 0
    lines = [x for x in resumed.stderr.splitlines() if x.startswith("error (rank")]
    assert len(lines) == 4, resumed.stderr[-3000:]
    assert all("the two ends of edge 0-1 hold different DECOR pair keys" in x for x in lines)


# ---- Reliability IV: what the printed epsilon means ----------------------------------------------


def test_decor_without_independent_noise_is_refused():
    """SecLDP needs sigma_ind > 0: with none, a peer whose every pair key a neighbour holds adds no
    noise that neighbour cannot remove, and no epsilon holds."""
    from gossip_powersgd.privacy.mechanisms import validate_mechanism_config

    config = small_config(dp_mechanism="decor", dp_decor_sigma_cor=3.0, dp_noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"dp_mechanism: decor needs dp_noise_multiplier > 0"):
        validate_mechanism_config(config)


def test_muffliato_with_momentum_says_its_epsilon_is_the_local_bound():
    """Muffliato's network bound models plain SGD at a constant learning rate: with momentum the
    run's epsilon is DP-SGD's local one (post-processing: valid against every observer), and the
    summary and a warning line say so, naming the momentum."""
    from gossip_powersgd.training.evaluation import format_summary
    from gossip_powersgd.training.trainer import train
    from gossip_powersgd.utils import RunWarning

    config = small_config(dp_mechanism="muffliato", momentum=0.9, lr=0.1)
    with pytest.warns(RunWarning, match=r"muffliato.*momentum 0.9.*local DP-SGD bound"):
        summary = LocalCluster(topologies.ring(4), timeout=60).run(train, config)[0]
    note = summary["dp_epsilon_note"]
    assert note.startswith("DP-SGD's local bound, valid against every observer")
    assert "momentum 0.9" in note
    assert note in format_summary(summary)
    plain = LocalCluster(topologies.ring(4), timeout=60).run(
        train, small_config(dp_mechanism="muffliato")
    )[0]
    assert "dp_epsilon_note" in plain and "momentum" not in plain["dp_epsilon_note"]
