"""cli/plot.py: reading run directories, where the figures go, the figures themselves (the program
from a clean clone: tests/project/test_clean_tree.py)."""

import json
import re

import pytest

from gossip_powersgd.cli import plot
from gossip_powersgd.cli.plot import FIGURES, _labels, default_out, plot_runs, read_run, run


def make_run(path, algorithm="powergossip:rank=1", records=None, config=True):
    (path / "metrics").mkdir(parents=True)
    records = (
        records
        if records is not None
        else [
            {"kind": "log", "step": 1, "consensus_distance": 0.5},
            {
                "kind": "eval",
                "epoch": 1,
                "step": 2,
                "test_acc_avg_model": 0.5,
                "test_acc_mean": 0.4,
                "mb_sent_per_peer": 0.1,
                "consensus_distance": 0.0,
            },
        ]
    )
    text = "\n".join(json.dumps(r) for r in records)
    (path / "metrics" / "rank-0.jsonl").write_text(text + "\n\n")  # a trailing blank line
    if config:
        (path / "config.yaml").write_text(f"algorithm: {algorithm}\n")
    return path


def test_read_run_takes_rank_0s_records_and_the_configs_algorithm(tmp_path):
    run_dir = make_run(tmp_path / "a")
    data = read_run(run_dir)
    assert data["algorithm"] == "powergossip:rank=1" and len(data["records"]) == 2
    assert read_run(make_run(tmp_path / "b", config=False))["algorithm"] == "b"
    (tmp_path / "b" / "config.yaml").write_text("algorithm: [unclosed\n")
    assert read_run(tmp_path / "b")["algorithm"] == "b"  # unreadable config: the folder's name


def test_read_run_refuses_a_folder_without_metrics_and_names_a_bad_line(tmp_path):
    with pytest.raises(ValueError, match=r"is not a run directory: .*rank-0\.jsonl is missing$"):
        read_run(tmp_path)
    run_dir = make_run(tmp_path / "a")
    with (run_dir / "metrics" / "rank-0.jsonl").open("a") as f:
        f.write('{"kind": "eval", \n')
    with pytest.raises(ValueError, match=r"rank-0\.jsonl:4: not valid JSON$"):
        read_run(run_dir)


def test_read_run_skips_a_last_line_still_being_written_and_says_so(tmp_path, capsys):
    """gossip-plot on a run still being written read the record it was writing, a last line
    without its newline yet, and refused the whole run ("not valid JSON"). That line is skipped
    now, said in one line on stderr; the same text with its newline (written whole, so damaged)
    is still refused."""
    run_dir = make_run(tmp_path / "a")
    path = run_dir / "metrics" / "rank-0.jsonl"
    path.write_text(path.read_text().rstrip("\n") + '\n{"kind": "eval", "epo')
    assert len(read_run(run_dir)["records"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{path}:3: skipped a last line not yet written whole (no newline" in err
    with path.open("a") as f:
        f.write("\n")
    with pytest.raises(ValueError, match=r"rank-0\.jsonl:3: not valid JSON$"):
        read_run(run_dir)


def test_read_run_takes_the_fullest_file_where_rank_0_was_away_for_part_of_the_run(tmp_path):
    """A run with churn whose rank 0 left at step 10 (`leave:0@10`): its metrics file stops there
    (two log records), while the members' go on to the end; gossip-plot drew rank 0's file, so
    every figure ended at step 8, with no accuracy at all, and exit status 0. It now draws the
    file with the most records (the lowest rank's among equals: rank 0's without churn)."""
    log = [{"kind": "log", "step": s, "consensus_distance": 1.0 / s} for s in (4, 8)]
    whole = log + [
        {"kind": "eval", "epoch": 1, "step": 13, "test_acc_avg_model": 0.9, "mb_sent_per_peer": 1},
        {"kind": "log", "step": 16, "consensus_distance": 0.1},
    ]
    run_dir = make_run(tmp_path / "a", records=log)
    for rank in (1, 2, 10):
        text = "".join(json.dumps(r) + "\n" for r in (whole if rank != 1 else whole[:3]))
        (run_dir / "metrics" / f"rank-{rank}.jsonl").write_text(text)
    assert read_run(run_dir)["records"] == whole  # rank 2's: rank 1's lacks one, rank 10 ties
    own = [dict(r, train_loss_local=0.5) for r in whole]  # as many records: rank 0's is read
    (run_dir / "metrics" / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in own))
    assert read_run(run_dir)["records"] == own  # as without churn


def test_read_run_counts_records_not_blank_lines_to_find_the_fullest_file(tmp_path):
    """Rank 0 left early (two records) and its file ends in blank lines; rank 1 holds all four.
    The fullest file was the one with the most newlines, blank lines included, so rank 0's five
    newlines beat rank 1's four and the figures ended where rank 0 left. Records are counted
    now: rank 1's file is read; a last line still being written counts for nothing either."""
    log = [{"kind": "log", "step": s, "consensus_distance": 1.0 / s} for s in (4, 8)]
    whole = log + [{"kind": "log", "step": s, "consensus_distance": 0.1} for s in (12, 16)]
    run_dir = make_run(tmp_path / "a", records=log)
    path = run_dir / "metrics" / "rank-0.jsonl"
    path.write_text(path.read_text() + "\n\n")  # 2 records, 5 newlines
    (run_dir / "metrics" / "rank-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in whole))
    assert read_run(run_dir)["records"] == whole
    tail = '\n{"kind": "log", "step": 20'  # rank 0: 3 lines with text, the last not whole
    path.write_text("".join(json.dumps(r) + "\n" for r in whole[:3]) + tail)
    assert read_run(run_dir)["records"] == whole  # 3 records against rank 1's 4


def test_labels_add_the_folder_only_where_two_runs_share_an_algorithm(tmp_path):
    runs = [
        {"dir": tmp_path / "x", "algorithm": "exact"},
        {"dir": tmp_path / "y", "algorithm": "exact"},
        {"dir": tmp_path / "z", "algorithm": "choco"},
    ]
    assert _labels(runs) == ["exact (x)", "exact (y)", "choco"]


def test_default_out_is_the_run_itself_or_a_folder_named_after_the_runs(tmp_path):
    assert default_out([tmp_path / "a"]) == tmp_path / "a"
    assert default_out([tmp_path / "a", tmp_path / "b"]) == tmp_path.resolve() / "plots-a-vs-b"
    many = [tmp_path / f"run-with-a-long-name-{k}" for k in range(6)]
    name = default_out(many).name
    assert len(name) <= 100 and name.endswith("-and-6-runs") and name.startswith("plots-run-with")


def test_plot_writes_each_figure_and_says_where_several_runs_go(tmp_path, capsys, monkeypatch):
    """The drawing is replaced by its file names (matplotlib takes seconds to import; the figures
    are drawn from a clean clone in tests/project/test_clean_tree.py): what is tested here is that
    every figure of the runs read is written where it is said to be, and nothing else."""
    drawn = []

    def figures(runs):
        drawn.append([r["algorithm"] for r in runs])
        return {name: name.encode() for name in FIGURES}

    monkeypatch.setattr(plot, "figures", figures)
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", algorithm="exact")
    written = run([str(a), str(b)])
    out = tmp_path.resolve() / "plots-a-vs-b"
    assert drawn == [["powergossip:rank=1", "exact"]]
    assert written == [out / name for name in FIGURES]
    assert all(path.read_bytes() == path.name.encode() for path in written)
    captured = capsys.readouterr()
    assert f"writing the figures to {out} (--out DIR to choose)" in captured.err
    assert captured.out.split() == [str(p) for p in written]
    assert sorted(p.name for p in out.iterdir()) == sorted(FIGURES)  # no temporary left
    with pytest.raises(ValueError, match="give at least one run directory"):
        plot_runs([])


#: What each case of the next test appends to rank 0's metrics file (its line 4).
DAMAGE = {
    "metrics": b"[1, 2]\n",
    "utf8": b"\xff\n",
    "out": b"",
    "epoch": b'{"kind": "eval", "step": 3, "mb_sent_per_peer": 0.1}\n',
    "null": b'{"kind": "eval", "epoch": 2, "step": 4, "mb_sent_per_peer": 0.2, '
    b'"test_acc_avg_model": null}\n',
    "text": b'{"kind": "log", "step": 5, "consensus_distance": "x"}\n',
}


@pytest.mark.parametrize(
    "damage, message",
    [
        ("metrics", r"rank-0\.jsonl:4: a list, not a record \(gossip-train writes one JSON object"),
        ("utf8", r"rank-0\.jsonl is not UTF-8 text \(byte \d+\): not gossip-train's metrics$"),
        ("out", r"cannot write to .*figures: it exists and is not a directory; give another --out"),
        (
            "epoch",
            r"rank-0\.jsonl:4: a record of kind 'eval' with no 'epoch', where gossip-train wri",
        ),
        ("null", r"rank-0\.jsonl:4: .* kind 'eval' with null as its 'test_acc_avg_model', where"),
        ("text", r"rank-0\.jsonl:4: .* kind 'log' with \"x\" as its 'consensus_distance', where"),
    ],
)
def test_a_damaged_run_or_an_out_that_is_a_file_is_one_line(tmp_path, capsys, damage, message):
    """A metrics line that is JSON but not an object, a config.yaml that is not a mapping (its
    algorithm then: the folder's name) and --out naming a file stopped gossip-plot with a
    traceback and 'AttributeError: 'list' object has no attribute 'get'' (or a bare '[Errno 17]
    File exists'); a metrics file that is not UTF-8 with Python's text, naming no file; a record
    without a number the figures read (its epoch), or with null or text there, with a traceback
    and 'KeyError' or 'TypeError: unsupported operand type(s)'."""
    run_dir = make_run(tmp_path / "a")
    (tmp_path / "figures").write_text("a file")
    with (run_dir / "metrics" / "rank-0.jsonl").open("ab") as f:
        f.write(DAMAGE[damage])
    (run_dir / "config.yaml").write_text("- a list\n")
    if damage == "out":  # the run itself reads, its algorithm the folder's name
        assert read_run(run_dir)["algorithm"] == "a"
    with pytest.raises(SystemExit) as stop:
        plot.main([str(run_dir), "--out", str(tmp_path / "figures")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: ") and re.search(message, err[0])


def test_a_private_runs_accuracy_legend_names_the_rank_whose_own_figures_it_draws(
    tmp_path, monkeypatch
):
    """With private statistics and each peer's own test set an eval record holds no mean over
    the peers, only its peer's own figures (``*_local``): the dashed curve, labelled "local
    mean", was the read file's rank's own model's accuracy, the solid one the averaged model's
    on that rank's test set. The legend now names them (rank 1's file here)."""
    legends = []

    def finish(plt, fig, ax):
        legends.append(ax.get_legend_handles_labels()[1])
        plt.close(fig)
        return b""

    monkeypatch.setattr(plot, "_finish", finish)
    own = {"kind": "eval", "epoch": 1, "step": 2, "mb_sent_per_peer": 0.1}
    own.update(test_acc_avg_model_local=0.5, test_acc_local=0.4)
    private = make_run(tmp_path / "p", records=[])
    (private / "metrics" / "rank-0.jsonl").unlink()
    (private / "metrics" / "rank-1.jsonl").write_text(json.dumps(own) + "\n")
    shared = make_run(tmp_path / "s", algorithm="exact")
    plot.figures([read_run(private), read_run(shared)])
    assert legends[0] == [
        "powergossip:rank=1, averaged model (rank 1's test set)",
        "powergossip:rank=1, rank 1's own model (rank 1's test set)",
        "exact, averaged model",
        "exact, local mean",
    ]
