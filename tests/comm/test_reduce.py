"""`comm.reduce`: the all-reduce's ops, the rank-order reduction of gathered control data, and the
refusal, before anything is sent, of an op torch cannot apply to a dtype (the transports' own
test of that refusal inside a ring: tests/comm/test_dtypes.py)."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd.comm.dtypes import DTYPE_CODES
from gossip_powersgd.comm.reduce import REDUCE_OPS, check_reducible, reduce_in_rank_order

FOLD = {"sum": torch.add, "mean": torch.add, "max": torch.maximum, "min": torch.minimum}


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_the_rank_order_reduction_is_the_left_fold_bit_for_bit(op):
    """Float addition is not associative: every peer gets the same bits only if each folds the
    gathered list in the same order, rank 0 first. The result equals that fold exactly (a mean:
    the fold divided by the count), and the inputs are left as they were."""
    g = torch.Generator().manual_seed(7)
    stacked = [torch.randn(50, generator=g, dtype=torch.float32) * 10**k for k in range(-3, 4)]
    before = [t.clone() for t in stacked]
    expected = stacked[0].clone()
    for t in stacked[1:]:
        expected = FOLD[op](expected, t)
    if op == "mean":
        expected = expected / len(stacked)
    assert torch.equal(reduce_in_rank_order(stacked, op), expected)
    assert all(torch.equal(a, b) for a, b in zip(stacked, before))


def _torch_applies(dtype: torch.dtype, op: str) -> bool:
    """Whether torch itself applies `op`'s steps (the fold and a mean's division) to `dtype`."""
    try:
        one = torch.zeros(2, dtype=dtype)
        out = FOLD[op](one, one)
        if op == "mean":
            out.div_(2)  # in place, as the ring divides its sum: no integer result type
    except (RuntimeError, TypeError):
        return False
    return True


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_a_dtype_is_refused_exactly_where_torch_cannot_reduce_it(op):
    """For every dtype that travels: refused in one line naming the rank, the op and the dtype
    where torch cannot apply the op (uint16 sums, integer means, complex maxima), accepted
    wherever it can."""
    for dtype in DTYPE_CODES:
        tensor = torch.zeros(3, dtype=dtype)
        if _torch_applies(dtype, op):
            check_reducible(tensor, op, rank=2)
            continue
        with pytest.raises(ValueError) as refused:
            check_reducible(tensor, op, rank=2)
        text = str(refused.value)
        assert "\n" not in text and text.startswith("rank 2: "), text
        assert f"with op {op!r} cannot reduce dtype {dtype} " in text, text


def test_an_unknown_op_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="unknown reduce op 'product'; valid: sum, mean, max, min"):
        check_reducible(torch.zeros(2), "product", rank=0)
