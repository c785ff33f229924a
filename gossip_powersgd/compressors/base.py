"""The compressor interface (:class:`Compressor`), the identity and :func:`encoded_size`."""

from __future__ import annotations

import operator
from typing import Iterable, Optional

import torch
from torch import Tensor

from . import wire


class Compressor:
    """A compression operator C with a fixed-size byte payload.

    Subclasses implement :meth:`nbytes`, :meth:`_encode`, :meth:`_decode` and :meth:`__repr__`
    (which returns the spelling :func:`parse_compressor` accepts). The public :meth:`encode` and
    :meth:`decode` check the buffers, then delegate.

    A compressor is one of two kinds, which :meth:`variance_bound` tells apart:

    * *contractive* (biased): ``E‖C(x) − x‖² ≤ (1 − δ)‖x‖²`` for some δ > 0 — top-k, plain
      random-k, sign, low rank. ``variance_bound`` is None (the default for subclasses, which must
      then be contractive);
    * *unbiased*: ``E[C(x)] = x`` and ``E‖C(x)‖² ≤ (1 + ω)‖x‖²`` — identity (ω = 0), QSGD,
      rescaled random-k. ``variance_bound(numel)`` returns ω. Such a C need not be contractive
      (QSGD with few levels has ω ≫ 1), but ``C(x) / (1 + ω)`` is, with δ = 1 / (1 + ω)
      (Koloskova, Stich, Jaggi, ICML 2019, on unbiased quantizers): Choco-SGD and DeepSqueeze
      divide by :meth:`contraction_scale`.
    """

    name: str = ""

    def variance_bound(self, numel: int) -> Optional[float]:
        """ω of an unbiased compressor on a tensor of ``numel`` entries, None for a contractive one."""
        return None

    def contraction_scale(self, numel: int) -> float:
        """τ such that ``C(x) / τ`` is contractive: ``1 + ω`` if unbiased, 1 if already contractive."""
        omega = self.variance_bound(numel)
        return 1.0 if omega is None else 1.0 + float(omega)

    def nbytes(self, shape: torch.Size, dtype: torch.dtype) -> int:
        """Exact payload size in bytes for a tensor of ``shape`` and ``dtype``."""
        raise NotImplementedError

    def encode(self, x: Tensor, out: Tensor, key: int) -> None:
        """Write the payload of ``x`` into ``out`` (1-D uint8 of exactly ``nbytes`` bytes)."""
        self._check_buffer(out, x.shape, x.dtype, "out")
        self._encode(x, out, operator.index(key))

    def decode(self, payload: Tensor, out: Tensor, key: int) -> None:
        """Write C(x) into ``out`` (the original shape and dtype) from ``payload``."""
        self._check_buffer(payload, out.shape, out.dtype, "payload")
        key = operator.index(key)
        if out.is_contiguous():
            self._decode(payload, out, key)
        else:
            tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
            self._decode(payload, tmp, key)
            out.copy_(tmp)

    def compress(self, x: Tensor, key: int = 0) -> Tensor:
        """C(x): what a receiver decodes from ``encode(x, key)``, same shape and dtype as ``x``."""
        payload = torch.empty(self.nbytes(x.shape, x.dtype), dtype=torch.uint8, device=x.device)
        self.encode(x, payload, key)
        result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        self.decode(payload, result, key)
        return result

    # subclass hooks; ``out`` in _decode is contiguous
    def _encode(self, x: Tensor, out: Tensor, key: int) -> None:
        raise NotImplementedError

    def _decode(self, payload: Tensor, out: Tensor, key: int) -> None:
        raise NotImplementedError

    def _check_buffer(self, buf: Tensor, shape, dtype, what: str) -> None:
        expected = self.nbytes(shape, dtype)
        if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() != expected:
            raise ValueError(
                f"{self!r}: {what} must be a 1-D uint8 tensor of {expected} bytes for a "
                f"{tuple(shape)} {dtype} tensor, got {buf.dtype} of shape {tuple(buf.shape)}"
            )
        if not buf.is_contiguous():
            raise ValueError(f"{self!r}: {what} must be contiguous")

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash((type(self), repr(self)))


class Identity(Compressor):
    """No compression.

    Wire format: the tensor's raw bytes, ``numel * itemsize`` (row-major). Any dtype.
    """

    name = "identity"

    def variance_bound(self, numel: int) -> float:
        """Exact, hence unbiased with ω = 0."""
        return 0.0

    def nbytes(self, shape, dtype) -> int:
        return wire.numel(shape) * wire.itemsize(dtype)

    def _encode(self, x, out, key):
        wire.put(out, 0, x)

    def _decode(self, payload, out, key):
        values, _ = wire.get(payload, 0, out.dtype, out.numel())
        out.view(-1).copy_(values)


def encoded_size(compressor: Compressor, tensors: Iterable[Tensor]) -> int:
    """Total payload bytes to send ``tensors`` with ``compressor`` (the sum of their ``nbytes``)."""
    return sum(compressor.nbytes(t.shape, t.dtype) for t in tensors)
