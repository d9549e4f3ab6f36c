"""benchmarks.fidelity_bounds: the best per-group TTFT correction, on rows whose answer is known."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from benchmarks import fidelity_bounds as fb


def _row(backend, system, measured, predicted):
    return {"backend": backend, "system": system, "model": "m", "backend_version": "1",
            "measured_ttft_ms": str(measured), "predicted_ttft_ms": str(predicted)}


# group (a, x): every prediction half the measurement -> a scale of 2 fits all four, no shift can
#               (the errors are 100 / 200 / 400 / 800 ms)
# group (a, y): every prediction 300 ms short of 1000 / 1600 / 2200 ms -> a shift of +300 fits all
#               three, and so does any scale in [1.214, 1.332]; as predicted only 1900 of 2200 is
#               within 15% (700 and 1300 are 30% and 19% short)
# group (b, x): one row 3x over, beyond the grids' reach (scales 0.5x .. 2x, shifts down to -500 ms)
ROWS = ([_row("a", "x", m, m / 2) for m in (200, 400, 800, 1600)]
        + [_row("a", "y", m, m - 300) for m in (1000, 1600, 2200)]
        + [_row("b", "x", 300, 900)])


def test_best_correction_finds_the_exact_scale_and_shift():
    m = np.array([200.0, 400.0, 800.0, 1600.0])
    n, scale, p = fb.best_correction(m, m / 2, shift=False)
    # every scale in [1.74, 2.3] lands the four within 15%; the median APE picks the grid's nearest to 2
    assert n == 4 and scale == pytest.approx(2.0, rel=0.005)
    assert np.allclose(p, m * scale / 2)
    n, shift, _ = fb.best_correction(np.array([1000.0, 1500.0, 2000.0]), np.array([900.0, 1400.0, 1900.0]), shift=True)
    assert n == 3 and shift == pytest.approx(100.0, abs=5.0)


def test_bounds_count_rows_group_by_group():
    out = {b.grouping: b for b in fb.bounds(ROWS, groupings=((), ("backend", "system")))}
    per_group = out[("backend", "system")]
    assert per_group.groups == 3 and per_group.rows == 8
    assert per_group.within_none == 1            # 2200 of (a, y)
    assert per_group.within_scale == 4 + 3 + 0
    # (a, x): a shift s lands a row m within 15% only for s in [0.35 m, 0.65 m], and those ranges
    # ([70, 130], [140, 260], [280, 520], [560, 1040]) do not overlap: one row at most
    assert per_group.within_shift == 1 + 3 + 0
    every = out[()]
    assert every.groups == 1 and every.within_none == 1
    assert every.within_scale <= per_group.within_scale  # one constant for all can only do worse


def test_load_results_skips_unpredicted_rows(tmp_path):
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(ROWS[:2] + [dict(ROWS[2], predicted_ttft_ms="")] + [dict(ROWS[3], measured_ttft_ms="nan")])
    assert len(fb.load_results(path)) == 2


def test_cli_rejects_a_missing_or_foreign_csv(tmp_path, capsys):
    assert fb.main(["--results", str(tmp_path / "none.csv")]) == 2
    assert "no such results CSV" in capsys.readouterr().err
    foreign = tmp_path / "foreign.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="not a validate results CSV"):
        fb.load_results(foreign)


def test_remeasurement_agreement_counts_pairs_of_one_configuration():
    def rerun(measured, predicted="100"):
        return {"mode": "agg", "backend": "a", "system": "x", "model": "m", "isl": "1024", "osl": "1024",
                "concurrency": "4", "measured_ttft_ms": str(measured), "predicted_ttft_ms": predicted}
    # one configuration measured 100 / 110 / 200 ms (a repeat of 100, and 100.05 within 0.1% of it,
    # are the same measurement exported again);
    # pairs: 100 vs 110 -> 9.1% / 10%, 100 vs 200 -> 50% / 100%, 110 vs 200 -> 45% / 81.8%
    rows = [rerun(100), rerun(100), rerun(100.05), rerun(110), rerun(200), rerun(300, predicted="250"), rerun(999, predicted="251")]
    a = fb.remeasurement_agreement(rows)
    assert (a.configurations, a.pairs, a.within) == (1, 6, 2)
    assert a.median_ape == pytest.approx((0.45 + 0.5) / 2)
    assert fb.remeasurement_agreement(rows[5:]).pairs == 0


def _parted(backend, measured, front, wait, prefill):
    return {"backend": backend, "measured_ttft_ms": str(measured), "predicted_ttft_ms": str(front + wait + prefill),
            "note": f"decode batch 4 (clients); TTFT = front end {front} + wait {wait} + prefill {prefill} ms"}


# engine a: measured = 1.5 x front end + wait + prefill, engine b: front end + wait + 0.8 x prefill;
# the exact scales are on the grid and fit with no error, so they win the ties
PARTED = ([_parted("a", 1.5 * f + w + p, f, w, p) for f, w, p in ((100, 10, 20), (200, 5, 400), (50, 300, 60))]
          + [_parted("b", f + w + 0.8 * p, f, w, p) for f, w, p in ((10, 20, 800), (300, 10, 100), (20, 400, 40))]
          + [{"backend": "a", "measured_ttft_ms": "100", "predicted_ttft_ms": "90", "note": "no parts here"}])


def test_ttft_parts_reads_the_note():
    assert fb.ttft_parts(PARTED[0]) == (100.0, 10.0, 20.0)
    assert fb.ttft_parts(PARTED[-1]) is None and fb.ttft_parts({}) is None


def test_part_scales_recover_each_engines_balance():
    per_engine = {b.group: b for b in fb.part_bounds(PARTED, ("backend",))}
    a, b = per_engine[("a",)], per_engine[("b",)]
    assert a.rows == 3 and b.rows == 3                 # the row without parts is left out
    assert a.within_best == 3 and a.scales == (1.5, 1.0, 1.0)
    assert b.within_best == 3 and b.scales == (1.0, 1.0, 0.8)
    # as stated: a's first row 130 vs 180 measured (28% short), b's first 830 vs 670 (24% over)
    assert a.within_none < 3 and b.within_none < 3
    (every,) = fb.part_bounds(PARTED, ())
    assert every.rows == 6 and every.within_best < 6   # one balance for both engines cannot fit all
