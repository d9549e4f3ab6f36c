"""Benchmark recipes as data (src/infercast/validate/recipe_files/*.yaml): the files load and say
where they come from, the generic matcher applies them to rows as the published scripts say, the
recipe data decides conflicts by priority, and the command line `validate --out` writes for a row
reproduces its prediction."""

from __future__ import annotations

import importlib
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from infercast.errors import DataFileError
from infercast.serving.backends import mean_length_ratio, scheduler_params
from infercast.validate.recipes import (
    RECIPE_DIR,
    RecipeBook,
    RowContext,
    load_recipe,
    shipped_recipes,
)
from infercast.validate.silicon import SiliconRow, WorkerSpec

IX = "source_file=2026-04-06.csv; model=m; silicon_concurrency=4"
DUMP = "db-dump/2026-04-27; config_id=1; silicon_concurrency=4"
AIC_H100 = "source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/sglang/0.5.1.post1/Qwen_Qwen3-32B.csv"
AIC_H200 = "source_file=/Users/x/aic-auto-gap-analysis/data/h200_sxm/sglang/0.5.6.post2/m.csv; silicon_concurrency=240"
REEXPORT = "source_file=qwen3.5-397b-gap-analysis.csv; silicon_concurrency=8"
MTP_V, STP_V = "1.2.0rc6.post3", "1.2.0rc6.post2"


def _row(**kw) -> SiliconRow:
    base = dict(id="x", backend="trtllm", backend_version=None, model="m", system="b200_sxm", mode="agg", isl=1024,
                osl=1024, concurrency=4, gemm_quant=None, moe_quant=None, measured_ttft_ms=1.0, measured_tpot_ms=1.0,
                worker=WorkerSpec(batch_size=4, tp=8))
    base.update(kw)
    return SiliconRow(**base)


def _resolve(row, tp=8, adp=1, clients=None, mtp=True, moe=True):
    return shipped_recipes().resolve(row, RowContext(tp, adp, clients, mtp, moe))


def _params(row, **kw):
    s = _resolve(row, **kw)
    return replace(scheduler_params(row.backend), **s.scheduler)


# --------------------------------------------------------------------------- the files


def test_every_shipped_recipe_loads_and_names_its_source() -> None:
    files = sorted(RECIPE_DIR.glob("*.yaml"))
    assert len(files) >= 10
    book = shipped_recipes()
    assert len(book.recipes) == len(files)
    for r in book.recipes:
        assert r.script and r.blocks, r.name
    # the package data is declared, so an installed infercast has the files
    assert "recipe_files/*.yaml" in (Path(__file__).parents[1] / "pyproject.toml").read_text()


def test_fits_are_named_with_their_rows_client_and_constant() -> None:
    fits = shipped_recipes().fits()
    assert fits
    for name, f in fits:
        assert f["fitted_on"] and f["benchmark_client"], name
        const = f.get("constant", "")
        if const.startswith("infercast."):
            mod, attr = const.rsplit(".", 1)
            # the value in the data is the value the code applies
            assert getattr(importlib.import_module(mod), attr) == f["value"], (name, const)


def test_no_model_file_or_date_rule_left_in_the_code() -> None:
    """Matching is generic: the names, sources and versions the recipes key on are in the data."""
    src = Path(__file__).parents[1] / "src" / "infercast" / "validate"
    for name in ("recipes.py", "predict.py", "serving_predict.py", "commands.py", "cli.py"):
        text = (src / name).read_text()
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        code = re.sub(r'"""[\s\S]*?"""', "", code)
        for needle in ("DeepSeek", "Llama", "gpt-oss", "MiniMax", "Qwen", "source_file=", "db-dump", "gap-analysis",
                       "1.2.0rc6", "b200_sxm", "b300_sxm", "h200_sxm", "aic-auto"):
            assert needle not in code, (name, needle)


# --------------------------------------------------------------------------- the matcher


def _write(tmp_path, name, text) -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


def test_equal_priorities_that_disagree_are_an_error(tmp_path) -> None:
    _write(tmp_path, "a", "script: s\napplies_to: {backend: vllm}\nengine:\n  - cmd: vllm serve M --max-num-seqs 8\n")
    _write(tmp_path, "b", "script: s\napplies_to: {backend: vllm}\nengine:\n  - cmd: vllm serve M --max-num-seqs 16\n")
    book = RecipeBook.load(tmp_path)
    with pytest.raises(DataFileError, match="both set max_batch_size"):
        book.resolve(_row(backend="vllm"), RowContext(1, 1))
    # a higher priority wins
    _write(tmp_path, "b", "script: s\npriority: 2\napplies_to: {backend: vllm}\nengine:\n"
                          "  - cmd: vllm serve M --max-num-seqs 16\n")
    got = RecipeBook.load(tmp_path).resolve(_row(backend="vllm"), RowContext(1, 1))
    assert got.scheduler == {"max_batch_size": 16} and got.recipes == ["a", "b"]


@pytest.mark.parametrize(("text", "msg"), [
    ("script: s\napplies_to: {modle: x}\n", "unknown match key"),
    ("script: s\nfoo: 1\n", "unknown key"),
    ("applies_to: {backend: vllm}\n", "no script"),
    ("script: s\nengine:\n  - options: {}\n    computed: {max_num_tokens: __import__('os')}\n", "uses"),
    ("script: s\nengine:\n  - options: {}\n    computed: {max_num_tokens: batch * 2}\n", "uses"),
    ("script: s\nfits:\n  - name: f\n    options: {max_num_tokens: 4}\n", "fitted_on"),
    ("script: s\nclient: {range: 0.5}\n", "unknown client setting"),
])
def test_bad_recipe_files_are_refused(tmp_path, text, msg) -> None:
    with pytest.raises(DataFileError, match=msg):
        load_recipe(_write(tmp_path, "bad", text))


def test_a_recipe_for_another_engine_is_refused(tmp_path) -> None:
    _write(tmp_path, "a", "script: s\nengine:\n  - cmd: vllm serve M --max-num-seqs 8\n")
    with pytest.raises(DataFileError, match="gives vllm settings"):
        RecipeBook.load(tmp_path).resolve(_row(backend="sglang"), RowContext(1, 1))


def test_formula_needs_its_quantities(tmp_path) -> None:
    _write(tmp_path, "a", "script: s\napplies_to: {backend: trtllm}\nengine:\n  - options: {}\n"
                          "    computed: {max_num_tokens: 'round_up(3 * clients + isl, 64)'}\n")
    book = RecipeBook.load(tmp_path)
    assert book.resolve(_row(isl=1000), RowContext(8, 1, clients=10)).scheduler == {"max_num_tokens": 1088}
    assert book.resolve(_row(isl=1000), RowContext(8, 1)).scheduler == {}  # no clients: not sized


def test_empty_book_is_defaults_only() -> None:
    s = RecipeBook.empty().resolve(_row(source=IX, gemm_quant="fp8"), RowContext(8, 1, 4, True, True))
    assert (s.estimator, s.scheduler, s.recipes) == ({}, {}, [])


# --------------------------------------------------------------------------- the shipped recipes


@pytest.mark.parametrize(("backend", "version", "quant", "adp", "model", "want"), [
    ("trtllm", MTP_V, "fp8", 1, "deepseek-ai/DeepSeek-R1", (3, None)),   # the MTP recipe: depth 3
    ("trtllm", MTP_V, "nvfp4", 8, "deepseek-ai/DeepSeek-R1", (1, None)),  # ... 1 with attention DP
    ("trtllm", STP_V, "fp8", 1, "deepseek-ai/DeepSeek-R1", (0, "trtllm")),  # STP: TensorRT-LLM-gen experts
    ("trtllm", STP_V, "fp8", 8, "deepseek-ai/DeepSeek-R1", (0, "deepgemm")),
    ("trtllm", STP_V, "nvfp4", 1, "deepseek-ai/DeepSeek-R1", (0, None)),
    ("trtllm", "1.1.0rc2.post2", "fp8", 1, "deepseek-ai/DeepSeek-R1", (1, None)),  # no recipe: MTP 1 of MTP checkpoints
    ("trtllm", "1.1.0rc2.post2", "fp8", 1, "deepseek-ai/DeepSeek-V3", (0, None)),  # ... not V3's
    ("trtllm", MTP_V, "fp8", 1, "deepseek-ai/DeepSeek-V3", (3, None)),
    ("sglang", MTP_V, "fp8", 1, "deepseek-ai/DeepSeek-R1", (0, None)),
])
def test_trtllm_mtp_and_moe_by_benchmarked_version(backend, version, quant, adp, model, want) -> None:
    s = _resolve(_row(backend=backend, backend_version=version, gemm_quant=quant, model=model), adp=adp)
    assert (s.estimator.get("nextn", 0), s.estimator.get("moe_kernel")) == want
    # a checkpoint without MTP layers gets none
    assert _resolve(_row(backend=backend, backend_version=version, gemm_quant=quant, model=model), adp=adp,
                    mtp=False).estimator.get("nextn", 0) == 0


@pytest.mark.parametrize(("model", "backend", "source", "workers"), [
    ("meta-llama/Llama-3.1-70B", "trtllm", IX, True),
    ("openai/gpt-oss-120b", "trtllm", IX, True),
    ("deepseek-ai/DeepSeek-R1", "trtllm", IX, False),
    ("openai/gpt-oss-120b", "vllm", IX, False),
    ("openai/gpt-oss-120b", "trtllm", DUMP, False),
])
def test_postprocess_workers_front_end(model, backend, source, workers) -> None:
    p = _params(_row(model=model, backend=backend, source=source))
    assert (p.arrival_delay_ms, p.front_end_per_stream_ms) == ((25.0, 0.0) if workers else (
        scheduler_params(backend).arrival_delay_ms, scheduler_params(backend).front_end_per_stream_ms))


@pytest.mark.parametrize(("system", "tp", "lengths", "source", "want"), [
    ("b200_sxm", 4, (1024, 1024), IX, (20, 0.9, 16384, False)),
    ("h200_sxm", 4, (1024, 1024), IX, (20, 0.9, 16384, True)),   # the budget is the fit on H200
    ("b200_sxm", 8, (1024, 1024), IX, (0, 0.0, 16384, False)),   # below TP 8 only; B200 unchunked 16384
    ("h200_sxm", 8, (1024, 1024), IX, (0, 0.0, 8192, True)),
    ("b200_sxm", 4, (1024, 8192), IX, (0, 0.0, 16384, False)),
    ("b200_sxm", 4, (1024, 1024), DUMP, (0, 0.0, 8192, True)),   # another harness
])
def test_llama_trtllm_recipe(system, tp, lengths, source, want) -> None:
    row = _row(model="meta-llama/Llama-3.1-70B", system=system, source=source, isl=lengths[0], osl=lengths[1])
    p = _params(row, tp=tp)
    assert (p.batch_wait_iters, p.batch_wait_max_tokens_ratio, p.max_num_tokens, p.chunked) == want


@pytest.mark.parametrize(("system", "model", "source", "conc", "tp", "quant", "interval"), [
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", IX, 4, 8, "nvfp4", 10),
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", IX, 16, 8, "nvfp4", 30),
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", DUMP, 64, 4, "fp8", 10),   # the TP 4 recipe: always 10
    ("b300_sxm", "Qwen/Qwen3.5-397B-A17B", DUMP, 128, 4, "fp8", 30),
    ("h200_sxm", "deepseek-ai/DeepSeek-R1", IX, 64, 8, "fp8", 1),
    ("b200_sxm", "zai-org/GLM-5", IX, 64, 8, "fp8", 1),
    ("h100_sxm", "Qwen/Qwen3-32B", AIC_H100, 64, 2, "fp8", None),     # fixed lengths: lock-step waves
    ("b200_sxm", "Qwen/Qwen3.5-397B-A17B", REEXPORT, 8, 4, "fp8", 10),
    ("h200_sxm", "Qwen/Qwen3.5-397B-A17B", REEXPORT, 8, 8, "fp8", 1),
])
def test_sglang_poll_interval_and_waves(system, model, source, conc, tp, quant, interval) -> None:
    row = _row(backend="sglang", system=system, model=model, source=source, concurrency=conc, gemm_quant=quant)
    p = _params(row, tp=tp)
    if interval is None:
        assert p.lockstep is True and p.recv_interval == 1 and p.kv_length_ratio == 1.0
    else:
        assert p.lockstep is False and p.recv_interval == interval and p.kv_length_ratio == mean_length_ratio(0.8)
    assert _params(replace(row, backend="vllm"), tp=tp).recv_interval == 1


@pytest.mark.parametrize(("version", "adp", "clients", "want"), [
    (MTP_V, 1, 128, (1600, 128)),   # MTP 3: 4 x 128 + 1024 + 64
    (MTP_V, 8, 16, (1152, 16)),     # MTP 1 with attention DP
    (STP_V, 1, 128, None),
])
def test_mtp_recipe_step_budget(version, adp, clients, want) -> None:
    row = _row(model="deepseek-ai/DeepSeek-R1", backend_version=version, gemm_quant="fp8", concurrency=128)
    p = _params(row, tp=8 if adp == 1 else 1, adp=adp, clients=clients)
    d = scheduler_params("trtllm")
    assert (p.chunked, p.max_num_tokens, p.max_batch_size) == ((False, *want) if want else
                                                               (d.chunked, d.max_num_tokens, d.max_batch_size))
    # without the clients per rank (a search over layouts) nothing sizes the step
    assert _params(row, adp=adp).max_num_tokens == d.max_num_tokens


@pytest.mark.parametrize(("backend", "system", "quant", "version", "model", "kv"), [
    ("sglang", "b200_sxm", None, None, "m", "fp8"),
    ("sglang", "b300_sxm", "fp8", None, "m", "fp8"),
    ("sglang", "h200_sxm", "fp8", None, "m", None),
    ("trtllm", "h200_sxm", "fp8", None, "m", "fp8"),
    ("vllm", "b200_sxm", None, None, "m", None),
    ("vllm", "b200_sxm", "fp8", "0.17.0", "MiniMaxAI/MiniMax-M2.5", None),   # the recipe's auto wins
    ("vllm", "b200_sxm", "fp8", "0.19.0", "MiniMaxAI/MiniMax-M2.5", "fp8"),
])
def test_kv_cache_dtype(backend, system, quant, version, model, kv) -> None:
    s = _resolve(_row(backend=backend, system=system, gemm_quant=quant, backend_version=version, model=model))
    assert s.estimator.get("kv_cache_quant") == kv


def test_minimax_vllm_recipe_experts() -> None:
    row = _row(backend="vllm", model="MiniMaxAI/MiniMax-M2.5", gemm_quant="fp8", backend_version="0.17.0")
    s = _resolve(row, tp=2)
    assert s.expert_parallel and s.estimator["moe_kernel"] == "triton"
    assert not _resolve(row, tp=2, moe=False).expert_parallel
    assert not _resolve(replace(row, system="h200_sxm"), tp=2).expert_parallel


@pytest.mark.parametrize(("version", "quant", "conc", "delayed"), [
    (STP_V, "fp8", 64, True), (STP_V, "fp8", 256, False), (STP_V, "fp8", 32, False),
    (STP_V, "nvfp4", 64, False), (MTP_V, "fp8", 64, False),
])
def test_deepseek_plain_recipe_batch_wait(version, quant, conc, delayed) -> None:
    row = _row(model="deepseek-ai/DeepSeek-R1", backend_version=version, gemm_quant=quant, concurrency=conc)
    p = _params(row)
    assert (p.batch_wait_iters, p.batch_wait_max_tokens_ratio) == ((40, 0.8) if delayed else (0, 0.0))


@pytest.mark.parametrize(("system", "quant", "gpus", "want"), [
    ("b200_sxm", "fp8", 4, (0.95, 8192, 32)),
    ("b300_sxm", "fp8", 4, (0.95, 8192, 32)),
    ("b200_sxm", "fp8", 8, None),
    ("b200_sxm", "nvfp4", 4, None),
    ("h200_sxm", "fp8", 4, None),
])
def test_sglang_tp4_recipe_sizes(system, quant, gpus, want) -> None:
    row = _row(backend="sglang", system=system, gemm_quant=quant, model="deepseek-ai/DeepSeek-R1", isl=8192)
    s = _resolve(row, tp=gpus)
    p = replace(scheduler_params("sglang"), **s.scheduler)
    d = scheduler_params("sglang")
    got = (s.estimator.get("kv_memory_fraction"), p.max_num_tokens, p.max_batch_size)
    assert got == (want or (None, d.max_num_tokens, d.max_batch_size))


@pytest.mark.parametrize(("version", "source", "overlap"), [
    ("0.5.10.post1", IX, True), ("nightly-dev-20260402-d7256eb6", DUMP, True),
    ("0.5.9", IX, False), ("0.5.10.post1", AIC_H100, False),
])
def test_sglang_hybrid_overlap_without_radix_cache(version, source, overlap) -> None:
    hybrid = scheduler_params("sglang", spec=SimpleNamespace(gdn=object()))
    row = _row(backend="sglang", system="b300_sxm", model="Qwen/Qwen3.5-397B-A17B", source=source,
               backend_version=version)
    assert replace(hybrid, **_resolve(row).scheduler).overlap is overlap


@pytest.mark.parametrize(("source", "drift"), [
    (AIC_H200, True), (AIC_H100, False), ("source_file=2026-04-06.csv; model=m", True),
    ("source_file=/Users/x/elsewhere/data/h200_sxm/sglang/0.5.6.post2/m.csv", False),
])
def test_clients_drift_by_campaign(source, drift) -> None:
    row = _row(backend="sglang", system="h200_sxm", model="Qwen/Qwen3-235B-A22B-FP8", source=source, concurrency=64)
    p = _params(row, tp=2)
    assert p.lockstep is (not drift) and p.recv_interval == 1


# --------------------------------------------------------------------------- reproducing commands


@pytest.mark.parametrize(("item", "msg"), [
    ("colour=1", "is not FIELD=VALUE of a scheduler setting"),
    ("chunked", "is not FIELD=VALUE"),
    ("chunked=maybe", "chunked takes true or false"),
    ("max_num_tokens=lots", "max_num_tokens takes an integer"),
])
def test_serve_scheduler_flag_refuses_bad_settings(item, msg, capsys) -> None:
    from infercast.cli.main import main

    argv = ["serve", "--model", "m", "--system", "s", "--backend", "vllm", "--concurrency", "1", "--isl", "8",
            "--osl", "8", "--scheduler", item]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_serve_scheduler_flag_values() -> None:
    from infercast.cli.main import _scheduler_fields

    got = _scheduler_fields(["chunked=false", "overlap=on", "kv_length_ratio=0.9", "graph_batch_sizes=1,2,4",
                             "recv-interval=10"])
    assert got == {"chunked": False, "overlap": True, "kv_length_ratio": 0.9, "graph_batch_sizes": (1, 2, 4),
                   "recv_interval": 10}


def test_validate_commands_reproduce_the_predictions(real_pack_available, tmp_path, capsys) -> None:
    """A sample of dev rows (recipes of every engine, disagg too): the command line `validate`
    records for each row, run in-process, prints the row's predicted TTFT and TPOT."""
    import json

    from infercast.cli.main import main
    from infercast.validate.cli import default_silicon_csv
    from infercast.validate.predict import EstimatorCache
    from infercast.validate.report import run_validation
    from infercast.validate.serving_predict import serving_predictor
    from infercast.validate.silicon import load_ids, load_rows

    ids = load_ids("/work/shared/fidelity/dev_fullspec_ids.txt") if Path("/work/shared/fidelity/dev_fullspec_ids.txt").exists() else None
    rows = load_rows(default_silicon_csv(), ids)
    cache = EstimatorCache()
    want = {  # one row of each kind the recipes touch, plus disagg and plain rows
        "trtllm-mtp": lambda r: r.backend_version == MTP_V and r.mode == "agg",
        "trtllm-postprocess": lambda r: r.backend == "trtllm" and "gpt-oss" in r.model and (r.source or "").startswith("source_file=2026"),
        "llama-batch-wait": lambda r: "Llama-3.1-70B" in r.model and r.backend == "trtllm" and r.isl == r.osl == 1024
        and (r.source or "").startswith("source_file=2026") and r.worker and r.worker.tp < 8,
        "sglang-ix": lambda r: r.backend == "sglang" and r.mode == "agg" and (r.source or "").startswith(("source_file=2026", "db-dump")),
        "sglang-waves": lambda r: r.backend == "sglang" and r.mode == "agg" and "h100_sxm" in (r.source or ""),
        "vllm": lambda r: r.backend == "vllm" and r.mode == "agg",
        "disagg": lambda r: r.mode == "disagg",
    }
    sample = []
    for pick in want.values():
        hit = next((r for r in rows if pick(r) and r not in sample), None)
        if hit is not None:
            sample.append(hit)
    assert len(sample) >= 5
    predictor = serving_predictor(cache)
    results = run_validation(sample, predictor)
    checked = 0
    for res in results:
        cmd = predictor.commands.get(res.row.id)
        if res.error is not None or not cmd:
            continue
        import shlex

        argv = shlex.split(cmd)
        assert argv[:2] == ["infercast", "serve"] or argv[:2] == ["infercast", "serve-disagg"]
        capsys.readouterr()
        assert main(argv[1:] + ["--json"]) == 0, cmd
        out = json.loads(capsys.readouterr().out)
        assert out["ttft_ms"] == res.ttft_ms and out["tpot_ms"] == res.tpot_ms, cmd
        checked += 1
    assert checked >= 5
