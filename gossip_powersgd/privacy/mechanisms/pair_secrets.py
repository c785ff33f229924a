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
in each end's own ``RUN_DIR/secrets/rank-K.pair-J.key`` (atomic, mode 0600), read back on resume so
the pair's noise continues bit for bit; ``public`` (dp_public_randomness, for tests): derived from
the seed, which every peer can recompute, as the name says.
"""

from __future__ import annotations

import hashlib
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
    """``RUN_DIR/secrets/rank-K.pair-J.key``: peer K's copy of the key it shares with J."""
    return Path(run_dir) / "secrets" / f"rank-{int(rank)}.pair-{int(other)}.key"


def _to_tensor(value: int) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(int(value).to_bytes(_BYTES, "big")), dtype=torch.uint8
    ).clone()


def agree_pair_keys(
    comm: Comm, kind: str, *, seed: int = 0, run_dir: Optional[str] = None
) -> Dict[int, bytes]:
    """{j: key shared with neighbour j} for every static neighbour: collective over the edges
    (one exchange of 256 raw bytes each way), so every peer calls it at the same point.

    ``run_dir``: keys already in this peer's run directory are reused (a resumed run; then every
    neighbour's must be there, else the run cannot continue the pairs' noise); new keys are written
    there. ``public``: no exchange, keys from the seed."""
    me, neighbors = comm.rank, tuple(comm.neighbors)
    if kind == "public":
        return {j: public_pair_key(seed, me, j) for j in neighbors}
    if kind == "run_dir":
        if run_dir is None:
            raise ValueError(
                "dp_secret: run_dir keeps the DECOR pair keys in the run directory: "
                "set out_dir, or use dp_secret: os"
            )
        paths = {j: pair_key_path(run_dir, me, j) for j in neighbors}
        present = {j for j, path in paths.items() if path.exists()}
    elif kind == "os":
        paths, present = {}, set()
    else:
        raise ValueError(f"pair keys come from os, run_dir or public randomness, got {kind!r}")
    # Every peer takes part in the exchange, resumed or not, so that no neighbour waits forever.
    # Byte 0 says whether this end holds a stored key for the edge: both ends must say the same
    # (both resume the stored key, or both agree a new one from the DH value in bytes 1..256).
    exponent = secrets.randbits(256) | (1 << 255)
    mine = dh_public(exponent)
    send = {
        j: torch.cat([torch.tensor([j in present], dtype=torch.uint8), _to_tensor(mine)])
        for j in neighbors
    }
    recv = {j: torch.zeros(_BYTES + 1, dtype=torch.uint8) for j in neighbors}
    if neighbors:
        comm.exchange(send, recv)
    odd = sorted(j for j in neighbors if bool(recv[j][0]) != (j in present))
    if odd:
        raise ValueError(
            f"rank {me}: the DECOR pair keys with neighbours {odd} are stored at one "
            f"end of the edge only: the pairs' noise cannot continue; start a new "
            f"run directory"
        )
    keys: Dict[int, bytes] = {}
    if present:
        for j in present:
            key = paths[j].read_bytes()
            if len(key) != 32:
                raise ValueError(f"the DECOR pair key file {paths[j]} is damaged")
            keys[j] = key
    for j in neighbors:
        if j in present:
            continue
        theirs = int.from_bytes(bytes(recv[j][1:].numpy().tobytes()), "big")
        keys[j] = dh_shared_key(exponent, theirs, me, j)
        if kind == "run_dir":
            path = paths[j]
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path.parent, 0o700)
            atomic_write(path, keys[j], mode=0o600)
    return keys
