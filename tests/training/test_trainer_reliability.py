"""Reliability: the issue's bad inputs, faults (a rank killed mid-training, a writer killed mid-write),
security (nothing unpickled, only weights-only loads, only the algorithm's bytes leave a peer), and a
long-run smoke test.

Bad inputs already covered elsewhere (not repeated here):
  1 disconnected graph ............ test_topologies.test_disconnected_graph_is_rejected (+ CLI below)
  2 bad weights from an edge list . test_topologies.test_edge_list_errors (+ CLI below)
  3 world size != topology size ... test_transport.test_mpi_bad_inputs_fail_on_every_rank[world_size]
  4 shapes differ across ranks .... test_transport (LocalCluster and MPI); dtypes: below
  5 non-finite values ............. test_choco / test_allreduce; PowerGossip, exact, training: below
  6 rank < 1 ...................... test_powergossip.test_bad_arguments_raise_naming_them; clipping: below
  7 unknown names/keys ............ test_registry, test_compressors, test_topologies, test_config (+ CLI below)
  8 corrupt checkpoint ............ test_checkpoint.test_corrupt_checkpoint_is_named_on_every_rank (+ CLI below)
  9 checkpoint of another run ..... test_checkpoint.test_resume_refuses_a_checkpoint_of_another_run
 10 run directory exists .......... test_training.test_existing_run_dir_is_never_overwritten
 11 wrong-size message ............ test_transport.test_mpi_wrong_message_size_ends_the_job_naming_the_peer
                                    (the size and dtype are checked from the probe, before the Recv)
 12 edge list that does not parse . test_topologies.test_edge_list_errors (+ CLI below)

Trainer-side bad inputs, below (each a one-line error on every rank, a non-zero exit, no hang):
 13 peers load different data ..... test_peers_that_load_different_data_fail_naming_the_ranks,
                                    test_mpi_ranks_with_unseeded_data_fail_on_every_rank
 14 two runs in one run directory . test_a_second_run_in_the_same_run_directory_fails_at_once_naming_
                                    the_holder; stale lock, another host's lock, release on error,
                                    --resume: the test_*lock* tests
 15 empty test set ................ test_an_empty_test_set_is_refused_at_load_time
 16 finite divergence ............. test_finite_divergence_stops_every_rank_with_one_line,
                                    test_a_growing_consensus_distance_is_divergence
 17 label far beyond the classes .. test_a_huge_label_is_refused_before_anything_is_sized_by_it
 18 unusable out_dir, full disk ... test_an_unusable_out_dir_is_one_line_on_every_rank,
                                    test_a_full_disk_during_a_checkpoint_stops_every_rank_keeping_...
 19 seed too large ................ test_a_huge_seed_is_blamed_on_the_seed
 20 unusable user model ........... test_an_unusable_user_model_is_one_line (frozen, meta, dtype,
                                    input size), test_batch_norm_on_a_one_sample_last_batch_is_told_...

Reliability II items tested in other modules (same rules: one line, every rank, no hang):
 21 gamma outside the stable range  test_algorithm_inputs (exact refused naming the range, compressed
                                    warned; a train() run gives one line on every rank);
                                    test_topologies.test_stable_gamma_range_closed_forms
 22 Choco / DeepSqueeze with QSGD .. test_choco / test_deepsqueeze (qsgd:2 and qsgd:4 converge on
                                    averaging after the 1 + omega rescaling)
 23 two threads on one communicator test_failures.test_a_second_exchange_in_flight_on_one_
                                    communicator_is_an_error
 24 library path under MPI raises . test_failures.test_uncaught_exception_on_one_rank_ends_the_mpi_
                                    job_promptly (mpiexec -n 4, the rank named, seconds not 120 s)
 25 Ctrl-C on the local backend ... test_failures.test_ctrl_c_on_the_local_backend_stops_every_peer_
                                    and_exits_130
 26 memory runaways ............... test_topologies.test_oversized_topologies_are_refused_before_
                                    allocation, ..._edge_list_id_typo_..., test_failures yaml alias
                                    bomb / oversized file; label: 17 above
 27 poor messages ................. duplicate YAML keys (test_failures), duplicate algorithm
                                    options and seed range (test_algorithm_inputs, test_specs),
                                    LocalCluster("ring:4") (test_failures), OSError/MemoryError
                                    one line (18 above)

Reliability III poor messages (one line naming the problem and the fix; test_reliability_inputs
unless named otherwise):
 28 a dp_* key while DP is off .... test_a_dp_key_while_dp_is_off_is_refused_naming_it
 29 absurd noise multiplier ....... test_noise_beyond_any_signal_is_refused_at_the_bound,
                                    test_an_absurd_noise_multiplier_is_one_line_on_every_rank_...;
                                    divergence under DP names the noise: test_a_divergence_under_dp_...
 30 dp_fix_model, local class ..... test_dp_fix_model_fixes_a_locally_defined_class_without_pickling_it
 31 older checkpoint renamed ...... test_an_older_checkpoint_renamed_to_the_newest_epoch_is_named
 32 pickled checkpoint ............ test_a_pickled_checkpoint_is_refused_in_our_own_words (file, plain
                                    pickle, payload under a valid digest), test_garbage_is_still_...
 33 full disk at the first
    checkpoint, then --resume ..... test_resume_after_a_full_disk_at_the_first_checkpoint_gives_...;
                                    another number of peers: test_checkpoint (ring:6)
 34 --resume D --set out_dir=E .... test_resume_with_another_out_dir_is_refused
 35 --set out_dir=2024-01-01 ...... test_a_string_key_takes_the_set_text_as_typed (YAML file: quote it)
 36 gamma unstable on a schedule .. test_algorithm_inputs: test_exact_gossip_refuses_an_unstable_gamma_
                                    on_a_schedule, test_compressed_gossip_warns_..._on_a_schedule,
                                    test_training_with_an_unstable_exact_gamma_...[matchings:8],
                                    test_schedule_stable_ranges_...
 37 lanes without taking turns .... test_cooperative.test_lanes_apply_to_a_cluster_taking_turns_only
                                    (LocalCluster(lanes=2, cooperative=False) refused, naming the fix)
 38 topologies show on 4096 peers . test_reliability_cli.test_show_of_a_4096_peer_schedule_answers_
                                    without_the_dense_products, ..._bounds_the_product_gap_before_
                                    computing_it; --steps 1e8 and --png of 32640 edges: refused
 39 consensus problem too large ... (its CLI is gone: `python -m experiments consensus` takes no
                                    options) test_page_consensus.test_bad_problem_names_are_one_line_
 40 consensus arguments late/silent (its CLI is gone, see 39)
 41 unusable --out of the CLIs .... test_engine.test_unknown_page_and_unwritable_out_are_one_line
                                    (the privacy_attacks CLI is gone: its pages take no options)
Reliability III items, in test_reliability_views (same rules):
 42 observers on a schedule or a .. test_observers_record_what_arrived_on_changing_graphs (matchings,
    directed graph                  one_peer_exponential, edge_sampling, cyclic Choco, push-sum);
                                    an internal KeyError: test_an_internal_key_error_names_its_type_...
 43 --resume resets two counters .. test_resume_restores_every_traffic_counter (the whole CommStats)
 44 a FIFO in place of a checkpoint test_a_fifo_in_place_of_a_checkpoint_is_refused_on_every_rank;
                                    a view's: test_a_damaged_view_file_is_one_line_naming_it
 45 full disk while recording ..... test_a_full_disk_while_recording_names_the_file_and_the_fix
 46 damaged view files ............ test_a_damaged_view_file_is_one_line_naming_it (empty, corrupt,
                                    pickled class, truncated zip, a list, missing keys, FIFO, dir)
 47 a killed view writer's .tmp ... test_a_killed_writers_leftover_temporary_view_files_are_removed_...
 48 --resume with observers ....... test_a_run_resumes_with_observers_added_recording_from_the_...,
                                    ..._dropped, test_a_refused_resume_writes_no_view,
                                    test_a_resume_with_another_observe_every_is_refused_naming_...
 49 attack on a NaN model ......... test_non_finite_attack_scores_are_refused_naming_the_count
 50 sys.exit in user code ......... test_user_code_calling_sys_exit_is_an_error_naming_the_spec (exit(0),
                                    exit(1), sys:exit, builtins:exit, at import, in forward),
                                    test_user_code_calling_sys_exit_fails_on_every_rank
 51 README example not reproducible test_the_readme_example_is_bit_identical_when_peers_run_at_once
    with peers running at once      (lanes=2, free threads); the guard: test_concurrent_peers_that_
                                    use_the_global_rng_are_warned_once, test_one_peer_at_a_time_...
Privacy III inputs (same rules):
 52 DP randomness / peer statistics test_privacy_training.test_bad_dp_inputs_are_one_line_errors_
                                    and_write_nothing (dp_secret unknown, dp_secure_noise: false,
                                    run_dir with public randomness, partition: local without
                                    public_train_size, public_train_size off local); a damaged key
                                    file: test_privacy_secrecy.test_a_damaged_key_file_is_one_line
Reliability III launcher faults (same rules):
 53 backend local under torchrun .. test_torch_transport.test_backend_local_under_torchrun_is_one_
                                    line_not_a_lock_error (was: the run lock blamed)
 54 sizeless topology, torch ...... test_torch_transport.test_training_under_torchrun_equals_the_
                                    local_backend (topology=ring takes torchrun's world size)
 55 comm_timeout out of range ..... test_config.test_bad_values_one_line[comm_timeout=1e-6/1e12];
                                    library: test_torch_transport.test_a_timeout_too_short_to_join_
                                    is_one_line_naming_the_rank
 56 SIGSTOP of one rank ........... test_failures.test_a_stopped_rank_is_named_by_every_rank_and_the_
                                    job_ends_before_the_timeout[mpi, torch] (every rank names the
                                    stopped peer; torch: gone in < 40 s, was timeout + 35 s)
 57 sys.exit on one rank .......... test_failures.test_a_rank_that_calls_sys_exit_is_named_within_
                                    seconds[mpi, torch] (was: mpi waited out comm_timeout, torch
                                    blamed both neighbours)
 58 Ctrl-C under torchrun ......... test_failures.test_ctrl_c_on_torchrun_stops_every_rank_each_
                                    naming_itself (torchrun's own status stays 1: README)
 59 sys.exit before the comm, mpi . test_failures.test_a_rank_that_exits_before_its_communicator_
                                    exists_is_named (was: the others hung in MPI_Comm_dup for ever);
                                    in a dataset spec: test_user_code_that_exits_during_the_config_
                                    check_ends_the_mpi_job_naming_it
"""

from __future__ import annotations


import pytest
import torch

import topologies
from gossip_powersgd import (
    AgreementError,
    ExactGossip,
    LocalCluster,
    NonFiniteError,
    PowerGossip,
)
from gossip_powersgd.comm.base import nbytes
from gossip_powersgd.training import setup as training_setup
from gossip_powersgd.training.config import load_config
from gossip_powersgd.training.trainer import train
from tests.conftest import (
    TINY,
    cli,
    errors_on_every_rank,
    tiny_config,
)

# ---- bad inputs through the command line: one line, non-zero exit ---------------------------------

EDGE_LISTS = {
    "disconnected": ("0 1\n2 3\n", "graph is not connected: 2 components"),
    # weights summing to more than 1 at a node cannot make a doubly stochastic W without a negative
    # diagonal, and this one would diverge
    "heavy": ("0 1 0.7\n1 2 0.7\n", "eigenvalue -1.1 < -1"),
    # the only way to write an asymmetric W in an undirected edge list is to give an edge twice
    "asymmetric": (
        "0 1 0.3\n1 2 0.3\n1 0 0.5\n",
        "reliability_asymmetric.txt:3: edge (0, 1) repeats line 1",
    ),
    "unparsable": ("0 1\n1 2\nfoo bar\n", "reliability_unparsable.txt:3: cannot parse 'foo bar'"),
}


@pytest.mark.parametrize("name", sorted(EDGE_LISTS))
def test_cli_bad_edge_list_files(tmp_path, capsys, name):
    text, expected = EDGE_LISTS[name]
    path = tmp_path / f"reliability_{name}.txt"
    path.write_text(text)
    code, lines = cli(
        [
            "--config",
            TINY,
            "--set",
            f"topology=file:{path}",
            "--set",
            f"out_dir={tmp_path / 'run'}",
        ],
        capsys,
    )
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: bad value for 'topology'"), lines
    assert expected in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "algorithm=gossipx",
            "algorithm spec 'gossipx': unknown name 'gossipx'; valid: allreduce, choco, "
            "deepsqueeze, exact, powergossip, powersgd",
        ),
        (
            "algorithm=choco:compressor=foo",
            "compressor spec 'foo': unknown name 'foo'; valid: identity, topk",
        ),
        (
            "topology=moebius:4",
            "topology spec 'moebius:4': unknown name 'moebius'; valid: ring, torus",
        ),
        (
            "optimiser=sgd",
            "unknown config key 'optimiser' in --set; valid keys: topology, algorithm",
        ),
        ("algorithm=powergossip:rank=0", "rank must be an integer >= 1, got 0"),
        # beyond float32: torch's optimizer would fail with a traceback at the first step
        ("lr=1e39", "bad value for 'lr': 1e+39 (must be > 0 and at most 3.403e+38 (float32))"),
    ],
)
def test_cli_bad_names_and_values_are_one_line(tmp_path, capsys, override, expected):
    code, lines = cli(
        ["--config", TINY, "--set", override, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_disagreeing_parameter_dtypes_fail_identically_on_every_peer():
    def peer(comm):
        dtype = torch.float64 if comm.rank == 1 else torch.float32
        try:
            ExactGossip([torch.zeros(5, 3, dtype=dtype)], comm)
        except AgreementError as exc:
            return str(exc)
        return "no error"

    messages = LocalCluster(topologies.ring(4)).run(peer)
    assert (
        messages
        == [
            "parameter shapes and dtypes differs across ranks: ranks 0,2-3 hold variant 1; "
            "ranks 1 hold variant 2"
        ]
        * 4
    )


def test_powergossip_clips_the_rank_to_the_smaller_side():
    """rank=50 on 4x3 matrices is rank 3 (documented): same bytes, same result, bit for bit."""

    def peer(comm, rank):
        g = torch.Generator().manual_seed(comm.rank)
        x = [
            torch.randn(4, 3, generator=g, dtype=torch.float64),
            torch.randn(3, 4, generator=g, dtype=torch.float64),
        ]
        gossip = PowerGossip(x, comm, rank=rank, seed=1)
        sizes = []
        for _ in range(3):
            sizes.append(gossip.bytes_per_step())
            gossip.step()
        return x, sizes, comm.stats.bytes_sent

    big = LocalCluster(topologies.ring(4)).run(peer, 50)
    three = LocalCluster(topologies.ring(4)).run(peer, 3)
    for (x_big, s_big, b_big), (x_3, s_3, b_3) in zip(big, three):
        assert s_big == s_3 and b_big == b_3 == sum(s_3)
        assert all(torch.equal(a, b) for a, b in zip(x_big, x_3))


# ---- non-finite values: named, and never sent -----------------------------------------------------


def watch_received(comm, log):
    """Wrap comm.exchange to record whether any received message held a NaN or an infinity."""
    real = comm.exchange

    def exchange(send, recv):
        real(send, recv)
        if any(not bool(torch.isfinite(t).all()) for t in recv.values() if t.is_floating_point()):
            log[comm.rank] = "received a non-finite value"

    comm.exchange = exchange


@pytest.mark.parametrize(
    "make",
    [lambda x, comm: PowerGossip(x, comm, rank=1), lambda x, comm: ExactGossip(x, comm)],
    ids=["powergossip", "exact"],
)
def test_a_nan_parameter_is_named_and_never_reaches_a_neighbour(make):
    log = {}

    def peer(comm):
        watch_received(comm, log)
        g = torch.Generator().manual_seed(comm.rank)
        weight, bias = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
        gossip = make([("layer.weight", weight), ("layer.bias", bias)], comm)
        for step in range(4):
            if comm.rank == 2 and step == 2:
                weight[1, 1] = float("nan")
            gossip.step()

    with pytest.raises(NonFiniteError) as info:
        LocalCluster(topologies.ring(4), timeout=30).run(peer)
    assert str(info.value).startswith(
        "rank 2: non-finite values in parameter(s) layer.weight at gossip step 2; nothing was sent"
    )
    assert log == {}  # no peer ever received a NaN


def test_a_diverging_training_run_names_the_rank_and_sends_nothing_non_finite():
    log = {}
    config = load_config(TINY, ["lr=1e38", "quiet=true"], deep=False)

    def peer(comm):
        watch_received(comm, log)
        return train(comm, config)

    with pytest.raises(
        NonFiniteError,
        match=r"^rank [0-3]: the training loss is (inf|nan) at step \d+ "
        r"\(lower the learning rate",
    ):
        LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    assert log == {}


# ---- faults: a checkpoint writer killed mid-write -------------------------------------------------


# ---- security ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["powergossip:rank=1", "exact"])
def test_a_peer_sends_exactly_the_algorithms_bytes(monkeypatch, algorithm):
    """During training, what goes through the point-to-point transport equals the algorithm's
    bytes_per_step() summed over its steps; the other traffic is metric all-reduces no larger than
    the model and short control messages, so no training data ever leaves a peer."""
    config = load_config(TINY, [f"algorithm={algorithm}", "epochs=2", "quiet=true"], deep=False)
    predicted, traffic = {}, {}
    real_make = training_setup.make_algorithm

    def make_algorithm(spec, params, comm):
        algorithm = real_make(spec, params, comm)
        real_step = algorithm.step

        def step():
            predicted[comm.rank] += algorithm.bytes_per_step()
            real_step()

        algorithm.step = step
        return algorithm

    monkeypatch.setattr(training_setup, "make_algorithm", make_algorithm)

    def peer(comm):
        predicted[comm.rank] = 0
        seen = traffic[comm.rank] = {
            "exchange": 0,
            "training_allreduce": 0,
            "metric_numel": [],
            "control_bytes": [],
        }
        real_exchange, real_allreduce, real_gather = (
            comm.exchange,
            comm.allreduce_,
            comm.allgather_bytes,
        )

        def exchange(send, recv):
            seen["exchange"] += sum(nbytes(t) for t in send.values())
            real_exchange(send, recv)

        def allreduce_(tensor, op="mean", metric=False):
            if metric:
                seen["metric_numel"].append(tensor.numel())
            else:
                seen["training_allreduce"] += nbytes(tensor)
            return real_allreduce(tensor, op, metric)

        def allgather_bytes(data):
            seen["control_bytes"].append(len(data))
            return real_gather(data)

        comm.exchange, comm.allreduce_, comm.allgather_bytes = exchange, allreduce_, allgather_bytes
        summary = train(comm, config)
        return summary, comm.stats.bytes_sent

    results = LocalCluster(topologies.parse(config.topology), timeout=30).run(peer)
    for rank, (summary, bytes_sent) in enumerate(results):
        seen = traffic[rank]
        assert seen["exchange"] == predicted[rank] == bytes_sent > 0
        assert seen["training_allreduce"] == 0
        assert max(seen["metric_numel"]) <= summary["parameters"]  # 84; a data shard is 10,000
        assert max(seen["control_bytes"]) <= 64
        assert summary["steps"] == 2 * summary["steps_per_epoch"]


# ---- trainer-side bad inputs: one line, every rank, no hang ------------------------------------------


every_rank = errors_on_every_rank


def test_peers_that_load_different_data_fail_naming_the_ranks(monkeypatch):
    """Bad input 13: threads share a dataset cache; uncached, each peer loads its own, as separate
    processes do, and the BYO function returns other data on every call."""
    from gossip_powersgd.training import data

    monkeypatch.setattr(data, "load_dataset", lambda name, seed=0: data._build_dataset(name, seed))
    errors = every_rank(tiny_config("dataset=reliability_fixtures:per_call_data"))
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("AgreementError: dataset differs across ranks: ranks ")
    assert "usually unseeded randomness" in errors[0] and "\n" not in errors[0]


@pytest.mark.mpi
def test_mpi_ranks_with_unseeded_data_fail_on_every_rank(tmp_path):
    """Bad input 13 under mpiexec: numpy's global random state differs per rank."""
    from tests.conftest import run_mpi

    result = run_mpi(
        4,
        [
            "-m",
            "experiments.train",
            "--config",
            TINY,
            "--set",
            "backend=mpi",
            "--set",
            "dataset=reliability_fixtures:unseeded_data",
            "--set",
            f"out_dir={tmp_path / 'run'}",
            "--quiet",
        ],
        timeout=180,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error (rank")]
    assert result.returncode != 0
    assert sorted(line.split(")")[0] for line in lines) == [f"error (rank {r}" for r in range(4)], (
        result.stderr[-2000:]
    )
    assert all("dataset differs across ranks" in line and "unseeded" in line for line in lines)
    assert "Traceback" not in result.stderr


def test_a_huge_seed_is_blamed_on_the_seed(tmp_path, capsys):
    code, lines = cli(
        ["--config", TINY, "--set", f"seed={2**64}", "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    assert code != 0 and lines == [f"error: bad value for 'seed': {2**64} (must be in [0, 2**64))"]
    assert tiny_config(f"seed={2**64 - 1}", deep=True).seed == 2**64 - 1


@pytest.mark.parametrize(
    "model, expected",
    [
        (
            "frozen_net",
            "the model has no trainable parameter (none, or every one has requires_grad=False)",
        ),
        (
            "meta_net",
            "the model has parameters or buffers on the meta device (no data to train); build it "
            "on the CPU",
        ),
        (
            "double_net",
            "cannot run on this dataset's inputs (shape (20,), torch.float32): RuntimeError: ",
        ),
        (
            "wrong_input_net",
            "cannot run on this dataset's inputs (shape (20,), torch.float32): RuntimeError: "
            "mat1 and mat2 shapes cannot be multiplied",
        ),
    ],
)
def test_an_unusable_user_model_is_one_line(tmp_path, capsys, model, expected):
    spec = f"model=reliability_fixtures:{model}"
    errors = every_rank(tiny_config(spec))  # the trainer's own checks
    assert len(set(errors)) == 1 and expected in errors[0] and "\n" not in errors[0], errors
    code, lines = cli(
        ["--config", TINY, "--set", spec, "--set", f"out_dir={tmp_path / 'run'}"], capsys
    )
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: bad value for 'model'")
    assert expected in lines[0]


def test_batch_norm_on_a_one_sample_last_batch_is_told_to_change_the_batch_size():
    """tiny's 1600 training samples give each of 4 peers 400: batch_size 399 leaves 1."""
    errors = every_rank(tiny_config("model=reliability_fixtures:batch_norm_net", "batch_size=399"))
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith(
        "ValueError: model 'reliability_fixtures:batch_norm_net' cannot train "
        "on a batch of 1 sample (Expected more than 1 value per channel"
    )
    assert "change batch_size (e.g. to 400)" in errors[0]
    assert (
        every_rank(
            tiny_config("model=reliability_fixtures:batch_norm_net", "batch_size=398", "epochs=1")
        )
        == ["ok"] * 4
    )
