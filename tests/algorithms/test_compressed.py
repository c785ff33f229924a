"""algorithms/compressed.py: what Choco-SGD and DeepSqueeze share: their arguments, the keys and
payloads of their wire, their state."""

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.algorithms import ChocoGossip, DeepSqueeze
from gossip_powersgd.algorithms.compressed import (
    CompressedGossip,
    CompressedMessages,
    compressed_gossip_arguments,
    compressed_label,
    compression_keys,
    flat_state,
    require_tuned_gamma,
)
from gossip_powersgd.compressors import QSGD, Identity, TopK

SHAPES = [torch.Size([6, 4]), torch.Size([5]), torch.Size([2, 3, 2])]


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def test_messages_are_every_tensors_payload_back_to_back():
    compressor = TopK(0.5)
    messages = CompressedMessages(compressor, SHAPES, torch.float32, torch.device("cpu"), [2, 0], 7)
    sizes = [compressor.nbytes(s, torch.float32) for s in SHAPES]
    assert messages.offsets == [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    assert messages.nbytes == sum(sizes) == messages.send.numel()
    assert set(messages.recv) == {0, 2} and all(
        b.numel() == sum(sizes) for b in messages.recv.values()
    )
    assert messages.send_views[1].data_ptr() == messages.send[sizes[0] :].data_ptr()


def test_a_receiver_decodes_with_the_senders_keys_and_divides_by_tau():
    """What a receiver decodes from sender 3's payload of round 4 is C(x) / tau per tensor with
    sender 3's round-4 key (the reference: `Compressor.compress`), tau = 1 + omega for the unbiased
    QSGD; another round's keys give other bits (QSGD rounds at random)."""
    compressor = QSGD(2)
    sender = CompressedMessages(compressor, SHAPES, torch.float32, torch.device("cpu"), [0], 11)
    receiver = CompressedMessages(compressor, SHAPES, torch.float32, torch.device("cpu"), [3], 11)
    x = tensors()
    sender.encode(x, step=4, sender=3)
    receiver.recv[3].copy_(sender.send)
    outs = [torch.empty(s) for s in SHAPES]
    receiver.decode(receiver.recv_views[3], outs, step=4, sender=3)
    keys = compression_keys(11, 4, 3, len(SHAPES))
    for t, out, key in zip(x, outs, keys):
        tau = 1 + compressor.variance_bound(t.numel())
        assert tau > 1 and torch.equal(out, compressor.compress(t, key) / tau)
    sender.encode(x, step=5, sender=3)
    assert not torch.equal(sender.send, receiver.recv[3])


def test_a_contractive_compressor_is_not_rescaled():
    messages = CompressedMessages(Identity(), SHAPES, torch.float64, torch.device("cpu"), [], 0)
    assert messages.scales == [1.0, 1.0, 1.0]
    x = [t.double() for t in tensors()]
    messages.encode(x, step=0, sender=0)
    outs = [torch.empty(s, dtype=torch.float64) for s in SHAPES]
    messages.decode(messages.send_views, outs, step=0, sender=0)
    assert all(torch.equal(a, b) for a, b in zip(x, outs))


def test_flat_state_is_one_zero_buffer_viewed_as_each_tensor():
    flat, views = flat_state(tensors(), torch.float64, torch.device("cpu"))
    assert flat.dtype == torch.float64 and flat.numel() == 24 + 5 + 12 and not torch.any(flat)
    assert [v.shape for v in views] == SHAPES
    views[2].fill_(1.0)
    assert float(flat.sum()) == 12 and float(flat[29:].sum()) == 12


def test_gamma_and_compressor_are_required_with_a_spelling_to_copy():
    with pytest.raises(ValueError, match=r"needs a tuned consensus step gamma.*e\.g\. choco:x"):
        require_tuned_gamma(None, "ChocoGossip", "choco:x")
    for bad in (0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match=r"^ChocoGossip: gamma must be > 0, got"):
            require_tuned_gamma(bad, "ChocoGossip", "choco:x")
    for bad in (float("inf"), 1e39):  # float32 tensors cannot be multiplied by it
        with pytest.raises(ValueError, match=r"^ChocoGossip: gamma must be finite and at most"):
            require_tuned_gamma(bad, "ChocoGossip", "choco:x")
    assert require_tuned_gamma("0.25", "ChocoGossip", "choco:x") == 0.25
    with pytest.raises(
        ValueError,
        match=r"^DeepSqueeze needs a compressor, e\.g\. compressor='sign' "
        r"\(spelling: deepsqueeze:compressor=sign,gamma=0\.1\)$",
    ):
        compressed_gossip_arguments("DeepSqueeze", "deepsqueeze", "sign", None, 0.1, 0)
    with pytest.raises(ValueError, match=r"gamma.*e\.g\. deepsqueeze:compressor=topk:0\.1,gamma"):
        compressed_gossip_arguments("DeepSqueeze", "deepsqueeze", "sign", "topk:0.1", None, 0)
    compressor, gamma, seed = compressed_gossip_arguments("D", "d", "sign", "topk:0.1", 0.3, 4)
    assert (repr(compressor), gamma, seed) == ("topk:0.1", 0.3, 4)


def test_compressed_label_names_the_compressor():
    class Named:
        label = compressed_label("Choco")

    assert Named.label({"compressor": "topk:0.01"}) == "Choco topk 0.01"
    assert Named.label({}) == "Choco ?"


def test_state_of_another_size_or_without_a_buffer_is_refused_naming_the_key():
    def peer(comm):
        x = [torch.zeros(6, 4), torch.ones(5)]
        state = ChocoGossip(x, comm, compressor="sign", gamma=0.2).state_dict()
        smaller = ChocoGossip([torch.zeros(6, 4)], comm, compressor="sign", gamma=0.2)
        with pytest.raises(
            ValueError, match=r"^ChocoGossip state 'x_hat' has 29 entries, expected 24"
        ):
            smaller.load_state_dict(state)
        del state["s"]
        with pytest.raises(ValueError, match=r"^ChocoGossip state has no 's'$"):
            ChocoGossip(x, comm, compressor="sign", gamma=0.2).load_state_dict(state)
        return True

    assert all(LocalCluster(topologies.ring(3)).run(peer))


def test_compressed_gossip_owns_wire_and_state_for_both_algorithms():
    def peer(comm):
        out = {}
        for cls, keys in ((ChocoGossip, ["x_hat", "s"]), (DeepSqueeze, ["error"])):
            x = [torch.full((6, 4), float(comm.rank)), torch.ones(5)]
            algorithm = cls(x, comm, compressor="topk:0.5", gamma=0.2)
            assert isinstance(algorithm, CompressedGossip)
            algorithm.step()
            state = algorithm.state_dict()
            assert list(state) == ["steps", "gamma", "seed", "compressor"] + keys
            fresh = cls([t.clone() for t in x], comm, compressor="topk:0.5", gamma=0.2)
            fresh.load_state_dict(state)
            assert fresh.steps == 1
            assert all(
                torch.equal(a, b)
                for a, b in zip(fresh.state_buffers().values(), algorithm.state_buffers().values())
            )
            other = cls([t.clone() for t in x], comm, compressor="sign", gamma=0.2)
            with pytest.raises(
                ValueError, match=f"^{cls.__name__} state is for compressor=topk:0.5"
            ):
                other.load_state_dict(state)
            out[cls.__name__] = (algorithm.payload_bytes, algorithm.bytes_per_step())
        return out

    for result in LocalCluster(topologies.ring(3)).run(peer):
        # topk:0.5 keeps 12 of 24 and 2 of 5 (round half to even) entries: float32 value + int32 index
        assert result == {"ChocoGossip": (112, 224), "DeepSqueeze": (112, 224)}


def test_keys_depend_on_seed_step_sender_and_tensor():
    keys = compression_keys(0, 3, 1, 4)
    assert keys == compression_keys(0, 3, 1, 4) and len(set(keys)) == 4
    assert all(0 <= k < 2**63 for k in keys)
    assert keys != compression_keys(0, 4, 1, 4) and keys != compression_keys(0, 3, 2, 4)
    assert keys != compression_keys(1, 3, 1, 4)
    assert compression_keys(0, 3, 1, 2) == keys[:2]


def test_the_layout_decodes_a_payload_from_the_saved_meta_alone_as_the_receiver_does():
    """An observer rebuilds the decoder from the view's meta (compressor, seed, shapes): the parts
    are the receiver's decoded tensors (QSGD: random rounding by the sender's key, and 1/tau)."""

    def peer(comm):
        x = [t.clone() for t in tensors(comm.rank)]
        choco = ChocoGossip(x, comm, compressor="qsgd:2", gamma=0.2, seed=9)
        layout = type(choco).layout.of(choco)
        assert layout.fields == {"compressor": "qsgd:2", "seed": 9}
        choco._messages.encode(x, step=3, sender=comm.rank)
        outs = [torch.empty(s) for s in SHAPES]
        choco._messages.decode(choco._messages.send_views, outs, step=3, sender=comm.rank)
        message = {"tensor": choco._messages.send.clone(), "step": 3, "sender": comm.rank}
        fresh = type(layout)(layout.meta)  # from the saved meta alone
        (part,) = fresh.decode(message)
        return part.kind, part.indices, all(torch.equal(a, b) for a, b in zip(part.values, outs))

    for result in LocalCluster(topologies.ring(3), cooperative=False).run(peer):
        assert result == ("increment", [0, 1, 2], True)
