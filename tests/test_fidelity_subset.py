"""The fidelity harness end to end on a small fixed subset of dev rows (real pack).

`python -m benchmarks.fidelity` runs all dev rows; this keeps the whole path (CSV -> row mapping
-> estimators -> serving models -> metrics -> JSON) under test in CI time. The bounds are loose
(the subset is small) but a broken mapping, model or metric fails them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercast.cli.main import main

SUBSET = Path(__file__).parent / "data" / "fidelity_subset_ids.txt"
N_IDS = sum(1 for line in SUBSET.read_text().splitlines() if line.strip() and not line.startswith("#"))


@pytest.mark.real_pack
def test_validate_subset_json(real_pack_available, capsys):
    assert main(["validate", "--ids", str(SUBSET), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("rows", "predicted", "ttft_median_ape", "tpot_median_ape", "ttft_within20", "tpot_within20", "by"):
        assert key in d
    assert d["rows"] == N_IDS == 16
    assert d["predicted"] == N_IDS  # every row of the subset maps to a configuration we model
    assert set(d["by"]["mode"]) == {"agg", "disagg"}
    assert set(d["by"]["backend"]) == {"trtllm", "vllm", "sglang"}
    assert 0.0 <= d["tpot_median_ape"] < 0.40
    assert 0.0 <= d["ttft_median_ape"] < 0.80
    # the defaults-only score: the same keys, its own numbers (the recipes move some rows)
    dflt = d["defaults_only"]
    assert set(dflt) == set(d) - {"defaults_only", "seconds", "model", "ids_not_in_csv"}
    assert dflt["rows"] == N_IDS and dflt["ttft_median_ape"] != d["ttft_median_ape"]


@pytest.mark.real_pack
def test_validate_static_subset_out(real_pack_available, capsys, tmp_path):
    assert main(["validate", "--ids", str(SUBSET), "--static", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rows predicted" in out
    assert "with recipes: TTFT median APE" in out and "defaults only: TTFT median APE" in out
    # printed to a pipe, the summary table keeps its numbers whole (rich's default 80 columns cut
    # them to "1…" / "100…")
    assert "…" not in out
    assert f"/{N_IDS} " in out and "100.0%" in out
    for name in ("results.csv", "report.md", "report.html", "summary.json"):
        assert (tmp_path / name).exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    # the static model cannot predict disaggregated rows: they are reported with the reason
    assert summary["by"]["mode"]["disagg"]["predicted"] == 0
    assert "disaggregated rows need the serving model" in (tmp_path / "report.md").read_text()


def test_validate_csv_missing_columns_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("id,backend\nx,trtllm\n")
    assert main(["validate", "--silicon", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert "lacks required columns" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.real_pack
def test_validate_by_compound_groups(real_pack_available, capsys):
    assert main(["validate", "--ids", str(SUBSET), "--json", "--by", "backend+mode", "--by", "concurrency"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert list(d["by"]) == ["backend+mode", "concurrency"]
    combos = d["by"]["backend+mode"]
    # the combinations partition the rows, and each one's rows add up to its backend's
    assert sum(b["rows"] for b in combos.values()) == N_IDS
    for backend in ("trtllm", "vllm", "sglang"):
        assert sum(b["rows"] for k, b in combos.items() if k.startswith(f"{backend} | ")) >= 1
    assert {k.split(" | ")[1] for k in combos} == {"agg", "disagg"}


def test_validate_by_unknown_attribute_is_a_clean_error(capsys):
    # refused before any row is read or predicted, naming what can be grouped by
    assert main(["validate", "--silicon", "/nonexistent.csv", "--by", "backend+colour"]) == 2
    err = capsys.readouterr().err
    assert "cannot group validation results by 'colour'" in err and "available: backend" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.real_pack
def test_validate_serving_notes_split_each_ttft(real_pack_available, capsys, tmp_path):
    """Each serving-model row's note says where its predicted TTFT goes, and the parts add up to it
    (to the note's whole-millisecond rounding)."""
    import csv
    import re

    assert main(["validate", "--ids", str(SUBSET), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    split = re.compile(r"TTFT = front end (-?\d+) \+ wait (-?\d+) \+ prefill (-?\d+) ms")
    checked = 0
    for r in rows:
        m = split.search(r["note"])
        if "no TP degree" in r["note"]:
            continue  # the best of a GPU count's deployments: its note names the layout instead
        assert m, r["note"]
        assert sum(int(x) for x in m.groups()) == pytest.approx(float(r["predicted_ttft_ms"]), abs=2.0)
        assert r["command"].startswith("infercast serve") and float(r["defaults_only_ttft_ms"]) > 0
        checked += 1
    assert checked >= N_IDS - 2 and any(r["mode"] == "disagg" for r in rows)
