"""DECOR's pair secrets (`privacy.mechanisms.pair_secrets`): the RFC 3526 group, Diffie-Hellman
pair keys no third peer can use, keys confirmed by both ends of an edge, kept and resumed bit for
bit, a changed or removed key refused on every rank (locally and under mpiexec), never made anew.

Threat model: a peer knows the whole config (the seed too), the code and every byte it receives.
"""

from __future__ import annotations

import math
import shutil

import pytest

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.mechanisms import decor, pair_secrets
from gossip_powersgd.privacy.seeds import Randomness
from mechanism_fixtures import small_config


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
        "topology=ring:3",  # one rank fewer than tiny's ring:4; each still has two neighbours
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
    done = run_mpi(3, args, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    key = pair_secrets.pair_key_path(run, 1, 0)
    key.write_bytes(bytes(b ^ 1 for b in key.read_bytes()))
    resumed = run_mpi(3, ["-m", "gossip_powersgd.cli.train", "--resume", run], timeout=180)
    assert resumed.returncode != 0
    lines = [x for x in resumed.stderr.splitlines() if x.startswith("error (rank")]
    assert len(lines) == 3, resumed.stderr[-3000:]
    assert all("the two ends of edge 0-1 hold different DECOR pair keys" in x for x in lines)
