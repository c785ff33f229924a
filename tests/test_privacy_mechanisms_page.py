"""`python -m experiments.privacy_mechanisms --quick`: the page, CSV and JSON it writes, with the
neighbour's attack on every run, and a bad --topologies refused in one line."""

from __future__ import annotations

import csv
import json
import os
import re

import pytest

from experiments import privacy_mechanisms


def test_quick_page_has_every_run_attacked(tmp_path):
    privacy_mechanisms.main(["--quick", "--out", str(tmp_path)])
    page = (tmp_path / "privacy_mechanisms.md").read_text()
    rows = list(csv.DictReader((tmp_path / "privacy_mechanisms.csv").open()))
    sections = json.loads((tmp_path / "privacy_mechanisms.json").read_text())
    # non-private once, then local, zipdl, decor (muffliato reuses local's runs) per algorithm
    assert len(rows) == 2 * (1 + 3) and len(sections) == 1
    assert "constant lr 0.5" in page and "LiRA online AUC (received)" in page
    assert "## Attacks: what the neighbour learns of membership" in page
    # at a constant lr the last quarter's change is the within-run plateau test, with a verdict
    plateau = page.split("## Trained to a plateau?")[1].split("\n## ")[0]
    assert plateau.count("- **ring:4**") == 1
    assert "plateau at this measure." in plateau or "**not** shown at a plateau" in plateau
    assert "python -m experiments.privacy_mechanisms --quick --out" in page
    # every placeholder of the page's text was filled (an f-string prefix once went missing)
    assert not re.search(r"\{[A-Za-z_][A-Za-z_0-9.\[\]'\"]*(\(|\})", page)
    # --render-only draws the same page again from the JSON, saying so after the run's sentence
    privacy_mechanisms.main(["--render-only", "--out", str(tmp_path)])
    again = (tmp_path / "privacy_mechanisms.md").read_text()
    first, rest = page.split("\n", 3)[2], page.split("\n", 3)[3]
    assert again.split("\n", 3)[2].startswith(first.split(" Backend")[0] + " Drawn again")
    assert again.split("\n", 3)[3] == rest
    for row in rows:
        for key in ("auc/received/LOSS", "auc/victim's own/LOSS", "auc/blind model/LOSS"):
            assert 0.0 <= float(row[key]) <= 1.0
        assert int(row["members"]) == int(row["nonmembers"]) > 0  # a balanced AUC
        # evaluated at every quarter: the plateau check has its points
        assert float(row["acc_half"]) == float(row["acc_half"])
        assert float(row["acc_3q"]) == float(row["acc_3q"])
    for row in rows:
        if row["algorithm"] == "exact gossip" and row["mechanism"] in ("none", "local", "decor"):
            # exact gossip sends the model itself (no noise on the wire for these): the observer's
            # received model is the victim's, so the two attacks score identically
            assert row["auc/received/LOSS"] == row["auc/victim's own/LOSS"]
        if row["algorithm"] == "exact gossip" and row["mechanism"] == "zipdl":
            # ZIP-DL's zero-sum noise is on the message only: what is received is not the model
            assert row["auc/received/LOSS"] != row["auc/victim's own/LOSS"]
    # --jobs 2 trains the same plan in two worker processes: rows come back in the plan's order,
    # and a non-private run (seeded, no secret noise) and every blind baseline repeat bit for bit;
    # a private run draws its noise from fresh entropy, so it is not compared
    parallel = tmp_path / "jobs"
    privacy_mechanisms.main(["--quick", "--jobs", "2", "--out", str(parallel)])
    again = list(csv.DictReader((parallel / "privacy_mechanisms.csv").open()))
    assert [(r["algorithm"], r["mechanism"], r["seed"]) for r in again] == [
        (r["algorithm"], r["mechanism"], r["seed"]) for r in rows
    ]
    for one, two in zip(rows, again):
        blind = [k for k in one if "blind" in k or k.startswith("null/")]
        assert blind and all(one[k] == two[k] for k in blind)
        if one["mechanism"] == "none":
            assert one["acc_avg"] == two["acc_avg"]
            assert one["auc/received/LOSS"] == two["auc/received/LOSS"]
    assert "--jobs 2" in (parallel / "privacy_mechanisms.md").read_text()
    with pytest.raises(SystemExit) as exit_info:
        privacy_mechanisms.main(["--quick", "--jobs", "0"])
    assert "--jobs 0" in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_bad_topology_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        privacy_mechanisms.main(["--quick", "--topologies", "ring:4,nonsense:3"])
    message = str(exit_info.value)
    assert "--topologies" in message and "nonsense:3" in message and "\n" not in message


def test_cosine_calibration_keeps_only_the_bounds_valid_for_a_changing_lr():
    """Under a cosine lr the network bounds (which model a constant step) are not used: Muffliato
    and ZIP-DL report DP-SGD's local bound at DP-SGD's sigma; DP-SGD's and DECOR's noise is on the
    gradient, so their sigma and epsilon are the constant schedule's, bit for bit."""
    constant = privacy_mechanisms.calibrate(privacy_mechanisms.setting_of("ring:4", True))
    cosine = privacy_mechanisms.calibrate(privacy_mechanisms.setting_of("ring:4", True, "cosine"))
    assert "network_neighbour" in constant["muffliato"]  # the constant run does compute it
    for name in ("local", "decor"):
        for key in ("sigma", "neighbour", "far", "neighbour_pld", "local"):
            assert cosine[name][key] == constant[name][key]
    local = cosine["local"]
    for name in ("muffliato", "zipdl"):
        row = cosine[name]
        assert "network_neighbour" not in row and "constant lr" in row["note"]
        assert row["sigma"] == local["sigma"] and row["neighbour"] == local["neighbour"]
        assert row["far"] == local["far"] and row["local"] == local["local"]
    # ZIP-DL's zero-sum std: rho = 1 times one step's DP noise on the model at the base lr
    setting = privacy_mechanisms.setting_of("ring:4", True, "cosine")
    expected = setting["lr"] * local["sigma"] * privacy_mechanisms.CLIP / setting["batch_size"]
    assert cosine["zipdl"]["zipdl_sigma"] == pytest.approx(
        expected * privacy_mechanisms.ZIPDL_RATIO, rel=1e-12
    )


def test_cosine_quick_page_says_its_schedule(tmp_path):
    privacy_mechanisms.main(["--quick", "--schedule", "cosine", "--out", str(tmp_path)])
    page = (tmp_path / "privacy_mechanisms.md").read_text()
    sections = json.loads((tmp_path / "privacy_mechanisms.json").read_text())
    assert sections[0]["setting"]["schedule"] == "cosine"
    assert "--schedule cosine" in page and "lr 0.5 with a cosine decay to 0" in page
    assert "LiRA online AUC (received)" in page
    # under a decaying lr the last quarter's rise is no plateau test: the page draws no verdict
    plateau = page.split("## Trained to a plateau?")[1].split("\n## ")[0]
    assert "however long the run" in plateau and "privacy_mechanisms_budget.md" in plateau
    assert "plateau at this measure" not in plateau and "**not** shown" not in plateau


def test_merge_joins_runs_of_one_plan_and_refuses_others(tmp_path):
    """--merge: runs of the same plan on different topologies become one page whose sections,
    CSV rows and reproduce block are both runs', each run's sentence kept; a topology twice or
    another plan is refused in one line. The second run is the first one's JSON under another
    topology name (the join is what is tested; a second training run would add half a minute)."""
    first, second = tmp_path / "a", tmp_path / "b"
    privacy_mechanisms.main(["--quick", "--out", str(first)])
    second.mkdir()
    sections = json.loads((first / "privacy_mechanisms.json").read_text())
    for section in sections:
        section["setting"]["topology"] = "ring:4b"
        for row in section["rows"]:
            row["topology"] = "ring:4b"
    (second / "privacy_mechanisms.json").write_text(json.dumps(sections))
    header = json.loads((first / privacy_mechanisms.HEADER_JSON).read_text())
    assert header["nice"] == os.nice(0)  # recorded, so the page can say it
    header.update(command=header["command"] + " (copy)", load=[9.0, 9.5], nice=3)
    (second / privacy_mechanisms.HEADER_JSON).write_text(json.dumps(header))

    out = tmp_path / "joined"
    privacy_mechanisms.main(["--merge", str(first), str(second), "--out", str(out)])
    page = (out / "privacy_mechanisms.md").read_text()
    joined = json.loads((out / "privacy_mechanisms.json").read_text())
    rows = list(csv.DictReader((out / "privacy_mechanisms.csv").open()))
    assert [s["setting"]["topology"] for s in joined] == ["ring:4", "ring:4b"]
    assert len(rows) == 2 * 2 * (1 + 3)
    assert "Topologies ring:4, ring:4b;" in page and "fit in 2 runs of this command" in page
    assert "9.0 and 9.5" in page
    assert ("some niced" if os.nice(0) == 0 else "all niced") in page
    block = page.split("## Reproduce")[1]
    assert f"--quick --out {first}\n" in block and "(copy)" in block
    assert f"--merge {first} {second} --out {out}" in block
    assert page.count("Generated by") == 2 and "Joined into one page by" in page
    # drawn again from the joined JSON and header: the same page below its first lines
    privacy_mechanisms.main(["--render-only", "--out", str(out)])
    again = (out / "privacy_mechanisms.md").read_text()
    assert "Drawn again" in again and again.split("\n", 3)[3] == page.split("\n", 3)[3]

    for bad, words in (([first, first], "comes twice"), ([first, second], "another plan")):
        if words == "another plan":
            sections[0]["setting"]["epochs"] = 8
            (second / "privacy_mechanisms.json").write_text(json.dumps(sections))
        with pytest.raises(SystemExit) as exit_info:
            privacy_mechanisms.main(["--merge", *map(str, bad), "--out", str(tmp_path / "x")])
        message = str(exit_info.value)
        assert words in message and "\n" not in message
    assert "epochs" in message
    with pytest.raises(SystemExit) as exit_info:
        privacy_mechanisms.main(["--merge", str(tmp_path / "none"), "--out", str(tmp_path / "x")])
    assert "no finished run" in str(exit_info.value) and "\n" not in str(exit_info.value)
