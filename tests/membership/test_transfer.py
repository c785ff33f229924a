"""`membership.transfer`: who hands a joiner its state (its surviving neighbours, the lowest one in
copy mode, the lowest survivor when none is around), the average in float64 in id order with the
counters taken as they are, and the state as raw bytes with a checked layout."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip_powersgd.errors import CommunicationError
from gossip_powersgd.membership.transfer import _combine, pack_state, senders_of


def test_the_senders_are_the_surviving_neighbours_or_the_lowest_survivor():
    ring = topologies.repair(topologies.ring(8), [0, 1, 2, 3, 4, 5, 6, 7])  # peer 3 rejoins
    survivors = [0, 1, 2, 4, 5, 6, 7]
    assert senders_of(3, ring, survivors, "average") == (2, 4)
    assert senders_of(3, ring, survivors, "copy") == (2,)
    # 3 and its neighbours 2 and 4 join together: none of them survived, peer 0 hands the state
    assert senders_of(3, ring, [0, 1, 5, 6, 7], "average") == (0,)
    assert senders_of(3, ring, [5, 6, 7], "copy") == (5,)


def test_floating_state_is_averaged_in_float64_and_counters_are_the_first_senders():
    """Three senders' float32 tensors: the mean is the float64 sum in id order, divided, rounded
    once to float32 (bit for bit; summing in float32 rounds three times and differs in places,
    so the comparison can fail). The counter is the first sender's, not averaged."""
    g = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(1000, generator=g), "step": torch.tensor(7 + k)} for k in range(3)]
    out = _combine(states, [2, 4, 6])
    exact = (sum(s["w"].double() for s in states) / 3).float()
    in_float32 = sum(s["w"] for s in states) / 3
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"], exact)
    assert not torch.equal(exact, in_float32)
    assert out["step"].item() == 7
    states[1] = {"w": states[1]["w"]}  # a layout without the counter
    with pytest.raises(CommunicationError, match="peers 2 and 4 handed different state layouts"):
        _combine(states, [2, 4, 6])


def test_a_dtype_that_cannot_travel_is_refused_naming_the_tensor():
    with pytest.raises(ValueError, match="state 'z' has dtype torch.bits8"):
        pack_state({"z": torch.zeros(2, dtype=torch.bits8)})


def test_complex_state_travels_and_is_averaged_in_complex128():
    """A complex64 tensor (the transports carry it) comes back bit for bit and is averaged like a
    float one, real and imaginary parts each as the float64 mean rounded once, not copied from the
    first sender."""
    from gossip_powersgd.membership.transfer import unpack_state

    g = torch.Generator().manual_seed(1)
    states = [{"z": torch.randn(50, generator=g, dtype=torch.complex64)} for _ in range(3)]
    assert torch.equal(unpack_state(*pack_state(states[0]), source=2)["z"], states[0]["z"])
    out = _combine(states, [2, 4, 6])["z"]
    exact = (sum(s["z"].to(torch.complex128) for s in states) / 3).to(torch.complex64)
    assert out.dtype == torch.complex64 and torch.equal(out, exact)


def test_a_state_travels_as_raw_bytes_and_a_bad_layout_is_refused():
    from gossip_powersgd.comm.base import CommunicationError
    from gossip_powersgd.membership.transfer import unpack_state

    state = {
        "model.w": torch.randn(3, 4),
        "optimizer.0.step": torch.tensor(7.0),
        "run.step": torch.tensor(12, dtype=torch.int64),
        "half": torch.ones(5, dtype=torch.float16),
    }
    header, body = pack_state(state)
    assert body.dtype == torch.uint8 and int(header[1]) == 48 + 4 + 8 + 10
    back = unpack_state(header, body, source=2)
    assert list(back) == list(state) and all(torch.equal(back[k], state[k]) for k in state)
    short = header.clone()
    short[1] -= 4  # the data does not add up to the layout
    with pytest.raises(CommunicationError, match="peer 2 does not add up"):
        unpack_state(short, body, source=2)
    garbled = body.clone()
    garbled[0] = ord("{")  # not the JSON list of [name, shape, dtype] it should be
    with pytest.raises(CommunicationError, match="peer 2 has a bad layout"):
        unpack_state(header, garbled, source=2)
