#!/usr/bin/env python
"""Re-pin the end-to-end golden estimates in tests/goldens/*.json.

    python scripts/repin_goldens.py            # recompute every group and rewrite its file
    python scripts/repin_goldens.py --check    # recompute and report differences, write nothing

Four groups, one file each:

* ``dense.json``   static estimates (``Estimator.static``) of dense models;
* ``moe.json``     static estimates of MoE and MLA models: expert / attention-data parallelism,
                   pipeline stages, MTP speculative decoding, long context, quant overrides,
                   configurations that do not fit;
* ``hybrid.json``  static estimates of Nemotron-H hybrids (Mamba2 blocks between attention and
                   MoE / MLP blocks) and Kimi-K3 (KDA linear-attention and MLA layers);
* ``serving.json`` the serving models: ``serving.agg.serve_agg`` (aggregated, closed-loop
                   benchmark) and ``serving.disagg.solve_disagg`` (prefill / decode pools);
* ``intervals.json`` the 80% / 95% prediction intervals (``serving.intervals``) of a static
                   estimate, an aggregated and a disaggregated serving result, as the CLI
                   attaches them: the shipped interval table, the cell lookup and the
                   extrapolated share end to end.

Every case runs on the real aiconfigurator-core pack. Files are written with sorted keys, one
value per line and a trailing newline, so ``git diff tests/goldens/`` after a re-pin shows exactly
which predictions moved: that diff is what a reviewer reads.

tests/test_goldens.py imports this module (the case lists, :func:`compute_all`,
:func:`compare_goldens`, :func:`check`) so the test and ``--check`` compute and compare every case
the same way. Each distinct engine configuration is compiled into one :class:`Estimator`, shared by
all the cases (and groups) that use it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "tests" / "goldens"
GOLDEN_SCHEMA = 1
PACK = "aiconfigurator-core==0.12.0"
#: relative tolerance of the comparison; the guard tests prove a 1% change is caught
REL_TOL = 1e-6

if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))


# ---------------------------------------------------------------------------------------------
# what a case is
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Engine:
    """One compiled engine: the ``Estimator`` constructor's arguments.

    Only arguments that differ from their defaults appear in a case's inputs and id, so the dense
    cases pinned before these options existed keep their ids and inputs unchanged.
    """

    model: str
    system: str
    backend: str
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int | None = None
    gemm_quant: str | None = None
    moe_quant: str | None = None
    kv_cache_quant: str | None = None
    nextn: int = 0
    database_mode: str = "SILICON"
    backend_version: str | None = None  # None: the backend's default version for the system
    cp: int = 1  # context-parallel ranks
    #: speculative decoding beyond MTP: the method (``nextn`` is its draft-token count) and draft model
    spec_method: str | None = None
    draft_model: str | None = None
    moe_kernel: str | None = None

    #: (field, id label) of the optional arguments, in id order
    _OPTIONAL = (("attention_dp", "adp"), ("moe_tp", "moetp"), ("moe_ep", "ep"), ("gemm_quant", "gemm-"),
                 ("moe_quant", "moe-"), ("kv_cache_quant", "kv-"), ("nextn", "nextn"), ("database_mode", "mode-"),
                 ("backend_version", "v"), ("cp", "cp"), ("spec_method", "spec-"), ("draft_model", "draft-"),
                 ("moe_kernel", "mk-"))

    def _extras(self) -> list[tuple[str, str, object]]:
        defaults = {f.name: f.default for f in fields(self)}
        return [(name, label, getattr(self, name)) for name, label in self._OPTIONAL if getattr(self, name) != defaults[name]]

    def inputs(self) -> dict:
        out = {"model": self.model, "system": self.system, "backend": self.backend, "tp": self.tp, "pp": self.pp}
        out.update({name: value for name, _, value in self._extras()})
        return out

    def tag(self) -> str:
        s = f"{self.model.split('/')[-1]}|{self.system}|{self.backend}|tp{self.tp}pp{self.pp}"
        return s + "".join(f"|{label}{value}" for _, label, value in self._extras())

    def build(self):
        from infercast import Estimator

        return Estimator(
            self.model, self.system, self.backend, tp=self.tp, pp=self.pp, attention_dp=self.attention_dp,
            moe_tp=self.moe_tp, moe_ep=self.moe_ep, gemm_quant=self.gemm_quant, moe_quant=self.moe_quant,
            kv_cache_quant=self.kv_cache_quant, nextn=self.nextn, database_mode=self.database_mode,
            backend_version=self.backend_version, cp=self.cp, moe_kernel=self.moe_kernel,
            speculative={"method": self.spec_method, "draft_model": self.draft_model} if self.spec_method else None,
        )


class Estimators(dict):
    """Engine -> Estimator, compiled on first use and shared by every case that needs it."""

    def get_for(self, engine: Engine):
        est = self.get(engine)
        if est is None:
            est = self[engine] = engine.build()
        return est


@dataclass(frozen=True)
class StaticCase:
    """``Estimator.static(batch, isl, osl, prefix)``. For attention-DP engines ``batch`` is per
    attention-DP rank (each rank serves its own requests; the experts see ``batch x attention_dp``)."""

    engine: Engine
    batch: int
    isl: int
    osl: int
    prefix: int = 0

    OUTPUT_KEYS = ("backend_version", "fits", "memory_gb_per_gpu", "tokens_per_s_per_gpu", "tpot_ms", "ttft_ms")

    @property
    def id(self) -> str:
        s = f"{self.engine.tag()}|b{self.batch}|isl{self.isl}|osl{self.osl}"
        return s + (f"|prefix{self.prefix}" if self.prefix else "")

    def inputs(self) -> dict:
        return {**self.engine.inputs(), "batch_size": self.batch, "isl": self.isl, "osl": self.osl, "prefix": self.prefix}

    def compute(self, ests: Estimators) -> dict:
        r = ests.get_for(self.engine).static(self.batch, self.isl, self.osl, self.prefix, breakdown=False)
        return {k: getattr(r, k) for k in self.OUTPUT_KEYS}


@dataclass(frozen=True)
class AggCase:
    """``serve_agg(est.engine, concurrency, isl, osl, scheduler_params(backend),
    est.memory.capacity_for(concurrency), est.gpus_per_rank)``; ``concurrency`` is per attention-DP rank."""

    engine: Engine
    concurrency: int
    isl: int
    osl: int
    prefix: int = 0  # cached prompt tokens shared by every request (serving.prefix)

    OUTPUT_KEYS = ("backend_version", "tpot_ms", "ttft_ms")

    @property
    def id(self) -> str:
        s = f"agg|{self.engine.tag()}|c{self.concurrency}|isl{self.isl}|osl{self.osl}"
        return s + (f"|prefix{self.prefix}" if self.prefix else "")

    def inputs(self) -> dict:
        out = {"mode": "agg", **self.engine.inputs(), "concurrency": self.concurrency, "isl": self.isl, "osl": self.osl}
        return {**out, "prefix": self.prefix} if self.prefix else out

    def compute(self, ests: Estimators) -> dict:
        from infercast.serving.agg import serve_agg
        from infercast.serving.backends import scheduler_params

        est = ests.get_for(self.engine)
        r = serve_agg(est.engine, self.concurrency, self.isl, self.osl, scheduler_params(self.engine.backend),
                      est.memory.capacity_for(self.concurrency), est.gpus_per_rank, prefix=self.prefix,
                      tokens_per_block=est.memory.tokens_per_block)
        return {"backend_version": est.version, "tpot_ms": r.tpot_ms, "ttft_ms": r.ttft_ms}


@dataclass(frozen=True)
class AggEnergyCase(AggCase):
    """An :class:`AggCase` and its energy (``serving.energy.agg_energy``: the measured part per
    request and its coverage of the GPU time), for a deployment whose tables measured power."""

    OUTPUT_KEYS = ("backend_version", "energy_coverage", "energy_measured_j_per_request", "tpot_ms", "ttft_ms")

    @property
    def id(self) -> str:
        return "energy-" + super().id

    def compute(self, ests: Estimators) -> dict:
        from infercast.serving.agg import serve_agg
        from infercast.serving.backends import scheduler_params
        from infercast.serving.energy import agg_energy

        est = ests.get_for(self.engine)
        r = serve_agg(est.engine, self.concurrency, self.isl, self.osl, scheduler_params(self.engine.backend),
                      est.memory.capacity_for(self.concurrency), est.gpus_per_rank)
        e = agg_energy(est, r, self.osl)
        return {"backend_version": est.version, "tpot_ms": r.tpot_ms, "ttft_ms": r.ttft_ms,
                "energy_coverage": e["coverage"], "energy_measured_j_per_request": e["measured_j_per_request"]}


@dataclass(frozen=True)
class DisaggCase:
    """``solve_disagg`` with ``prefill_workers`` x ``prefill`` and ``decode_workers`` x ``decode``;
    the KV transfer time from ``kv_transfer_ms`` over the prefill system's inter-node link and the
    attention-DP ranks of both pools passed as :mod:`infercast.validate.serving_predict` does."""

    prefill: Engine
    decode: Engine
    prefill_workers: int
    decode_workers: int
    prefill_batch: int
    concurrency: int
    isl: int
    osl: int

    OUTPUT_KEYS = ("backend_version", "tpot_ms", "ttft_ms")

    @property
    def id(self) -> str:
        return (f"disagg|{self.prefill.tag()}x{self.prefill_workers}|{self.decode.tag()}x{self.decode_workers}"
                f"|pb{self.prefill_batch}|c{self.concurrency}|isl{self.isl}|osl{self.osl}")

    def inputs(self) -> dict:
        return {"mode": "disagg", "prefill": self.prefill.inputs(), "decode": self.decode.inputs(),
                "prefill_workers": self.prefill_workers, "decode_workers": self.decode_workers,
                "prefill_batch": self.prefill_batch, "concurrency": self.concurrency, "isl": self.isl, "osl": self.osl}

    def compute(self, ests: Estimators) -> dict:
        from infercast.serving.backends import scheduler_params
        from infercast.serving.disagg import kv_transfer_ms, solve_disagg

        pe, de = ests.get_for(self.prefill), ests.get_for(self.decode)
        node = pe.data.system.node
        transfer = kv_transfer_ms(pe.memory.kv_per_token, self.isl, pe.gpus, node.inter_node_bw, node.p2p_latency_s,
                                  pe.memory.state_per_request)
        gpus = self.prefill_workers * pe.gpus + self.decode_workers * de.gpus
        r = solve_disagg(pe.engine, de.engine, self.concurrency, self.isl, self.osl, self.prefill_workers,
                         self.decode_workers, de.plan.parallel.attention_dp, self.prefill_batch,
                         scheduler_params(self.prefill.backend), scheduler_params(self.decode.backend), transfer, gpus,
                         prefill_dp=pe.plan.parallel.attention_dp)
        return {"backend_version": pe.version, "tpot_ms": r.tpot_ms, "ttft_ms": r.ttft_ms}


@dataclass(frozen=True)
class IntervalCase:
    """The prediction intervals the CLI attaches to ``case``'s result (a :class:`StaticCase`:
    ``estimate``; an :class:`AggCase`: ``serve`` through :func:`infercast.api.serve_agg`, its
    ``concurrency`` per attention-DP rank; a :class:`DisaggCase`: ``serve-disagg`` through
    :func:`infercast.api.serve_disagg`): the predicted TTFT / TPOT, each figure's range ends
    (:func:`infercast.serving.intervals.flat_intervals`) and the TTFT's cell."""

    case: object

    OUTPUT_KEYS = ("ttft_ms", "tpot_ms", "ttft_cell", *(f"{f}_p{p}_{end}" for f in (
        "ttft_ms", "tpot_ms", "request_latency_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user")
        for p in (80, 95) for end in ("lo", "hi")))

    @property
    def id(self) -> str:
        return f"intervals|{self.case.id}"

    def inputs(self) -> dict:
        return self.case.inputs()

    def compute(self, ests: Estimators) -> dict:
        from infercast.api import serve_agg, serve_disagg
        from infercast.serving.intervals import agg_intervals, disagg_intervals, flat_intervals, static_intervals

        c = self.case
        if isinstance(c, StaticCase):
            est = ests.get_for(c.engine)
            r = est.static(c.batch, c.isl, c.osl, c.prefix, breakdown=False)
            iv = static_intervals(est, r)
        elif isinstance(c, AggCase):
            est = ests.get_for(c.engine)
            r = serve_agg(est, c.concurrency, c.isl, c.osl)
            iv = agg_intervals(est, r, concurrency=c.concurrency * est.plan.parallel.attention_dp, isl=c.isl, osl=c.osl)
        else:
            pe, de = ests.get_for(c.prefill), ests.get_for(c.decode)
            r = serve_disagg(pe, de, concurrency=c.concurrency, isl=c.isl, osl=c.osl, prefill_workers=c.prefill_workers,
                             decode_workers=c.decode_workers, prefill_batch=c.prefill_batch)
            iv = disagg_intervals(pe, de, r, concurrency=c.concurrency, isl=c.isl, osl=c.osl)
        cell = ", ".join(f"{k}={v}" for k, v in iv["ttft_ms"].cell.items()) or "all"
        return {"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "ttft_cell": cell, **flat_intervals(iv)}


# ---------------------------------------------------------------------------------------------
# the cases. Add cases at the end of a group; ids derive from the inputs, so editing a case shows
# up as one removed and one added entry in the diff.
# ---------------------------------------------------------------------------------------------
L8 = "meta-llama/Meta-Llama-3.1-8B"
L70 = "meta-llama/Meta-Llama-3.1-70B"
Q32 = "Qwen/Qwen3-32B"
Q32F = "Qwen/Qwen3-32B-FP8"
Q235 = "Qwen/Qwen3-235B-A22B-FP8"
OSS = "openai/gpt-oss-120b"
MM = "MiniMaxAI/MiniMax-M2.5"
V3 = "deepseek-ai/DeepSeek-V3"
R1 = "deepseek-ai/DeepSeek-R1"
K25 = "moonshotai/Kimi-K2.5"
Q35 = "Qwen/Qwen3.5-397B-A17B"


def _s(model, system, backend, tp, pp, batch, isl, osl, prefix=0, **engine) -> StaticCase:
    return StaticCase(Engine(model, system, backend, tp, pp, **engine), batch, isl, osl, prefix)


#: (model, system, backend, tp, pp, batch, isl, osl, prefix)
DENSE_CASES: list[StaticCase] = [_s(*c) for c in [
    # Llama-3.1-8B across systems and backends
    (L8, "h100_sxm", "trtllm", 1, 1, 1, 128, 128, 0),
    (L8, "h100_sxm", "vllm", 1, 1, 8, 2048, 256, 0),
    (L8, "h100_sxm", "sglang", 2, 1, 32, 1024, 512, 0),
    (L8, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (L8, "h200_sxm", "vllm", 2, 1, 64, 512, 128, 0),
    (L8, "h200_sxm", "sglang", 1, 1, 4, 8000, 200, 0),
    (L8, "b200_sxm", "trtllm", 4, 1, 16, 4096, 1024, 0),
    (L8, "b200_sxm", "vllm", 1, 1, 128, 256, 256, 0),
    # Llama-3.1-70B: memory-bound at TP1, TP sweep, a pipeline-parallel case
    (L70, "h100_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (L70, "h100_sxm", "trtllm", 4, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 2, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 8, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 4, 2, 16, 4096, 512, 0),
    (L70, "h200_sxm", "vllm", 4, 1, 32, 1024, 1024, 0),
    (L70, "b200_sxm", "sglang", 2, 1, 8, 2048, 256, 0),
    (L70, "b200_sxm", "trtllm", 8, 1, 256, 1000, 300, 0),
    # Qwen3-32B bf16
    (Q32, "h100_sxm", "sglang", 4, 1, 16, 3000, 500, 0),
    (Q32, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32, "h200_sxm", "trtllm", 2, 1, 8, 1024, 256, 3072),
    (Q32, "h200_sxm", "vllm", 2, 1, 8, 2048, 256, 0),
    (Q32, "h200_sxm", "sglang", 8, 1, 2, 16000, 100, 0),
    (Q32, "b200_sxm", "trtllm", 2, 1, 48, 777, 333, 0),
    (Q32, "b200_sxm", "vllm", 4, 1, 8, 2048, 256, 0),
    # Qwen3-32B FP8 (block-scaled weights)
    (Q32F, "h100_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32F, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32F, "h200_sxm", "vllm", 2, 1, 16, 1024, 128, 0),
    (Q32F, "h200_sxm", "sglang", 2, 1, 8, 2048, 256, 1024),
    (Q32F, "b200_sxm", "trtllm", 4, 1, 64, 2048, 512, 0),
    (Q32F, "b200_sxm", "sglang", 1, 1, 1, 32000, 64, 0),
    (Q32F, "b200_sxm", "vllm", 8, 1, 8, 2048, 256, 0),
    # an out-of-memory case: fits=false, no latencies
    (Q32, "h100_sxm", "vllm", 1, 1, 64, 8192, 1024, 0),
]]
# Llama-3.1-70B with fp8 per-tensor GEMMs: the activation quantisation fused into the RMSNorm /
# SwiGLU before them (vLLM) or into the all-reduce + RMSNorm (TensorRT-LLM under TP)
DENSE_CASES += [
    _s(L70, "b200_sxm", "vllm", 2, 1, 32, 1024, 1024, gemm_quant="fp8"),
    _s(L70, "b200_sxm", "trtllm", 4, 1, 16, 8192, 1024, gemm_quant="fp8"),
    _s(L70, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, gemm_quant="fp8"),
]
# speculative decoding beyond MTP (models.speculative): EAGLE-3 heads of the target's shape, a
# draft model (Qwen3-0.6B for Qwen3-32B), n-gram (verification only); acceptance 0.8 per position
DENSE_CASES += [
    _s(L8, "h200_sxm", "vllm", 1, 1, 16, 2048, 256, nextn=3, spec_method="eagle3"),
    _s(L8, "h200_sxm", "trtllm", 1, 1, 16, 2048, 256, nextn=3, spec_method="eagle3"),
    _s(Q32, "h200_sxm", "vllm", 2, 1, 8, 2048, 256, nextn=3, spec_method="eagle3"),
    _s(Q32, "h200_sxm", "trtllm", 2, 1, 8, 2048, 256, nextn=3, spec_method="eagle3"),
    _s(Q32, "h200_sxm", "vllm", 2, 1, 8, 2048, 256, nextn=4, spec_method="draft_model", draft_model="Qwen/Qwen3-0.6B"),
    _s(L8, "h200_sxm", "sglang", 1, 1, 16, 2048, 256, nextn=4, spec_method="ngram"),
]

MOE_CASES: list[StaticCase] = [
    # Qwen3-235B-A22B (GQA + MoE, FP8 block-scaled): TP, TP + EP, attention-DP + EP, long context
    _s(Q235, "h200_sxm", "trtllm", 4, 1, 16, 2048, 256),
    _s(Q235, "h200_sxm", "trtllm", 4, 1, 16, 2048, 256, moe_ep=4),
    _s(Q235, "h200_sxm", "trtllm", 1, 1, 16, 2048, 256, attention_dp=4, moe_ep=4),
    _s(Q235, "h200_sxm", "vllm", 4, 1, 8, 32768, 512),
    _s(Q235, "h200_sxm", "trtllm", 4, 2, 16, 2048, 256),  # pipeline-parallel MoE
    _s(Q235, "h200_sxm", "sglang", 4, 1, 16, 2048, 256, attention_dp=2, moe_ep=8),
    _s("nvidia/Qwen3-235B-A22B-NVFP4", "b200_sxm", "trtllm", 2, 1, 16, 2048, 256),  # nvfp4 weights, fp8 KV
    _s("Qwen/Qwen3-235B-A22B", "b200_sxm", "trtllm", 4, 1, 16, 2048, 256, moe_tp=2, moe_ep=2),  # bf16, MoE TP x EP
    _s(Q235, "h100_sxm", "vllm", 1, 1, 1, 1024, 128),  # weights alone exceed the GPU: does not fit
    # gpt-oss-120b (mxfp4 experts, alternating sliding-window layers)
    _s(OSS, "h200_sxm", "vllm", 2, 1, 16, 2048, 256),
    _s(OSS, "b200_sxm", "trtllm", 1, 1, 64, 1024, 1024),
    _s(OSS, "h200_sxm", "vllm", 2, 1, 8, 32768, 512),
    _s(OSS, "h100_sxm", "sglang", 1, 1, 8, 2048, 256),
    # MiniMax-M2.5
    _s(MM, "h200_sxm", "vllm", 4, 1, 16, 2048, 256),
    _s(MM, "h200_sxm", "sglang", 4, 1, 16, 2048, 256, moe_ep=4),
    _s(MM, "b200_sxm", "trtllm", 2, 1, 16, 2048, 256, attention_dp=2, moe_ep=4),
    # DeepSeek-V3 / R1 (MLA + MoE, dense first layers, shared experts)
    _s(V3, "h200_sxm", "trtllm", 8, 1, 16, 2048, 256),
    _s(R1, "h200_sxm", "trtllm", 8, 1, 32, 1024, 1024),
    _s(V3, "b200_sxm", "sglang", 1, 1, 16, 2048, 256, attention_dp=8, moe_ep=8),
    _s(R1, "b200_sxm", "sglang", 1, 1, 4, 4096, 512, attention_dp=8, moe_ep=8),
    _s(V3, "b200_sxm", "trtllm", 1, 1, 64, 1024, 512, attention_dp=8, moe_ep=8),
    _s(R1, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256, attention_dp=8, moe_ep=8),
    _s(R1, "gb200", "trtllm", 1, 1, 16, 2048, 256, attention_dp=16, moe_ep=16),  # EP16 in one NVLink domain
    _s(R1, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256, attention_dp=16, moe_ep=16),  # EP16 over two nodes
    _s(V3, "b200_sxm", "vllm", 8, 1, 16, 2048, 256),
    _s(V3, "b200_sxm", "trtllm", 8, 1, 16, 2048, 256, moe_quant="nvfp4"),
    _s("nvidia/DeepSeek-V3.1-NVFP4", "b200_sxm", "trtllm", 4, 1, 16, 2048, 256, moe_ep=4),
    # MTP speculative decoding (draft passes in decode steps only)
    _s(R1, "h200_sxm", "trtllm", 8, 1, 16, 2048, 256, nextn=1),
    _s(R1, "h200_sxm", "trtllm", 8, 1, 16, 2048, 256, nextn=3),
    _s(R1, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256, attention_dp=8, moe_ep=8, nextn=3),
    # long context, pipeline stages, prefix, fp8 KV, a pure roofline
    _s(V3, "h200_sxm", "trtllm", 8, 1, 4, 32768, 1024),
    _s(V3, "h200_sxm", "trtllm", 4, 2, 16, 2048, 256),
    _s(V3, "h200_sxm", "trtllm", 8, 1, 16, 1024, 256, 3072),
    _s(V3, "h200_sxm", "sglang", 8, 1, 16, 2048, 256, kv_cache_quant="fp8"),
    _s(V3, "h200_sxm", "trtllm", 8, 1, 16, 2048, 256, database_mode="SOL"),
    # the KV cache does not fit (weights do): fits=false, no latencies
    _s(V3, "h200_sxm", "trtllm", 8, 1, 256, 32768, 1024),
    # Kimi-K2.5 (int4 experts) and Qwen3.5 (Gated DeltaNet + gated attention + MoE)
    _s(K25, "b200_sxm", "vllm", 8, 1, 16, 2048, 256),
    _s(K25, "h200_sxm", "sglang", 8, 1, 16, 2048, 256),
    _s(Q35, "b200_sxm", "sglang", 4, 1, 16, 2048, 256, gemm_quant="fp8_block"),
    _s("Qwen/Qwen3.5-35B-A3B", "h200_sxm", "vllm", 1, 1, 16, 2048, 256),
    # TP 8 across two GB200 trays: TensorRT-LLM's all-reduce from its own 4-GPU curve
    _s(V3, "gb200", "trtllm", 8, 1, 16, 2048, 256, moe_ep=8),
    # large EP across hosts (SGLang wide EP): DeepEP dispatch + combine from the multi-host rows
    # (node_num 2 / 4 / 8), experts from the wide-EP expert tables
    _s(R1, "h100_sxm", "sglang", 1, 1, 8, 2048, 256, attention_dp=16, moe_ep=16),
    _s(V3, "h200_sxm", "sglang", 1, 1, 8, 2048, 256, attention_dp=32, moe_ep=32),
    _s(V3, "h200_sxm", "sglang", 1, 1, 8, 2048, 256, attention_dp=64, moe_ep=64),
]

# heterogeneous layers (#37): Gemma-4 (sliding / global attention of different shapes, a dense
# MLP beside the experts), MiMo-V2-Flash (sliding / full attention, v heads narrower than q/k),
# DeciLM (per-layer attention and FFN widths)
G4 = "google/gemma-4-26B-A4B"
G4F = "nvidia/Gemma-4-26B-A4B-NVFP4"
G31 = "nvidia/Gemma-4-31B-IT-NVFP4"
MIMO = "XiaomiMiMo/MiMo-V2-Flash"
DECI = "nvidia/Llama-3_3-Nemotron-Super-49B-v1"
DENSE_CASES += [
    _s(G31, "b200_sxm", "vllm", 2, 1, 16, 2048, 256),
    _s(G31, "b200_sxm", "sglang", 1, 1, 8, 8192, 512),
    _s(DECI, "h200_sxm", "trtllm", 2, 1, 16, 2048, 256),
    _s(DECI, "h200_sxm", "vllm", 4, 1, 32, 1024, 1024),
    _s(DECI, "h100_sxm", "sglang", 2, 2, 8, 4096, 256),
]
MOE_CASES += [
    _s(G4, "h200_sxm", "sglang", 1, 1, 16, 2048, 256),
    _s(G4, "b200_sxm", "trtllm", 2, 1, 16, 2048, 256, moe_ep=2),
    _s(G4F, "b200_sxm", "vllm", 1, 1, 32, 4096, 512),
    _s(MIMO, "h200_sxm", "trtllm", 4, 1, 16, 2048, 256),
    _s(MIMO, "h200_sxm", "sglang", 1, 1, 8, 2048, 256, attention_dp=4, moe_ep=4),
    _s(MIMO, "b200_sxm", "vllm", 4, 1, 4, 32768, 512, kv_cache_quant="fp8"),
]

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
SUPER4 = "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4"
ULTRA8 = "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8"

#: Nemotron-H hybrids (Mamba2 + attention + MoE / MLP blocks), on systems and backends the pack's
#: support matrix marks PASS for them
HYBRID_CASES: list[StaticCase] = [
    _s(NANO, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256),  # conv from mamba2_perf
    _s(NANO, "h100_sxm", "vllm", 2, 1, 16, 2048, 256),  # conv roofline (no vLLM table), TP split
    _s(NANO, "h200_sxm", "sglang", 1, 1, 8, 4096, 512),
    _s(NANO, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256, database_mode="SOL"),
    _s(SUPER4, "b200_sxm", "trtllm", 2, 1, 16, 2048, 256),  # LatentMoE, nvfp4, fp8 KV
    _s(SUPER4, "gb200", "sglang", 1, 1, 32, 1024, 1024),
    _s(SUPER4, "b200_sxm", "trtllm", 1, 1, 16, 2048, 256, attention_dp=4, moe_ep=4),
    _s("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "h200_sxm", "trtllm", 1, 1, 16, 2048, 256, nextn=1),  # MTP *E
    _s("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "b200_sxm", "trtllm", 4, 1, 16, 2048, 256, moe_ep=4),
    _s(ULTRA8, "h200_sxm", "trtllm", 8, 1, 8, 8192, 512),
    _s("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "gb200", "vllm", 8, 1, 16, 2048, 256),
    _s("nvidia/Nemotron-H-56B-Base-8K", "h100_sxm", "trtllm", 4, 1, 16, 2048, 256),  # Mamba2 + attention + MLP
]

# MiniMax-M3 (#37): MiniMax sparse attention from the msa module tables, dense leading layers
M3 = "MiniMaxAI/MiniMax-M3"
M3F = "nvidia/MiniMax-M3-NVFP4"
MOE_CASES += [
    _s(M3, "b200_sxm", "sglang", 8, 1, 8, 4096, 256, moe_ep=8, backend_version="0.5.16"),
    _s(M3, "h200_sxm", "vllm", 8, 1, 16, 2048, 256, moe_ep=8, backend_version="0.24.0"),
    _s(M3F, "b200_sxm", "trtllm", 4, 1, 16, 8192, 512, moe_ep=4, backend_version="1.3.0rc23"),
]

# DeepSeek-V4 (#37): CSA / HCA attention from the dsv4 module tables, mHC from the mhc tables,
# MXFP4 / NVFP4 / FP8 experts
V4F = "deepseek-ai/DeepSeek-V4-Flash"
V4P = "deepseek-ai/DeepSeek-V4-Pro"
MOE_CASES += [
    _s(V4F, "h200_sxm", "sglang", 8, 1, 16, 2048, 256, moe_ep=8, backend_version="0.5.14"),
    _s("sgl-project/DeepSeek-V4-Flash-FP8", "h200_sxm", "vllm", 4, 1, 16, 4096, 256, moe_ep=4, backend_version="0.24.0"),
    _s(V4P, "b200_sxm", "trtllm", 8, 1, 8, 8192, 512, moe_ep=8, nextn=1, backend_version="1.3.0rc23"),
    _s("nvidia/DeepSeek-V4-Pro-NVFP4", "b200_sxm", "sglang", 8, 1, 16, 2048, 256, moe_ep=8, backend_version="0.5.14"),
    _s(V4F, "gb200", "vllm", 1, 1, 32, 2048, 256, attention_dp=4, moe_ep=4, backend_version="0.24.0"),
]

# Step-3.7-Flash (#37): sliding / full GQA layer groups (the 512-token window from the full-attention
# curves), shared expert, dense first layers, MTP; MiMo-V2-Flash with a bf16 KV cache where vLLM
# 0.24.0 on b200 collected head size 192 with fp8 KV only
STEP = "stepfun-ai/Step-3.7-Flash"
MOE_CASES += [
    _s(STEP, "h200_sxm", "vllm", 8, 1, 16, 2048, 256),
    _s(STEP + "-FP8", "b200_sxm", "sglang", 4, 1, 8, 4096, 512),
    _s(STEP, "b200_sxm", "trtllm", 8, 1, 16, 2048, 256, nextn=3),
    _s(MIMO, "b200_sxm", "vllm", 4, 1, 16, 2048, 256),
]

# Kimi-K3 (#37): KDA / gated-MLA layers, latent MoE with MXFP4 experts, attention residuals
K3 = "moonshotai/Kimi-K3"
HYBRID_CASES += [
    _s(K3, "b200_sxm", "vllm", 16, 1, 8, 2048, 256),
    _s(K3, "gb200", "sglang", 8, 1, 16, 2048, 256, attention_dp=4, moe_ep=32),
    _s(K3, "b200_sxm", "sglang", 8, 1, 8, 4096, 256, attention_dp=2, moe_ep=16, backend_version="0.5.16"),
]

_DS_PREFILL = Engine(V3, "h200_sxm", "trtllm", 8)
_DS_DECODE = Engine(V3, "h200_sxm", "trtllm", 1, attention_dp=8, moe_ep=8)

SERVING_CASES: list = [
    AggCase(Engine(L8, "h200_sxm", "trtllm", 1), 32, 2048, 256),
    AggCase(Engine(L8, "h100_sxm", "vllm", 1), 64, 1024, 512),
    AggCase(Engine(L8, "h200_sxm", "sglang", 1), 16, 4000, 500),  # SGLang: lock-step simulation
    AggCase(Engine(Q235, "h200_sxm", "vllm", 4), 64, 4000, 500),
    AggCase(Engine(OSS, "b200_sxm", "trtllm", 1), 128, 1024, 1024),
    AggCase(Engine(V3, "h200_sxm", "sglang", 8), 64, 2048, 512),
    AggCase(Engine(R1, "h200_sxm", "trtllm", 8, nextn=3), 32, 4000, 1000),
    AggCase(Engine(V3, "b200_sxm", "trtllm", 1, attention_dp=8, moe_ep=8), 16, 1024, 512),
    DisaggCase(_DS_PREFILL, _DS_DECODE, prefill_workers=2, decode_workers=1, prefill_batch=1,
               concurrency=256, isl=4000, osl=1000),
    AggCase(Engine(G4, "h200_sxm", "vllm", 1), 64, 2048, 256),
    AggCase(Engine(MIMO, "h200_sxm", "trtllm", 4), 32, 4000, 500),
    AggCase(Engine(DECI, "h200_sxm", "sglang", 2), 32, 2048, 512),
    AggCase(Engine(NANO, "h200_sxm", "vllm", 1), 32, 2048, 256),
    AggCase(Engine(SUPER4, "b200_sxm", "sglang", 2), 64, 4000, 500),
    AggCase(Engine(M3, "b200_sxm", "vllm", 8, moe_ep=8, backend_version="0.24.0"), 32, 4000, 500),
    # energy (#37): vLLM's b200 Triton expert rows (0.22.0) measured power
    AggEnergyCase(Engine("Qwen/Qwen3-30B-A3B", "b200_sxm", "vllm", 1, moe_kernel="triton"), 16, 1024, 256),
    AggCase(Engine(V4F, "b200_sxm", "sglang", 4, moe_ep=4, backend_version="0.5.14"), 32, 4000, 500),
]

# context parallelism (#37 item 3): prompts split over cp ranks (zigzag attention, K/V all-gather),
# the KV cache sharded over them in decode; GQA dense, GQA + MoE, MLA (latent exchange), a prefix
DENSE_CASES += [
    _s(L70, "h200_sxm", "trtllm", 2, 1, 1, 32768, 256, cp=2),
    _s(L70, "h200_sxm", "trtllm", 2, 1, 1, 32768, 256, cp=4),
    _s(Q32, "h200_sxm", "vllm", 1, 1, 2, 16384, 512, cp=2),
    _s(Q32, "h200_sxm", "sglang", 2, 1, 1, 8192, 256, 8192, cp=4),
]
MOE_CASES += [
    _s(Q235, "h200_sxm", "trtllm", 4, 1, 1, 32768, 512, cp=2),
    _s(V3, "gb200", "trtllm", 8, 1, 1, 32768, 1024, moe_ep=8, cp=2),
]
SERVING_CASES += [
    AggCase(Engine(Q32, "h200_sxm", "trtllm", 2, cp=2), 4, 32768, 256),
    DisaggCase(Engine(L70, "h200_sxm", "trtllm", 2, cp=4), Engine(L70, "h200_sxm", "trtllm", 4), prefill_workers=1,
               decode_workers=2, prefill_batch=1, concurrency=16, isl=32768, osl=512),
    AggCase(Engine(STEP, "h200_sxm", "vllm", 8), 32, 4000, 500),
    AggCase(Engine(K3, "gb200", "sglang", 8, attention_dp=4, moe_ep=32), 32, 2048, 256),
    # a shared cached prefix (serve --prefix): attention over it, no prefill of it
    AggCase(Engine(Q32, "h200_sxm", "vllm", 2), 16, 1000, 500, prefix=2000),
    AggCase(Engine(V3, "h200_sxm", "trtllm", 8), 32, 1000, 500, prefix=4000),
]

INTERVAL_CASES: list = [
    IntervalCase(_s(Q32, "h200_sxm", "vllm", 2, 1, 16, 1000, 200)),
    IntervalCase(AggCase(Engine(L8, "h200_sxm", "trtllm", 1), 32, 2048, 256)),
    IntervalCase(AggCase(Engine(V3, "h200_sxm", "sglang", 8), 64, 2048, 512)),
    IntervalCase(AggCase(Engine(V3, "b200_sxm", "trtllm", 1, attention_dp=8, moe_ep=8), 16, 1024, 512)),
    IntervalCase(DisaggCase(_DS_PREFILL, _DS_DECODE, prefill_workers=2, decode_workers=1, prefill_batch=1,
                            concurrency=256, isl=4000, osl=1000)),
    IntervalCase(AggCase(Engine(Q32, "h200_sxm", "vllm", 2), 4, 64000, 200)),  # prompts beyond the tables: extrapolated
]

GROUPS: dict[str, list] = {"dense": DENSE_CASES, "moe": MOE_CASES, "serving": SERVING_CASES, "hybrid": HYBRID_CASES,
                           "intervals": INTERVAL_CASES}


def golden_path(group: str, directory: Path = GOLDEN_DIR) -> Path:
    return Path(directory) / f"{group}.json"


# ---------------------------------------------------------------------------------------------
# computing, writing, comparing
# ---------------------------------------------------------------------------------------------
def compute_group(cases, estimators: Estimators | None = None) -> dict:
    """The golden document for ``cases`` (same structure as a file)."""
    ests = Estimators() if estimators is None else estimators
    out = [{"id": c.id, "inputs": c.inputs(), "outputs": c.compute(ests)} for c in cases]
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate golden case ids")
    return {"schema": GOLDEN_SCHEMA, "pack": PACK, "rel_tol": REL_TOL, "cases": out}


def compute_all(groups: dict | None = None) -> dict[str, dict]:
    """``{group: document}`` for every group, with one Estimator per engine across all groups."""
    ests = Estimators()
    return {name: compute_group(cases, ests) for name, cases in (groups or GROUPS).items()}


def dumps(doc: dict) -> str:
    for case in doc["cases"]:
        for k, v in case["outputs"].items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{case['id']}: {k} is {v}; goldens hold finite numbers only")
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _same(a, b, rel: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
    return a == b


def compare_goldens(expected: dict, actual: dict, rel: float = REL_TOL) -> list[str]:
    """Every difference between two golden documents, one line each (empty list = identical)."""
    problems = []
    exp_cases = {c["id"]: c for c in expected["cases"]}
    act_cases = {c["id"]: c for c in actual["cases"]}
    for cid in sorted(exp_cases.keys() - act_cases.keys()):
        problems.append(f"{cid}: pinned but not computed")
    for cid in sorted(act_cases.keys() - exp_cases.keys()):
        problems.append(f"{cid}: computed but not pinned (re-pin)")
    for cid in [c["id"] for c in expected["cases"] if c["id"] in act_cases]:
        e, a = exp_cases[cid], act_cases[cid]
        if e["inputs"] != a["inputs"]:
            problems.append(f"{cid}: inputs differ: pinned {e['inputs']} vs {a['inputs']}")
        for key in sorted(e["outputs"].keys() | a["outputs"].keys()):
            if key not in e["outputs"] or key not in a["outputs"]:
                problems.append(f"{cid}: output {key!r} present on one side only")
                continue
            ev, av = e["outputs"][key], a["outputs"][key]
            if not _same(ev, av, rel):
                detail = ""
                if isinstance(ev, float) and isinstance(av, float) and ev:
                    detail = f" ({(av - ev) / ev:+.4%})"
                problems.append(f"{cid}: {key} pinned {ev!r} now {av!r}{detail}")
    return problems


def check(actual: dict[str, dict], directory: Path = GOLDEN_DIR) -> list[str]:
    """Differences between computed documents and the pinned files, prefixed by group."""
    problems = []
    for name, doc in actual.items():
        path = golden_path(name, directory)
        if not path.exists():
            problems.append(f"[{name}] {path} is missing (re-pin)")
            continue
        problems += [f"[{name}] {p}" for p in compare_goldens(load(path), doc)]
    return problems


def _counts(docs: dict[str, dict]) -> str:
    return ", ".join(f"{name}: {len(doc['cases'])}" for name, doc in docs.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the pinned files, write nothing")
    ap.add_argument("--dir", type=Path, default=GOLDEN_DIR, help="directory of the golden files")
    a = ap.parse_args(argv)
    docs = compute_all()
    total = sum(len(d["cases"]) for d in docs.values())
    if a.check:
        problems = check(docs, a.dir)
        if problems:
            print(f"{len(problems)} difference(s) from {a.dir}:", *problems, sep="\n  ")
            return 1
        print(f"all {total} cases match {a.dir} ({_counts(docs)})")
        return 0
    a.dir.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        golden_path(name, a.dir).write_text(dumps(doc))
    print(f"wrote {total} cases to {a.dir} ({_counts(docs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
