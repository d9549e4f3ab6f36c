"""The public Python API: :class:`Estimator` and its results.

>>> est = Estimator("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", tp=2)   # doctest: +SKIP
>>> est.prefill_ms(8, 4000), est.decode_ms(8, 4000, 500)                # doctest: +SKIP
>>> est.static(8, 4000, 500).to_dict()                                  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .data.database import PerfData
from .data.quant import GEMM_QUANTS
from .data.model_configs import resolve_model
from .engine import beyond
from .engine.compiled import CompiledEngine, remember
from .errors import InvalidConfigError, InvalidInputError
from .interp.provenance import Prov
from .models.fusions import engine_fusions
from .models.groups import layer_group_notes
from .models.plan import (
    MOE_COMMS,
    MOE_DISTRIBUTION,
    ParallelConfig,
    Plan,
    SpecDecode,
    build_plan,
    with_moe_kernel,
)
from .models.spec import ModelSpec, build_spec
from .models.speculative import EAGLE_METHODS, draft_parallel, eagle_head_spec, spec_decode_of, speculation_notes, with_speculation
from .ops.base import DatabaseMode, OpDB, broadcast_named, check_positive, shown
from .serving.backends import backend_defaults
from .serving.memory import GB, VISION_WEIGHT_BYTES, WINDOW_KV_COUNTED_FROM, MemoryBreakdown, memory_breakdown
from .serving.speculative import draft_memory

MAX_BATCH = 1_000_000
MAX_TOKENS = 10_000_000
#: decode steps are evaluated one by one up to this many; beyond, the mean is a trapezoid over
#: this many evenly spaced KV lengths (the per-step curve is smooth and monotone)
DECODE_SAMPLES = 256


@dataclass
class OpBreakdown:
    op: str
    count: int
    prefill_ms: float
    decode_ms: float
    provenance: str
    source: dict


@dataclass
class StaticResult:
    model: str
    system: str
    backend: str
    backend_version: str
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    batch_size: int
    isl: int
    osl: int
    prefix: int
    fits: bool
    ttft_ms: float | None
    tpot_ms: float | None
    request_latency_ms: float | None
    tokens_per_s_per_gpu: float | None
    tokens_per_s_per_user: float | None
    memory_gb_per_gpu: float
    memory: dict
    versions: dict
    quant: dict
    gpus: int = 1  # of the replica: tp x attention_dp x pp x cp
    layout: str = ""  # the layout in words (infercast.report.layout.layout_words)
    reason: str | None = None  # why it does not fit (fits is False)
    notes: list[str] = field(default_factory=list)
    breakdown: list[OpBreakdown] = field(default_factory=list)
    cp: int = 1  # context-parallel ranks (infercast.models.context_parallel)
    #: energy per request and per output token where the tables measured power
    #: (:func:`static_energy`, :mod:`infercast.serving.energy`); None until asked for
    energy: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class Estimator:
    """One model on one system/backend/version with one parallel configuration, compiled once.

    ``prefill_ms`` / ``decode_ms`` accept scalars or numpy arrays (broadcast together) and do no
    I/O: simulators may call them in a loop.

    ``kv_memory_fraction`` is the backend's own KV-memory knob, in its own sense
    (:mod:`infercast.serving.backends`): TensorRT-LLM's ``free_gpu_memory_fraction`` (of the memory
    free after weights and activations), vLLM's ``gpu_memory_utilization`` (of all GPU memory, for
    everything), SGLang's ``mem_fraction_static`` (of all GPU memory, for weights + KV); None keeps
    the engine's default.

    ``moe_comm`` is how attention-DP tokens reach the expert-parallel ranks: ``"gather"``
    (all-gather before the experts, reduce-scatter after: TensorRT-LLM's and vLLM's default) or
    ``"alltoall"`` (DeepEP-style dispatch / combine: SGLang's ``--moe-a2a-backend deepep``, vLLM's
    ``--all2all-backend deepep_*``, TensorRT-LLM's wide-EP); None: all-to-all where the backend's
    wide-EP expert tables cover the shape, else gather.

    ``cp``: context-parallel ranks, each a copy of the ``tp x attention_dp x pp`` layout
    (:mod:`infercast.models.context_parallel`: prompts split over them in zigzag chunks, the KV
    cache sharded over them); ``cp_overlap``: their per-layer K/V exchange in prefill runs
    concurrently with the attention (default: before it).
    """

    def __init__(
        self,
        model: str,
        system: str,
        backend: str,
        backend_version: str | None = None,
        tp: int = 1,
        pp: int = 1,
        *,
        attention_dp: int = 1,
        moe_tp: int | None = None,
        moe_ep: int | None = None,
        gemm_quant: str | None = None,
        kv_cache_quant: str | None = None,
        attention_quant: str | None = None,
        moe_quant: str | None = None,
        nextn: int = 0,
        mtp_acceptance: float | None = None,
        moe_kernel: str | None = None,
        kv_memory_fraction: float | None = None,
        database_mode: str | DatabaseMode = DatabaseMode.SILICON,
        systems_path: str | Path | None = None,
        moe_comm: str | None = None,
        cp: int = 1,
        cp_overlap: bool = False,
        speculative: dict | None = None,
    ):
        mode = DatabaseMode.parse(database_mode)
        if not (isinstance(model, str) and model.strip() or isinstance(model, os.PathLike)):
            raise InvalidInputError("model must be a model id or a config path", f"got {model!r}")
        self.data = _shared(("data", system, backend, backend_version, str(systems_path)),
                            lambda: PerfData.open(system, backend, backend_version, systems_path))
        mc = _shared(("model", str(self.data.pack.systems_dir), str(model)), lambda: resolve_model(self.data.pack, model))
        spec = build_spec(mc)
        quant = spec.quant.with_overrides(gemm=gemm_quant, kv_cache=kv_cache_quant, attention=attention_quant, moe=moe_quant)
        if spec.moe is None:
            quant = replace(quant, moe=None)
        elif gemm_quant and not moe_quant and spec.quant.moe == spec.quant.gemm:
            quant = replace(quant, moe=gemm_quant)  # one checkpoint precision for both
        spec = replace(spec, quant=quant)
        par = ParallelConfig(_int("--tp", tp), _int("--pp", pp), _int("--attention-dp", attention_dp),
                             None if moe_tp is None else _int("--moe-tp", moe_tp), None if moe_ep is None else _int("--moe-ep", moe_ep))
        if cp != 1 or cp_overlap:
            if not isinstance(cp_overlap, bool):
                raise InvalidInputError(f"cp_overlap must be true or false, got {cp_overlap!r}")
            par = replace(par, cp=_int("--cp", cp), cp_overlap=cp_overlap)
        self.db = OpDB.shared(self.data, mode)
        self.data = self.db.data
        if moe_comm is not None:
            if moe_comm not in MOE_COMMS:
                raise InvalidInputError(f"unknown --moe-comm {moe_comm!r}", "known: " + ", ".join(MOE_COMMS))
            if moe_comm == "alltoall" and not (spec.moe is not None and par.attention_dp > 1 and par.ep > 1):
                raise InvalidConfigError("--moe-comm alltoall dispatches attention-DP tokens to expert-parallel ranks",
                                         "it needs an MoE model with --attention-dp > 1 and --moe-ep > 1")
            par = replace(par, moe_comm=moe_comm)
        elif par.attention_dp > 1 and par.ep > 1 and spec.moe is not None:
            from .ops.moe import wide_ep_available  # (the MoE modules: imported for an MoE model alone)

            par.check(spec)
            m = spec.moe
            if wide_ep_available(self.db, quant=quant.moe or quant.gemm, hidden=spec.hidden, inter=m.inter, topk=m.topk,
                                 experts=m.experts, moe_tp=par.etp, moe_ep=par.ep, gated=m.gated, distribution=MOE_DISTRIBUTION):
                par = replace(par, moe_comm="alltoall")  # the backend's wide-EP path (DeepEP dispatch / combine)
        sd = spec_decode_of(_nonneg_int("--nextn", nextn),
                            None if mtp_acceptance is None else _unit("--mtp-acceptance", mtp_acceptance), speculative)
        fusions = engine_fusions(backend, spec, par, self.data.system)
        self.plan: Plan = build_plan(spec, par, sd, fusions)
        if sd.method == "mtp":
            self.plan = with_speculation(self.plan, sd)  # checks only: a --draft-tp the MTP layers would ignore
        elif sd.nextn:
            draft = self._draft_spec(sd, spec, kv_cache_quant)
            dfus = engine_fusions(backend, draft, draft_parallel(sd, par), self.data.system) if sd.method == "draft_model" else None
            self.plan = with_speculation(self.plan, sd, draft, dfus)
        if moe_kernel is not None:
            from .ops.moe import MOE_KERNELS

            kernel = str(moe_kernel).lower()
            if kernel not in MOE_KERNELS:
                raise InvalidInputError(f"unknown --moe-kernel {moe_kernel!r}", "known kernel families: " + ", ".join(MOE_KERNELS))
            self.plan = with_moe_kernel(self.plan, kernel)
        self.engine = CompiledEngine(self.plan, self.db)
        self.backend = backend_defaults(backend)
        if kv_memory_fraction is not None:
            f = _unit("--kv-memory-fraction", kv_memory_fraction)
            if f == 0.0:
                raise InvalidInputError("--kv-memory-fraction must be above 0", "a KV cache of no memory serves nothing")
            self.backend = replace(self.backend, kv_memory_fraction=f)
        mtp = spec.mtp_layers if self.plan.spec_decode.mtp_steps else 0
        self.memory: MemoryBreakdown = memory_breakdown(spec, self.plan.parallel, self.data.system, self.backend, mtp,
                                                        draft_memory(self.plan))
        self._cache: dict = {}

    def _draft_spec(self, sd: SpecDecode, target: ModelSpec, kv_cache_quant: str | None) -> ModelSpec | None:
        """The draft network of ``sd`` (:mod:`infercast.models.speculative`): an EAGLE head (from
        its config when ``sd.draft`` names one, else the target's shape), or the draft model
        resolved like ``model`` at its own quant (``sd.draft_quant`` overriding its GEMMs; the
        KV-cache dtype override applies to the draft's cache too); None for n-gram."""
        if sd.method == "ngram":
            return None
        if sd.draft_quant is not None and sd.draft_quant not in GEMM_QUANTS:
            raise InvalidConfigError(f"--draft-quant {sd.draft_quant!r} is not a known quant mode", available=GEMM_QUANTS)
        mc = resolve_model(self.data.pack, sd.draft) if sd.draft else None
        if sd.method in EAGLE_METHODS:
            return eagle_head_spec(target, sd.method, mc.config if mc else None, sd.draft or "", sd.draft_quant)
        d = build_spec(mc)
        q = d.quant.with_overrides(gemm=sd.draft_quant, kv_cache=kv_cache_quant)
        if d.moe is None:
            q = replace(q, moe=None)
        elif sd.draft_quant and d.quant.moe == d.quant.gemm:
            q = replace(q, moe=sd.draft_quant)
        return replace(d, quant=q)

    @classmethod
    def from_plan(cls, plan: Plan, system: str, backend: str, backend_version: str | None = None,
                  database_mode: str | DatabaseMode = DatabaseMode.SILICON, systems_path=None) -> Estimator:
        self = cls.__new__(cls)
        self.data = PerfData.open(system, backend, backend_version, systems_path)
        self.plan = plan
        self.db = OpDB.shared(self.data, DatabaseMode.parse(database_mode))
        self.data = self.db.data
        self.engine = CompiledEngine(plan, self.db)
        self.backend = backend_defaults(backend)
        self.memory = memory_breakdown(plan.model, plan.parallel, self.data.system, self.backend,
                                       plan.model.mtp_layers if plan.spec_decode.mtp_steps else 0, draft_memory(plan))
        self._cache = {}
        return self

    # ---- properties -------------------------------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        return self.plan.model

    @property
    def gpus(self) -> int:
        return self.plan.parallel.gpus

    @property
    def gpus_per_rank(self) -> float:
        """GPUs behind one attention-DP rank's requests (the serving models' unit of concurrency)."""
        return self.plan.parallel.gpus / self.plan.parallel.attention_dp

    @property
    def layout_words(self) -> str:
        """The layout and its GPU count in words, e.g. "64 GPUs: 8 attention-DP ranks x TP 8; experts EP 8 x TP 8"."""
        from .report.layout import parallel_words

        return parallel_words(self.plan.parallel, self.spec.moe is not None)

    @property
    def version(self) -> str:
        return self.data.version

    # ---- hot path ---------------------------------------------------------------------------
    def prefill_ms(self, batch_size, isl, prefix=0):
        """Latency (ms) of one prefill step: ``batch_size`` sequences of ``isl`` new tokens."""
        if np.isscalar(batch_size) and np.isscalar(isl) and np.isscalar(prefix):
            key = ("p", batch_size, isl, prefix)
            hit = self._cache.get(key)
            if hit is None:
                _check_scalar(batch_size, isl, prefix)
                hit = self._remember(key, self.engine.prefill_scalar(float(batch_size), float(isl), float(prefix)))
            return hit
        b, i, p = _check(batch_size, isl, prefix)
        return self.engine.prefill_ms(b, i, p)

    #: scalar results kept per Estimator (a simulator repeats shapes); cleared when full
    CACHE_LIMIT = 100_000

    def _remember(self, key, value: float) -> float:
        return remember(self._cache, key, value, self.CACHE_LIMIT)

    def decode_step_ms(self, batch_size, kv_len):
        """Latency (ms) of one decode step at KV length ``kv_len`` (tokens incl. the new one)."""
        if np.isscalar(batch_size) and np.isscalar(kv_len):
            _check_scalar(batch_size, kv_len, 0.0, "kv_len")
            return self.engine.decode_scalar(float(batch_size), float(kv_len))
        b = check_positive("batch_size", batch_size, MAX_BATCH)
        kv = check_positive("kv_len", kv_len, MAX_TOKENS)
        broadcast_named(batch_size=b, kv_len=kv)
        return self.engine.decode_ms(b, kv)

    def decode_ms(self, batch_size, isl, osl):
        """Mean decode step (ms) over an output of ``osl`` tokens after a prompt of ``isl``."""
        if np.isscalar(batch_size) and np.isscalar(isl) and np.isscalar(osl):
            key = ("d", batch_size, isl, osl)
            hit = self._cache.get(key)
            if hit is None:
                hit = self._remember(key, float(self._decode_mean(batch_size, isl, osl, scalar=True)))
            return hit
        return self._decode_mean(batch_size, isl, osl)

    def _decode_mean(self, batch_size, isl, osl, scalar: bool = False):
        """The mean over the decode steps' KV lengths: every step up to :data:`DECODE_SAMPLES`
        steps, else that many evenly spaced samples (trapezoid weights). ``scalar``: one batch size,
        so the token-wise ops are summed once (:meth:`CompiledEngine.decode_run_ms`) and only
        attention runs over the samples."""
        b, i, _ = _check(batch_size, isl, 0)
        o = check_positive("osl", osl, MAX_TOKENS)
        b, i, o = broadcast_named(batch_size=b, isl=i, osl=o)
        steps = np.maximum(o - 1.0, 1.0)[..., None]  # decode steps after the prefill's first token
        j = np.arange(DECODE_SAMPLES, dtype=float)
        exact = steps <= DECODE_SAMPLES
        # KV length (incl. the new token) of decode step j is isl + 1 + j, j = 0 .. steps-1
        frac = j / (DECODE_SAMPLES - 1)
        kv = i[..., None] + 1.0 + np.where(exact, j, frac * (steps - 1.0))
        if scalar:
            per = self.engine.decode_run_ms(float(b), kv)
        else:
            per = self.engine.decode_ms(b[..., None], kv)
        mask = np.where(exact, j < steps, True)
        w = np.where(exact, 1.0, np.where((j == 0) | (j == DECODE_SAMPLES - 1), 0.5, 1.0)) * mask
        return (per * w).sum(axis=-1) / w.sum(axis=-1)

    def context_notes(self, isl: int, osl: int, prefix: int = 0) -> list[str]:
        """Notes on what a request of these lengths is taken to be: a vision-language checkpoint
        serves text (its vision tower takes memory, images are not modelled), what a model's layer
        groups approximate (:func:`infercast.models.groups.layer_group_notes`) and Kimi-K3's
        costing does (:func:`infercast.models.kimi_k3.plan_notes`), and a request
        longer than the model's context window (the engines refuse such requests unless the
        window is extended, e.g. by RoPE scaling in the config)."""
        notes = []
        if self.spec.vision_params:
            p = self.spec.vision_params
            notes.append(f"vision-language checkpoint served text-only: its vision tower ({p / 1e9:.2f} B parameters, "
                         f"{p * VISION_WEIGHT_BYTES / GB:.2f} GB in bf16, split over TP) counts in memory; image "
                         "inputs and the encoder's time are not modelled")
        notes.extend(layer_group_notes(self.spec, WINDOW_KV_COUNTED_FROM))
        notes.extend(speculation_notes(self.plan))
        if self.spec.kimi is not None:  # Kimi-K3's costing approximations (models.kimi_k3)
            from .models.kimi_k3 import plan_notes

            notes.extend(plan_notes(self.spec))
        total = int(isl) + int(prefix) + int(osl)
        if self.spec.max_position and total > self.spec.max_position:
            notes.append(f"isl+prefix+osl={total} exceeds the model's max_position_embeddings {self.spec.max_position}")
        return notes

    # ---- static estimate ----------------------------------------------------------------------
    def static(self, batch_size: int, isl: int, osl: int, prefix: int = 0, breakdown: bool = True) -> StaticResult:
        _check(batch_size, isl, prefix)
        check_positive("osl", osl, MAX_TOKENS)
        b, isl, osl, prefix = int(batch_size), int(isl), int(osl), int(prefix)
        mem = self.memory
        tokens_needed = b * (isl + prefix + osl)
        kv_tokens_alloc = b * (-(-(isl + prefix + osl) // mem.tokens_per_block) * mem.tokens_per_block)
        used = mem.weights + mem.activations + mem.reserves + mem.kv_bytes(tokens_needed)
        fits = kv_tokens_alloc <= mem.capacity_for(b)
        notes = []
        if self.spec.alias_note:
            notes.append(self.spec.alias_note)
        fused = [name for name, on in asdict(self.plan.fusions).items() if on]
        if fused:
            notes.append(f"{self.data.backend} kernel fusions in the plan: {', '.join(fused)} (infercast.models.fusions)")
        notes.extend(self.context_notes(isl, osl, prefix))
        res = StaticResult(
            model=self.spec.model_id, system=self.data.system.name, backend=self.data.backend,
            backend_version=self.data.version, tp=self.plan.parallel.tp, pp=self.plan.parallel.pp,
            attention_dp=self.plan.parallel.attention_dp, moe_tp=self.plan.parallel.etp, moe_ep=self.plan.parallel.ep,
            cp=self.plan.parallel.cp, batch_size=b, isl=isl, osl=osl, prefix=prefix, fits=fits,
            ttft_ms=None, tpot_ms=None, request_latency_ms=None,
            tokens_per_s_per_gpu=None, tokens_per_s_per_user=None,
            memory_gb_per_gpu=used / GB,
            memory={
                "weights_gb": mem.weights / GB, "activations_gb": mem.activations / GB,
                "reserves_gb": mem.reserves / GB, "kv_cache_gb": mem.kv_bytes(tokens_needed) / GB,
                "capacity_gb": mem.capacity / GB, "kv_capacity_tokens": mem.kv_capacity_tokens,
                "kv_tokens_needed": kv_tokens_alloc,
            },
            versions=self.versions(),
            quant=asdict(self.spec.quant),
            gpus=self.gpus,
            layout=self.layout_words,
            notes=notes,
        )
        if not fits:
            res.reason = (
                f"{b} x ({isl + prefix}+{osl}) tokens need {kv_tokens_alloc} KV slots "
                f"({mem.kv_bytes(kv_tokens_alloc) / GB:.1f} GB); the KV budget holds {mem.kv_capacity_tokens} "
                f"({mem.kv_budget / GB:.1f} GB of {mem.capacity / GB:.0f} GB after {mem.weights / GB:.1f} GB weights)"
            )
            res.notes.append(f"does not fit: {res.reason}")
            return res
        ttft = self.prefill_ms(b, isl, prefix)
        tau = self.engine.tokens_per_step
        steps = max((osl - 1) / tau, 1.0)
        tpot = self.decode_ms(b, isl + prefix, int(round(steps)) + 1) * steps / (osl - 1) if osl > 1 else 0.0
        total = ttft + tpot * (osl - 1)
        res.ttft_ms, res.tpot_ms, res.request_latency_ms = ttft, tpot, total
        # batch_size is per attention-DP rank: the replica serves attention_dp x batch requests
        res.tokens_per_s_per_gpu = b * self.plan.parallel.attention_dp * osl / (total / 1e3) / self.gpus
        res.tokens_per_s_per_user = 1e3 / tpot if tpot > 0 else None
        res.notes.extend(self.beyond_table_notes(b, isl, osl, prefix))
        if breakdown:
            res.breakdown = self.breakdown(b, isl, osl, prefix)
        return res

    def beyond_table_notes(self, batch_size: int, isl: int, osl: int, prefix: int = 0) -> list[str]:
        """Notes naming the ops a static estimate answers beyond their measured tables
        (:mod:`infercast.engine.beyond`): per op the axis, the farthest query, the measured bound,
        and its share of TTFT (the prefill step) and of TPOT (its mean over the decode steps over
        the mean decode step, the KV lengths and weights :meth:`decode_ms` averages over). Empty
        when every op is inside its tables."""
        b = float(batch_size)
        ctx = dict(ctx_batch=b, ctx_isl=float(isl), ctx_prefix=float(prefix))
        records = [(beyond.find(self.engine, **ctx, phase="prefill"), ctx, None, lambda: self.prefill_ms(b, isl, prefix), "TTFT")]
        if osl > 1:
            out_osl = int(round(max((osl - 1) / self.engine.tokens_per_step, 1.0))) + 1
            kv, w = decode_samples(isl + prefix, out_osl)
            ends = [beyond.find(self.engine, dec_batch=b, dec_kv=float(k), phase="decode") for k in (kv[0], kv[w > 0][-1])]
            records.append((ends[0] + ends[1], dict(dec_batch=b, dec_kv=kv), w,
                            lambda: self.decode_ms(b, isl + prefix, out_osl), "TPOT"))
        return beyond_notes(self.engine, records)

    def serving_beyond_notes(self, *, prefill_batch: float, prefill_isl: float, prefill_prefix: float, ttft_factor: float,
                             decode_batch: float | None, isl: int, osl: int, tpot_ms: float, phases=("prefill", "decode")) -> list[str]:
        """:meth:`beyond_table_notes` for a serving result, at its representative steps: the
        largest prefill step the scheduler forms (``prefill_batch`` prompts, or chunks, of
        ``prefill_isl`` new tokens after ``prefill_prefix``), an op's share of that step scaled
        by ``ttft_factor`` (the prefill steps' share of TTFT); the decode steps of
        ``decode_batch`` sequences over the output's KV lengths, an op's mean time there over the
        wall time of one decode step (``tpot_ms`` times the tokens a step yields). The shares
        are approximate (marked ``~``): a serving benchmark mixes step shapes."""
        records = []
        if "prefill" in phases and prefill_batch > 0 and ttft_factor > 0:
            ctx = dict(ctx_batch=float(prefill_batch), ctx_isl=float(prefill_isl), ctx_prefix=float(prefill_prefix))
            records.append((beyond.find(self.engine, **ctx, phase="prefill"), ctx, None,
                            lambda: self.engine.prefill_scalar(float(prefill_batch), float(prefill_isl), float(prefill_prefix)) / ttft_factor, "TTFT"))
        if "decode" in phases and decode_batch and osl > 1 and tpot_ms > 0:
            b = max(float(decode_batch), 1.0)
            kv, w = decode_samples(isl, osl)
            ends = [beyond.find(self.engine, dec_batch=b, dec_kv=float(k), phase="decode") for k in (kv[0], kv[w > 0][-1])]
            records.append((ends[0] + ends[1], dict(dec_batch=b, dec_kv=kv), w,
                            lambda: tpot_ms * self.engine.tokens_per_step, "TPOT"))
        return beyond_notes(self.engine, records, approx=True)

    def breakdown(self, batch_size, isl, osl, prefix=0) -> list[OpBreakdown]:
        pre = self.engine.components(ctx_batch=batch_size, ctx_isl=isl, ctx_prefix=prefix)
        mid_kv = isl + prefix + max(osl, 2) / 2.0
        dec = self.engine.components(dec_batch=batch_size, dec_kv=mid_kv)
        out = []
        for c in self.engine.ops:
            pv, pp = pre[c.name]
            dv, dp = dec[c.name]
            prov = Prov(int(max(np.max(pp), np.max(dp))))
            src = c.resolved[0].describe() if len(c.resolved) == 1 else {"context": c.resolved[0].describe(), "generation": c.resolved[1].describe()}
            out.append(OpBreakdown(c.name, c.op.count, float(pv), float(dv), prov.label, src))
        return out

    def surface(self, tol: float | None = None):
        """The compiled latency surfaces of this configuration
        (:class:`~infercast.engine.surface.Surface`), built on first use and kept: the simulator
        hot path (``surface().prefill_ms(...)``, ``decode_step_ms``, ``decode_ms`` in closed form,
        and their ``*_many`` array forms). It agrees with this Estimator's op-by-op path within
        its tolerance and answers through that path outside its domain."""
        from .engine.surface import DEFAULT_TOL, Surface

        tol = DEFAULT_TOL if tol is None else float(tol)
        cached = getattr(self, "_surface", None)
        if cached is None or cached.tol != tol:
            cached = self._surface = Surface.build(self.engine, self.identity(), self.versions(), tol=tol)
        return cached

    @staticmethod
    def from_surface(path):
        """A :class:`~infercast.engine.surface.Surface` read from a file written by
        ``infercast compile`` (no perf tables needed; queries outside its domain raise)."""
        from .engine.surface import Surface

        return Surface.read(path)

    def identity(self) -> dict:
        """What identifies this configuration's predictions (model, system, backend and version,
        parallel layout, quantisation, speculative decoding, database mode)."""
        p = self.plan.parallel
        return {
            "model": self.spec.model_id, "system": self.data.system.name, "backend": self.data.backend,
            "backend_version": self.data.version, "tp": p.tp, "pp": p.pp, "attention_dp": p.attention_dp,
            "moe_tp": p.etp, "moe_ep": p.ep, "quant": asdict(self.spec.quant), "nextn": self.plan.spec_decode.nextn,
            "database_mode": str(getattr(self.db.mode, "value", self.db.mode)),
            **self._speculative_identity(),
        }

    def _speculative_identity(self) -> dict:
        """The speculative method, draft network and tokens per step, for methods other than MTP."""
        sd = self.plan.spec_decode
        if sd.method == "mtp" or not sd.nextn:
            return {}
        d = self.plan.draft
        return {"speculative": {"method": sd.method, "draft": d.resolved_id if d else None,
                                "draft_tp": self.plan.draft_parallel.tp if d else None,
                                "tokens_per_step": sd.tokens_per_step}}

    def versions(self) -> dict:
        return {"data_version": self.data.version, "slots": self.data.versions.slots(), "tables": self.data.provenance()}


def decode_samples(isl: float, osl: int) -> tuple[np.ndarray, np.ndarray]:
    """The KV lengths and weights :meth:`Estimator.decode_ms` averages the decode steps of an
    output of ``osl`` tokens after ``isl`` over (one batch size): every step up to
    :data:`DECODE_SAMPLES`, else that many evenly spaced (trapezoid weights)."""
    steps = max(float(osl) - 1.0, 1.0)
    j = np.arange(DECODE_SAMPLES, dtype=float)
    if steps <= DECODE_SAMPLES:
        return float(isl) + 1.0 + j, (j < steps).astype(float)
    kv = float(isl) + 1.0 + j / (DECODE_SAMPLES - 1) * (steps - 1.0)
    return kv, np.where((j == 0) | (j == DECODE_SAMPLES - 1), 0.5, 1.0)


def beyond_notes(engine, records, approx: bool = False) -> list[str]:
    """:func:`infercast.engine.beyond.notes` from ``(excursions, step shape, weights, latency
    denominator, latency name)`` records: an op's share is its (weighted mean) time at the step
    shape over the denominator (a callable, in ms; evaluated, like the op times, only for a phase
    where some op is beyond its table)."""
    out = []
    for exc, shape, w, denominator, latency in records:
        if not exc:
            continue
        names = {e.op for e in exc}
        times = beyond.op_times(engine, names, weights=w, **shape, phase="prefill" if latency == "TTFT" else "decode")
        total = float(denominator())
        out.append((exc, {k: (v / total if total > 0 else 0.0) for k, v in times.items()}, 1.0, latency))
    return beyond.notes(out, [c.name for c in engine.ops], approx=approx) if out else []


def _nonneg_int(name: str, v) -> int:
    return 0 if v in (0, None) else _int(name, v)


def _unit(name: str, v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number in [0, 1]", f"got {v!r}") from None
    if not (0.0 <= f <= 1.0):
        raise InvalidInputError(f"{name} must be a number in [0, 1]", f"got {v!r}")
    return f


def _int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) and not (isinstance(v, float) and v.is_integer()):
        raise InvalidInputError(f"{name} must be a positive integer", f"got {v!r}")
    if int(v) < 1:
        raise InvalidInputError(f"{name} must be a positive integer", f"got {v!r}")
    return int(v)


def _check_scalar(batch, isl, prefix, isl_name: str = "isl") -> None:
    """Plain-Python twin of :func:`_check` for one shape (the simulator hot path)."""
    try:
        b, i, p = float(batch), float(isl), float(prefix)
    except (TypeError, ValueError):
        if isl_name == "kv_len":  # a decode step has no prefix argument
            raise InvalidInputError("batch_size and kv_len must be numbers", f"got {batch!r}, {isl!r}") from None
        raise InvalidInputError(f"batch_size, {isl_name} and prefix must be numbers", f"got {batch!r}, {isl!r}, {prefix!r}") from None
    if 0.0 < b <= MAX_BATCH and 0.0 < i <= MAX_TOKENS and 0.0 <= p <= MAX_TOKENS:
        return
    _check(batch, isl, prefix, isl_name)


def _check(batch, isl, prefix, isl_name: str = "isl"):
    b = check_positive("batch_size", batch, MAX_BATCH)
    i = check_positive(isl_name, isl, MAX_TOKENS)
    p = np.asarray(prefix, dtype=float)
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise InvalidInputError("prefix must be a finite number >= 0", f"got {shown(p, p[~(np.isfinite(p) & (p >= 0))])}")
    if np.any(p > MAX_TOKENS):
        raise InvalidInputError("prefix is absurdly large", f"the limit is {MAX_TOKENS}")
    broadcast_named(batch_size=b, **{isl_name: i}, prefix=p)
    return b, i, p


#: the caches of the open :func:`sharing_data` blocks (innermost last)
_SHARING: list[dict] = []


@contextmanager
def sharing_data():
    """Within this block, the estimators built share the system's perf data (:class:`PerfData`:
    the system's spec and its backend's versions) and the model's config with the first one built
    for the same system, backend, version, pack and model, instead of reading and checking them
    again (~0.8 ms an estimator; a search builds tens). Neither is changed by an estimator (the
    perf data only caches where its tables are), so sharing them gives the same numbers; outside
    the block every estimator reads its own."""
    _SHARING.append({})
    try:
        yield
    finally:
        _SHARING.pop()


def _shared(key: tuple, make):
    """``make()``, or what it made for ``key`` in the innermost open :func:`sharing_data` block."""
    if not _SHARING:
        return make()
    cache = _SHARING[-1]
    if key not in cache:
        cache[key] = make()
    return cache[key]


def serve_agg(est: Estimator, clients_per_rank: int, isl: int, osl: int, params=None, prefix: int = 0,
              notes: bool = True, first_waves: dict | None = None):
    """Aggregated serving (:func:`infercast.serving.agg.serve_agg`) of one replica of ``est``'s
    layout under a closed-loop benchmark of ``clients_per_rank`` clients on each attention-DP rank:
    a :class:`~infercast.serving.agg.ServingResult`. The rank's KV capacity, the GPUs behind it and
    the replica's attention-DP ranks come from ``est``; scheduler parameters default to the
    backend's (:func:`infercast.serving.backends.scheduler_params`). ``prefix``: cached prompt
    tokens shared by every request (:mod:`infercast.serving.prefix`), before the ``isl`` new ones.
    ``notes=False``: the result's ``notes`` (which ops were read beyond their tables,
    :meth:`Estimator.serving_beyond_notes`) are left empty, for a caller that does not report them
    (a search). ``first_waves``: a dict kept across calls for ``est`` that speeds up the first waves
    of larger concurrencies (:func:`infercast.serving.agg.serve_agg`; the same answers)."""
    from .serving.agg import serve_agg as serve
    from .serving.backends import scheduler_params
    from .serving.sim import DoesNotFitError

    clients = _int("clients per rank", clients_per_rank)
    isl, osl = _int("isl", isl), _int("osl", osl)
    prefix = _nonneg_int("prefix", prefix)
    weights_misfit = one_request_misfit(est, isl + osl + prefix, strict=False)
    if weights_misfit:  # say why, as serve_disagg does, rather than "a KV cache of 0 tokens"
        raise DoesNotFitError(f"a replica cannot serve one request: {weights_misfit}",
                              "use more GPUs per replica or a smaller quant")
    p = params or scheduler_params(est.data.backend, est.data.system, est.spec)
    from .serving.scaled import phase_scaled

    res = serve(phase_scaled(est.engine, p), clients, isl, osl, p, est.memory.capacity_for(clients),
                est.gpus_per_rank, ranks=est.plan.parallel.attention_dp, prefix=prefix,
                tokens_per_block=est.memory.tokens_per_block, first_waves=first_waves)
    if not notes:
        return res
    batch, chunk, before = _largest_prefill_step(p, isl, clients)
    res.notes = est.serving_beyond_notes(prefill_batch=batch, prefill_isl=chunk, prefill_prefix=before + prefix,
                                         ttft_factor=_prefill_share_of_ttft(res), decode_batch=res.decode_batch,
                                         isl=isl + prefix, osl=osl, tpot_ms=res.tpot_ms)
    if prefix:
        res.notes.append(f"every request starts with the same {prefix} cached prompt tokens (a warm prefix cache: "
                         "attention over them, no prefill of them, held once per rank's KV cache)")
    return res


def _largest_prefill_step(params, isl: int, prompts: float) -> tuple[float, float, float]:
    """(prompts, new tokens each, cached prefix) of the largest prefill step a scheduler with
    ``params`` forms for prompts of ``isl`` tokens, at most ``prompts`` at once: as many whole
    prompts as the token budget holds, or, for a prompt longer than the budget (chunked prefill),
    its last chunk."""
    budget = float(params.max_num_tokens)
    if isl <= budget:
        return float(max(1, min(int(prompts), int(budget // isl)))), float(isl), 0.0
    if not params.chunked:
        return 1.0, float(isl), 0.0
    chunk = isl / math.ceil(isl / budget)
    return 1.0, chunk, isl - chunk


def _prefill_share_of_ttft(res) -> float:
    """The share of a serving result's mean TTFT spent in the steps that prefill the request
    (:data:`~infercast.serving.result.TTFT_PARTS`), 1 when the parts are not known."""
    parts = res.ttft_parts
    if not parts or not res.ttft_ms:
        return 1.0
    return parts["prefill"] / res.ttft_ms


def static_energy(est: Estimator, res: StaticResult) -> dict | None:
    """The energy of :meth:`Estimator.static`'s result ``res`` (:mod:`infercast.serving.energy`):
    its prefill step and decode steps, per request and per output token; None when it does not fit."""
    from .serving.energy import static_energy as energy

    if not res.fits or res.ttft_ms is None:
        return None
    steps, kv, w = 0.0, None, None
    if res.osl > 1:
        steps = max((res.osl - 1) / est.engine.tokens_per_step, 1.0)
        kv, w = decode_samples(res.isl + res.prefix, int(round(steps)) + 1)
    return energy(est, res.batch_size, res.isl, res.osl, res.prefix, res.tokens_per_s_per_gpu, kv, w, steps)


def serve_agg_replica(est: Estimator, concurrency: int, isl: int, osl: int, params=None, memo: dict | None = None,
                      prefix: int = 0, notes: bool = True, first_waves: dict | None = None):
    """:func:`serve_agg` for ``concurrency`` clients of the whole replica: ``(result, clients per
    rank)``. With attention data parallelism the clients spread over the ranks, the busiest rank
    holding ``ceil(concurrency / ranks)`` of them; its latencies stand for every client (the ranks
    step together behind the experts' collectives), and the throughput counts the clients there
    are: with fewer clients than ranks, some ranks idle.

    ``memo``: a dict the caller keeps for one estimator, ``isl``, ``osl`` and ``params``; the
    :func:`serve_agg` result of each clients-per-rank count is kept there and a copy of it
    answered again (replica concurrencies that put as many clients on the busiest rank share it).
    ``first_waves``: as :func:`serve_agg`'s (a dict kept with ``memo``).
    ``prefix``, ``notes``: as :func:`serve_agg`'s (one memo holds results of one setting)."""
    c = _int("concurrency", concurrency)
    dp = est.plan.parallel.attention_dp
    per_rank = -(-c // dp)
    if memo is None:
        r = serve_agg(est, per_rank, isl, osl, params, prefix, notes, first_waves)
    else:
        kept = memo.get(per_rank)
        if kept is None:
            kept = memo[per_rank] = serve_agg(est, per_rank, isl, osl, params, prefix, notes, first_waves)
        r = copy.copy(kept)  # the caller may change its result's fields
        r.notes = list(kept.notes)
        if kept.ttft_parts is not None:
            r.ttft_parts = dict(kept.ttft_parts)
    if per_rank * dp != c:
        r.tokens_per_s_per_gpu *= c / (per_rank * dp)
    return r, per_rank


def one_request_misfit(est: Estimator, tokens: int, *, strict: bool = True) -> str | None:
    """Why a rank of ``est``'s layout cannot serve one request of ``tokens`` KV tokens, or None.
    Always: its weights alone exceed the GPU's memory. ``strict``: also when the KV cache left by
    weights, activations and reserves (:mod:`infercast.serving.memory`, a conservative account)
    holds fewer than ``tokens``."""
    mem = est.memory
    if mem.weights >= mem.capacity:
        return f"its weights take {mem.weights / GB:.1f} GB per GPU, more than the GPU's {mem.capacity / GB:.0f} GB"
    if not strict or mem.capacity_for(1) >= tokens:
        return None
    return (f"its KV cache holds {int(mem.capacity_for(1))} tokens of the {int(tokens)} one request needs "
            f"({mem.weights / GB:.1f} GB of weights per GPU of {mem.capacity / GB:.0f} GB)")


def serve_disagg(
    prefill: Estimator,
    decode: Estimator,
    *,
    concurrency: int,
    isl: int,
    osl: int,
    prefill_workers: int,
    decode_workers: int,
    prefill_batch: int = 1,
    params_prefill=None,
    params_decode=None,
    prefix: int = 0,
):
    """Disaggregated serving (:mod:`infercast.serving.disagg`) of ``prefill_workers`` copies of
    the ``prefill`` estimator's layout and ``decode_workers`` of ``decode``'s, under a closed-loop
    benchmark of ``concurrency`` clients: a :class:`~infercast.serving.disagg.DisaggResult`.

    The KV cache moves from every prefill GPU in parallel over the node-to-node network
    (``inter_node_bw``, ``p2p_latency`` of the system spec). Scheduler parameters default to each
    backend's (:func:`infercast.serving.backends.scheduler_params`). The result's
    ``decode_kv_capacity`` is how many requests of ``isl + osl`` tokens one decode rank's KV cache
    holds by :mod:`infercast.serving.memory` (``prefill_kv_capacity``: prompts one prefill rank
    holds); the model does not cap the decode batch by it (it is reported, and ``infercast
    serve-disagg`` warns when the decode batch exceeds it: the memory model is conservative, and
    measured deployments run where it leaves no room). It does cap it at the decode scheduler's
    ``max_batch_size`` (requests then wait for a decode slot, in TPOT: ``decode_slot_wait_ms``).
    A worker whose weights alone exceed its
    GPUs' memory is refused (:class:`~infercast.serving.sim.DoesNotFitError`). ``prefix``: cached
    prompt tokens shared by every request (:mod:`infercast.serving.prefix`): both workers attend
    to them and hold them once per rank; only the ``isl`` new tokens' KV cache moves."""
    from .serving.backends import scheduler_params
    from .serving.disagg import kv_transfer_ms, solve_disagg
    from .serving.prefix import prefixed, shared_prefix_capacity
    from .serving.sim import DoesNotFitError

    for name, v in (("concurrency", concurrency), ("isl", isl), ("osl", osl), ("prefill_workers", prefill_workers),
                    ("decode_workers", decode_workers), ("prefill_batch", prefill_batch)):
        _int(name, v)
    prefix = _nonneg_int("prefix", prefix)
    if (prefill.data.system.name, prefill.data.backend, prefill.spec.model_id) != (
            decode.data.system.name, decode.data.backend, decode.spec.model_id):
        raise InvalidInputError("prefill and decode workers must serve the same model on the same system and backend",
                                f"got {prefill.spec.model_id} on {prefill.data.system.name} ({prefill.data.backend}) and "
                                f"{decode.spec.model_id} on {decode.data.system.name} ({decode.data.backend})")
    for role, est, tokens in (("prefill", prefill, isl + prefix), ("decode", decode, isl + osl + prefix)):
        # only what cannot run at all: the memory account is conservative, and measured
        # deployments run where it leaves no KV room (the capacities are reported, the CLI warns)
        why = one_request_misfit(est, tokens, strict=False)
        if why:
            raise DoesNotFitError(f"a {role} worker cannot serve one request: {why}",
                                  "use more GPUs per worker or a smaller quant")
    pp = params_prefill or scheduler_params(prefill.data.backend, prefill.data.system, prefill.spec)
    pd = params_decode or scheduler_params(decode.data.backend, decode.data.system, decode.spec)
    node = prefill.data.system.node
    transfer = kv_transfer_ms(prefill.memory.kv_per_token, isl, prefill.gpus, node.inter_node_bw, node.p2p_latency_s,
                              prefill.memory.state_per_request)
    gpus = prefill_workers * prefill.gpus + decode_workers * decode.gpus
    from .serving.scaled import phase_scaled

    res = solve_disagg(
        prefixed(phase_scaled(prefill.engine, pp), prefix), prefixed(phase_scaled(decode.engine, pd), prefix),
        float(concurrency), isl, osl, prefill_workers, decode_workers,
        decode.plan.parallel.attention_dp, prefill_batch, pp, pd, transfer, gpus,
        prefill_dp=prefill.plan.parallel.attention_dp,
    )
    res.decode_kv_capacity = shared_prefix_capacity(decode.memory.capacity_for(res.decode_batch), prefix,
                                                    decode.memory.tokens_per_block) / (isl + osl)
    res.prefill_kv_capacity = shared_prefix_capacity(prefill.memory.capacity_for(res.prefill_batch), prefix,
                                                     prefill.memory.tokens_per_block) / isl
    batch, chunk, before = _largest_prefill_step(pp, isl, res.prefill_batch)
    res.notes = (prefill.serving_beyond_notes(prefill_batch=batch, prefill_isl=chunk, prefill_prefix=before + prefix,
                                              ttft_factor=_prefill_share_of_ttft(res), decode_batch=None, isl=isl + prefix,
                                              osl=osl, tpot_ms=res.tpot_ms, phases=("prefill",))
                 + decode.serving_beyond_notes(prefill_batch=0, prefill_isl=isl, prefill_prefix=0, ttft_factor=0.0,
                                               decode_batch=res.decode_batch, isl=isl + prefix, osl=osl,
                                               tpot_ms=res.tpot_ms, phases=("decode",)))
    if prefix:
        res.notes.append(f"every request starts with the same {prefix} cached prompt tokens (warm prefix caches on "
                         "both workers: attention over them, no prefill of them; only the new tokens' KV cache moves)")
    if res.decode_slot_wait_ms > 0:
        res.notes.append(f"every decode rank runs its scheduler's max_batch_size {pd.max_batch_size} requests: the "
                         f"others wait {res.decode_slot_wait_ms:.0f} ms on average for a decode slot after their KV "
                         "arrives (in TPOT: the first token came from the prefill worker)")
    return res
