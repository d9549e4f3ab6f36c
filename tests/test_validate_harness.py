"""Tests of the fidelity harness: silicon CSV reader, metrics, runner and report writers."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

from infercast.errors import (
    DataFileError,
    InfercastError,
    InvalidInputError,
    NotAvailableError,
    UnknownSystemError,
)
from infercast.validate import (
    RowResult,
    SiliconRow,
    WorkerSpec,
    error_stats,
    load_ids,
    load_rows,
    plot_error_vs_concurrency,
    render_console,
    run_validation,
    summarize,
    write_all,
)

HEADER = (
    "id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
    "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
    "moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,"
    "prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,"
    "decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,decode_moe_tp_size,"
    "decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms"
).split(",")

def _real_csv() -> Path:
    """The installed pack's silicon_sample.csv (a path that does not exist when no pack is found)."""
    try:
        from infercast.validate.cli import default_silicon_csv

        return Path(default_silicon_csv())
    except Exception:  # no pack installed: the real-data test is skipped
        return Path("/nonexistent/silicon_sample.csv")


REAL_CSV = _real_csv()
#: the fidelity rows' folder: ``shared/fidelity`` beside the checkout (or beside its worktrees' parent)
FIDELITY = next((p / "shared" / "fidelity" for p in Path(__file__).resolve().parents
                 if (p / "shared" / "fidelity").is_dir()), Path("shared") / "fidelity")


def _agg(id_, source, ttft, tpot, *, system="h100_sxm", bs="8", tp="2", pp="1", adp="", moe_tp="", moe_ep="0"):
    return {
        "id": id_,
        "silicon_data_source": source,
        "backend": "trtllm",
        "backend_version": "1.0.0rc3",
        "model_path": "Qwen/Qwen3-32B",
        "system": system,
        "precision": "fp8",
        "mode": "agg",
        "isl": "1024",
        "osl": "128",
        "gemm_quant_mode": "fp8",
        "moe_quant_mode": "",
        "batch_size": bs,
        "tp_size": tp,
        "pp_size": pp,
        "attention_dp_size": adp,
        "moe_tp_size": moe_tp,
        "moe_ep_size": moe_ep,
        "silicon_ttft_ms": ttft,
        "silicon_tpot_ms": tpot,
    }


def _disagg(id_, source, ttft, tpot, *, workers: tuple[str, str] = ("", ""), decode_bs=""):
    return {
        "id": id_,
        "silicon_data_source": source,
        "backend": "sglang",
        "backend_version": "",
        "model_path": "deepseek-ai/DeepSeek-R1",
        "system": "b200_sxm",
        "precision": "fp4",
        "mode": "disagg",
        "isl": "8192",
        "osl": "1024",
        "gemm_quant_mode": "nvfp4",
        "moe_quant_mode": "nvfp4",
        "prefill_batch_size": "1.0" if workers[0] else "",
        "prefill_num_workers": workers[0],
        "prefill_tp_size": "4.0",
        "prefill_pp_size": "1.0",
        "prefill_attention_dp_size": "1.0",
        "prefill_moe_tp_size": "1.0",
        "prefill_moe_ep_size": "4.0",
        "decode_batch_size": decode_bs,
        "decode_num_workers": workers[1],
        "decode_tp_size": "8.0",
        "decode_pp_size": "1.0",
        "decode_attention_dp_size": "1.0",
        "decode_moe_tp_size": "1.0",
        "decode_moe_ep_size": "8.0",
        "silicon_ttft_ms": ttft,
        "silicon_tpot_ms": tpot,
    }


ROWS = [
    # 1: agg, concurrency in the source; empty/0 sizes mean 1. Predicted x1.1.
    _agg("qwen_h100_trtllm_agg_1024x128_c8_a", "source_file=a.csv; silicon_concurrency=8; wip=False", "100", "10"),
    # 2: agg, concurrency only in the id; unparsable pp_size; attention DP 2. Predicted x1.5.
    _agg("qwen_h100_trtllm_agg_1024x128_c16_b", "source_file=b.csv", "200", "20", pp="x", adp="2.0"),
    # 3: disagg with worker counts (fully specified). Predicted x0.8.
    _disagg(
        "dsr1_b200_sglang_disagg_8192x1024_c32_cfg1",
        "db-dump/2026-04-27; config_id=1; silicon_concurrency=32; measured=2026-01-01",
        "400",
        "40",
        workers=("1.0", "2.0"),
        decode_bs="16.0",
    ),
    # 4 and 7: disagg without worker counts -> the fake predictor cannot do them.
    _disagg("dsr1_b200_sglang_disagg_8192x1024_c64_tp8_ep8_4", "source_file=c.csv; silicon_concurrency=64", "500", "50"),
    # 5: agg with a NaN TTFT. Predicted x1.1 on TPOT.
    _agg("qwen_h100_trtllm_agg_1024x128_c32_e", "silicon_concurrency=32", "nan", "30", bs="32"),
    # 6: agg with the system value missing -> the fake predictor raises UnknownSystemError.
    _agg("qwen_x_trtllm_agg_1024x128_c4_f", "silicon_concurrency=4", "60", "6", system="", bs="4"),
    _disagg("dsr1_b200_sglang_disagg_8192x1024_c128_tp8_ep8_7", "source_file=c.csv; silicon_concurrency=128", "700", "70"),
]

FACTOR = {
    "qwen_h100_trtllm_agg_1024x128_c8_a": 1.1,
    "qwen_h100_trtllm_agg_1024x128_c16_b": 1.5,
    "dsr1_b200_sglang_disagg_8192x1024_c32_cfg1": 0.8,
    "qwen_h100_trtllm_agg_1024x128_c32_e": 1.1,
}


def _write(path: Path, rows, header=HEADER) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k in header})
    return path


def fake_predictor(row: SiliconRow) -> tuple[float, float]:
    if not row.system:
        raise UnknownSystemError(f"unknown system {row.system!r}", available=["h100_sxm"])
    if not row.fully_specified:
        raise NotAvailableError("disagg row lacks worker counts")
    f = FACTOR[row.id]
    ttft = (row.measured_ttft_ms or 300.0) * f
    return ttft, row.measured_tpot_ms * f


@pytest.fixture()
def sample(tmp_path: Path) -> Path:
    return _write(tmp_path / "silicon.csv", ROWS)


@pytest.fixture()
def rows(sample: Path) -> list[SiliconRow]:
    return load_rows(sample)


# --------------------------------------------------------------------------- reader


def test_parsed_fields(rows: list[SiliconRow]) -> None:
    assert len(rows) == 7
    a, b, c, d, e, f, g = rows
    assert a.id == "qwen_h100_trtllm_agg_1024x128_c8_a"
    assert (a.backend, a.backend_version, a.model, a.system, a.mode) == (
        "trtllm",
        "1.0.0rc3",
        "Qwen/Qwen3-32B",
        "h100_sxm",
        "agg",
    )
    assert (a.isl, a.osl, a.concurrency, a.concurrency_source) == (1024, 128, 8, "source")
    assert (a.gemm_quant, a.moe_quant) == ("fp8", None)
    assert (a.measured_ttft_ms, a.measured_tpot_ms) == (100.0, 10.0)
    assert a.worker == WorkerSpec(batch_size=8, tp=2, pp=1, attention_dp=1, moe_tp=1, moe_ep=1)
    assert a.prefill is None and a.decode is None and a.fully_specified
    assert a.problems == ()
    assert a.clients_per_replica() == 8.0

    assert (b.concurrency, b.concurrency_source) == (16, "id")
    assert b.worker == WorkerSpec(batch_size=8, tp=2, pp=1, attention_dp=2, moe_tp=1, moe_ep=1)
    assert b.implied_concurrency == 16
    assert b.clients_per_rank() == 8.0
    assert b.problems == ("pp_size: unparsable number 'x'",)

    assert c.mode == "disagg" and c.worker is None and c.backend_version is None
    assert c.prefill == WorkerSpec(batch_size=1, tp=4, pp=1, attention_dp=1, moe_tp=1, moe_ep=4)
    assert c.decode == WorkerSpec(batch_size=16, tp=8, pp=1, attention_dp=1, moe_tp=1, moe_ep=8)
    assert (c.prefill_workers, c.decode_workers, c.concurrency) == (1, 2, 32)
    assert c.fully_specified and c.implied_concurrency == 32
    assert c.clients_per_replica("decode") == 16.0 and c.clients_per_replica("prefill") == 32.0
    assert c.problems == ()

    assert d.mode == "disagg" and not d.fully_specified
    assert (d.prefill_workers, d.decode_workers, d.concurrency) == (None, None, 64)
    assert d.decode is not None and d.decode.batch_size is None
    assert d.clients_per_replica() is None and d.problems == ()

    assert e.measured_ttft_ms is None and e.measured_tpot_ms == 30.0 and not e.measured
    assert e.problems == ("silicon_ttft_ms: NaN",)

    assert f.system == "" and f.problems == ("system: missing value",)
    assert g.concurrency == 128


def test_problem_kinds(tmp_path: Path) -> None:
    bad = [
        _agg("m_agg_1024x128_c_x", "source_file=z.csv", "-1", "", bs="12", adp="2"),
        _agg("m_agg_1024x128_c4_y", "silicon_concurrency=8", "1", "2"),
        dict(_agg("m_1024x128_c4_z", "silicon_concurrency=4", "1", "2"), mode="", isl="abc"),
    ]
    rows = load_rows(_write(tmp_path / "bad.csv", bad))
    x, y, z = rows
    assert (x.concurrency, x.concurrency_source) == (24, "derived")
    assert x.measured_ttft_ms is None and x.measured_tpot_ms is None
    assert x.problems == (
        "silicon_ttft_ms: non-positive (-1)",
        "silicon_tpot_ms: missing value",
        "concurrency: not in silicon_data_source or id; derived from the batch columns as 24",
    )
    assert y.concurrency == 8 and y.problems == (
        "concurrency: silicon_concurrency=8 disagrees with id token _c4_; using 8",
    )
    assert z.mode == "agg" and z.isl is None
    assert z.problems == ("mode: missing value; taken as 'agg'", "isl: unparsable number 'abc'")


def test_short_row_and_duplicate_id(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    good = _agg("m_agg_1024x128_c4_y", "silicon_concurrency=4", "1", "2")
    _write(path, [good, good])
    with path.open("a") as fh:
        fh.write("m_agg_1024x128_c2_short,silicon_concurrency=2,vllm\n")
    rows = load_rows(path)
    assert len(rows) == 3
    assert rows[1].problems == ("id: duplicate of the row on line 2",)
    short = rows[2]
    assert short.backend == "vllm" and short.concurrency == 2
    assert "model_path: missing value" in short.problems
    assert "silicon_tpot_ms: missing value" in short.problems


def test_ids_filter_and_load_ids(sample: Path, tmp_path: Path) -> None:
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# dev\nqwen_h100_trtllm_agg_1024x128_c8_a\n\n  dsr1_b200_sglang_disagg_8192x1024_c32_cfg1  \n")
    ids = load_ids(ids_file)
    assert ids == {"qwen_h100_trtllm_agg_1024x128_c8_a", "dsr1_b200_sglang_disagg_8192x1024_c32_cfg1"}
    assert [r.id for r in load_rows(sample, ids)] == [
        "qwen_h100_trtllm_agg_1024x128_c8_a",
        "dsr1_b200_sglang_disagg_8192x1024_c32_cfg1",
    ]
    with pytest.raises(DataFileError):
        load_ids(tmp_path / "nope.txt")
    with pytest.raises(DataFileError):
        load_rows(tmp_path / "nope.csv")


def test_missing_columns(tmp_path: Path) -> None:
    header = [h for h in HEADER if h not in ("isl", "silicon_tpot_ms")]
    path = _write(tmp_path / "cols.csv", ROWS[:1], header=header)
    with pytest.raises(InvalidInputError) as info:
        load_rows(path)
    msg = str(info.value)
    assert "lacks required columns: isl, silicon_tpot_ms" in msg
    assert "columns found: id, silicon_data_source, backend" in msg
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InvalidInputError, match="no header row"):
        load_rows(empty)


# --------------------------------------------------------------------------- metrics


def test_error_stats_by_hand() -> None:
    nan = float("nan")
    s = error_stats([110.0, 300.0, nan, 80.0, 5.0], [100.0, 200.0, 50.0, 100.0, nan])
    assert s["n"] == 3
    assert s["median_ape"] == pytest.approx(0.2)
    assert s["mape"] == pytest.approx((0.1 + 0.5 + 0.2) / 3)
    assert s["within20"] == pytest.approx(2 / 3)
    assert s["bias"] == pytest.approx(0.1)
    assert s["gmr"] == pytest.approx((1.1 * 1.5 * 0.8) ** (1 / 3))
    empty = error_stats([nan], [1.0])
    assert empty == {"n": 0, "median_ape": None, "mape": None, "within20": None, "bias": None, "gmr": None}
    with pytest.raises(InvalidInputError):
        error_stats([1.0, 2.0], [1.0])


def test_run_and_summarize(rows: list[SiliconRow]) -> None:
    results = run_validation(rows, fake_predictor)
    assert [r.predicted for r in results] == [True, True, True, False, True, False, False]
    # rows the CSV does not specify never reach the predictor: input-data issues naming the columns
    assert results[3].error == ("InputData: prefill_num_workers and decode_num_workers: missing value "
                                "(a disaggregated row needs both worker counts)")
    assert results[3].error_kind == "InputData"
    assert results[5].error == "InputData: system: missing value (empty cell)"
    # the NaN TTFT of row 5 is an issue, not a blocking one: the row is scored on its TPOT
    assert [str(i) for i in results[4].issues] == ["silicon_ttft_ms: NaN ('nan')"]

    s = summarize(results)
    assert (s["rows"], s["predicted"]) == (7, 4)
    assert s["coverage"] == pytest.approx(4 / 7)
    # TTFT: APEs 0.1, 0.5, 0.2 (row 5 has no measured TTFT).
    assert s["ttft_n"] == 3
    assert s["ttft_median_ape"] == pytest.approx(0.2)
    assert s["ttft_mape"] == pytest.approx(0.8 / 3)
    assert s["ttft_within20"] == pytest.approx(2 / 3)
    assert s["ttft_bias"] == pytest.approx(0.1)
    assert s["ttft_gmr"] == pytest.approx((1.1 * 1.5 * 0.8) ** (1 / 3))
    # TPOT: APEs 0.1, 0.5, 0.2, 0.1; signed -0.2, 0.1, 0.1, 0.5.
    assert s["tpot_n"] == 4
    assert s["tpot_median_ape"] == pytest.approx(0.15)
    assert s["tpot_mape"] == pytest.approx(0.9 / 4)
    assert s["tpot_within20"] == pytest.approx(0.75)
    assert s["tpot_bias"] == pytest.approx(0.1)
    assert s["tpot_gmr"] == pytest.approx((1.1 * 1.5 * 0.8 * 1.1) ** 0.25)

    assert list(s["by"]) == ["mode", "backend", "system", "model"]
    agg, dis = s["by"]["mode"]["agg"], s["by"]["mode"]["disagg"]
    assert (agg["rows"], agg["predicted"], dis["rows"], dis["predicted"]) == (4, 3, 3, 1)
    assert agg["ttft_median_ape"] == pytest.approx(0.3)
    assert dis["tpot_median_ape"] == pytest.approx(0.2) and dis["tpot_bias"] == pytest.approx(-0.2)
    assert list(s["by"]["system"]) == ["(none)", "b200_sxm", "h100_sxm"]
    assert s["by"]["system"]["(none)"]["coverage"] == 0.0
    assert s["by"]["system"]["(none)"]["ttft_median_ape"] is None
    json.dumps(s)  # JSON-serialisable as-is

    with pytest.raises(InvalidInputError, match="cannot group"):
        summarize(results, by=("colour",))


def test_summarize_compound_groups(rows: list[SiliconRow]) -> None:
    """``a+b`` groups by each combination of the two attributes, with the same statistics as the
    rows of that combination summarised alone."""
    results = run_validation(rows, fake_predictor)
    s = summarize(results, by=("mode+system", "backend"))
    assert list(s["by"]) == ["mode+system", "backend"]
    combos = s["by"]["mode+system"]
    expected = sorted({f"{r.row.mode or '(none)'} | {r.row.system or '(none)'}" for r in results})
    assert sorted(combos) == expected
    for label, block in combos.items():
        mode, system = label.split(" | ")
        alone = summarize([r for r in results if (r.row.mode or "(none)") == mode and (r.row.system or "(none)") == system], by=())
        top_only = ("by", "unpredicted", "input_issues")  # counts of the whole run, not per group
        assert {k: block[k] for k in alone if k not in top_only} == {k: v for k, v in alone.items() if k not in top_only}
    assert sum(b["rows"] for b in combos.values()) == len(results)
    with pytest.raises(InvalidInputError, match="cannot group validation results by 'colour'"):
        summarize(results, by=("mode+colour",))


def test_runner_contract(rows: list[SiliconRow]) -> None:
    def buggy(row: SiliconRow) -> tuple[float, float]:
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        run_validation(rows, buggy)

    out = run_validation(rows[:2], lambda r: (float("nan"), 1.0, "nearest version"))
    assert out[0].error == "InvalidPrediction: predicted TTFT is not a finite positive latency (nan)"
    assert out[0].note == "nearest version" and not out[0].predicted

    seen = []
    out = run_validation(rows[:2], lambda r: (1.0, 2.0, "n"), progress=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2), (2, 2)] and out[1].note == "n"
    with pytest.raises(TypeError):
        run_validation(rows[:1], lambda r: 5.0)  # type: ignore[arg-type, return-value]


# --------------------------------------------------------------------------- reports


def test_reports_written(rows: list[SiliconRow], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Force the "matplotlib missing" path so this test does not depend on it.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    results = run_validation(rows, fake_predictor)
    summary = summarize(results)
    written = write_all(results, tmp_path / "out", summary=summary, meta={"ids": "test"})
    assert set(written) == {"csv", "json", "markdown", "html"}
    assert plot_error_vs_concurrency(results, tmp_path / "p.png") is None

    with written["csv"].open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 7
    first = table[0]
    assert first["id"] == "qwen_h100_trtllm_agg_1024x128_c8_a" and first["concurrency"] == "8"
    assert float(first["predicted_ttft_ms"]) == pytest.approx(110.0)
    assert float(first["ttft_ape"]) == pytest.approx(0.1)
    assert table[3]["predicted_ttft_ms"] == "" and table[3]["error"].startswith("InputData: prefill_num_workers")
    assert table[4]["measured_ttft_ms"] == "" and table[4]["ttft_ape"] == ""

    assert json.loads(written["json"].read_text())["predicted"] == 4

    md = written["markdown"].read_text()
    for heading in (
        "## Overall",
        "## By mode",
        "## By backend",
        "## By system",
        "## By model",
        "## Worst 20 rows by TTFT APE",
        "## Worst 20 rows by TPOT APE",
        "## Unpredictable rows",
        "## Input data issues",
    ):
        assert heading in md
    assert ("| 2 | InputData: prefill_num_workers and decode_num_workers: missing value (a disaggregated row "
            "needs both worker counts) |") in md
    assert "| 1 | InputData: system: missing value (empty cell) |" in md
    assert "| 3 | InputData |" in md
    assert "| agg | 3/4 | 75.0% | 30.0% |" in md
    assert "Plot not available" in md
    # Worst TTFT row first: row 2 at +50%.
    worst = md.split("## Worst 20 rows by TTFT APE", 1)[1]
    assert worst.index("qwen_h100_trtllm_agg_1024x128_c16_b") < worst.index("qwen_h100_trtllm_agg_1024x128_c8_a")
    assert "+50.0%" in worst

    page = written["html"].read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page and "Unpredictable rows" in page
    assert "system: missing value (empty cell)" in page

    console = render_console(summary)
    from rich.console import Console

    con = Console(record=True, width=200)
    con.print(console)
    text = con.export_text()
    assert "mode=agg" in text and "backend=sglang" in text


def test_plot_when_matplotlib_present(rows: list[SiliconRow], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = run_validation(rows, fake_predictor)
    written = write_all(results, tmp_path / "out")
    png = written["plot"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in written["html"].read_text()
    assert "![signed error vs concurrency](error_vs_concurrency.png)" in written["markdown"].read_text()


# --------------------------------------------------------------------------- real data


@pytest.mark.skipif(
    not (REAL_CSV.exists() and (FIDELITY / "dev_fullspec_ids.txt").exists()),
    reason="silicon_sample.csv or the dev id lists are not available",
)
def test_real_csv_dev_fullspec() -> None:
    ids = load_ids(FIDELITY / "dev_fullspec_ids.txt")
    rows = load_rows(REAL_CSV, ids)
    assert len(rows) == 1924
    assert {r.id for r in rows} == ids
    assert all(r.fully_specified for r in rows)
    assert all(r.concurrency is not None and r.concurrency > 0 for r in rows)
    assert all(r.measured and r.isl and r.osl for r in rows)
    # Structured facts from the fidelity README (counted on these dev rows, no per-row output).
    assert sum(r.mode == "disagg" for r in rows) == 132
    assert all(isinstance(r.worker, WorkerSpec) for r in rows if r.mode == "agg")


def test_rowresult_properties(rows: list[SiliconRow]) -> None:
    r = RowResult(rows[0], 90.0, 12.0)
    assert r.predicted and r.ttft_signed == pytest.approx(-0.1) and r.tpot_ape == pytest.approx(0.2)
    missing = RowResult(rows[4], 1.0, 1.0)
    assert missing.ttft_ape is None and not math.isnan(missing.tpot_ape or 0.0)
    failed = RowResult(rows[0], None, None, error="X: y", error_kind="X")
    assert not failed.predicted and failed.ttft_ape is None
    assert issubclass(NotAvailableError, InfercastError)


def test_reference_benchmark_parses_the_reference_output_and_needs_a_reference(capsys, monkeypatch):
    """benchmarks.reference reads TTFT / TPOT / memory from the reference's printed estimate, and
    without a reference to run says how to get one (exit 2) instead of failing later."""
    from benchmarks import reference as ref

    text = "  TTFT:             1265.208 ms\n  TPOT:             8.351 ms\n  Memory (GPU):     25.19 GB\n"
    assert ref.parse_reference(text) == {"ttft_ms": 1265.208, "tpot_ms": 8.351, "memory_gb": 25.19}
    assert ref.parse_reference("no estimate here") == {}
    argv = ref.reference_argv(["aic"], ref.Config("m/x", "h200_sxm", "vllm", 4, 8, 100, 10, moe_tp=1, moe_ep=4))
    assert argv[:3] == ["aic", "cli", "estimate"] and argv[argv.index("--moe-ep-size") + 1] == "4"
    monkeypatch.delenv("INFERCAST_REFERENCE", raising=False)
    monkeypatch.setattr(ref.shutil, "which", lambda _: None)
    assert ref.main(["--reference", "/nonexistent/aiconfigurator"]) == 2
    assert "no reference found" in capsys.readouterr().err


# --------------------------------------------------------------------------- CLI on bad input
#
# These run `infercast validate` in-process on the synthetic pack (fast, no real data needed).


def _synth_agg(id_: str, source: str, *, osl: str = "8", bs: str = "4", tpot: str = "1") -> dict[str, str]:
    import synthpack as sp

    row = _agg(id_, source, "10", tpot, system=sp.SYSTEM, bs=bs, tp="1")
    row.update(model_path=sp.MODEL_ID, gemm_quant_mode="", isl="128", osl=osl)
    return row


def _synth_disagg_without_concurrency() -> dict[str, str]:
    """Worker counts given, but no _c<N>_ in the id, no silicon_concurrency=N, no decode batch."""
    import synthpack as sp

    row = _disagg("synth_disagg_128x8_cfg9", "source_file=x.csv", "10", "1", workers=("1.0", "1.0"), decode_bs="")
    row.update(
        model_path=sp.MODEL_ID, system=sp.SYSTEM, backend="trtllm", gemm_quant_mode="", moe_quant_mode="",
        isl="128", osl="8", prefill_tp_size="1", prefill_moe_ep_size="", decode_tp_size="1", decode_moe_ep_size="",
    )
    return row


def _validate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from infercast.cli.main import main

    code = main(["validate", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def _results_by_id(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


NO_CONCURRENCY = "InputData: concurrency: not in silicon_data_source (silicon_concurrency=N), the id (_c<N>_) or the batch columns"


def test_validate_row_without_concurrency_is_reported_and_the_run_goes_on(synth, tmp_path, capsys) -> None:
    """A row with no concurrency anywhere (id, silicon_data_source, batch columns) is reported
    as not predictable; it neither crashes the run (disagg: int(None)) nor is predicted at an
    assumed concurrency of 1 (agg without batch_size)."""
    agg_no_conc = _synth_agg("synth_agg_128x8_nobatch", "source_file=x.csv", bs="")
    good = _synth_agg("synth_agg_128x8_c4_ok", "silicon_concurrency=4")
    csv_path = _write(tmp_path / "s.csv", [_synth_disagg_without_concurrency(), agg_no_conc, good])
    rows = load_rows(csv_path)
    assert [r.concurrency for r in rows] == [None, None, 4]

    for extra in ([], ["--static"]):
        out = tmp_path / f"out{len(extra)}"
        code, stdout, _ = _validate(
            ["--silicon", str(csv_path), "--systems-path", str(synth.systems_dir), "--json", "--out", str(out), *extra],
            capsys,
        )
        assert code == 0
        assert json.loads(stdout)["predicted"] == 1
        table = _results_by_id(out / "results.csv")
        assert table["synth_agg_128x8_nobatch"]["error"].startswith(NO_CONCURRENCY)
        assert table["synth_agg_128x8_nobatch"]["predicted_ttft_ms"] == ""
        assert table["synth_agg_128x8_c4_ok"]["error"] == "" and float(table["synth_agg_128x8_c4_ok"]["predicted_ttft_ms"]) > 0
        # an input-data issue is found before any model looks at the row (the static model, too)
        assert table["synth_disagg_128x8_cfg9"]["error"].startswith(NO_CONCURRENCY)
        assert "concurrency: not in silicon_data_source" in (out / "report.md").read_text()


def test_load_ids_not_utf8_is_a_typed_error(sample: Path, tmp_path: Path, capsys) -> None:
    ids_file = tmp_path / "ids.bin"
    ids_file.write_bytes(b"\xff\xfe\xfaqwen\n")
    with pytest.raises(DataFileError, match="cannot read id list .*ids.bin: not UTF-8 text"):
        load_ids(ids_file)
    code, _, err = _validate(["--silicon", str(sample), "--ids", str(ids_file)], capsys)
    assert code == 2
    assert "cannot read id list" in _one_line_error(err) and str(ids_file) in err


@pytest.fixture()
def no_prediction(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record calls of the prediction loop of `infercast validate` (a flag error must come first)."""
    import infercast.validate.cli as vcli

    calls: list[int] = []
    monkeypatch.setattr(vcli, "run_grouped", lambda rows, predictor, **kw: calls.append(len(rows)) or [])
    return calls


def test_validate_bad_out_fails_before_predicting(synth, sample: Path, tmp_path: Path, capsys, no_prediction) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    base = ["--silicon", str(sample), "--systems-path", str(synth.systems_dir)]

    code, _, err = _validate([*base, "--out", str(afile)], capsys)
    assert code == 2
    assert f"cannot write the report to {afile}: it exists and is not a directory" in _one_line_error(err)

    below_file = afile / "sub"  # mkdir fails (NotADirectoryError), like --out /proc/nope
    code, _, err = _validate([*base, "--out", str(below_file)], capsys)
    assert code == 2
    assert f"cannot create the report directory {below_file}" in _one_line_error(err)
    assert no_prediction == []

    # the writer itself gives the same typed error
    results = run_validation(load_rows(sample), fake_predictor)
    with pytest.raises(DataFileError, match="not a directory"):
        write_all(results, afile)


def test_validate_bad_database_mode_or_systems_path_fails_up_front(
    synth, sample: Path, tmp_path: Path, capsys, no_prediction
) -> None:
    from infercast.ops.base import DatabaseMode
    from infercast.validate.predict import EstimatorCache

    with pytest.raises(InvalidInputError) as info:
        DatabaseMode.parse("BOGUS")
    code, _, err = _validate(
        ["--silicon", str(sample), "--systems-path", str(synth.systems_dir), "--database-mode", "BOGUS"], capsys
    )
    assert code == 2
    assert _one_line_error(err) == f"infercast: error: {info.value}"  # as `estimate` says it
    with pytest.raises(InvalidInputError, match="unknown database mode"):
        EstimatorCache(synth.systems_dir, "BOGUS")
    assert EstimatorCache(synth.systems_dir, "hybrid").database_mode is DatabaseMode.HYBRID

    empty = tmp_path / "systems"
    empty.mkdir()
    code, _, err = _validate(["--silicon", str(sample), "--systems-path", str(empty)], capsys)
    assert code == 2
    assert "holds no system YAML files" in _one_line_error(err) and str(empty) in err
    assert no_prediction == []


def test_osl1_rows_are_compared_on_ttft_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """osl 1: one output token, TPOT undefined. The row keeps its TTFT comparison and stays out
    of the TPOT statistics, whatever TPOT the predictor (0.0) or the CSV (empty) gives."""
    one = dict(_agg("m_agg_1024x1_c8_one", "silicon_concurrency=8", "100", ""), osl="1")
    one_measured = dict(_agg("m_agg_1024x1_c8_two", "silicon_concurrency=8", "200", "7"), osl="1")
    normal = _agg("m_agg_1024x128_c8_three", "silicon_concurrency=8", "100", "10")
    rows = load_rows(_write(tmp_path / "osl1.csv", [one, one_measured, normal]))

    results = run_validation(rows, lambda r: (r.measured_ttft_ms * 1.1, 0.0 if r.osl == 1 else 12.0, "n"))
    assert [r.error for r in results] == [None, None, None]
    assert [r.predicted for r in results] == [True, True, True]
    assert [r.tpot_defined for r in rows] == [False, False, True]
    assert rows[0].measured  # TTFT is all an osl-1 row can measure
    assert results[0].tpot_ms is None and results[0].ttft_ms == pytest.approx(110.0)
    assert results[0].note == "n; osl 1: TPOT undefined, row left out of the TPOT statistics"
    assert results[1].tpot_ape is None and results[1].ttft_ape == pytest.approx(0.1)

    s = summarize(results)
    assert (s["rows"], s["predicted"], s["ttft_n"], s["tpot_n"]) == (3, 3, 3, 1)
    assert s["ttft_median_ape"] == pytest.approx(0.1)
    assert s["tpot_median_ape"] == pytest.approx(0.2) and s["tpot_bias"] == pytest.approx(0.2)

    # metrics alone: a TTFT-only result, and a TPOT given for an osl-1 row is ignored
    direct = [RowResult(rows[0], 120.0, None), RowResult(rows[1], 220.0, 3.5)]
    assert all(r.predicted for r in direct) and direct[1].tpot_signed is None
    d = summarize(direct)
    assert (d["predicted"], d["ttft_n"], d["tpot_n"], d["tpot_median_ape"]) == (2, 2, 0, None)
    assert d["ttft_median_ape"] == pytest.approx(0.15)
    json.dumps(d)

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # the plot's "matplotlib missing" path, even after an import
    written = write_all(results, tmp_path / "out", summary=s)
    table = _results_by_id(written["csv"])
    assert table["m_agg_1024x1_c8_one"]["predicted_tpot_ms"] == "" and table["m_agg_1024x1_c8_one"]["error"] == ""
    assert float(table["m_agg_1024x1_c8_two"]["ttft_ape"]) == pytest.approx(0.1)
    assert "lack a usable measurement" not in written["markdown"].read_text()
