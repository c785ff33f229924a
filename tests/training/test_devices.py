"""The device a peer's model is put on (training/devices.py): `resolve_device` for a config's
`device`, `model_device` for the GPU its torch transport moves tensors on. CUDA is mocked: the
properties are about which index is chosen or refused, not about a GPU."""

import pytest


def test_a_cuda_model_takes_the_gpu_its_torch_transport_moves_tensors_on(monkeypatch):
    """torchrun over 2 hosts of 4 GPUs with 2 processes each: rank 2 (LOCAL_RANK 0 of the second
    host) put its model on cuda:rank%count = cuda:2 while its transport moved tensors on cuda:0,
    which refused the model's tensors at the first gossip ("create it with device=cuda:2"). A
    transport with a GPU of its own now gives the model that GPU; without one (local, mpi), or on
    the CPU, the device is resolve_device's."""
    from types import SimpleNamespace

    import torch

    from gossip_powersgd.training.devices import model_device, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    torch_comm = SimpleNamespace(rank=2, device=torch.device("cuda", 0))
    member_comm = SimpleNamespace(rank=2, transport=torch_comm)  # on_peer_loss: continue's wrapper
    for comm in (torch_comm, member_comm):
        assert resolve_device("auto", comm.rank) == torch.device("cuda", 2)
        for spec in ("auto", "cuda"):
            assert model_device(spec, comm) == torch.device("cuda", 0)
        assert model_device("cpu", comm) == torch.device("cpu")
    assert model_device("auto", SimpleNamespace(rank=2)) == torch.device("cuda", 2)  # local, mpi
    gloo_cpu = SimpleNamespace(rank=2, device=torch.device("cpu"))
    assert model_device("cuda", gloo_cpu) == torch.device("cuda", 2)
    assert model_device("cuda:0", torch_comm) == torch.device("cuda", 0)
    with pytest.raises(ValueError) as info:  # the transport could not move it
        model_device("cuda:1", torch_comm)
    assert str(info.value) == (
        "bad value for 'device': 'cuda:1' (this process's transport moves tensors on its host's "
        "LOCAL_RANK-th GPU, cuda:0: set device cuda or auto)"
    )


def test_a_gpu_index_beyond_the_machines_gpus_is_refused_in_one_line(monkeypatch):
    """device cuda:3 on a machine of 1 GPU passed to torch, whose "invalid device ordinal" came
    at the model's first use, in several lines of CUDA's."""
    import torch

    from gossip_powersgd.training.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0", 2) == torch.device("cuda", 0)
    assert resolve_device("cuda", 2) == torch.device("cuda", 0)
    with pytest.raises(ValueError) as info:
        resolve_device("cuda:3", 0)
    assert str(info.value) == (
        "bad value for 'device': 'cuda:3' (this machine has 1 GPU(s), cuda:0 to cuda:0; or "
        "device cuda spreads the peers over them)"
    )
