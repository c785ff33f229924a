"""Compression operators C(x) with fixed-size wire formats, for Choco-SGD and DeepSqueeze.

The transport moves raw bytes into receive buffers that are allocated before any message arrives,
so every compressor states the exact payload size from the tensor's shape and dtype alone
(:meth:`Compressor.nbytes`) and never varies it with the data.

Conventions shared by every wire format below:

* Multi-byte fields are written in the machine's native byte order (little-endian on every platform
  torch supports), as the raw bytes of a contiguous tensor. Fields follow each other without
  padding; a field may therefore start at any byte offset, and readers copy rather than assume
  alignment. This also lets a caller pack several payloads back to back in one message buffer.
* Values, scales and norms are stored in the input tensor's dtype, except QSGD's norm of a 16-bit
  tensor (float32: it can exceed float16's range); indices as int32.
* Bit-packed fields are little-endian at the bit level: entry ``i`` of width ``b`` occupies the
  global bit positions ``i*b .. i*b+b-1`` (its least significant bit first), and global bit ``p``
  is bit ``p % 8`` of byte ``p // 8`` (numpy's ``packbits(bitorder="little")``). Unused bits of the
  last byte are zero.
* ``key`` is an integer both ends know (taken modulo 2**64). Anything random is drawn from
  ``torch.Generator(device="cpu").manual_seed(key)`` on the CPU, so CPU and GPU peers agree and the
  sender can compute exactly what its receivers decode. Same input and key give identical bytes.
* ``payload`` and ``out`` may live on a different device than the tensor (e.g. a CPU send buffer
  for a GPU parameter).

Public names: :class:`Compressor`, :class:`Identity`, :class:`TopK`, :class:`RandomK`,
:class:`SignNorm`, :class:`QSGD`, :class:`LowRank`, :func:`parse_compressor`,
:func:`encoded_size`. One module per job: ``base`` (the interface, the identity), a module per
family (``sparse``: top-k and random-k; ``quantized``: sign and QSGD; ``lowrank``), ``wire`` (the
byte and bit fields every format is written with) and ``spec`` (the CLI spelling).
"""

from .base import Compressor, Identity, encoded_size
from .lowrank import LowRank
from .quantized import QSGD, SignNorm
from .sparse import RandomK, TopK
from .spec import parse_compressor

__all__ = [
    "Compressor",
    "Identity",
    "TopK",
    "RandomK",
    "SignNorm",
    "QSGD",
    "LowRank",
    "parse_compressor",
    "encoded_size",
]
