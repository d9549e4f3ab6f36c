"""Compiled ops kept between processes (:mod:`infercast.engine.compile_cache`): a later process
answers from the store with the same numbers and the same provenance, without resolving the op
again; a changed table, a file added anywhere in the pack, or changed code empties the store; an
answer that cannot be pickled is resolved every time; ``INFERCAST_CACHE_DIR=off`` keeps nothing.

A "new process" is made here by forgetting everything this one holds: the open stores, the shared
per-database memos and the parsed tables."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import synthpack as sp
from infercast import Estimator
from infercast.data import tables
from infercast.engine import compile_cache
from infercast.engine.compiled import CompiledEngine
from infercast.ops.base import OpDB


def _new_process():
    compile_cache.close_all()
    OpDB.release_shared()
    tables.cached_table.cache_clear()
    tables.COLUMNS_READ.clear()
    compile_cache.pack_fingerprint.cache_clear()


@pytest.fixture
def pack(synth, tmp_path, monkeypatch):
    """A private copy of the synthetic pack (the tests change its files) and a private cache."""
    shutil.copytree(synth.root, tmp_path / "pack")
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    _new_process()
    yield tmp_path / "pack" / "systems"
    _new_process()


@pytest.fixture
def compiles(monkeypatch):
    """The ops resolved (not answered from a memo or the store), by kind."""
    seen: list[str] = []
    real = CompiledEngine._compile_backfilled

    def spy(self, op):
        seen.append(op.kind)
        return real(self, op)

    monkeypatch.setattr(CompiledEngine, "_compile_backfilled", spy)
    return seen


def _answers(systems) -> dict:
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=systems)
    b, kv = np.array([1.0, 3.0, 17.5, 64.0]), np.array([100.0, 300.0, 1000.0, 2000.0])
    return {"decode": e.engine.decode_steps_ms(b, kv).tolist(),
            "mixed": float(e.engine.mixed_step_ms([2.0], [128.0], [0.0], 4.0, 200.0)),
            "versions": e.versions(),
            "ops": [[r.describe() for r in c.resolved] for c in e.engine.ops]}


def test_a_later_process_answers_from_the_store(pack, compiles):
    cold = _answers(pack)
    n = len(compiles)
    assert n > 0 and cold["versions"]["tables"]  # resolved, and the provenance of each table read
    _new_process()  # the store is written as the process ends
    files = list((pack.parent.parent / "cache" / "compiled").glob("*.sqlite"))
    assert len(files) == 1
    warm = _answers(pack)
    assert len(compiles) == n  # nothing resolved again
    assert warm == cold  # the same numbers, descriptions and provenance (replayed)
    assert tables.COLUMNS_READ  # the measured columns of the tables behind the kept answers


def test_a_changed_table_empties_the_store(pack, compiles):
    cold = _answers(pack)
    _new_process()
    gemm = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=pack).data.served["gemm"].path  # the table read
    _new_process()
    import pyarrow.parquet as pq

    t = pq.read_table(gemm)
    lat = t.column("latency").to_numpy() * 1.5  # every GEMM 1.5x slower
    import pyarrow as pa

    pq.write_table(t.set_column(t.schema.get_field_index("latency"), "latency", pa.array(lat)), gemm)
    os.utime(gemm, ns=(gemm.stat().st_atime_ns, gemm.stat().st_mtime_ns + 10**9))
    n = len(compiles)
    warm = _answers(pack)
    assert len(compiles) > n  # resolved again
    assert warm["decode"] != cold["decode"]
    _new_process()
    off = os.environ["INFERCAST_CACHE_DIR"]
    os.environ["INFERCAST_CACHE_DIR"] = "off"
    try:
        assert _answers(pack) == warm  # what a process without the cache answers
    finally:
        os.environ["INFERCAST_CACHE_DIR"] = off


def test_a_file_added_anywhere_an_edited_yaml_or_changed_code_empties_the_store(pack, compiles, monkeypatch):
    _answers(pack)
    _new_process()
    n = len(compiles)
    (pack / "data" / sp.SYSTEM / "notes.txt").write_text("a file the pack did not have")
    _answers(pack)
    assert len(compiles) > n  # the pack's fingerprint changed
    _new_process()
    n = len(compiles)
    _answers(pack)
    assert len(compiles) == n  # kept under the new fingerprint
    _new_process()
    n = len(compiles)
    yml = pack / f"{sp.SYSTEM}.yaml"  # a YAML edited in place (its directory keeps its time)
    yml.write_text(yml.read_text() + "\n# edited\n")
    os.utime(yml, ns=(yml.stat().st_atime_ns, yml.stat().st_mtime_ns + 10**9))
    _answers(pack)
    assert len(compiles) > n
    _new_process()
    n = len(compiles)
    monkeypatch.setattr(compile_cache, "code_fingerprint", lambda: "other code")
    _answers(pack)
    assert len(compiles) > n


def test_an_answer_that_cannot_be_pickled_is_resolved_every_time(pack, compiles, monkeypatch):
    from infercast.ops import gemm

    monkeypatch.setattr(gemm, "gemm_sol_fn", lambda db, quant, n, k: (lambda m: np.asarray(m, dtype=float) * 0.0 + 1e-6))
    _answers(pack)
    _new_process()
    gemms, others = compiles.count("gemm"), len(compiles) - compiles.count("gemm")
    _answers(pack)
    assert compiles.count("gemm") == 2 * gemms  # its GEMMs resolved again
    assert len(compiles) - compiles.count("gemm") == others  # the other ops answered from the store


def test_off_keeps_nothing_and_a_forked_worker_leaves_the_store_alone(pack, compiles, monkeypatch):
    monkeypatch.setenv("INFERCAST_CACHE_DIR", "off")
    assert compile_cache.compile_cache_dir() is None
    _answers(pack)
    _new_process()
    assert not (pack.parent.parent / "cache").exists()
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(pack.parent.parent / "cache"))
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=pack)
    assert compile_cache._store(e.engine.db) is not None
    pid = os.getpid()
    monkeypatch.setattr(compile_cache.os, "getpid", lambda: pid + 1)  # as a forked worker sees itself
    assert compile_cache._store(e.engine.db) is None
    compile_cache.save_all()  # writes nothing from the worker
    monkeypatch.undo()


def test_key_text():
    assert compile_cache.key_text(("compiled-op", "gemm", "both", (("n", 4),), None)) is not None
    assert compile_cache.key_text(("x", object())) is None  # shown by its address: not a name


def test_energy_from_kept_answers(pack, compiles):
    """The energy model resolves its ops only when a table read carries measured power: kept
    answers replay their tables' columns, so a later process reports the same energy."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from infercast.api import static_energy

    for stem in ("context_attention_perf", "generation_attention_perf"):
        path = pack / "data" / sp.SYSTEM / "attention" / "trtllm" / sp.TRTLLM_CURRENT / f"{stem}.parquet"
        t = pq.read_table(path)
        t = t.append_column("power", pa.array(400.0 + 10.0 * t.column("batch_size").to_numpy()))
        pq.write_table(t, path)

    def energy():
        """(the energy, ops the estimator resolved, ops the energy model resolved)"""
        n = len(compiles)
        e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=1, systems_path=pack)
        m = len(compiles)
        return static_energy(e, e.static(4, 256, 8)), m - n, len(compiles) - m

    cold, resolved, probed = energy()
    assert cold["available"] and cold["measured_ops"] == ["attention"] and resolved > 0 and probed > 0
    _new_process()
    # the estimator's ops from the store; the energy model probes its energy tables as before
    assert energy() == (cold, 0, probed)


#: one configuration of each kind of op the real pack resolves (dense, MoE, MLA, sparse MLA,
#: Gated DeltaNet, windowed attention, DeepSeek-V4's modules through HYBRID, Kimi's linear
#: attention, Mamba, and measured power)
REAL_ESTIMATES = (
    ["Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", "--tp", "2"],
    ["Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "vllm", "--tp", "4"],
    ["deepseek-ai/DeepSeek-R1", "gb200", "trtllm", "--tp", "4"],
    ["deepseek-ai/DeepSeek-V3.2", "b200_sxm", "sglang", "--tp", "8"],
    ["Qwen/Qwen3.5-35B-A3B", "h200_sxm", "trtllm", "--tp", "1"],
    ["google/gemma-4-26B-A4B", "h200_sxm", "vllm", "--tp", "1"],
    ["openai/gpt-oss-120b", "h200_sxm", "trtllm", "--tp", "2"],
    ["deepseek-ai/DeepSeek-V4-Flash", "b200_sxm", "trtllm", "--tp", "4", "--database-mode", "HYBRID"],
    ["moonshotai/Kimi-K3", "b200_sxm", "trtllm", "--tp", "8", "--pp", "4", "--moe-ep", "8", "--moe-tp", "1"],
    ["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "h200_sxm", "trtllm", "--tp", "1"],
    ["Qwen/Qwen3-30B-A3B", "b200_sxm", "vllm", "--moe-kernel", "triton"],
)

_ESTIMATES_SCRIPT = """
import contextlib, io, json, sys
from infercast.cli.main import main
for model, system, backend, *rest in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["estimate", "--model", model, "--system", system, "--backend", backend, *rest,
                   "--isl", "2000", "--osl", "200", "--batch", "8", "--json"])
    print(json.dumps({"rc": rc, "out": out.getvalue()}))
"""


def test_real_pack_estimates_the_same_without_with_and_from_the_store(real_pack_available, tmp_path):
    """``estimate --json`` of every kind of op in the real pack, in three processes: without the
    cache, filling it, answered from it: the same output, byte for byte (numbers, per-op notes,
    the tables' provenance, energy)."""
    import json
    import subprocess
    import sys

    def run(cache):
        env = {**os.environ, "INFERCAST_CACHE_DIR": cache}
        p = subprocess.run([sys.executable, "-c", _ESTIMATES_SCRIPT, json.dumps(REAL_ESTIMATES)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return [json.loads(line) for line in p.stdout.splitlines()]

    off = run("off")
    assert [r["rc"] for r in off] == [0] * len(REAL_ESTIMATES)
    assert all(json.loads(r["out"])["fits"] for r in off)  # each one's numbers, not only its compile
    assert any((json.loads(r["out"])["energy"] or {}).get("available") for r in off)
    cache = str(tmp_path / "cache")
    assert run(cache) == off
    assert list((tmp_path / "cache" / "compiled").glob("*.sqlite"))
    assert run(cache) == off


def test_a_damaged_store_is_made_anew(pack, compiles):
    cold = _answers(pack)
    _new_process()
    (store,) = (pack.parent.parent / "cache" / "compiled").glob("*.sqlite")
    store.write_bytes(b"not a database" * 100)
    n = len(compiles)
    assert _answers(pack) == cold and len(compiles) > n  # resolved again, the file replaced
    _new_process()
    n = len(compiles)
    assert _answers(pack) == cold and len(compiles) == n  # and kept again


def test_stores_of_a_pack_that_is_gone_are_pruned(pack, monkeypatch):
    cache = pack.parent.parent / "cache" / "compiled"
    _answers(pack)
    _new_process()
    (mine,) = cache.glob("*.sqlite")
    other = pack.parent.parent / "other"
    shutil.copytree(pack.parent, other)  # the same pack elsewhere (another virtual environment)
    _answers(other / "systems")
    _new_process()
    assert len(list(cache.glob("*.sqlite"))) == 2
    (cache / "broken.sqlite").write_bytes(b"not a database")
    shutil.rmtree(other)
    monkeypatch.setattr(tables, "_PRUNED", set())  # (one gate for both caches: tables.prune_due)
    assert compile_cache.prune(cache) == 0  # looked at today already
    assert len(list(cache.glob("pack-walk-*"))) == 2  # each pack's kept walk (pack_fingerprint)
    assert compile_cache.prune(cache, force=True) == 3  # the other pack's store and walk, the broken store
    assert list(cache.glob("*.sqlite")) == [mine]
    (walk,) = cache.glob("pack-walk-*")
    assert str(pack) in walk.read_text()


def test_the_pack_walk_is_kept_and_checked_entry_by_entry(pack, monkeypatch):
    """The pack's fingerprint comes from the kept walk while every directory and YAML file stats
    as recorded (the ~900 directories are not listed again), and from a new walk, with the same
    value as a walk would give, as soon as anything under ``systems/`` is added, removed or
    edited, however deep."""
    walks = []
    real = compile_cache._walk_pack

    def counted(d):
        walks.append(d)
        return real(d)

    monkeypatch.setattr(compile_cache, "_walk_pack", counted)
    sd = str(pack)
    first = compile_cache.pack_fingerprint(sd)
    compile_cache.pack_fingerprint.cache_clear()
    assert compile_cache.pack_fingerprint(sd) == first and len(walks) == 1  # kept
    deep = max((p for p in pack.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
    (deep / "added.parquet").write_bytes(b"x")
    compile_cache.pack_fingerprint.cache_clear()
    second = compile_cache.pack_fingerprint(sd)
    assert second != first and len(walks) == 2
    assert second == __import__("hashlib").sha1(__import__("json").dumps(real(sd)).encode()).hexdigest()
    (deep / "added.parquet").unlink()
    compile_cache.pack_fingerprint.cache_clear()
    assert compile_cache.pack_fingerprint(sd) != second and len(walks) == 3
    monkeypatch.setenv("INFERCAST_CACHE_DIR", "off")  # nothing kept: a walk every time
    compile_cache.pack_fingerprint.cache_clear()
    compile_cache.pack_fingerprint(sd)
    compile_cache.pack_fingerprint.cache_clear()
    compile_cache.pack_fingerprint(sd)
    assert len(walks) == 5
