"""training/batches.py: checkpointable batch iterators (shuffled mini-batches, a text's parallel
streams), each a pure function of its state."""

import pytest
import torch

from gossip_powersgd.training.batches import Batches, StreamBatches, stream_rows


def collect(batches, count):
    """The next `count` batches, crossing epoch boundaries."""
    out = []
    while len(out) < count:
        for xb, yb in batches:
            out.append((xb.clone(), yb.clone()))
            if len(out) == count:
                break
    return out


def test_batches_cover_each_epoch_once():
    x, y = torch.arange(23.0).unsqueeze(1), torch.arange(23)
    batches = Batches(x, y, batch_size=5, seed=0, rank=0)
    assert len(batches) == 5
    epoch = list(batches)
    assert [len(b[1]) for b in epoch] == [5, 5, 5, 5, 3]
    assert sorted(torch.cat([b[1] for b in epoch]).tolist()) == list(range(23))
    assert torch.equal(
        torch.cat([b[0] for b in epoch]).squeeze(1).long(), torch.cat([b[1] for b in epoch])
    )  # x and y stay paired
    assert batches.state_dict() == {"epoch": 1, "position": 0, "seed": 0}
    second = torch.cat([b[1] for b in batches])
    assert not torch.equal(second, torch.cat([b[1] for b in epoch]))  # reshuffled


def test_batches_resume_mid_epoch_reproduces_the_sequence():
    x, y = torch.randn(50, 3), torch.arange(50)
    reference = collect(Batches(x, y, 8, seed=11, rank=2), 20)  # 7 batches/epoch: ~3 epochs
    run = Batches(x, y, 8, seed=11, rank=2)
    first = collect(run, 10)  # stop mid-epoch 1
    state = run.state_dict()
    assert state == {"epoch": 1, "position": 3, "seed": 11}
    resumed = Batches(x, y, 8, seed=0, rank=2)
    resumed.load_state_dict(state)
    rest = collect(resumed, 10)
    for (xa, ya), (xb, yb) in zip(reference, first + rest):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_batches_differ_between_ranks_and_validate():
    x, y = torch.randn(40, 2), torch.arange(40)
    a = torch.cat([b[1] for b in Batches(x, y, 10, seed=0, rank=0)])
    b = torch.cat([b[1] for b in Batches(x, y, 10, seed=0, rank=1)])
    assert not torch.equal(a, b)
    with pytest.raises(ValueError):
        Batches(x, y, 0)
    with pytest.raises(ValueError):
        Batches(x, y[:5], 4)
    with pytest.raises(ValueError, match="invalid Batches state"):
        Batches(x, y, 10).load_state_dict({"epoch": 0, "position": 4, "seed": 0})


def test_stream_batches_continue_each_row_and_resume():

    x = torch.arange(11)[:, None].repeat(1, 3)  # 11 consecutive windows
    b = StreamBatches(x, x, batch_size=4)
    # streams of 3, 3, 3, 2 windows: [0..2], [3..5], [6..8], [9, 10]
    assert len(b) == 3
    steps = [xb[:, 0].tolist() for xb, _ in b]
    assert steps == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert [xb[:, 0].tolist() for xb, _ in b] == steps  # every pass the same, in text order
    it = iter(b)
    next(it)
    state = b.state_dict()
    again = StreamBatches(x, x, batch_size=4)
    again.load_state_dict(state)
    assert [xb[:, 0].tolist() for xb, _ in again] == steps[1:]
    assert len(StreamBatches(x[:2], x[:2], batch_size=4)) == 1  # fewer windows than streams


def test_a_transform_draws_from_its_own_stream_and_resumes():
    """The transform's generator is a pure function of (seed, rank, epoch, position): a batch's
    transform is the same after a resume, differs between ranks, and leaves the batch order alone."""
    x, y = torch.zeros(12, 2), torch.arange(12)

    def noise(xb, generator):
        return xb + torch.rand(xb.shape, generator=generator)

    def run(rank=0, state=None):
        batches = Batches(x, y, 4, seed=3, rank=rank)
        batches.transform = noise
        if state is not None:
            batches.load_state_dict(state)
        return [(xb, yb) for xb, yb in batches]

    whole = run()
    assert [yb.tolist() for _, yb in whole] == [
        yb.tolist() for _, yb in Batches(x, y, 4, seed=3, rank=0)
    ]  # the order is the untransformed one
    resumed = run(state={"epoch": 0, "position": 1, "seed": 3})
    assert all(torch.equal(a[0], b[0]) for a, b in zip(whole[1:], resumed))
    assert not torch.equal(whole[0][0], run(rank=1)[0][0])


def test_stream_rows_read_a_text_as_stream_batches_lay_it_out():
    """Evaluation's rows (7 windows as 3 streams of 3, 2, 2) are StreamBatches' steps."""
    assert [r.tolist() for r in stream_rows(7, 3)] == [[0, 3, 5], [1, 4, 6], [2]]
    layout = StreamBatches(torch.arange(7)[:, None], torch.arange(7), 3)
    assert [yb.tolist() for _, yb in layout] == [r.tolist() for r in stream_rows(7, 3)]


def test_stream_batches_hand_the_carriers_state_over_and_restart_it_each_pass():
    class Carrier:
        def __init__(self):
            self.state, self.resets = ["h0"], 0

        def reset_state(self):
            self.state, self.resets = [], self.resets + 1

        def get_state(self):
            return list(self.state)

        def set_state(self, state):
            self.state = list(state)

    carrier = Carrier()
    batches = StreamBatches(torch.zeros(6, 1), torch.zeros(6), 2, carrier=carrier)
    it = iter(batches)
    next(it)
    assert carrier.resets == 1  # a new pass starts from a zero state
    carrier.state = ["after step 0"]
    saved = batches.state_dict()
    assert saved == {"epoch": 0, "position": 1, "seed": 0, "hidden": ["after step 0"]}
    other = Carrier()
    again = StreamBatches(torch.zeros(6, 1), torch.zeros(6), 2, carrier=other)
    again.load_state_dict(saved)
    list(again)
    assert other.state == ["after step 0"] and other.resets == 0  # mid-pass: no reset


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Batches(torch.zeros(0, 1), torch.zeros(0), 2), "cannot batch an empty dataset"),
        (lambda: Batches(torch.zeros(3, 1), torch.zeros(3), 2, seed=-1), "seed and rank must be"),
        (lambda: StreamBatches(torch.zeros(3, 1), torch.zeros(3), 0), "batch_size must be >= 1"),
        (
            lambda: StreamBatches(torch.zeros(3, 1), torch.zeros(2), 2),
            "x has 3 samples but y has 2",
        ),
    ],
)
def test_bad_batches_are_refused_naming_the_problem(make, message):
    with pytest.raises(ValueError, match=message):
        make()
