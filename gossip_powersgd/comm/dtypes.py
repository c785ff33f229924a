"""The dtypes a message may have, and the code each travels with.

Message tags (MPI) and headers (torch.distributed) carry a dtype's code so that a receiver can reject
a message of the wrong dtype even though only raw bytes travel. Every transport carries exactly the
dtypes listed here and refuses any other before anything is sent (`dtype_code`), with the same line:
the in-process transport, which could copy any tensor, must not accept what MPI and torch cannot.
Codes stay below 100: an MPI all-reduce tag adds 100 x the op to its dtype's code.
"""

from __future__ import annotations

import torch

# Plain data: whole bytes per element that any transport copies as they are (gloo and MPI move
# them as bytes). Not listed: quantized tensors (their scale is not in the data), complex32
# (experimental in torch), the sub-byte and bits kinds (no copy kernel, or no element to speak of).
# Codes 1-10 predate the others: keep them.
_NAMES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex64",
    "complex128",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)

#: dtype -> its code, for the dtypes this torch has (torch>=2.1 lacks the newest float8 kinds).
DTYPE_CODES = {
    getattr(torch, name): code
    for code, name in enumerate(_NAMES, start=1)
    if isinstance(getattr(torch, name, None), torch.dtype)
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def supported_dtypes() -> str:
    return ", ".join(str(dtype).replace("torch.", "") for dtype in DTYPE_CODES)


def dtype_code(dtype: torch.dtype, rank: int, what: str) -> int:
    """`dtype`'s code, or a one-line ValueError naming it and the dtypes that travel."""
    code = DTYPE_CODES.get(dtype)
    if code is None:
        raise ValueError(
            f"rank {rank}: {what} has dtype {dtype}, which no transport carries "
            f"(supported: {supported_dtypes()}): convert it, e.g. with .to(torch.float32)"
        )
    return code
