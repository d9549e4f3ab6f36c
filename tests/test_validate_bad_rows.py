"""``infercast validate`` on CSVs and id lists with nothing or little to score (issue #36, case 7),
its console report (case 8) and its progress / grouped running (case 9), through the CLI as a user
meets them. Rows are predicted on the synthetic pack (tests/synthpack.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.validate.silicon import REQUIRED_COLUMNS, load_rows

HEADER = ["silicon_data_source", *REQUIRED_COLUMNS]


def _agg(id_: str, *, isl="128", osl="8", ttft="10", tpot="1", conc="4", system=None, tp="1") -> dict[str, str]:
    return {
        "id": id_, "silicon_data_source": f"source_file=x.csv; silicon_concurrency={conc}" if conc else "source_file=x.csv",
        "backend": "trtllm", "model_path": sp.MODEL_ID, "system": system or sp.SYSTEM, "mode": "agg",
        "isl": isl, "osl": osl, "batch_size": conc, "tp_size": tp, "silicon_ttft_ms": ttft, "silicon_tpot_ms": tpot,
    }


def _disagg_without_workers(id_: str) -> dict[str, str]:
    return {
        "id": id_, "silicon_data_source": "silicon_concurrency=4", "backend": "trtllm", "model_path": sp.MODEL_ID,
        "system": sp.SYSTEM, "mode": "disagg", "isl": "128", "osl": "8", "prefill_tp_size": "1", "decode_tp_size": "1",
        "decode_batch_size": "4", "silicon_ttft_ms": "10", "silicon_tpot_ms": "1",
    }


def _csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=HEADER, restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def _validate(capsys, synth, csv_path: Path, *args: str):
    return run_cli(capsys, ["validate", "--silicon", str(csv_path), "--systems-path", str(synth.systems_dir), *args])


# --------------------------------------------------------------------------- nothing to score: exit 2


def test_header_only_csv_is_an_error(synth, tmp_path, capsys):
    path = _csv(tmp_path / "empty.csv", [])
    rc, out, err = _validate(capsys, synth, path, "--json")
    assert_one_line_error(rc, out, err, str(path), "has no data rows", "header only")
    assert out == ""


def test_empty_ids_file_is_an_error(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_agg("a_c4_1")])
    ids = tmp_path / "ids.txt"
    ids.write_text("# nothing here\n\n")
    rc, out, err = _validate(capsys, synth, path, "--ids", str(ids))
    assert_one_line_error(rc, out, err, f"--ids {ids} lists no row id")


def test_ids_none_of_which_is_in_the_csv_is_an_error(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_agg("a_c4_1")])
    ids = tmp_path / "ids.txt"
    ids.write_text("other_1\nother_2\n")
    rc, out, err = _validate(capsys, synth, path, "--ids", str(ids))
    assert_one_line_error(rc, out, err, f"none of the 2 ids in --ids {ids} is a row of {path}", "'other_1'")


def test_ids_partly_in_the_csv_are_counted(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_agg("a_c4_1"), _agg("b_c4_2")])
    ids = tmp_path / "ids.txt"
    ids.write_text("a_c4_1\nmissing_1\nmissing_2\n")
    rc, out, err = _validate(capsys, synth, path, "--ids", str(ids), "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert (s["rows"], s["predicted"], s["ids_not_in_csv"]) == (1, 1, 2)
    rc, out, err = _validate(capsys, synth, path, "--ids", str(ids))
    last = out.rstrip().splitlines()[-1]
    assert rc == 0 and last.startswith("1/1 rows predicted in ") and last.endswith("; 2 id(s) of --ids not in the CSV")


def test_lengths_that_are_not_numbers_name_the_column_and_value(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_agg("a_c4_1", isl="abc"), _agg("b_c4_2", isl="abc"), _agg("c_c4_3", osl="")])
    rc, out, err = _validate(capsys, synth, path, "--json")
    line = assert_one_line_error(rc, out, err, f"no row of {path} could be scored (0 of 3 predicted)",
                                 "2 x InputData: isl: unparsable number ('abc')",
                                 "1 x InputData: osl: missing value (empty cell)")
    assert "None" not in line


def test_nan_and_negative_measurements_are_input_data_issues(synth, tmp_path, capsys):
    rows = [_agg(f"r_c4_{i}", ttft="nan", tpot="-3") for i in range(5)]
    path = _csv(tmp_path / "s.csv", rows)
    rc, out, err = _validate(capsys, synth, path)
    assert_one_line_error(rc, out, err, "(0 of 5 predicted)",
                          "5 x InputData: silicon_ttft_ms: NaN ('nan'); silicon_tpot_ms: non-positive ('-3')")
    assert "5/5 rows predicted" not in out


def test_disagg_rows_without_worker_counts_say_which_columns(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_disagg_without_workers("d_c4_1"), _disagg_without_workers("d_c4_2")])
    rc, out, err = _validate(capsys, synth, path)
    line = assert_one_line_error(
        rc, out, err, "2 x InputData: prefill_num_workers and decode_num_workers: missing value "
                      "(a disaggregated row needs both worker counts)")
    assert "UnsupportedModelError" not in line


def test_out_is_written_before_the_nothing_scored_error(synth, tmp_path, capsys):
    path = _csv(tmp_path / "s.csv", [_agg("a_c4_1", isl="x")])
    rc, out, err = _validate(capsys, synth, path, "--out", str(tmp_path / "rep"))
    assert_one_line_error(rc, out, err, "could be scored")
    with (tmp_path / "rep" / "results.csv").open() as fh:
        (row,) = csv.DictReader(fh)
    assert row["error"] == "InputData: isl: unparsable number ('x')"


# --------------------------------------------------------------------------- some rows scored: counted by reason


def _mixed(tmp_path: Path) -> Path:
    return _csv(tmp_path / "mixed.csv", [
        _agg("good_c4_1"),
        _agg("good_c8_2", conc="8", ttft="0.5", tpot="1000"),  # the worst TTFT by far
        _agg("bad_isl_c4_3", isl="12x"),
        _agg("bad_isl_c4_4", isl="??"),
        _agg("nan_ttft_c4_5", ttft="nan"),  # TPOT still measured: predicted, scored on TPOT
        _agg("no_meas_c4_6", ttft="", tpot="0"),
        _disagg_without_workers("dis_c4_7"),
        _agg("unknown_sys_c4_8", system="no_such_gpu"),
    ])


def test_mixed_rows_counted_by_reason_in_json(synth, tmp_path, capsys):
    rc, out, err = _validate(capsys, synth, _mixed(tmp_path), "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert (s["rows"], s["predicted"], s["ttft_n"], s["tpot_n"]) == (8, 3, 2, 3)
    un = s["unpredicted"]
    assert (un["rows"], un["input_data"], un["prediction_errors"]) == (5, 4, 1)
    reasons = un["by_reason"]
    assert reasons["input data: isl: unparsable number"] == 2
    assert reasons["input data: silicon_ttft_ms: missing value; silicon_tpot_ms: non-positive"] == 1
    assert reasons["input data: prefill_num_workers and decode_num_workers: missing value "
                   "(a disaggregated row needs both worker counts)"] == 1
    (error,) = [k for k in reasons if not k.startswith("input data: ")]
    assert error.startswith("UnknownSystemError") and "no_such_gpu" in error
    assert list(reasons.values())[0] == 2  # most frequent first
    assert un["example"]["input data: isl: unparsable number"] == "InputData: isl: unparsable number ('12x')"
    assert s["input_issues"]["rows"] == 5
    assert s["input_issues"]["by_reason"]["silicon_ttft_ms: NaN"] == 1
    assert s["input_issues"]["by_reason"]["isl: unparsable number"] == 2
    assert not any("None" in k for k in [*reasons, *s["input_issues"]["by_reason"]])


def test_console_shows_breakdowns_worst_rows_and_reasons(synth, tmp_path, capsys):
    rc, out, err = _validate(capsys, synth, _mixed(tmp_path), "--worst", "1")
    assert rc == 0, err
    # the README's default breakdowns: mode, backend, system, model
    for scope in ("mode=agg", "mode=disagg", "backend=trtllm", f"system={sp.SYSTEM}", "system=no_such_gpu",
                  f"model={sp.MODEL_ID}"):
        assert scope in out, scope
    worst = out.split("worst 1 rows by TTFT APE", 1)[1].split("rows not predicted")[0]
    assert "good_c8_2" in worst and "good_c4_1" not in worst
    assert "0.5 " in worst and "1,000" in worst  # measured TTFT and TPOT beside the predictions
    assert "5 rows not predicted (4 input-data issues, 1 prediction errors)" in out
    assert "input data: isl: unparsable number" in out
    assert "input-data issues of 5 rows" in out
    assert out.rstrip().splitlines()[-1].startswith("3/8 rows predicted in ")


def test_console_breakdowns_follow_by(synth, tmp_path, capsys):
    rc, out, err = _validate(capsys, synth, _mixed(tmp_path), "--by", "system", "--worst", "0")
    assert rc == 0, err
    assert "system=no_such_gpu" in out and "model=" not in out and "mode=agg" not in out
    assert "worst" not in out


def test_worst_must_not_be_negative(synth, tmp_path, capsys):
    rc, out, err = _validate(capsys, synth, _mixed(tmp_path), "--worst", "-1")
    assert_one_line_error(rc, out, err, "--worst must be 0 or more")


# --------------------------------------------------------------------------- progress, grouping, memory


def test_progress_goes_to_stderr_and_json_stays_clean(synth, tmp_path, capsys):
    path = _mixed(tmp_path)
    rc, out, err = _validate(capsys, synth, path, "--json")
    assert rc == 0 and err == ""  # not a terminal: no progress unless asked
    rc, out_p, err_p = _validate(capsys, synth, path, "--json", "--progress")
    assert rc == 0
    lines = err_p.strip().splitlines()
    assert lines and all(ln.startswith("infercast validate: ") for ln in lines)
    assert lines[-1].startswith("infercast validate: 8/8 rows (100%)")
    strip = ("seconds",)
    assert {k: v for k, v in json.loads(out_p).items() if k not in strip} == {
        k: v for k, v in json.loads(out).items() if k not in strip}
    rc, out_q, err_q = _validate(capsys, synth, path, "--json", "--quiet")
    assert rc == 0 and err_q == ""
    rc, _, err = run_cli(capsys, ["validate", "--progress", "--quiet"])
    assert rc == 2 and "not allowed with argument" in err


def test_grouped_run_keeps_row_order_and_releases_per_group(synth, tmp_path):
    from infercast.validate.runner import run_grouped

    rows = load_rows(_csv(tmp_path / "s.csv", [
        _agg("x_c4_1", system="sys_b"), _agg("y_c4_2"), _agg("z_c4_3", system="sys_b"), _agg("w_c4_4", system="sys_a"),
    ]))
    seen: list[str] = []
    released: list[list[str]] = []
    ticks: list[tuple[int, int, str]] = []

    def predictor(row):
        seen.append(row.id)
        return 2.0 * row.measured_ttft_ms, row.measured_tpot_ms

    results = run_grouped(rows, predictor, release=lambda: released.append(list(seen)),
                          progress=lambda d, t, label: ticks.append((d, t, label)))
    assert [r.row.id for r in results] == ["x_c4_1", "y_c4_2", "z_c4_3", "w_c4_4"]
    assert all(r.ttft_ms == 20.0 for r in results)
    assert seen == ["y_c4_2", "w_c4_4", "x_c4_1", "z_c4_3"]  # one system at a time: synth_gpu, sys_a, sys_b
    assert released == [["y_c4_2"], ["y_c4_2", "w_c4_4"], seen]
    assert [d for d, _, _ in ticks] == [1, 2, 3, 4] and {t for _, t, _ in ticks} == {4}
    assert [label for _, _, label in ticks] == [f"{sp.SYSTEM} trtllm", "sys_a trtllm", "sys_b trtllm", "sys_b trtllm"]


def test_bounded_estimator_cache_predicts_the_same(synth, tmp_path):
    """Evicting and releasing estimators changes no prediction: every cache is keyed by what it
    depends on."""
    from infercast.ops import base as ops_base
    from infercast.validate.predict import EstimatorCache
    from infercast.validate.report import run_validation
    from infercast.validate.serving_predict import serving_predictor

    rows = load_rows(_csv(tmp_path / "s.csv", [
        _agg("a_c4_1"), _agg("b_c4_2", tp="2"), _agg("c_c8_3", conc="8"), _agg("d_c4_4", tp="2", isl="256"),
        _agg("e_c2_5", conc="2"),
    ]))
    roomy = EstimatorCache(synth.systems_dir)
    tight = EstimatorCache(synth.systems_dir, max_estimators=1)
    first = run_validation(rows, serving_predictor(roomy))
    assert all(r.predicted for r in first), [r.error for r in first]
    assert len(roomy._estimators) == 2
    second = run_validation(rows, serving_predictor(tight))
    assert len(tight._estimators) == 1
    tight.release()
    assert len(tight._estimators) == 0 and not ops_base._SHARED
    third = run_validation(rows, serving_predictor(tight))
    for a, b, c in zip(first, second, third):
        assert (a.ttft_ms, a.tpot_ms, a.note) == (b.ttft_ms, b.tpot_ms, b.note) == (c.ttft_ms, c.tpot_ms, c.note)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_row_progress_modes_on_a_non_terminal(mode, capsys):
    import io

    from infercast.report.progress import RowProgress

    buf = io.StringIO()
    with RowProgress(mode, stream=buf) as bar:
        for i in range(1, 21):
            bar.update(i, 20, "sys backend")
    text = buf.getvalue()
    if mode == "off":
        assert text == ""
    else:
        lines = text.splitlines()
        assert lines[0].startswith("infercast validate: 1/20 rows (5%)") and lines[-1].startswith("infercast validate: 20/20")
        assert len(lines) == 11  # the first row, then every 10% of the rows
