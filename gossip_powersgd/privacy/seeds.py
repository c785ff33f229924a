"""A peer's DP randomness: a keyed keystream for its Gaussian noise and its Poisson masks.

Threat model: a neighbour knows the whole config (the seed too), the code, the initial model and
every byte it receives. Randomness derived from the shared seed is therefore public: the neighbour
regenerates the noise and subtracts it (epsilon = infinity against it), or knows which records
were in each batch (no amplification by subsampling). So every peer draws both from a keystream
keyed by a secret of its own (`Randomness`):

* ``Randomness.os_entropy()``: a fresh 256-bit key from the OS CSPRNG (`secrets`), held in memory
  only (the default, ``dp_secret: os``). Nothing on disk lets anyone, the peer included, replay it;
  a resumed run draws a new key, so the steps it takes again after its checkpoint, already sent
  with the old key's noise, are sent again with independent noise: its accountant counts them
  again (`releases`), and its epsilon is above an uninterrupted run's.
* ``Randomness.run_dir_key(run_dir, rank)``: the same kind of key, generated on the peer when the
  run starts and kept only in the peer's own folder ``RUN_DIR/secrets/rank-K/`` (mode 0700; the
  key file ``key`` written atomically, mode 0600) and in each of its checkpoints, so that
  ``--resume`` draws the same noise (``dp_secret: run_dir``, for reproducible research; a step
  taken again is sent only if bit for bit what was sent before: `releases`). It is
  never derived from the config, never sent, never printed. It is secret only while that folder
  and the peer's checkpoints are: whoever reads them regenerates the peer's noise and removes it.
  A run directory shared by every peer (all ranks on one machine, a shared file system) therefore
  shares every peer's noise with every peer: the trainer says so, loudly, when such a run starts.
* ``Randomness.public(seed, rank)``: a key every peer can compute from the config
  (``dp_public_randomness: true``), for exact-reproducibility tests only: the epsilon then holds
  against outsiders who do not know the config, not against the peers.

The keystream of a label (stream tag, counters) is ChaCha20 (RFC 8439; the cipher of the Linux
kernel's random generator) keyed by SHAKE-256 (FIPS 202) of the key followed by the label in a
fixed width: each label gets its own 256-bit key, a pseudorandom function of the label for
whoever does not hold the peer's key, and its keystream is ChaCha20's from block 0. The stream is
counter based, so the draw of (noise, step t) or (mask, epoch e, position p) needs no generator
state beyond the key: resuming needs only the key and the counters the checkpoint already holds.
Uniforms take 53 bits of 8 keystream bytes each; Gaussians come from them by Box-Muller in
float64 (see `Randomness.normals`). ChaCha20 comes from the `cryptography` package (OpenSSL's):
its keystream for 10^5 uniforms takes about 0.25 ms on one core, SHAKE-256's (this module's
keystream before) about 2 ms; the conversion to uniforms and Box-Muller add about 0.5 ms per
10^5 Gaussians.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import secrets
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from gossip_powersgd.utils import atomic_write

__all__ = [
    "Randomness",
    "RANDOMNESS_KINDS",
    "NOISE_STREAM",
    "SAMPLER_STREAM",
    "derive_seed",
    "key_path",
    "make_randomness",
    "make_secret_dir",
    "secret_dir",
]

#: Tags that keep the sampler's and the noise's streams apart for the same key.
SAMPLER_STREAM = 0x5A3B1E
NOISE_STREAM = 0x9015E

#: Where a peer's randomness comes from: "os" (fresh OS entropy), "run_dir" (a key in the peer's
#: own run directory and checkpoint), "public" (derived from the shared seed: not secret).
RANDOMNESS_KINDS = ("os", "run_dir", "public")

_KEY_BYTES = 32
_DOMAIN = b"gossip_powersgd/dp-randomness/v2\0"  # v1: a SHAKE-256 keystream
#: ChaCha20 counts 64-byte blocks in 32 bits: one label's keystream is at most this long.
_MAX_BYTES = 64 << 32
_PUBLIC_DOMAIN = b"gossip_powersgd/dp-public-key/v1\0"


@functools.lru_cache(maxsize=None)
def _chacha20():
    """(Cipher, ChaCha20) of the `cryptography` package; one-line ImportError if missing."""
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    except ModuleNotFoundError:
        raise ImportError(
            "differential privacy needs the cryptography package (its keystream "
            "is ChaCha20): pip install 'gossip_powersgd[privacy]'"
        ) from None
    return Cipher, algorithms.ChaCha20


def derive_seed(seed: int, rank: int, stream: int, *counters: int) -> int:
    """A 64-bit seed from (seed, rank, stream, counters...): public, whoever knows the seed.

    SeedSequence hashes the whole tuple, so nearby inputs (rank 1 vs 2, step 9 vs 10) give
    unrelated seeds, which a plain ``seed + rank`` would not. Not for DP noise or masks (see the
    module docstring); kept for what is meant to be public.
    """
    values = [int(seed), int(rank), int(stream), *(int(c) for c in counters)]
    if any(v < 0 for v in values):
        raise ValueError(f"seed, rank and counters must be non-negative, got {values}")
    return int(np.random.SeedSequence(values).generate_state(1, np.uint64)[0])


def secret_dir(run_dir, rank: int) -> Path:
    """Peer `rank`'s own folder of secrets: ``RUN_DIR/secrets/rank-K`` (created mode 0700)."""
    return Path(run_dir) / "secrets" / f"rank-{int(rank)}"


def make_secret_dir(run_dir, rank: int) -> Path:
    """`secret_dir`, created if missing, it and ``RUN_DIR/secrets`` with mode 0700."""
    folder = secret_dir(run_dir, rank)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (folder.parent, folder):
        os.chmod(path, 0o700)
    return folder


def key_path(run_dir, rank: int) -> Path:
    """Peer `rank`'s secret key file: ``RUN_DIR/secrets/rank-K/key``."""
    return secret_dir(run_dir, rank) / "key"


def _label(stream: int, counters) -> bytes:
    values = [int(stream), *(int(c) for c in counters)]
    if any(v < 0 or v >= 2**64 for v in values):
        raise ValueError(f"stream and counters must lie in [0, 2**64), got {values}")
    # Fixed width and a count first: no two labels share an encoding.
    return len(values).to_bytes(8, "little") + b"".join(v.to_bytes(8, "little") for v in values)


class Randomness:
    """A peer's keyed keystream (see the module docstring). The key is never shown by ``repr``."""

    def __init__(self, key: bytes, kind: str):
        if kind not in RANDOMNESS_KINDS:
            raise ValueError(
                f"randomness kind must be one of {', '.join(RANDOMNESS_KINDS)}, got {kind!r}"
            )
        if not isinstance(key, (bytes, bytearray)) or len(key) != _KEY_BYTES:
            raise ValueError(f"a DP randomness key is {_KEY_BYTES} bytes")
        self._key = bytes(key)
        self.kind = kind

    # ---- where the key comes from ---------------------------------------------------------------

    @classmethod
    def os_entropy(cls) -> "Randomness":
        """A fresh key from the OS CSPRNG, in memory only."""
        return cls(secrets.token_bytes(_KEY_BYTES), "os")

    @classmethod
    def public(cls, seed: int, rank: int) -> "Randomness":
        """A key anyone who knows (seed, rank) computes: NOT secret from the other peers."""
        material = _PUBLIC_DOMAIN + _label(int(seed), [int(rank)])
        return cls(hashlib.sha256(material).digest(), "public")

    @classmethod
    def run_dir_key(cls, run_dir, rank: int) -> "Randomness":
        """The key of `rank` in `run_dir`: read it if the file exists (a resumed run), else generate
        it from OS entropy and write it (atomically, mode 0600, in the peer's own folder, 0700)."""
        path = key_path(run_dir, rank)
        if path.exists():
            key = path.read_bytes()
            if len(key) != _KEY_BYTES:
                raise ValueError(
                    f"the DP key file {path} is damaged ({len(key)} bytes, expected "
                    f"{_KEY_BYTES}); a run cannot continue its noise without it"
                )
            return cls(key, "run_dir")
        key = secrets.token_bytes(_KEY_BYTES)
        make_secret_dir(run_dir, rank)
        atomic_write(path, key, mode=0o600)
        return cls(key, "run_dir")

    def rekey(self) -> None:
        """A fresh key from the OS CSPRNG in place of this one, same kind: whatever holds this
        `Randomness` (the noise, the Poisson masks) draws from the new key from now on, and a
        ``run_dir`` checkpoint keeps it (`releases`: a replay that differs from what was sent)."""
        self._key = secrets.token_bytes(_KEY_BYTES)

    def fingerprint(self) -> str:
        """16 hex digits that tell keys apart (a hash of the key: it reveals nothing of it)."""
        return hashlib.sha256(_DOMAIN + b"fingerprint\0" + self._key).hexdigest()[:16]

    # ---- draws ------------------------------------------------------------------------------

    def _bytes(self, stream: int, counters, count: int) -> bytes:
        """``count`` keystream bytes of the label: ChaCha20 under the label's own key."""
        if count > _MAX_BYTES:
            raise ValueError(f"one draw of DP randomness is at most {_MAX_BYTES // 8} numbers")
        label_key = hashlib.shake_256(_DOMAIN + self._key + _label(stream, counters)).digest(32)
        cipher, chacha20 = _chacha20()
        # nonce = 32-bit block counter 0, then 96 zero bits: each label key makes one stream
        return cipher(chacha20(label_key, bytes(16)), None).encryptor().update(bytes(count))

    def uniforms(self, stream: int, *counters: int, n: int) -> torch.Tensor:
        """`n` float64 uniforms in (0, 1) of the label (stream, counters): (k + 0.5) / 2^53 for
        53 keystream bits k each, so neither 0 nor 1 occurs."""
        if n == 0:
            return torch.zeros(0, dtype=torch.float64)
        words = np.frombuffer(self._bytes(stream, counters, 8 * n), dtype="<u8")
        values = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        return torch.from_numpy(values)

    def normals(self, stream: int, *counters: int, n: int) -> torch.Tensor:
        """`n` standard Gaussians (float64) of the label, by Box-Muller on `uniforms`.

        Float64 matters: the floating-point attack on DP noise (Mironov 2012; Jin et al. 2021)
        reads the gaps between representable noise values off the released result. Here the
        noise's gaps are float64's (relative 2^-52, away from the far tails the 53-bit uniforms
        reach, about 8.6 sigma) and the released gradient is float32 (2^-23), so every
        float32 result near a value is reachable from noise near it.
        """
        pairs = (n + 1) // 2
        u = self.uniforms(stream, *counters, n=2 * pairs)
        radius = torch.sqrt(-2.0 * torch.log(u[:pairs]))
        angle = (2.0 * math.pi) * u[pairs:]
        return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]

    # ---- checkpoint -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the kind, and the key only when it is meant to be replayed
        (``run_dir``; ``public`` needs none, ``os`` is never written anywhere)."""
        state = {"kind": self.kind}
        if self.kind == "run_dir":
            state["key"] = torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue a checkpoint's stream (``run_dir``: its key); the kinds must match."""
        kind = state.get("kind") if isinstance(state, dict) else None
        if kind != self.kind:
            raise ValueError(
                f"the checkpoint's DP randomness is {kind!r} but this run's is "
                f"{self.kind!r}: resume with the dp_secret / dp_public_randomness "
                f"the run was started with"
            )
        if kind == "run_dir":
            key = state.get("key")
            if not isinstance(key, torch.Tensor) or key.numel() != _KEY_BYTES:
                raise ValueError("the checkpoint's DP key is missing or damaged")
            self._key = bytes(key.to(torch.uint8).numpy().tobytes())

    def __repr__(self) -> str:
        return f"Randomness(kind={self.kind!r}, key=<secret>)"

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Randomness)
            and other.kind == self.kind
            and secrets.compare_digest(other._key, self._key)
        )

    __hash__ = None


def make_randomness(
    kind: str, *, seed: int, rank: int, run_dir: Optional[str] = None
) -> Randomness:
    """The `Randomness` of `kind` for peer `rank` (see `RANDOMNESS_KINDS`)."""
    if kind == "public":
        return Randomness.public(seed, rank)
    if kind == "run_dir":
        if run_dir is None:
            raise ValueError(
                "dp_secret: run_dir keeps each peer's key in its run directory: set "
                "out_dir, or use dp_secret: os"
            )
        return Randomness.run_dir_key(run_dir, rank)
    if kind == "os":
        return Randomness.os_entropy()
    raise ValueError(f"randomness kind must be one of {', '.join(RANDOMNESS_KINDS)}, got {kind!r}")
