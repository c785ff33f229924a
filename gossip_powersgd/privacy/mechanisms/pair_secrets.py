"""Secrets shared by the two ends of an edge only (DECOR's pairwise noise), by Diffie-Hellman.

Threat model: a peer knows the whole config (the seed too), the code and every byte it receives,
and nothing else. A pair key must therefore come from fresh entropy (never from the config) and be
computable by its two ends only. Two ways meet that:

* one end draws the key and sends it to the other over their own channel: a third peer never
  receives those bytes, so under the threat model it learns nothing, but the key itself then
  crosses the wire in clear, readable by anyone who can watch that link (a shared network, a
  packet capture, an MPI or gloo transport's logs);
* a Diffie-Hellman exchange (what this module does): each end draws a 256-bit exponent a from the
  OS CSPRNG and sends only g^a mod p; both compute g^(ab) mod p. The key never crosses the wire;
  what crosses is public by design. Same one message each way, the same guarantee under the threat
  model, and it also holds against a passive eavesdropper of that link (computing g^(ab) from
  g^a and g^b is the Diffie-Hellman problem, believed hard in this group).

So DH: strictly more than the threat model asks, at no extra round. Neither resists an *active*
attacker who rewrites messages in flight (no authentication): that is outside an
honest-but-curious model.

Group: the 2048-bit MODP group 14 of RFC 3526 (a safe prime p, generator 2), with Python ints.
Key: SHA-256 of a domain tag, the two ranks (smaller first) and g^(ab) mod p (256 bytes, big-
endian): 32 bytes, a `seeds.Randomness` key for the pair's keystream.

Where the keys live: ``os`` randomness, in memory only (a resumed run agrees new ones); ``run_dir``,
in each end's own ``RUN_DIR/secrets/rank-K/pair-J.key`` (atomic, mode 0600), read back on resume so
the pair's noise continues bit for bit (a key missing then is refused, never made anew); ``public`` (dp_public_randomness, for tests): derived from
the seed, which every peer can recompute, as the name says.

Key confirmation: after every agreement (a fresh start or a resume) the two ends of each edge
exchange HMAC-SHA256(key, edge) (`key_confirmation`) and compare: a key changed or replaced at one
end (its noise would no longer cancel the other end's) is refused naming the edge. The HMAC is a
pseudo-random function of the key: it reveals nothing of the key or the noise to a reader.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Optional

import torch

from gossip_powersgd.utils import atomic_write

if TYPE_CHECKING:
    from ...comm.base import Comm

__all__ = [
    "MODP_2048",
    "GENERATOR",
    "agree_pair_keys",
    "dh_public",
    "dh_shared_key",
    "key_confirmation",
    "pair_key_path",
    "public_pair_key",
]

#: RFC 3526, section 3: the 2048-bit MODP group, p = 2^2048 - 2^1984 - 1 + 2^64 (floor(2^1918 pi)
#: + 124476), a safe prime ((p - 1) / 2 is prime; both checked by the tests).
MODP_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
GENERATOR = 2
_BYTES = 256
_DOMAIN = b"gossip_powersgd/decor-pair-key/v1\0"
_PUBLIC_DOMAIN = b"gossip_powersgd/decor-public-pair-key/v1\0"
_CONFIRM_DOMAIN = b"gossip_powersgd/decor-pair-key-confirmation/v1\0"


def dh_public(exponent: int) -> int:
    """g^a mod p."""
    return pow(GENERATOR, int(exponent), MODP_2048)


def dh_shared_key(exponent: int, their_public: int, i: int, j: int) -> bytes:
    """The pair key of edge {i, j} from this end's exponent and the other end's public value;
    refuses a public value outside [2, p - 2] (1 and p - 1 would force a known secret)."""
    if not 2 <= int(their_public) <= MODP_2048 - 2:
        raise ValueError(
            f"peer {j}'s Diffie-Hellman value is out of range: it is not running the "
            f"same version of the key agreement"
        )
    shared = pow(int(their_public), int(exponent), MODP_2048).to_bytes(_BYTES, "big")
    small, big = sorted((int(i), int(j)))
    return hashlib.sha256(
        _DOMAIN + small.to_bytes(8, "little") + big.to_bytes(8, "little") + shared
    ).digest()


def public_pair_key(seed: int, i: int, j: int) -> bytes:
    """A pair key everyone who knows the seed computes (dp_public_randomness: NOT secret)."""
    small, big = sorted((int(i), int(j)))
    return hashlib.sha256(
        _PUBLIC_DOMAIN + b"".join(int(v).to_bytes(8, "little") for v in (seed, small, big))
    ).digest()


def pair_key_path(run_dir, rank: int, other: int) -> Path:
    """``RUN_DIR/secrets/rank-K/pair-J.key``: peer K's copy of the key it shares with J, in K's
    own secrets folder (`seeds.secret_dir`)."""
    from gossip_powersgd.privacy.seeds import secret_dir

    return secret_dir(run_dir, rank) / f"pair-{int(other)}.key"


def _to_tensor(value: int) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(int(value).to_bytes(_BYTES, "big")), dtype=torch.uint8
    ).clone()


def key_confirmation(key: bytes, i: int, j: int) -> bytes:
    """HMAC-SHA256 of edge {i, j} under its pair key: what the two ends compare to know that they
    hold the same key. A pseudo-random function of the key, so it reveals nothing of it (nor of
    the pair's noise) to whoever reads it; per edge, so one edge's confirmation says nothing of
    another's."""
    small, big = sorted((int(i), int(j)))
    message = _CONFIRM_DOMAIN + small.to_bytes(8, "little") + big.to_bytes(8, "little")
    return hmac.new(bytes(key), message, hashlib.sha256).digest()


def _exchange(comm: Comm, neighbors, send: Dict[int, torch.Tensor], size: int):
    recv = {j: torch.zeros(size, dtype=torch.uint8) for j in neighbors}
    if neighbors:
        comm.exchange(send, recv)
    return recv


def _stored_keys(paths: Dict[int, Path], present) -> tuple:
    """({j: key} read from this end's files, problem or None); never raises (see the caller)."""
    keys, problem = {}, None
    for j in sorted(present):
        try:
            key = paths[j].read_bytes()
        except OSError as exc:
            key, problem = b"", problem or f"cannot read {paths[j]}: {exc.strerror or exc}"
        if len(key) != 32:
            problem = problem or f"the DECOR pair key file {paths[j]} is damaged"
        else:
            keys[j] = key
    return keys, problem


def _confirm_keys(comm: Comm, neighbors, keys: Dict[int, bytes], paths, problem) -> None:
    """Exchange each edge's `key_confirmation` and compare (collective over the edges; every peer
    takes part before anything is raised: `problem`, this end's own, first)."""
    me = comm.rank
    send = {
        j: torch.frombuffer(bytearray(key_confirmation(keys.get(j, b""), me, j)), dtype=torch.uint8)
        for j in neighbors
    }
    confirmations = _exchange(comm, neighbors, send, 32)
    if problem is not None:
        raise ValueError(problem)
    for j in neighbors:
        theirs = bytes(confirmations[j].numpy().tobytes())
        if not hmac.compare_digest(theirs, key_confirmation(keys[j], me, j)):
            small, big = sorted((me, j))
            where = (
                f" ({paths[j]} or its other end's copy was changed or replaced)" if paths else ""
            )
            raise ValueError(
                f"the two ends of edge {small}-{big} hold different DECOR pair keys{where}: "
                "their pair noise would not cancel; restore the run's secrets/ folder, or start "
                "a new run"
            )


def _store_keys(keys: Dict[int, bytes], paths: Dict[int, Path]) -> None:
    """Write each new key to this end's file (atomic, mode 0600, its folder 0700)."""
    for j, key in keys.items():
        path = paths[j]
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        atomic_write(path, key, mode=0o600)


def agree_pair_keys(
    comm: Comm,
    kind: str,
    *,
    seed: int = 0,
    run_dir: Optional[str] = None,
    resume: bool = False,
) -> Dict[int, bytes]:
    """{j: key shared with neighbour j} for every static neighbour: collective over the edges
    (two exchanges each way: the DH values, then each end's `key_confirmation`), so every peer
    calls it at the same point.

    ``run_dir``: keys already in this peer's run directory are reused (a resumed run; with
    `resume` every neighbour's must be there: a missing key is refused, never made anew, since a
    new key would not continue the pair's noise); new keys are written there on a fresh start.
    ``public``: no exchange, keys from the seed. Either way the two ends of every edge confirm that
    they hold the same key (a key changed or replaced at one end would make noise that no longer
    cancels): a ValueError names the edge. Every check's outcome is known only after both
    exchanges, so that no neighbour is left waiting for a message."""
    me, neighbors = comm.rank, tuple(comm.neighbors)
    if kind == "public":
        return {j: public_pair_key(seed, me, j) for j in neighbors}
    problem = None
    if kind == "run_dir":
        if run_dir is None:
            raise ValueError(
                "dp_secret: run_dir keeps the DECOR pair keys in the run directory: "
                "set out_dir, or use dp_secret: os"
            )
        paths = {j: pair_key_path(run_dir, me, j) for j in neighbors}
        present = {j for j, path in paths.items() if os.path.lexists(path)}
        missing = [paths[j] for j in neighbors if j not in present]
        if resume and missing:
            problem = (
                f"rank {me}: the DECOR pair key file {missing[0]} is missing: a resumed run "
                "continues each pair's noise with its stored key, which is not made anew "
                "(the pair's noise would no longer cancel the noise already sent); restore the "
                "run's secrets/ folder, or start a new run"
            )
    elif kind == "os":
        paths, present = {}, set()
    else:
        raise ValueError(f"pair keys come from os, run_dir or public randomness, got {kind!r}")
    # Byte 0 says whether this end holds a stored key for the edge: both ends must say the same
    # (both resume the stored key, or both agree a new one from the DH value in bytes 1..256).
    exponent = secrets.randbits(256) | (1 << 255)
    mine = dh_public(exponent)
    send = {
        j: torch.cat([torch.tensor([j in present], dtype=torch.uint8), _to_tensor(mine)])
        for j in neighbors
    }
    recv = _exchange(comm, neighbors, send, _BYTES + 1)
    odd = sorted(j for j in neighbors if bool(recv[j][0]) != (j in present))
    if odd and problem is None:
        problem = (
            f"rank {me}: the DECOR pair keys with neighbours {odd} are stored at one "
            f"end of the edge only: the pairs' noise cannot continue; restore the run's "
            "secrets/ folder, or start a new run directory"
        )
    keys, unreadable = _stored_keys(paths, present)
    problem = problem or unreadable
    for j in neighbors:
        if j not in present:
            theirs = int.from_bytes(bytes(recv[j][1:].numpy().tobytes()), "big")
            keys[j] = dh_shared_key(exponent, theirs, me, j)
    _confirm_keys(comm, neighbors, keys, paths, problem)
    if kind == "run_dir" and not resume:
        _store_keys({j: keys[j] for j in neighbors if j not in present}, paths)
    return keys
