"""Datasets from local files (CIFAR-10 binary, WikiText-2 tokens) and the per-peer pipeline."""

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gossip_powersgd.training.batches import Batches
from gossip_powersgd.training.data import clear_dataset_cache, load_dataset, peer_shard
from gossip_powersgd.training.records import CIFAR10_MEAN, CIFAR10_STD, cifar_augment

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "support"))
import paper_fixtures  # noqa: E402

from tests.conftest import ROOT, run_bounded, run_mpi  # noqa: E402


@pytest.fixture
def cifar_root(tmp_path):
    paper_fixtures.write_cifar10(tmp_path)
    clear_dataset_cache()
    yield tmp_path
    clear_dataset_cache()


def normalised(records):
    """The closed form: (pixel / 255 - mean) / std per channel, channel-major 3 x 32 x 32."""
    x = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float64) / 255
    return (x - np.array(CIFAR10_MEAN)[:, None, None]) / np.array(CIFAR10_STD)[:, None, None]


def test_cifar10_reads_the_binary_format(cifar_root):
    data = load_dataset(f"cifar10:root={cifar_root}")
    assert data.num_train == 40 and data.num_test == 10 and data.input_shape == (3, 32, 32)
    test = paper_fixtures.cifar_records(10, 0)
    assert torch.equal(data.y_test, torch.from_numpy(test[:, 0].astype(np.int64)))
    # float32 rounding of values of size <= 2.1: 1e-6 covers a few ulps
    assert np.allclose(data.x_test.numpy(), normalised(test), atol=1e-6)
    # records 8..15 are data_batch_2's; 39 is the last of data_batch_5
    x, y = data.read_train(np.array([9, 39, 0]))
    batch2, batch5 = paper_fixtures.cifar_records(8, 2), paper_fixtures.cifar_records(8, 5)
    assert x.dtype == torch.uint8 and y.tolist() == [
        batch2[1, 0],
        batch5[7, 0],
        paper_fixtures.cifar_records(8, 1)[0, 0],
    ]
    assert np.array_equal(x[0].numpy().reshape(-1), batch2[1, 1:])
    # the root may also be the folder itself
    assert load_dataset(f"cifar10:root={cifar_root}/cifar-10-batches-bin").num_train == 40


def test_cifar10_missing_and_truncated_files(cifar_root):
    folder = cifar_root / "cifar-10-batches-bin"
    (folder / "data_batch_3.bin").unlink()
    with pytest.raises(
        ValueError, match="data_batch_3.bin does not exist.*cifar-10-batches-bin"
    ) as info:
        load_dataset(f"cifar10:root={cifar_root}")
    assert "\n" not in str(info.value)
    (folder / "data_batch_3.bin").write_bytes(b"\0" * 3074)
    with pytest.raises(ValueError, match="not a whole number of 3073-byte"):
        load_dataset(f"cifar10:root={cifar_root}")
    for spec, match in (
        ("cifar10", "needs the folder"),
        (f"cifar10:root={cifar_root},x=1", "unknown option 'x'"),
    ):
        with pytest.raises(ValueError, match=match):
            load_dataset(spec)


def test_augmentation_is_a_padded_crop_and_flip():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    out = cifar_augment(x, torch.Generator().manual_seed(5))
    again = cifar_augment(x, torch.Generator().manual_seed(5))
    assert torch.equal(out, again)
    g = torch.Generator().manual_seed(5)  # the same draws, in the same order
    dy, dx = torch.randint(0, 9, (16,), generator=g), torch.randint(0, 9, (16,), generator=g)
    flips = torch.rand(16, generator=g) < 0.5
    padded = torch.nn.functional.pad(x.double() / 255, (4, 4, 4, 4))
    mean = torch.tensor(CIFAR10_MEAN, dtype=torch.float64)[:, None, None]
    std = torch.tensor(CIFAR10_STD, dtype=torch.float64)[:, None, None]
    for i in range(16):
        crop = padded[i, :, dy[i] : dy[i] + 32, dx[i] : dx[i] + 32]
        crop = crop.flip(-1) if flips[i] else crop
        assert torch.allclose(out[i].double(), (crop - mean) / std, atol=1e-5)  # float32 ulps
    assert 0 < int(flips.sum()) < 16 and len(set(dy.tolist())) > 1


def test_batches_transform_is_reproducible_and_resumes(cifar_root):
    data = load_dataset(f"cifar10:root={cifar_root}")
    x, y = peer_shard(data, 1, 2, "iid", 0)

    def batches():
        b = Batches(x, y, batch_size=6, seed=0, rank=1)
        b.transform = data.train_transform
        return b

    first = batches()
    it = iter(first)
    next(it)
    state = first.state_dict()
    rest = [xb for xb, _ in it]
    resumed = batches()
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, (b, _) in zip(rest, resumed, strict=True))
    other_rank = Batches(x, y, batch_size=6, seed=0, rank=0)
    other_rank.transform = data.train_transform
    assert not torch.equal(next(iter(other_rank))[0], next(iter(batches()))[0])


def test_wikitext2_vocabulary_and_windows(tmp_path):
    paper_fixtures.write_wikitext2(tmp_path, repeat=3)
    data = load_dataset(f"wikitext2:root={tmp_path},bptt=4")
    words = []
    for line in (paper_fixtures.TRAIN_TEXT * 3).splitlines(keepends=True):
        words += line.split() + ["<eos>"]
    vocabulary = ["<unk>"] + list(dict.fromkeys(w for w in words if w != "<unk>"))
    assert data.num_classes == len(vocabulary) and data.input_shape == (4,)
    assert data.num_train == (len(words) - 1) // 4
    ids = torch.tensor([vocabulary.index(w) for w in words])
    x, y = data.read_train(np.array([0, 2]))
    assert torch.equal(x[1], ids[8:12]) and torch.equal(y[1], ids[9:13])  # targets: next tokens
    test_words = []
    for line in (paper_fixtures.TEST_TEXT * 3).splitlines(keepends=True):
        test_words += line.split() + ["<eos>"]
    expect = [vocabulary.index(w) if w in vocabulary else 0 for w in test_words]  # unseen: <unk>
    assert data.x_test.reshape(-1).tolist() == expect[: 4 * data.num_test]
    assert "unseen" not in vocabulary and data.x_test[0, 1] == 0
    (tmp_path / "wikitext-2" / "wiki.valid.tokens").unlink()
    with pytest.raises(ValueError, match="wiki.valid.tokens does not exist.*wikitext-2"):
        load_dataset(f"wikitext2:root={tmp_path}")


def test_contiguous_partition_gives_text_chunks(tmp_path):
    paper_fixtures.write_wikitext2(tmp_path)
    data = load_dataset(f"wikitext2:root={tmp_path},bptt=5")
    shards = [peer_shard(data, r, 3, "contiguous", 0) for r in range(3)]
    together = torch.cat([x for x, _ in shards])
    assert torch.equal(together, data.read_train(np.arange(data.num_train))[0])


def test_peer_reads_only_its_own_records():
    data = load_dataset("paper_fixtures:torch_pair")
    touched = []
    original = data.read_train

    def spy(indices):
        touched.append(np.asarray(indices).copy())
        return original(indices)

    object.__setattr__(data, "read_train", spy)
    try:
        from gossip_powersgd.training.data import partition

        x, y = peer_shard(data, 2, 4, "iid", 0)
        mine = partition(np.zeros(96), 4, "iid", 0)[2]
        assert len(touched) == 1 and np.array_equal(touched[0], mine) and len(y) == 24
        with pytest.raises(ValueError, match="no per-record labels for partition"):
            data.partition_labels("dirichlet:0.5")  # no targets attribute: no label split
    finally:
        object.__setattr__(data, "read_train", original)
        clear_dataset_cache()


@pytest.mark.mpi
def test_other_ranks_records_raise_and_the_run_still_trains(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "guarded.yaml"
    config.write_text(
        "topology: ring:3\nalgorithm: exact\ndataset: paper_fixtures:rank_guarded\n"
        "model: mlp:8\nbatch_size: 8\nepochs: 2\nlr: 0.3\nbackend: mpi\n"
    )
    result = run_mpi(
        3,
        [
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            config,
            "--set",
            f"out_dir={out}",
            "--quiet",
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 * 4 and summary["final_test_acc_avg_model"] > 0.6


def test_a_user_module_in_the_cwd_imports_without_pythonpath(tmp_path):
    (tmp_path / "mydata.py").write_text(
        "import numpy as np\n"
        "def load(seed=0):\n"
        "    rng = np.random.default_rng(seed)\n"
        "    x = rng.standard_normal((40, 3)); y = (x[:, 0] > 0).astype(int)\n"
        "    return x[:32], y[:32], x[32:], y[32:]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = (
        "import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
        "sys.path.insert(0, sys.argv.pop(1)); "
        "from gossip_powersgd.cli.train import main; main()"
    )
    result = run_bounded(
        [
            sys.executable,
            "-c",
            script,
            str(ROOT),
            "--set",
            "dataset=mydata:load",
            "--set",
            "model=logreg",
            "--set",
            "topology=ring:2",
            "--set",
            "epochs=1",
            "--set",
            "algorithm=exact",
            "--quiet",
            "--config",
            str(ROOT / "experiments" / "configs" / "tiny.yaml"),
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        120,
        "gossip-train with a module in the cwd",
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").is_file()


def local_train(config):
    import topologies

    from gossip_powersgd import LocalCluster
    from gossip_powersgd.training.config import config_from_dict
    from gossip_powersgd.training.trainer import train

    config = config_from_dict(config)
    return LocalCluster(topologies.parse(config.topology), timeout=60).run(train, config)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # peers used the global RNG (dropout)
def test_cifar10_resnet_and_wikitext_lstm_train_in_process(cifar_root, tmp_path):
    common = dict(topology="ring:2", algorithm="powergossip:rank=1", epochs=1, quiet=True)
    s = local_train(
        dict(
            common,
            dataset=f"cifar10:root={cifar_root}",
            model="resnet20:width=4",
            batch_size=8,
            lr=0.05,
        )
    )
    assert s[0]["steps"] == 3 and s[0]["final_test_acc_avg_model"] is not None
    paper_fixtures.write_wikitext2(tmp_path)
    lm = local_train(
        dict(
            common,
            dataset=f"wikitext2:root={tmp_path},bptt=6",
            partition="contiguous",
            model="lstm_lm:layers=1,hidden=8",
            lr=1.0,
            batch_size=4,
            epochs=2,
        )
    )
    final = [r for r in lm[0]["history"] if r["kind"] == "eval"]
    vocabulary = load_dataset(f"wikitext2:root={tmp_path},bptt=6").num_classes
    # perplexity is exp(per-token cross-entropy); below the vocabulary size: better than uniform
    assert final[-1]["test_perplexity_avg_model"] == pytest.approx(
        np.exp(final[-1]["test_loss_avg_model"]), rel=1e-12
    )
    assert final[-1]["test_perplexity_avg_model"] < vocabulary
    assert lm[0]["label_histogram"] == [[], []]  # a target per token: no label histogram


@pytest.mark.mpi
def test_augmented_cifar_run_is_the_same_under_mpi_and_local(cifar_root, tmp_path):
    config = tmp_path / "cifar.yaml"
    config.write_text(
        f"topology: ring:2\nalgorithm: powergossip:rank=1\n"
        f"dataset: cifar10:root={cifar_root}\nmodel: resnet20:width=4\n"
        "batch_size: 8\nepochs: 2\nlr: 0.05\nmomentum: 0.9\n"
    )
    out = tmp_path / "mpi"
    result = run_mpi(
        2,
        [
            "-m",
            "gossip_powersgd.cli.train",
            "--config",
            config,
            "--set",
            "backend=mpi",
            "--set",
            f"out_dir={out}",
            "--quiet",
        ],
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    from gossip_powersgd.training.config import load_config

    summary = local_train(load_config(config, deep=False).replace(quiet=True).to_dict())[0]
    mpi_summary = json.loads((out / "summary.json").read_text())
    assert mpi_summary["model_sha256"] == summary["model_sha256"]  # crops, flips, BN refresh


# ---- Reliability IV: what the files hold, not their shapes ------------------------------------------


def test_cifar10_digest_covers_every_training_record(tmp_path):
    """Two folders that differ in one pixel of one training record are different datasets: the
    digest peers compare (and a checkpoint records) reads the files' bytes, not their shapes."""
    from gossip_powersgd.training.data import dataset_digest

    a, b = tmp_path / "a", tmp_path / "b"
    paper_fixtures.write_cifar10(a)
    folder = paper_fixtures.write_cifar10(b)
    records = bytearray((folder / "data_batch_4.bin").read_bytes())
    records[100] ^= 1
    (folder / "data_batch_4.bin").write_bytes(bytes(records))
    clear_dataset_cache()
    first, second = load_dataset(f"cifar10:root={a}"), load_dataset(f"cifar10:root={b}")
    assert dataset_digest(first) != dataset_digest(second)
    changed = [f.name for f, g in zip(first.files, second.files) if f.sha256 != g.sha256]
    assert changed == ["data_batch_4.bin"]
    clear_dataset_cache()


def test_cifar10_training_label_out_of_range_names_its_file(tmp_path):
    folder = paper_fixtures.write_cifar10(tmp_path)
    records = paper_fixtures.cifar_records(8, 3)
    records[5, 0] = 12
    (folder / "data_batch_3.bin").write_bytes(records.tobytes())
    clear_dataset_cache()
    with pytest.raises(
        ValueError, match=r"data_batch_3.bin has label 12; CIFAR-10 labels are 0..9"
    ):
        load_dataset(f"cifar10:root={tmp_path}")


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
@pytest.mark.parametrize("dataset", ["cifar10", "wikitext2"])
def test_a_data_file_that_is_no_regular_file_is_named_as_such(tmp_path, kind, dataset):
    """A directory, a FIFO or a link to /dev/zero in place of a data file: said what it is (not
    "does not exist"), and never opened (a FIFO would block for good, /dev/zero never ends)."""
    if dataset == "cifar10":
        folder, name = paper_fixtures.write_cifar10(tmp_path), "data_batch_2.bin"
    else:
        folder, name = paper_fixtures.write_wikitext2(tmp_path), "wiki.test.tokens"
    path = folder / name
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    what = {"directory": "a directory", "fifo": r"a FIFO \(named pipe\)", "device": "a device"}[
        kind
    ]
    clear_dataset_cache()
    with pytest.raises(ValueError, match=f"{name} is {what}, not a regular file") as info:
        load_dataset(f"{dataset}:root={tmp_path}")
    assert "\n" not in str(info.value)


def test_roots_with_spaces_and_non_ascii_letters_load(tmp_path):
    root = tmp_path / "my data ünï 数据"
    paper_fixtures.write_cifar10(root)
    paper_fixtures.write_wikitext2(root)
    clear_dataset_cache()
    assert load_dataset(f"cifar10:root={root}").num_train == 40
    assert load_dataset(f"wikitext2:root={root},bptt=4").num_train > 0
    clear_dataset_cache()


def test_wikitext2_test_text_outside_the_training_vocabulary_is_refused(tmp_path):
    """A test text none of whose words the training text has reads as all <unk>: its perplexity
    would be a number about nothing. Refused, naming the file."""
    folder = paper_fixtures.write_wikitext2(tmp_path)
    (folder / "wiki.test.tokens").write_text(" lorem ipsum dolor sit amet \n" * 20)
    clear_dataset_cache()
    with pytest.raises(
        ValueError, match=r"wiki.test.tokens: none of its 100 words is in the training vocabulary"
    ):
        load_dataset(f"wikitext2:root={tmp_path},bptt=4")
    # split=valid reads its own file; the valid text is in the vocabulary
    assert load_dataset(f"wikitext2:root={tmp_path},bptt=4,split=valid").num_test > 0
    clear_dataset_cache()


@pytest.mark.mpi
def test_ranks_reading_different_cifar_copies_under_one_spec_are_refused(tmp_path):
    """`root=~/c` under two homes (mpiexec MPMD): same spec, different files. partition: iid splits
    one dataset, so the ranks agree on every file's digest first; the file that differs is named
    on every rank, and nothing trains."""
    from tests.conftest import SUPPORT, mpiexec_path

    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    for home in homes:
        paper_fixtures.write_cifar10(home / "c")
    path = homes[1] / "c" / "cifar-10-batches-bin" / "data_batch_2.bin"
    data = bytearray(path.read_bytes())
    data[4000] ^= 1
    path.write_bytes(bytes(data))
    program = [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        str(ROOT / "experiments" / "configs" / "tiny.yaml"),
        "--set",
        "topology=ring:2",
        "--set",
        "backend=mpi",
        "--set",
        "dataset=cifar10:root=~/c",
        "--set",
        f"out_dir={tmp_path / 'run'}",
        "--quiet",
    ]
    command = [mpiexec_path()]
    for k, home in enumerate(homes):
        command += [*([":"] if k else []), "-n", "1", "-env", "HOME", str(home), *program]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}:{SUPPORT}")
    result = run_bounded(command, 120, "mpiexec MPMD with two homes", env=env, cwd=ROOT)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert len(lines) == 2, result.stderr[-3000:]
    for line in lines:
        assert "dataset file data_batch_2.bin differs across ranks" in line
        assert "partition 'iid' splits one dataset" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


# ---- Reliability IV: truncated BPTT over a peer's contiguous text ------------------------------------


def lm_config(root, out_dir=None, **changes):
    return dict(
        dict(
            topology="ring:2",
            algorithm="exact",
            dataset=f"wikitext2:root={root},bptt=5",
            partition="contiguous",
            model="lstm_lm:layers=2,hidden=8,dropout=0.3",
            lr=1.0,
            batch_size=3,
            epochs=3,
            quiet=True,
            out_dir=None if out_dir is None else str(out_dir),
        ),
        **changes,
    )


def test_an_lstm_on_contiguous_text_trains_by_truncated_bptt_and_resumes_bit_for_bit(tmp_path):
    """Each peer's batches are its text as parallel streams and the LSTM carries its state from
    batch to batch (the run differs from one that resets it); a run interrupted mid-pass resumes
    bit for bit (the carried state is in the checkpoint); peers draw their own dropout masks."""
    import topologies

    from gossip_powersgd import LocalCluster
    from gossip_powersgd.training.config import config_from_dict
    from gossip_powersgd.training.hooks import HookList
    from gossip_powersgd.training.setup import build_run
    from gossip_powersgd.training.trainer import train

    paper_fixtures.write_wikitext2(tmp_path / "data", repeat=7)
    config = config_from_dict(lm_config(tmp_path / "data", tmp_path / "a"))

    def peer(comm):
        run = build_run(comm, config.replace(out_dir=None), HookList())
        return type(run.batches).__name__, run.model.carry_state, run.model.drops[1].rng_state

    built = LocalCluster(topologies.ring(2)).run(peer)
    assert [b[:2] for b in built] == [("StreamBatches", True)] * 2
    assert not torch.equal(built[0][2], built[1][2])  # each peer its own masks

    reference = LocalCluster(topologies.ring(2), timeout=60).run(train, config)

    def interrupted(comm):
        def stop(step):
            if step == 2 * reference[0]["steps_per_epoch"] - 1:
                raise KeyboardInterrupt

        try:
            train(comm, config.replace(out_dir=str(tmp_path / "b")), on_step=stop)
        except KeyboardInterrupt:
            return None

    LocalCluster(topologies.ring(2), timeout=60).run(interrupted)
    resumed = LocalCluster(topologies.ring(2), timeout=60).run(
        train, config.replace(out_dir=str(tmp_path / "b")), resume=True
    )
    assert resumed[0]["model_sha256"] == reference[0]["model_sha256"]
    shuffled = LocalCluster(topologies.ring(2), timeout=60).run(
        train, config.replace(out_dir=None, partition="iid")
    )
    assert shuffled[0]["model_sha256"] != reference[0]["model_sha256"]
    clear_dataset_cache()


def test_wikitext2_blank_lines_read_as_the_standard_loaders_read_them(tmp_path):
    """The stream PyTorch's word-language-model example and torchtext (newline_eos) build, whose
    token counts are those published with WikiText-2: every line's words, then <eos>; a blank or
    whitespace-only line is one <eos>; a last line without its line break counts as a line."""
    folder = paper_fixtures.write_wikitext2(tmp_path)
    text = " \n = Title = \n\n \t \n the game began \r\n the end"
    (folder / "wiki.train.tokens").write_text(text, encoding="utf-8")
    clear_dataset_cache()
    data = load_dataset(f"wikitext2:root={tmp_path},bptt=1")
    expected = ["<eos>", "=", "Title", "=", "<eos>", "<eos>", "<eos>"]
    expected += ["the", "game", "began", "<eos>", "the", "end", "<eos>"]
    x, y = data.read_train(np.arange(data.num_train))
    ids = torch.cat([x[:, 0], y[-1:, 0]])
    vocabulary = ["<unk>"] + list(dict.fromkeys(expected))
    assert ids.tolist() == [vocabulary.index(w) for w in expected]
    clear_dataset_cache()


@pytest.mark.parametrize("name", ["wiki.train.tokens", "wiki.test.tokens"])
def test_wikitext2_text_of_blank_lines_only_is_refused(tmp_path, name):
    """A file of blank lines only (a failed copy, an editor's empty buffer) would be a stream of
    <eos> alone: the run would learn to predict <eos> and report a perplexity near 1. Refused,
    naming the file."""
    folder = paper_fixtures.write_wikitext2(tmp_path)
    (folder / name).write_text(" \n\n \n" * 40, encoding="utf-8")
    clear_dataset_cache()
    with pytest.raises(ValueError, match=f"{name} holds no word, only 120 blank lines"):
        load_dataset(f"wikitext2:root={tmp_path},bptt=4")
    clear_dataset_cache()


def test_a_file_dataset_is_read_again_in_the_same_process_when_its_files_changed(tmp_path):
    """load_dataset's in-process cache (keyed by spec and seed) handed a second run in the same
    process the text of the files as they were at the first load: replacing wiki.train.tokens
    changed nothing (the old windows, vocabulary and digests). Unchanged files still share one
    load; a changed one is read again."""
    folder = paper_fixtures.write_wikitext2(tmp_path)
    spec = f"wikitext2:root={tmp_path},bptt=5"
    clear_dataset_cache()
    try:
        first = load_dataset(spec)
        assert load_dataset(spec) is first  # the peers of a run share one load
        text = paper_fixtures.TRAIN_TEXT.replace("game", "novel")
        (folder / "wiki.train.tokens").write_text(text * 40, encoding="utf-8")
        again = load_dataset(spec)
        x, _ = again.read_train(np.arange(again.num_train))
        words = paper_fixtures.TRAIN_TEXT.split()
        assert again.num_train == (40 * (len(words) + 4) - 1) // 5  # 4 lines: 4 <eos> each copy
        assert again.files[0].sha256 != first.files[0].sha256 and len(x) == again.num_train
    finally:
        clear_dataset_cache()


@pytest.mark.parametrize("name", ["wiki.train.tokens", "wiki.test.tokens"])
def test_a_wikitext2_file_that_is_not_utf8_is_named(tmp_path, name):
    """A token file of other bytes (a Latin-1 copy, a compressed file under the name) stopped the
    load with "'utf-8' codec can't decode byte 0xff in position 0", naming no file."""
    folder = paper_fixtures.write_wikitext2(tmp_path)
    (folder / name).write_bytes(b"the game \xff began\n")
    spec = f"wikitext2:root={tmp_path},bptt=2"
    clear_dataset_cache()
    where = re.escape(f"dataset spec '{spec}': {folder / name} is not UTF-8 text (byte 9: ")
    with pytest.raises(ValueError, match="^" + where):
        load_dataset(spec)
