"""``infercast support`` and the agreement with a pack's support matrix, on a synthetic pack.

The pack (a fresh copy of :mod:`synthpack` per module, with two extra models and a support
matrix) has known answers: tiny-llama is served by trtllm 1.0 and 1.1 (1.1 borrows its GEMM table
through reuse.yaml) but not by trtllm 0.9 (no generation-attention table in it or older) nor vllm
2.0 (no context-attention table anywhere); the foreign-family model is not modelled; deep-llama's
weights (~22 GB) exceed one 16 GiB GPU and fit TP 2.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from cli_helpers import assert_one_line_error, run_cli
from synthpack import (
    DEEP_MODEL_ID,
    FOREIGN_ARCH,
    FOREIGN_MODEL_ID,
    MODEL_ID,
    SYSTEM,
    add_support_models,
    make_pack,
    write_support_matrix,
)

from infercast.data.pack import find_pack
from infercast.data.support_matrix import last_error_line, read_matrix
from infercast.search.support import Probe, Prober, combos, compare, reason_group, support_rows

FP8_ID = "synth/tiny-llama-fp8"
LLAMA = "LlamaForCausalLM"

#: (matrix row, whether infercast answers it, the start of its reason group)
MATRIX = [
    (dict(model=MODEL_ID, arch=LLAMA, backend="trtllm", version="1.0", mode="agg", status="PASS"), True, None),
    (dict(model=MODEL_ID, arch=LLAMA, backend="trtllm", version="1.0", mode="disagg", status="PASS"), True, None),
    (dict(model=MODEL_ID, arch=LLAMA, backend="trtllm", version="0.9", mode="agg", status="PASS"), False,
     "NotAvailableError: no generation_attention table for trtllm <version> on <system>"),
    (dict(model=MODEL_ID, arch=LLAMA, backend="vllm", version="2.0", mode="agg", status="PASS"), False,
     "NotAvailableError: no context_attention table for vllm <version> on <system>"),
    (dict(model=FOREIGN_MODEL_ID, arch=FOREIGN_ARCH, backend="trtllm", version="1.0", mode="agg", status="PASS"),
     False, f"UnsupportedModelError: model family {FOREIGN_ARCH} (<model>) is not modelled yet"),
    (dict(model=DEEP_MODEL_ID, arch=LLAMA, backend="trtllm", version="1.0", mode="agg", status="PASS", gpus=1),
     False, "does not fit: the weights take N GB per GPU on tp1 (N GPU)"),
    (dict(model=DEEP_MODEL_ID, arch=LLAMA, backend="trtllm", version="1.0", mode="agg", status="FAIL", gpus=2,
          error="ValueError: no config fits"), True, None),
    (dict(model=FP8_ID, arch=LLAMA, backend="trtllm", version="1.1", mode="disagg", status="FAIL",
          error="RuntimeError: boom"), True, None),
    (dict(model=MODEL_ID, arch=LLAMA, backend="vllm", version="2.0", mode="disagg", status="HW_INCOMPATIBLE",
          error="synth_gpu cannot"), False, "NotAvailableError: no context_attention table"),
]


@pytest.fixture(scope="module")
def spack(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("supportpack"))
    add_support_models(p)
    write_support_matrix(p, [row for row, _, _ in MATRIX])
    return p


@pytest.fixture(scope="module")
def agreement(spack):
    return compare(Prober(Probe(), systems_path=spack.systems_dir), read_matrix(find_pack(spack.systems_dir)))


def test_matrix_is_read_with_budgets_and_error_lines(spack):
    rows = read_matrix(find_pack(spack.systems_dir))
    assert len(rows) == len(MATRIX)
    assert [r.total_gpus for r in rows] == [row.get("gpus", 8) for row, _, _ in MATRIX]
    assert rows[6].error == "ValueError: no config fits"
    assert rows[0].error == "" and rows[0].passed and not rows[6].passed
    assert (rows[0].isl, rows[0].osl) == (256, 256)
    assert last_error_line('Traceback\\n  File "a"\\nKeyError: x\\n') == "KeyError: x"


def test_each_row_answered_as_known(agreement):
    assert len(agreement.pairs) == len(MATRIX)
    for (m, r), (row, ok, group) in zip(agreement.pairs, MATRIX):
        assert (m.model, m.version, m.mode, m.status) == (row["model"], row["version"], row["mode"], row["status"])
        assert r.supported is ok, (row, r.reason)
        if ok:
            assert r.reason is None and r.ttft_ms > 0 and r.tpot_ms > 0 and r.layout
        else:
            assert r.reason and r.group.startswith(group), (r.group, group)


def test_agreement_summary_is_hand_known(agreement):
    s = agreement.summary()
    assert s["pass_rows"] == 6
    assert s["pass_answered"] == 2
    assert s["coverage"] == pytest.approx(2 / 6)
    assert sum(s["pass_missed_by_reason"].values()) == 4
    assert len(s["pass_missed_by_reason"]) == 4  # four distinct causes, one row each
    assert s["other_rows"] == {"FAIL": 2, "HW_INCOMPATIBLE": 1}
    assert s["other_answered"] == {"FAIL": 2}
    assert agreement.coverage_by("backend") == {"trtllm": (2, 5), "vllm": (0, 1)}
    assert agreement.coverage_by("architecture") == {FOREIGN_ARCH: (0, 1), LLAMA: (2, 5)}


def test_budget_picks_the_smallest_layout_that_holds_the_model(spack):
    pr = Prober(systems_path=spack.systems_dir)
    assert pr.probe_combo(MODEL_ID, SYSTEM, "trtllm", "1.0")["agg"].layout == "tp1"
    one = pr.probe_combo(DEEP_MODEL_ID, SYSTEM, "trtllm", "1.0", max_gpus=1)
    assert not one["agg"].supported and one["agg"].reason.startswith("does not fit")
    two = pr.probe_combo(DEEP_MODEL_ID, SYSTEM, "trtllm", "1.0", max_gpus=2)
    assert two["agg"].supported and two["agg"].layout == "tp2" and two["agg"].gpus == 2
    assert two["disagg"].supported and two["disagg"].gpus == 4  # one prefill + one decode worker
    n = pr.probed
    pr.probe_combo(DEEP_MODEL_ID, SYSTEM, "trtllm", "1.0", max_gpus=2)
    assert pr.probed == n  # memoised


def test_reason_group_strips_names_and_numbers():
    g = reason_group("no fp8 MoE data for trtllm 1.3.0rc23 on h200_sxm: hidden=7168 (available: a, b)",
                     model="m/x", system="h200_sxm", version="1.3.0rc23")
    assert g == "no fp8 MoE data for trtllm <version> on <system>: hidden=N"
    assert reason_group("model family X (org/m-1.5) tp 8", model="org/m-1.5") == "model family X (<model>) tp N"
    # a version inside a longer token is left alone
    assert reason_group("v 1.0.1 and 1.0", version="1.0") == "v 1.0.1 and <version>"


def test_combos_default_versions_are_the_slots(spack):
    pack = find_pack(spack.systems_dir)
    got = combos(pack, models=MODEL_ID)
    assert [(c.backend, c.version) for c in got] == [("trtllm", "1.0"), ("trtllm", "0.9"), ("trtllm", "1.1"),
                                                      ("vllm", "2.0")]
    assert {c.version for c in combos(pack, models=MODEL_ID, backends="vllm", versions="all")} == {"1.5", "2.0"}
    assert [c.version for c in combos(pack, models=MODEL_ID, backends="trtllm", versions="next")] == ["1.1"]
    rows = support_rows(Prober(systems_path=spack.systems_dir), got, ["agg"])
    assert [r.supported for r in rows] == [True, False, True, False]


# ---- CLI -------------------------------------------------------------------------------------------


def test_cli_csv(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--model", MODEL_ID,
                                    "--backend", "trtllm", "--csv", "--quiet"])
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["version"], r["mode"], r["supported"]) for r in rows] == [
        ("1.0", "agg", "yes"), ("1.0", "disagg", "yes"), ("0.9", "agg", "no"), ("0.9", "disagg", "no"),
        ("1.1", "agg", "yes"), ("1.1", "disagg", "yes")]
    assert rows[2]["reason"].startswith("NotAvailableError: no generation_attention table")
    assert rows[0]["layout"] == "tp1" and float(rows[0]["ttft_ms"]) > 0


def test_cli_json_and_mode_filter(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--model",
                                    f"{MODEL_ID},{FOREIGN_MODEL_ID}", "--backend-version", "current", "--mode",
                                    "disagg", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["probe"]["isl"] == 256
    got = {(r["model"], r["backend"], r["version"], r["mode"]): r["supported"] for r in d["rows"]}
    assert got == {(MODEL_ID, "trtllm", "1.0", "disagg"): True, (FOREIGN_MODEL_ID, "trtllm", "1.0", "disagg"): False,
                   (MODEL_ID, "vllm", "2.0", "disagg"): False, (FOREIGN_MODEL_ID, "vllm", "2.0", "disagg"): False}


def test_cli_against_pack_json(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--against-pack", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["summary"]["pass_rows"] == 6 and d["summary"]["pass_answered"] == 2
    assert sum(r["pack_status"] == "FAIL" and r["supported"] for r in d["rows"]) == 2


def test_cli_table(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--model", DEEP_MODEL_ID,
                                    "--backend", "trtllm", "--backend-version", "1.0", "--max-gpus", "1"])
    assert rc == 0, err
    assert "does not fit" in out and "0 of 2 combinations supported" in out


@pytest.mark.parametrize("argv, needles", [
    (["--model", "nope/model"], ["--model nope/model", MODEL_ID]),
    (["--system", "h900"], ["--system h900", SYSTEM]),
    (["--backend", "tensorrt"], ["--backend tensorrt", "trtllm, vllm"]),
    (["--backend-version", "9.9"], ["--backend-version 9.9", "1.0", "2.0"]),
    (["--mode", "both"], ["--mode both", "agg, disagg"]),
    (["--isl", "0"], ["--isl must be >= 1"]),
    (["--csv", "--json"], ["--json and --csv"]),
])
def test_cli_bad_filters(spack, capsys, argv, needles):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), *argv])
    assert_one_line_error(rc, out, err, *needles)


def test_cli_against_pack_csv_has_the_pack_status(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--against-pack", "--csv",
                                    "--backend", "vllm", "--quiet"])
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["mode"], r["supported"], r["pack_status"]) for r in rows] == [
        ("agg", "no", "PASS"), ("disagg", "no", "HW_INCOMPATIBLE")]


def test_cli_against_pack_table(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--against-pack", "--quiet"])
    assert rc == 0, err
    assert "PASS rows answered: 2 / 6 (33.3%)" in out
    assert "FAIL 2 (infercast answers 2)" in out and "HW_INCOMPATIBLE 1 (infercast answers 0)" in out
    assert "ValueError: no config fits" in out  # the reference's error beside a FAIL row infercast answers


def test_jobs_give_the_serial_answers_bit_for_bit(spack, agreement):
    matrix = read_matrix(find_pack(spack.systems_dir))
    par = compare(Prober(Probe(), systems_path=spack.systems_dir), matrix, jobs=2)
    assert [r for _, r in par.pairs] == [r for _, r in agreement.pairs]
    assert [r.ttft_ms for _, r in par.pairs] == [r.ttft_ms for _, r in agreement.pairs]


def test_cli_bad_jobs(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--jobs", "0"])
    assert_one_line_error(rc, out, err, "--jobs must be >= 1")


def test_cli_against_pack_without_a_matrix(synth, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(synth.systems_dir), "--against-pack"])
    assert_one_line_error(rc, out, err, "no support_matrix/*.csv")


def test_cli_against_pack_filters_select_no_row(spack, capsys):
    rc, out, err = run_cli(capsys, ["support", "--systems-path", str(spack.systems_dir), "--against-pack",
                                    "--backend-version", "1.1", "--mode", "agg"])
    assert_one_line_error(rc, out, err, "no row for the filters", SYSTEM)
