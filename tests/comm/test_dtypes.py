"""Every transport carries the same dtypes, and refuses the same others with the same line.

`comm.dtypes.DTYPE_CODES` lists what travels (its code is in the MPI tag and the torch header); the
in-process transport could copy any tensor, MPI and torch only the listed ones (before, a complex or
uint16 message went through in-process and was a KeyError, an "internal error", on the others).
"""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.comm.base import REDUCE_OPS
from gossip_powersgd.comm.dtypes import DTYPE_CODES, dtype_code
from tests.comm.test_torch import SUPPORT, assert_bit_equal, run_torchrun
from tests.conftest import run_scenario_mpi

#: Whole-byte kinds that no transport carries (no copy kernel problem: they are refused by name).
REFUSED = [torch.bits8, torch.bits16]


def message(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Six elements of `dtype` made of bytes that differ by rank and position (any bit pattern: a
    float8 NaN travels as bytes like any other, a bool is a 0 or a 1)."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = (torch.arange(6 * size, dtype=torch.int64) * 37 + 11 * rank + 1) % 256
    if dtype == torch.bool:
        raw = raw % 2  # a bool is stored as 0 or 1: a copy would turn another byte into 1
    return raw.to(torch.uint8).view(dtype)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8).clone()


def every_dtype(comm):
    """Each listed dtype exchanged with the neighbours; each listed dtype all-reduced with each op
    ("reduced", or the refusal line); where torch can add it, all-reduced (sum), after the
    refusals; then each refused kind's error line, for the exchange and the all-reduce."""
    out = {"received": {}, "summed": {}, "refused": {}, "reduced": {}}
    for dtype in DTYPE_CODES:
        recv = {j: torch.empty(6, dtype=dtype) for j in comm.neighbors}
        comm.exchange({j: message(comm.rank, dtype) for j in comm.neighbors}, recv)
        out["received"][str(dtype)] = {j: as_bytes(t) for j, t in recv.items()}
        for op in REDUCE_OPS:
            try:
                comm.allreduce_(torch.zeros(6, dtype=dtype), op=op)
                out["reduced"][f"{dtype}/{op}"] = "reduced"
            except ValueError as exc:
                out["reduced"][f"{dtype}/{op}"] = str(exc)
    for dtype in (torch.float32, torch.complex64, torch.complex128, torch.int64, torch.bool):
        summed = comm.allreduce_(message(comm.rank, torch.uint8).to(dtype), op="sum")
        out["summed"][str(dtype)] = as_bytes(summed)
    for dtype in REFUSED:
        for name, call in (
            (
                "exchange",
                lambda: comm.exchange(
                    {j: torch.zeros(2, dtype=dtype) for j in comm.neighbors},
                    {j: torch.zeros(2, dtype=dtype) for j in comm.neighbors},
                ),
            ),
            ("allreduce", lambda: comm.allreduce_(torch.zeros(2, dtype=dtype), op="sum")),
        ):
            try:
                call()
                out["refused"][f"{dtype}/{name}"] = "accepted"
            except ValueError as exc:
                out["refused"][f"{dtype}/{name}"] = str(exc)
    comm.barrier()  # every rank still talks after the refusals: nothing was sent
    return out


@pytest.fixture(scope="module")
def local():
    return LocalCluster(topologies.ring(3)).run(every_dtype)


def test_every_listed_dtype_arrives_bit_for_bit_in_process(local):
    for rank, result in enumerate(local):
        for dtype in DTYPE_CODES:
            for j, got in result["received"][str(dtype)].items():
                assert torch.equal(got, as_bytes(message(j, dtype))), (rank, j, dtype)


def test_complex_and_unsigned_kinds_are_listed():
    names = {str(dtype).replace("torch.", "") for dtype in DTYPE_CODES}
    assert {"complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn"} <= names
    assert len(set(DTYPE_CODES.values())) == len(DTYPE_CODES) and max(DTYPE_CODES.values()) < 100


def test_an_unlisted_dtype_is_refused_in_one_line_naming_it(local):
    for result in local:
        for key, text in result["refused"].items():
            assert "\n" not in text and "supported: float32" in text, key
            assert f"dtype {key.split('/')[0]}, which no transport carries" in text, key
    with pytest.raises(ValueError, match=r"rank 5: the x has dtype torch.qint8, which no "):
        dtype_code(torch.qint8, 5, "the x")


def torch_reduces(dtype: torch.dtype, op: str) -> bool:
    """Whether torch has the ring's steps for `op` on six elements of `dtype` (asked directly, not
    through the transports' probe)."""
    a, b = torch.zeros(6, dtype=dtype), torch.ones(6, dtype=torch.uint8).to(dtype)
    steps = {
        "sum": lambda: a.add_(b),
        "mean": lambda: a.add_(b).div_(3),
        "max": lambda: torch.maximum(a, b, out=a),
        "min": lambda: torch.minimum(a, b, out=a),
    }
    try:
        steps[op]()
    except (RuntimeError, TypeError):  # NotImplementedError is a RuntimeError
        return False
    return True


def test_an_op_torch_cannot_apply_to_a_dtype_is_refused_in_one_line_before_sending(local):
    """uint16 or float8 travel but torch cannot add them, nor divide an integer for a mean, nor
    take a complex maximum: each is one line naming the dtype and the op, and the ring stays in
    step (the sums after the refusals are right); before, torch's own NotImplementedError came
    out of the middle of the ring."""
    refused = set()
    for rank, result in enumerate(local):
        for dtype in DTYPE_CODES:
            for op in REDUCE_OPS:
                text = result["reduced"][f"{dtype}/{op}"]
                if torch_reduces(dtype, op):
                    assert text == "reduced", (dtype, op, text)
                    continue
                refused.add((dtype, op))
                assert "\n" not in text and text.startswith(f"rank {rank}: "), text
                assert f"with op {op!r} cannot reduce dtype {dtype} " in text, text
        total = sum(message(k, torch.uint8).to(torch.int64) for k in range(3))
        assert torch.equal(result["summed"]["torch.int64"], as_bytes(total))
    assert {(torch.uint16, "sum"), (torch.int64, "mean"), (torch.complex64, "max")} <= refused


def launched(transport, tmp_path):
    scenario = "tests.comm.test_dtypes:every_dtype"
    if transport == "mpi":
        return run_scenario_mpi(3, scenario, "ring:3", tmp_path, timeout=120)
    result = run_torchrun(3, [SUPPORT / "torch_worker.py", scenario, "ring:3", tmp_path])
    assert result.returncode == 0, result.stderr[-3000:]
    return [torch.load(tmp_path / f"rank-{k}.pt", weights_only=True) for k in range(3)]


@pytest.mark.parametrize(
    "transport",
    [pytest.param("mpi", marks=pytest.mark.mpi), pytest.param("torch", marks=pytest.mark.torchrun)],
)
def test_every_transport_carries_and_refuses_the_same(transport, tmp_path, local):
    """The same bytes received, the same sums and the same refusal lines as in-process."""
    for rank, (a, b) in enumerate(zip(launched(transport, tmp_path), local)):
        assert_bit_equal(a, b, f"{transport} vs local, rank {rank}")
