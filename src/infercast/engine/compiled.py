"""Compiled plan -> step latency, vectorised over arrays of shapes.

:class:`CompiledEngine` resolves every plan op against a database once (tables read, sites
transferred, grids filled) and then evaluates steps with numpy only: no I/O, no model walk.

A *step* is one forward pass of the engine over a batch:

* ``prefill(batch, isl, prefix)``: ``batch`` sequences each adding ``isl`` new tokens on top of
  ``prefix`` cached ones (a prefill or a prefill chunk);
* ``decode(batch, kv_len)``: ``batch`` sequences each adding one token at KV length ``kv_len``;
* ``mixed_step_ms(...)``: both in one step (continuous batching with chunked prefill):
  token-wise ops run once over all tokens, attention runs per part.

Op kinds and how they are evaluated:

* token-wise with a table grid (``gemm``, ``moe``, collectives, ``moe_dispatch``): the op's 1-D
  grid at ``tokens x params["x_per_token"]`` (elements for collectives; 1 for GEMM/MoE);
* ``attention`` / ``mla``: a context grid over ``(batch, length)`` and a generation grid over
  ``(batch, cached tokens)``; a cached prefix scales the full causal attention over
  ``isl + prefix`` by the share of query-key pairs the new tokens own, never below the new tokens
  alone (:func:`~infercast.ops.attention.with_prefix`);
* analytic (``elementwise``, ``p2p``): bytes over bandwidth plus a constant latency;
* context parallelism (``plan.parallel.cp > 1``, :mod:`infercast.engine.context_parallel`):
  prompt tokens count ``1 / cp`` in the token-wise ops, context attention is the slowest CP
  rank's zigzag chunks, decode attention reads ``1 / cp`` of the KV, and the ``cp_exchange``
  (prefill K/V all-gather over the sequence's ``isl + prefix`` tokens) and ``cp_combine``
  (decode partial outputs over the decoding tokens) collectives are added per attention op.

Every evaluator has a plain-Python scalar twin (:meth:`Grid.scalar`) for callers asking one
shape at a time; the two agree to rounding.
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass, replace

import numpy as np

from ..errors import NotAvailableError
from ..interp.provenance import Prov
from ..interp.grid import latency_rows, sorted_unique, stack_rows
from ..models.plan import Plan, PlanOp
from ..ops.attention import prefixed_context, resolve_context_attention, resolve_generation_attention, with_prefix
from .context_parallel import sharded_cached, sharded_cached_scalar, zigzag_context, zigzag_context_scalar
from ..ops.base import OpDB, Resolved

GRID_KINDS = ("gemm", "moe", "allreduce", "allgather", "reduce_scatter", "alltoall", "moe_dispatch", "mhc")
ATTENTION_KINDS = ("attention", "mla", "dsa", "msa", "dsv4_attention", "gdn", "kda", "mamba_conv", "mamba_ssm")
#: attention-like kinds whose cost does not depend on cached tokens before the new ones (a
#: linear-attention layer keeps a fixed-size state): a prefix does not enter their context grid
STATEFUL_KINDS = ("gdn", "kda", "mamba_conv", "mamba_ssm")
ANALYTIC_KINDS = ("elementwise", "p2p")
CP_KINDS = ("cp_exchange", "cp_combine")
#: decode runs of at most this many steps are summed with the scalar grid path (a numpy call costs
#: more than a few scalar lookups)
SCALAR_RUN = 4
#: :meth:`CompiledEngine.mixed_steps_ms` prices at most this many steps with the scalar twins (one
#: array call over every op costs about as much as this many scalar steps)
SCALAR_STEPS = 32


@dataclass
class CompiledOp:
    op: PlanOp
    # token-wise: 1, or (context, generation) when ``phase_split``; attention-like: (context, generation)
    resolved: tuple[Resolved, ...]
    x_per_token: float = 1.0
    # analytic ops: ms = count * (units * ms_per_unit + fixed_ms)
    ms_per_unit: float = 0.0
    fixed_ms: float = 0.0
    #: a token-wise op whose kernels differ by phase (SGLang's wide-EP expert block and its
    #: dispatch: DeepEP's normal mode in steps that carry prompt tokens, low-latency in
    #: decode-only steps): ``resolved`` is (context, generation)
    phase_split: bool = False

    @property
    def name(self) -> str:
        return self.op.name


def _single_phase(op: PlanOp) -> str:
    """The phase whose kernels a token-wise op resolves when it is not phase-split: its own
    (``decode`` for MTP draft passes), ``generation`` for an op of both phases."""
    return "generation" if op.phase == "both" else op.phase


def _collective_name(kind: str) -> str:
    return {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter", "alltoall": "alltoall"}[kind]


#: scalar results a CompiledEngine keeps per memo (a simulator repeats its steps); cleared when full
MEMO_LIMIT = 100_000


def remember(memo: dict, key, value: float, limit: int | None = None) -> float:
    """Store ``value`` under ``key`` in a bounded memo and return it; a memo holding ``limit``
    entries (default :data:`MEMO_LIMIT`) is emptied first."""
    if len(memo) >= (MEMO_LIMIT if limit is None else limit):
        memo.clear()
    memo[key] = value
    return value


#: the types :meth:`CompiledEngine.step_ms` takes for scalars without asking numpy
_SCALARS = (float, int, np.float64)


def _floats(x) -> list:
    """A scalar, sequence or array as a list of Python numbers."""
    return list(x) if isinstance(x, (list, tuple)) else np.atleast_1d(x).tolist()


class CompiledEngine:
    def __init__(self, plan: Plan, db: OpDB):
        self.plan = plan
        self.db = db
        self.ops: list[CompiledOp] = [self._compile_shared(op) for op in plan.ops]
        self._index_ops()

    def _index_ops(self) -> None:
        """Group :attr:`ops` by kind and phase for the evaluators, and start with empty memos
        (called again by a copy that keeps only some ops, :mod:`.energy`)."""
        plan = self.plan
        main = [c for c in self.ops if c.op.phase != "decode"]
        draft = [c for c in self.ops if c.op.phase == "decode"]
        self._grid_ops = [c for c in main if c.op.kind in GRID_KINDS]
        self._attn_ops = [c for c in main if c.op.kind in ATTENTION_KINDS]
        self._analytic_ops = [c for c in main if c.op.kind in ANALYTIC_KINDS]
        self._draft_grid_ops = [c for c in draft if c.op.kind in GRID_KINDS]
        self._draft_attn_ops = [c for c in draft if c.op.kind in ATTENTION_KINDS]
        self._draft_analytic_ops = [c for c in draft if c.op.kind in ANALYTIC_KINDS]
        #: context-parallel ranks (1: none) and their collectives
        self.cp = int(plan.parallel.cp)
        self._cp_exchange = [c for c in main if c.op.kind == "cp_exchange"]
        self._cp_combine = [c for c in main if c.op.kind == "cp_combine"]
        self._draft_cp_combine = [c for c in draft if c.op.kind == "cp_combine"]
        self._by_name = {c.name: c for c in self.ops}
        #: main-model tokens per decoding sequence per step (1 + MTP draft tokens verified)
        self.decode_width = 1.0 + plan.spec_decode.nextn
        #: output tokens a decoding sequence gains per step on average
        self.tokens_per_step = plan.spec_decode.tokens_per_step
        self._tw_main = self._tokenwise_rows(self._grid_ops, self._analytic_ops)
        self._tw_draft = self._tokenwise_rows(self._draft_grid_ops, self._draft_analytic_ops)
        #: (the generation grid's ``scalar``, count) of each attention op, main model then draft
        self._gen_attn_rows = tuple((c.resolved[1].grid.scalar, c.op.count) for c in self._attn_ops + self._draft_attn_ops)
        self._tokenwise_memo: dict = {}
        self._context_memo: dict = {}
        self._mixed_memo: dict = {}
        self._decode_plan: list | None = None  # _decode_rows's answer
        self._tokenwise_stacks: dict = {}  # _stack_plan's answers: "main", "draft"

    def _compile_shared(self, op: PlanOp) -> CompiledOp:
        """:meth:`_compile_backfilled`, kept in the database's memo (:meth:`OpDB.memo`) under
        everything the resolution reads (the op's kind, phase and parameters, and for an MoE op
        how tokens reach the experts): the layouts of a search share most of their op shapes, and
        each is resolved once per process, and kept between processes
        (:mod:`~infercast.engine.compile_cache`). The op's own name and count are put back on the
        answer."""
        from .compile_cache import compiled

        try:
            key = ("compiled-op", op.kind, op.phase, tuple(sorted(op.params.items())),
                   self.plan.parallel.moe_comm if op.kind == "moe" else None)
            hash(key)
        except TypeError:  # a parameter that cannot be a key: resolved afresh
            return self._compile_backfilled(op)
        c = self.db.memo(key, lambda: compiled(self.db, key, lambda: self._compile_backfilled(op)))
        return c if c.op is op else replace(c, op=op)

    def _compile_backfilled(self, op: PlanOp) -> CompiledOp:
        """``op`` resolved against the engine's data version; when that version has no data for
        the op's shape (:class:`~infercast.errors.NotAvailableError` in SILICON mode: a table
        re-collected for a few models, a quant mode or site it lacks), against the older
        collected versions the backfill rule allows (:meth:`OpDB.backfill_dbs`, newest first),
        the first that answers winning. The op's own quant mode is asked every time: a missing
        shape is never answered from another quant by this fallback. Each resolved lookup keeps
        the version that answered it and says why in its notes; if no version answers, the
        chosen version's error stands."""
        try:
            return self._compile(op)
        except NotAvailableError as exc:
            first = exc
        for donor in self.db.backfill_dbs():
            other = copy(self)  # the same engine reading the donor version's tables
            other.db = donor
            try:
                c = other._compile(op)
            except NotAvailableError:
                continue
            why = (f"{self.db.data.version} cannot answer this op ({first.what}): answered by the older "
                   f"collected version {donor.data.version}")
            return replace(c, resolved=tuple(replace(r, notes=(*r.notes, why)) for r in c.resolved))
        raise first

    def _compile(self, op: PlanOp) -> CompiledOp:
        from ..ops.comm import resolve_collective
        from ..ops.gemm import resolve_gemm

        p = op.params
        if op.kind == "gemm":
            return CompiledOp(op, (resolve_gemm(self.db, p["quant"], int(p["n"]), int(p["k"]),
                                                fused_input_quant=p.get("input_quant") == "fused"),))
        if op.kind in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
            r = resolve_collective(self.db, _collective_name(op.kind), int(p["group"]))
            return CompiledOp(op, (r,), x_per_token=float(p["elements_per_token"]))
        if op.kind in CP_KINDS:
            from ..models.context_parallel import check_context_parallel

            check_context_parallel(self.plan.model, self.plan.parallel, self.db.system.node.nvlink_gpus)
            r = resolve_collective(self.db, "all_gather", int(p["group"]))
            return CompiledOp(op, (r,), x_per_token=float(p["elements_per_token"]))
        if op.kind == "moe":
            from ..ops.moe import resolve_moe

            wide_ep = self.plan.parallel.moe_comm == "alltoall"  # the DeepEP path: its expert kernels too

            def moe(phase: str):
                return resolve_moe(
                    self.db, quant=p["quant"], hidden=int(p["hidden"]), inter=int(p["inter"]), topk=int(p["topk"]),
                    experts=int(p["experts"]), moe_tp=int(p["moe_tp"]), moe_ep=int(p["moe_ep"]),
                    distribution=p.get("distribution", "balanced"), gated=bool(p.get("gated", True)), wide_ep=wide_ep,
                    kernel=p.get("kernel"), phase=phase,
                )

            x = float(p.get("tokens_multiplier", 1.0))
            if wide_ep and op.phase == "both":  # DeepEP's mode follows the step (ops.moe.WIDE_EP_TABLES)
                return CompiledOp(op, (moe("context"), moe("generation")), x_per_token=x, phase_split=True)
            return CompiledOp(op, (moe(_single_phase(op)),), x_per_token=x)
        if op.kind == "moe_dispatch":
            from ..ops.moe import resolve_moe_dispatch

            def dispatch(phase: str):
                return resolve_moe_dispatch(self.db, phase=phase, hidden=int(p["hidden"]), topk=int(p["topk"]),
                                            experts=int(p["experts"]), ep=int(p["ep"]), quant=p.get("quant", "bfloat16"))

            if op.phase != "both":
                return CompiledOp(op, (dispatch(_single_phase(op)),))
            # high-throughput kernels in steps that carry prompt tokens, low-latency ones in decode-only steps
            return CompiledOp(op, (dispatch("context"), dispatch("generation")), phase_split=True)
        if op.kind == "attention":
            args = (int(p["heads"]), int(p["kv_heads"]), int(p["head_dim"]), p["kv_quant"], p["attn_quant"], int(p["window"]))
            return CompiledOp(op, (resolve_context_attention(self.db, *args), resolve_generation_attention(self.db, *args)))
        if op.kind == "mla":
            from ..ops.mla import resolve_mla

            kw = {k: p[k] for k in ("hidden", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                    "qk_rope_head_dim", "v_head_dim", "gemm_quant", "kv_quant")}
            kw["model_id"] = p.get("model_id")
            return CompiledOp(op, (resolve_mla(self.db, "context", **kw), resolve_mla(self.db, "generation", **kw)))
        if op.kind == "dsa":
            from ..ops.dsa import resolve_dsa

            kw = {k: p[k] for k in ("hidden", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                    "qk_rope_head_dim", "v_head_dim", "gemm_quant", "kv_quant")}
            kw.update(model_id=p.get("model_id"), tp=int(p.get("tp", 1)))
            return CompiledOp(op, (resolve_dsa(self.db, "context", **kw), resolve_dsa(self.db, "generation", **kw)))
        if op.kind == "msa":
            from ..ops.msa import resolve_msa

            kw = {k: p[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "topk_tokens", "gemm_quant", "kv_quant")}
            kw["tp"] = int(p.get("tp", 1))
            return CompiledOp(op, (resolve_msa(self.db, "context", **kw), resolve_msa(self.db, "generation", **kw)))
        if op.kind == "dsv4_attention":
            from ..ops.dsv4 import DSV4Dims, resolve_dsv4_attention

            dims = DSV4Dims(*(int(p[k]) for k in ("hidden", "q_lora_rank", "o_lora_rank", "head_dim", "qk_rope_head_dim",
                                                  "index_n_heads", "index_head_dim", "index_topk", "window")))
            kw = {"kind": p["kind"], "ratio": int(p["ratio"]), "dims": dims, "heads": int(p["heads"]),
                  "o_groups": int(p["o_groups"]), "gemm_quant": p["gemm_quant"], "kv_quant": p["kv_quant"],
                  "tp": int(p.get("tp", 1)), "model_id": p.get("model_id")}
            return CompiledOp(op, (resolve_dsv4_attention(self.db, "context", **kw),
                                   resolve_dsv4_attention(self.db, "generation", **kw)))
        if op.kind == "mhc":
            from ..ops.mhc import resolve_mhc

            return CompiledOp(op, (resolve_mhc(self.db, p["which"], hidden=int(p["hidden"]), hc_mult=int(p["hc_mult"]),
                                               sinkhorn_iters=int(p["sinkhorn_iters"])),))
        if op.kind == "gdn":
            from ..ops.gdn import resolve_gdn

            kw = {k: p[k] for k in ("d_model", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "conv_kernel")}
            kw["model_name"] = p.get("model_name")
            return CompiledOp(op, (resolve_gdn(self.db, "context", **kw), resolve_gdn(self.db, "generation", **kw)))
        if op.kind == "kda":
            from ..ops.kda import resolve_kda

            kw = {k: int(p[k]) for k in ("d_model", "num_heads", "head_dim", "conv_kernel")}
            kw["model_name"] = p.get("model_name")
            return CompiledOp(op, (resolve_kda(self.db, "context", **kw), resolve_kda(self.db, "generation", **kw)))
        if op.kind in ("mamba_conv", "mamba_ssm"):
            from ..ops.mamba import resolve_mamba_conv, resolve_mamba_ssm

            if op.kind == "mamba_conv":
                kw = {k: int(p[k]) for k in ("d_model", "nheads", "head_dim", "n_groups", "d_state", "conv_kernel")}
                kw["model_name"] = p.get("model_name")
                return CompiledOp(op, (resolve_mamba_conv(self.db, "context", **kw), resolve_mamba_conv(self.db, "generation", **kw)))
            kw = {k: int(p[k]) for k in ("nheads", "head_dim", "d_state", "n_groups", "chunk")}
            kw["state_bytes"] = float(p.get("state_bytes", 4.0))
            return CompiledOp(op, (resolve_mamba_ssm(self.db, "context", **kw), resolve_mamba_ssm(self.db, "generation", **kw)))
        if op.kind == "elementwise":
            g = self.db.system.gpu
            return CompiledOp(op, (Resolved(None, "sol", how="analytic", fixed_prov=Prov.ANALYTIC),),
                              x_per_token=float(p["bytes_per_token"]), ms_per_unit=1e3 / g.effective_mem_bw, fixed_ms=g.mem_latency_s * 1e3)
        if op.kind == "p2p":
            n = self.db.system.node
            bw = n.inter_node_bw if p.get("inter_node") else n.intra_node_bw
            return CompiledOp(op, (Resolved(None, "analytic", how="analytic", fixed_prov=Prov.ANALYTIC),),
                              x_per_token=float(p["bytes_per_token"]), ms_per_unit=1e3 / bw, fixed_ms=n.p2p_latency_s * 1e3)
        raise ValueError(f"unknown op kind {op.kind!r}")

    # ---- vectorised per-op evaluation ------------------------------------------------------------
    def _tokenwise(self, c: CompiledOp, tokens: np.ndarray, seqs: np.ndarray, context=False):
        """``context``: whether each step carries prompt tokens (a phase-split op reads its context
        grid there, its generation grid elsewhere)."""
        n = tokens if c.op.tokens == "all" else seqs
        active = n > 0
        n_eval = np.where(active, n, 1.0)
        if c.op.kind in ANALYTIC_KINDS:
            v = n_eval * c.x_per_token * c.ms_per_unit + c.fixed_ms
            pr = np.full(n_eval.shape, int(Prov.ANALYTIC), np.int8)
        elif c.phase_split:
            # each grid is asked only at the steps of its phase (elsewhere at its first point): a
            # low-latency table that stops at decode sizes must not refuse a prefill step
            x = n_eval * c.x_per_token
            ctx = np.broadcast_to(np.asarray(context, dtype=bool), np.shape(x))
            gc, gg = c.resolved[0].grid, c.resolved[1].grid
            vc, pc = gc(np.where(ctx, x, gc.axes[0][0]), refuse=True)
            vg, pg = gg(np.where(ctx, gg.axes[0][0], x), refuse=True)
            v, pr = np.where(ctx, vc, vg), np.where(ctx, pc, pg).astype(np.int8)
        else:
            v, pr = c.resolved[0].grid(n_eval * c.x_per_token, refuse=True)
        return np.where(active, v * c.op.count, 0.0), pr

    def _context_attention(self, c: CompiledOp, batch, isl, prefix):
        active = batch > 0
        b = np.where(active, batch, 1.0)
        if c.op.kind in STATEFUL_KINDS:
            v, pr = c.resolved[0].grid(b, isl, refuse=True)
        elif self.cp > 1:
            grid = c.resolved[0].grid
            w = float(c.op.params.get("window", 0) or 0)  # a sliding window sees at most w earlier tokens
            v, pr = zigzag_context(lambda bb, q, pre: prefixed_context(grid, bb, q, np.minimum(pre, w) if w > 0 else pre),
                                   b, isl, prefix, self.cp)
        else:
            v, pr = prefixed_context(c.resolved[0].grid, b, isl, prefix)
        return np.where(active, v * c.op.count, 0.0), pr

    def _generation_attention(self, c: CompiledOp, batch, kv_len):
        active = batch > 0
        b = np.where(active, batch, 1.0)
        step = sharded_cached(kv_len, self.cp) if self.cp > 1 else np.maximum(kv_len - 1.0, 1.0)
        v, pr = c.resolved[1].grid(b, step, refuse=True)
        return np.where(active, v * c.op.count, 0.0), pr

    def _cp_collective(self, c: CompiledOp, tokens):
        """A context-parallel all-gather over ``tokens`` tokens' elements, times its count (0 where
        there are none)."""
        tokens = np.asarray(tokens, dtype=float)
        active = tokens > 0
        v, pr = c.resolved[0].grid(np.where(active, tokens, 1.0) * c.x_per_token, refuse=True)
        return np.where(active, v * c.op.count, 0.0), np.where(active, pr, 0).astype(np.int8)

    def components(
        self,
        *,
        ctx_batch=0.0,
        ctx_isl=1.0,
        ctx_prefix=0.0,
        dec_batch=0.0,
        dec_kv=1.0,
        dec_pad=0.0,
        phase: str | None = None,
        only: set[str] | None = None,
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per-op latency (ms, summed over the op's count) and provenance for one step shape.
        ``dec_pad``: padding rows of a CUDA graph captured for a larger decode batch — the
        token-wise ops run on ``dec_batch + dec_pad`` decoding rows, attention on ``dec_batch``.
        ``only``: the names of the ops to evaluate (default: all)."""
        ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad = np.broadcast_arrays(
            *(np.asarray(a, dtype=float) for a in (ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad))
        )
        rows = dec_batch + dec_pad
        tokens = (ctx_batch * ctx_isl if self.cp == 1 else ctx_batch * ctx_isl / self.cp) + rows * self.decode_width
        seqs = ctx_batch + rows
        zero = np.zeros_like(ctx_batch)
        out = {}
        for c in self.ops:
            if phase is not None and c.op.phase not in ("both", phase) or only is not None and c.name not in only:
                continue
            draft = c.op.phase == "decode"  # MTP draft passes: one token per decoding sequence
            if c.op.kind == "cp_exchange":
                v, pr = self._cp_collective(c, ctx_batch * (ctx_isl + ctx_prefix))
                if c.op.params.get("overlap"):  # hidden behind its attention: only the excess shows
                    a, _ = self._context_attention(self._by_name[c.op.params["attention"]], ctx_batch, ctx_isl, ctx_prefix)
                    v = np.maximum(v - a, 0.0)
                out[c.name] = (v, pr)
                continue
            if c.op.kind == "cp_combine":
                out[c.name] = self._cp_collective(c, dec_batch * (1.0 if draft else self.decode_width))
                continue
            if c.op.kind in ATTENTION_KINDS:
                vc, pc = self._context_attention(c, zero if draft else ctx_batch, ctx_isl, ctx_prefix)
                vg, pg = self._generation_attention(c, dec_batch, dec_kv)
                out[c.name] = (vc + vg, np.maximum(np.where(ctx_batch > 0, pc, 0), np.where(dec_batch > 0, pg, 0)).astype(np.int8))
            else:
                out[c.name] = self._tokenwise(c, rows if draft else tokens, rows if draft else seqs,
                                              False if draft else ctx_batch > 0)
        return out

    def step_ms(self, **shape) -> np.ndarray:
        if shape.get("phase") is None and all(type(v) in _SCALARS or np.ndim(v) == 0 for v in shape.values()):
            return np.float64(self._step_scalar(**{k: float(v) for k, v in shape.items() if k != "phase"}))
        comps = self.components(**shape)
        return sum(v for v, _ in comps.values())

    def decode_steps_ms(self, batch, kv_len, pad=0.0) -> np.ndarray:
        """``step_ms(dec_batch=batch, dec_kv=kv_len, dec_pad=pad, phase="decode")`` for arrays of
        decode-only steps, with the same per-op values summed in the same order (so the same
        numbers), at less cost: each token-wise op is evaluated once per distinct row count
        ``batch + pad`` (CUDA-graph padding leaves few), and the context attention, which a step
        without prompt tokens does not run (zero in :meth:`components`), is left out. A
        context-parallel engine (sharded KV reads, the partial outputs' combine) takes
        :meth:`step_ms` itself."""
        if self.cp > 1:
            return self.step_ms(dec_batch=batch, dec_kv=kv_len, dec_pad=pad, phase="decode")
        batch, kv, pad = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (batch, kv_len, pad)))
        rows, inv = batch + pad, None
        if pad.any():  # padded to a few captured sizes: each evaluated once
            rows, inv = np.unique(rows, return_inverse=True)
            inv = inv.reshape(batch.shape)
        # per-call invariants of the op loop, computed once (the same arrays each op would build)
        dec_active = batch > 0
        dec_everywhere = bool(dec_active.all())
        dec_b, dec_kv = np.where(dec_active, batch, 1.0), np.maximum(kv - 1.0, 1.0)
        by_n = {}  # token counts -> (active, the counts with 1 where inactive, all active)
        units = {}  # id(unit) -> its ops' values (a row each for a stack), None: a stack held beyond its axis
        total = 0
        for unit, row in self._decode_rows():
            kind = unit[0]
            if kind == "attention":  # _generation_attention's values
                c = unit[1]
                v = c.resolved[1].grid.latency(dec_b, dec_kv, refuse=True) * c.op.count
                total = total + (v if dec_everywhere else np.where(dec_active, v, 0.0))
                continue
            wide = unit[1]
            hit = by_n.get(wide)
            if hit is None:
                n = rows * self.decode_width if wide else rows
                active = n > 0
                hit = by_n[wide] = (active, np.where(active, n, 1.0), bool(active.all()))
            active, n1, everywhere = hit
            vals = units.get(id(unit), False)
            if vals is False:  # _tokenwise's values in a step without prompt tokens, for every op of the unit
                if kind == "analytic":  # (tokens x tokens per unit) x ms per unit + fixed ms, a row per op
                    _, _, xpt, mpu, fixed, count = unit
                    vals = n1 * xpt * mpu + fixed
                elif kind == "stack":  # the grids' rows (one locate for all), then a row per op
                    _, _, stack, grid_rows, xpt, count, _ = unit
                    vals = latency_rows(stack, n1 * xpt)
                    if vals is not None:
                        vals = vals[grid_rows]
                else:  # one op's grid
                    _, _, grid, xpt, count = unit
                    vals = grid.latency(n1 * xpt, refuse=True)
                if vals is not None:
                    vals = vals * count if everywhere else np.where(active, vals * count, 0.0)
                    if inv is not None:
                        vals = vals[..., inv]
                units[id(unit)] = vals
            if vals is None:  # a query beyond the stack's axis: the op's own grid holds it (or refuses)
                c = unit[6][row]
                v = c.resolved[1 if c.phase_split else 0].grid.latency(n1 * c.x_per_token, refuse=True)
                v = np.where(active, v * c.op.count, 0.0)
                if inv is not None:
                    v = v[inv]
            else:
                v = vals if row is None else vals[row]
            total = total + v
        return total

    def decode_batch_knots(self) -> np.ndarray | None:
        """The decode batches (rows of a decode-only step) at which some op of :meth:`decode_steps_ms`
        meets a grid point: each token-wise op's axis over its tokens per row (the decode width for
        a main-model op), each attention op's batch axis. Between two of them every op is
        interpolated within one interval of its grid, so a step's time is linear in the batch
        there wherever the grids blend linearly (linear and tile axes; not a log axis, nor beyond a
        grid's edge: :class:`~infercast.serving.decode_curve.DecodeCurve` checks it). None when the
        batch does not enter the ops that way (context parallelism, a grid that is not 1-D or
        batch-first)."""
        if self.cp > 1:
            return None
        points = []
        for unit, _ in self._decode_rows():
            kind = unit[0]
            if kind == "analytic":
                continue
            if kind == "attention":
                grid = unit[1].resolved[1].grid
                if len(getattr(grid, "axes", ())) != 2:
                    return None
                points.append(grid.axes[0])
                continue
            wide, (axes, xpt) = unit[1], ((unit[2][0],), unit[4]) if kind == "stack" else (getattr(unit[2], "axes", ()), unit[3])
            if len(axes) != 1:
                return None
            points.append(np.asarray(axes[0], dtype=float) / (xpt * (self.decode_width if wide else 1.0)))
        return sorted_unique(np.concatenate(points)) if points else np.zeros(0)

    def _decode_rows(self) -> list:
        """What :meth:`decode_steps_ms` sums, in op order: (unit, row) per op, a unit being the
        values of one or more ops computed together (the op's row of them; None: the unit is the
        one op's). Units: ``("attention", op)``; ``("analytic", wide, x per token, ms per unit,
        fixed ms, count)`` (columns, a row per op) for every analytic op of one token count;
        ``("stack", wide, stack, grid rows, x per token, counts, ops)`` for the token-wise ops
        of one token count whose 1-D grids share an axis (the GEMMs of a layer on one token axis,
        a collective used several times; :func:`~infercast.interp.grid.stack_rows`), so that
        each call locates their neighbours once; ``("grid", wide, grid, x per token, count)``
        for any other. ``wide``: the op's token count is the decode width times the rows. The
        same elementwise operations as one op at a time, so the same numbers. Built on first use."""
        if self._decode_plan is not None:
            return self._decode_plan
        entries, analytic, grids = [], {}, {}
        for c in self.ops:
            if c.op.phase not in ("both", "decode"):
                continue
            if c.op.kind in ATTENTION_KINDS:
                entries.append((("attention", c), None))
                continue
            wide = not (c.op.phase == "decode" or c.op.tokens != "all")
            if c.op.kind in ANALYTIC_KINDS:
                members = analytic.setdefault(wide, [])
                entries.append([("analytic", wide), len(members)])
                members.append(c)
                continue
            g = c.resolved[1 if c.phase_split else 0].grid
            key = (wide, c.x_per_token, g.scales[0], g.axes[0].tobytes()) if len(getattr(g, "axes", ())) == 1 else None
            if key is None:
                entries.append((("grid", wide, g, c.x_per_token, c.op.count), None))
                continue
            members = grids.setdefault(key, [])
            entries.append([("stackable", key), len(members)])
            members.append(c)
        col = lambda ops, f: np.array([[float(f(c))] for c in ops])  # noqa: E731
        made = {}
        for wide, ops in analytic.items():
            made["analytic", wide] = ("analytic", wide, col(ops, lambda c: c.x_per_token), col(ops, lambda c: c.ms_per_unit),
                                      col(ops, lambda c: c.fixed_ms), col(ops, lambda c: c.op.count))
        for key, ops in grids.items():
            own = [c.resolved[1 if c.phase_split else 0].grid for c in ops]
            unique = list({id(g): g for g in own}.values())
            stack = stack_rows(unique) if len(ops) > 1 else None
            if stack is None:  # each op alone
                made["stackable", key] = [("grid", key[0], g, c.x_per_token, c.op.count) for c, g in zip(ops, own)]
            else:
                at = {id(g): r for r, g in enumerate(unique)}
                made["stackable", key] = ("stack", key[0], stack, np.array([at[id(g)] for g in own], dtype=np.intp),
                                          key[1], col(ops, lambda c: c.op.count), tuple(ops))
        plan = []
        for unit, row in entries:
            if unit[0] in ("analytic", "stackable"):
                unit = made[unit]
                if isinstance(unit, list):  # not stacked: the op's own unit
                    unit, row = unit[row], None
            plan.append((unit, row))
        self._decode_plan = plan
        return plan

    def _step_scalar(self, ctx_batch=0.0, ctx_isl=1.0, ctx_prefix=0.0, dec_batch=0.0, dec_kv=1.0, dec_pad=0.0) -> float:
        """:meth:`step_ms` of one shape through the scalar twins (the same sums as
        :meth:`components`, without numpy per op)."""
        context = ctx_batch > 0
        groups = ((ctx_batch, ctx_isl, ctx_prefix),) if context else ()
        return self._scalar_step(groups, dec_batch, dec_kv, dec_pad, context)

    def _scalar_step(self, groups, dec_batch: float, dec_kv: float, dec_pad: float, context: bool) -> float:
        """One step of prefill ``groups`` (sequences, new tokens, prefix each) and ``dec_batch``
        decodes (plus ``dec_pad`` CUDA-graph padding rows for the token-wise ops): token-wise ops
        once over all tokens, context attention per group, generation attention of the decodes."""
        rows = dec_batch + dec_pad
        tokens = sum(b * i for b, i, _ in groups) / self.cp + rows * self.decode_width if self.cp > 1 else \
            sum(b * i for b, i, _ in groups) + rows * self.decode_width
        seqs = sum(b for b, _, _ in groups) + rows
        total = self.tokenwise_scalar(float(tokens), float(seqs), float(rows), context)
        for b, i, p in groups:
            total += self.context_attention_scalar(b, i, p)
        return total + self.generation_attention_scalar(dec_batch, dec_kv)

    def prefill_ms(self, batch, isl, prefix=0.0) -> np.ndarray:
        return self.step_ms(ctx_batch=batch, ctx_isl=isl, ctx_prefix=prefix, phase="prefill")

    def decode_ms(self, batch, kv_len) -> np.ndarray:
        return self.step_ms(dec_batch=batch, dec_kv=kv_len, phase="decode")

    # ---- scalar twins (plain Python, no numpy per call) -----------------------------------------
    @staticmethod
    def _tokenwise_rows(grid_ops, analytic_ops) -> tuple:
        """The fields :meth:`_sum_tokenwise` reads per op, gathered once: grid ops as (counts all
        tokens, the grid's ``scalar`` in a step with prompt tokens, without, tokens per unit, count),
        analytic ops as (counts all tokens, tokens per unit, ms per unit, fixed ms, count)."""
        grid_rows = tuple((c.op.tokens == "all", c.resolved[0].grid.scalar,
                           (c.resolved[1] if c.phase_split else c.resolved[0]).grid.scalar, c.x_per_token, c.op.count)
                          for c in grid_ops)
        analytic_rows = tuple((c.op.tokens == "all", c.x_per_token, c.ms_per_unit, c.fixed_ms, c.op.count) for c in analytic_ops)
        return grid_rows, analytic_rows

    @staticmethod
    def _sum_tokenwise(rows, tokens: float, seqs: float, context: bool = False) -> float:
        """Sum of the token-wise ops of ``rows`` (:meth:`_tokenwise_rows`) for one step."""
        total = 0.0
        grid_rows, analytic_rows = rows
        for every, ctx_scalar, gen_scalar, xpt, count in grid_rows:
            n = tokens if every else seqs
            if n > 0:
                total += (ctx_scalar if context else gen_scalar)(n * xpt, refuse=True)[0] * count
        for every, xpt, ms_per_unit, fixed_ms, count in analytic_rows:
            n = tokens if every else seqs
            if n > 0:
                total += (n * xpt * ms_per_unit + fixed_ms) * count
        return total

    def tokenwise_scalar(self, tokens: float, seqs: float, draft_seqs: float = 0.0, context: bool = False) -> float:
        """Sum of every token-wise op for one step of ``tokens`` main-model tokens over ``seqs``
        sequences, plus MTP draft passes over ``draft_seqs`` decoding sequences; ``context``: the
        step carries prompt tokens (phase-split ops, :attr:`CompiledOp.phase_split`)."""
        key = (tokens, seqs, draft_seqs, context)
        hit = self._tokenwise_memo.get(key)
        if hit is not None:
            return hit
        total = self._sum_tokenwise(self._tw_main, tokens, seqs, context)
        if draft_seqs > 0 and (self._draft_grid_ops or self._draft_analytic_ops):
            total += self._sum_tokenwise(self._tw_draft, draft_seqs, draft_seqs)
        return remember(self._tokenwise_memo, key, total)

    def context_attention_scalar(self, batch: float, isl: float, prefix: float = 0.0) -> float:
        """Context attention of ``batch`` sequences of ``isl`` new tokens after ``prefix`` cached
        ones, summed over the attention ops (memoised: a simulated benchmark repeats its prefill
        chunks wave after wave)."""
        if batch <= 0:
            return 0.0
        key = (batch, isl, prefix)
        hit = self._context_memo.get(key)
        if hit is not None:
            return hit
        return remember(self._context_memo, key, self._context_attention_sum(batch, isl, prefix))

    def _context_attention_sum(self, batch: float, isl: float, prefix: float) -> float:
        if self.cp > 1:
            return self._cp_context_attention_sum(batch, isl, prefix)
        frac = 1.0
        if prefix > 0:
            tot = isl + prefix
            frac = (isl * prefix + isl * (isl + 1.0) / 2.0) / (tot * (tot + 1.0) / 2.0)
        total = 0.0
        for c in self._attn_ops:
            if c.op.kind in STATEFUL_KINDS:
                total += c.resolved[0].grid.scalar(batch, isl, refuse=True)[0] * c.op.count
            else:
                v = c.resolved[0].grid.scalar(batch, isl + prefix, refuse=True)[0] * frac
                if prefix > 0:  # never below the new tokens alone (ops.attention.with_prefix)
                    v = max(v, c.resolved[0].grid.scalar(batch, isl, refuse=True)[0])
                total += v * c.op.count
        return total

    @staticmethod
    def _prefixed_scalar(grid, batch: float, isl: float, prefix: float) -> float:
        """Scalar twin of :func:`~infercast.ops.attention.prefixed_context`."""
        v = grid.scalar(batch, isl + prefix, refuse=True)[0]
        if prefix > 0:
            tot = isl + prefix
            frac = (isl * prefix + isl * (isl + 1.0) / 2.0) / (tot * (tot + 1.0) / 2.0)
            v = max(v * frac, grid.scalar(batch, isl, refuse=True)[0])
        return v

    def _cp_context_attention_sum(self, batch: float, isl: float, prefix: float) -> float:
        """Context attention of a context-parallel step: per attention op the slowest rank's
        zigzag chunks, plus its K/V exchange (serial, or only its excess over the attention when
        overlapped)."""
        total = 0.0
        attn = {}
        for c in self._attn_ops:
            grid = c.resolved[0].grid
            w = float(c.op.params.get("window", 0) or 0)
            v = zigzag_context_scalar(lambda b, q, pre: self._prefixed_scalar(grid, b, q, min(pre, w) if w > 0 else pre),
                                      batch, isl, prefix, self.cp)
            attn[c.name] = v * c.op.count
            total += attn[c.name]
        for c in self._cp_exchange:
            e = c.resolved[0].grid.scalar(batch * (isl + prefix) * c.x_per_token, refuse=True)[0] * c.op.count
            if c.op.params.get("overlap"):
                e = max(e - attn.get(c.op.params["attention"], 0.0), 0.0)
            total += e
        return total

    def generation_attention_scalar(self, batch: float, kv_len: float) -> float:
        if batch <= 0:
            return 0.0
        if self.cp > 1:
            step = sharded_cached_scalar(kv_len, self.cp)
            total = sum(c.resolved[1].grid.scalar(batch, step, refuse=True)[0] * c.op.count for c in self._attn_ops + self._draft_attn_ops)
            total += sum(c.resolved[0].grid.scalar(batch * self.decode_width * c.x_per_token, refuse=True)[0] * c.op.count
                         for c in self._cp_combine)
            return total + sum(c.resolved[0].grid.scalar(batch * c.x_per_token, refuse=True)[0] * c.op.count
                               for c in self._draft_cp_combine)
        step = max(kv_len - 1.0, 1.0)
        return sum(scalar(batch, step, refuse=True)[0] * count for scalar, count in self._gen_attn_rows)

    def prefill_scalar(self, batch: float, isl: float, prefix: float = 0.0) -> float:
        tokens = batch * isl if self.cp == 1 else batch * isl / self.cp
        return self.tokenwise_scalar(tokens, batch, context=batch > 0) + self.context_attention_scalar(batch, isl, prefix)

    def decode_scalar(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        """One decode step of ``batch`` sequences at KV length ``kv_len`` (``pad``: CUDA-graph
        padding rows, token-wise ops only; see :meth:`components`)."""
        rows = batch + pad
        return self.tokenwise_scalar(rows * self.decode_width, rows, rows) + self.generation_attention_scalar(batch, kv_len)

    def decode_run_ms(self, batch: float, kv_len, pad: float = 0.0) -> np.ndarray:
        """Decode-only steps of ``batch`` sequences at each KV length of the array ``kv_len`` (a
        run of steps between two scheduler events). The token-wise ops do not depend on the KV
        length, so they are summed once (scalar, memoised) and only the attention ops run over the
        array: the same values as ``step_ms(dec_batch=batch, dec_kv=kv_len)`` at a fraction of the
        cost."""
        kv = np.asarray(kv_len, dtype=float)
        if batch <= 0:
            return np.zeros_like(kv)
        if kv.size <= SCALAR_RUN:  # most runs end at the next arrival after one step: no numpy
            return np.array([self.decode_scalar(float(batch), float(x), pad) for x in kv.ravel()]).reshape(kv.shape)
        rows = float(batch) + pad
        total = np.full(kv.shape, self.tokenwise_scalar(rows * self.decode_width, rows, rows))
        step = sharded_cached(kv, self.cp) if self.cp > 1 else np.maximum(kv - 1.0, 1.0)
        b = np.full(kv.shape, float(batch))
        for c in self._attn_ops + self._draft_attn_ops:
            total = total + c.resolved[1].grid(b, step, refuse=True)[0] * c.op.count
        for c in self._cp_combine + self._draft_cp_combine:  # the same at every KV length
            width = self.decode_width if c.op.phase != "decode" else 1.0
            total = total + c.resolved[0].grid.scalar(float(batch) * width * c.x_per_token, refuse=True)[0] * c.op.count
        return total

    def decode_one_ms(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        """:meth:`decode_run_ms` of a run of one step, as a float (the same number, without numpy:
        a simulator's usual run ends at the next completion, one step on)."""
        if batch <= 0:
            return 0.0
        return self.decode_scalar(float(batch), float(kv_len), pad)

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch: float, dec_kv: float) -> float:
        """One step carrying several prefill groups (sequences, new tokens, prefix each) and
        ``dec_batch`` decodes at mean KV length ``dec_kv``: token-wise ops run once over all
        tokens, attention per group."""
        return self.mixed_groups_ms(tuple(zip(_floats(ctx_batch), _floats(ctx_isl), _floats(ctx_prefix))), dec_batch, dec_kv)

    def mixed_groups_ms(self, groups: tuple, dec_batch: float, dec_kv: float) -> float:
        """:meth:`mixed_step_ms` of prefill ``groups`` given as a tuple of (sequences, new tokens,
        prefix) float triples (a simulator's step, without building the three lists)."""
        key = (groups, dec_batch, dec_kv)
        hit = self._mixed_memo.get(key)
        if hit is not None:
            return hit
        context = any(b > 0 and i > 0 for b, i, _ in groups)
        return remember(self._mixed_memo, key, self._scalar_step(groups, dec_batch, dec_kv, 0.0, context))

    def steps_path(self, n: int) -> str:
        """How :meth:`mixed_steps_ms` prices ``n`` steps by default: ``"scalar"`` (the scalar twins:
        a few steps, or a context-parallel engine) or ``"array"`` (one grid call per op)."""
        return "scalar" if self.cp > 1 or n <= SCALAR_STEPS else "array"

    def mixed_steps_ms(self, group_step, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad,
                       path: str | None = None) -> np.ndarray:
        """GPU time of each of a sequence of steps (a recorded benchmark, :mod:`infercast.serving.sim`):
        step ``s`` carries ``dec_batch[s]`` decodes at mean KV length ``dec_kv[s]`` (plus
        ``dec_pad[s]`` CUDA-graph padding rows for the token-wise ops) and the prefill groups ``g``
        with ``group_step[g] == s`` (``ctx_batch`` sequences of ``ctx_isl`` new tokens after
        ``ctx_prefix`` cached ones each; ``group_step`` ascending). Each step is what
        :meth:`mixed_groups_ms` (or, without prefill groups, :meth:`decode_scalar`) answers, the
        per-op values summed in the same order: through those scalar twins for a few steps or a
        context-parallel engine, else through the array path, one grid call per op for all the
        steps (equal to the scalar twins to rounding); ``path`` ("scalar" or "array") chooses
        instead (:meth:`steps_path`: the default). Either way each step's time depends on that
        step alone (a simulator prices a run's steps in pieces: the same numbers)."""
        dec = np.asarray(dec_batch, dtype=float)
        kv = np.asarray(dec_kv, dtype=float)
        pad = np.asarray(dec_pad, dtype=float)
        gs = np.asarray(group_step, dtype=np.int64)
        gb, gi, gp = (np.asarray(x, dtype=float) for x in (ctx_batch, ctx_isl, ctx_prefix))
        n = dec.size
        path = path or self.steps_path(n)
        if path == "scalar":
            return self._mixed_steps_scalar(gs, gb, gi, gp, dec, kv, pad)
        if path != "array" or self.cp > 1:
            raise ValueError(f"mixed_steps_ms: path {path!r} (scalar, or array without context parallelism)")
        rows = dec + pad
        tokens = np.bincount(gs, gb * gi, minlength=n) + rows * self.decode_width
        seqs = np.bincount(gs, gb, minlength=n) + rows
        context = np.bincount(gs, (gb > 0) & (gi > 0), minlength=n) > 0
        # token-wise ops over all of a step's tokens (tokenwise_scalar's sums, in its order)
        total = self._tokenwise_sum("main", self._grid_ops + self._analytic_ops, tokens, seqs, context)
        if self._draft_grid_ops or self._draft_analytic_ops:  # MTP draft passes over the decoding rows
            total = total + self._tokenwise_sum("draft", self._draft_grid_ops + self._draft_analytic_ops, rows, rows, False)
        if gs.size:  # context attention per group, added group by group in each step's order
            ctx = np.zeros(gs.size)
            b, prefixed = np.where(gb > 0, gb, 1.0), gp > 0
            for c in self._attn_ops:  # _context_attention's values (without the provenance)
                grid = c.resolved[0].grid
                if c.op.kind in STATEFUL_KINDS:
                    v = grid.latency(b, gi, refuse=True)
                else:  # prefixed_context: over isl + prefix, then never below the new tokens alone
                    v = grid.latency(b, gi + gp, refuse=True)
                    if prefixed.any():
                        alone = v.copy()
                        alone[prefixed] = grid.latency(b[prefixed], gi[prefixed], refuse=True)
                        v = with_prefix(v, alone, gi, gp)
                ctx = ctx + np.where(gb > 0, v * c.op.count, 0.0)
            pos = np.arange(gs.size) - np.searchsorted(gs, gs)  # each group's place in its step
            for j in range(int(pos.max()) + 1):
                at = pos == j
                total[gs[at]] += ctx[at]
        active = dec > 0
        b, step = np.where(active, dec, 1.0), np.maximum(kv - 1.0, 1.0)
        gen = 0.0
        for c in self._attn_ops + self._draft_attn_ops:  # _generation_attention's values
            gen = gen + np.where(active, c.resolved[1].grid.latency(b, step, refuse=True) * c.op.count, 0.0)
        return total + gen

    def _tokenwise_sum(self, which: str, ops: list, tokens: np.ndarray, seqs: np.ndarray, context) -> np.ndarray:
        """The sum over ``ops`` (token-wise, in order; ``which``: "main" or "draft", the name its
        plan is kept under) of :meth:`_tokenwise`'s values, the 1-D grids
        that share an axis, scale and token count evaluated as one stack
        (:func:`~infercast.interp.grid.latency_rows`: the same elementwise operations)."""
        plan = self._tokenwise_stacks.get(which)
        if plan is None:
            plan = self._tokenwise_stacks[which] = self._stack_plan(ops)
        entries, stacks = plan
        values = {}
        for k, (every, xpt, stack, members) in stacks.items():
            n = tokens if every else seqs
            active = n > 0
            x = np.where(active, n, 1.0) * xpt
            rows = latency_rows(stack, x) if stack is not None else None
            if rows is None:  # not stacked, or a query beyond the axis: each grid answers (or refuses)
                rows = [c.resolved[0].grid.latency(x, refuse=True) for c in members]
            values[k] = [np.where(active, r * c.op.count, 0.0) for r, c in zip(rows, members)]
        total = np.zeros(np.shape(tokens))
        for k, c in entries:
            total = total + (values[k][c] if k is not None else self._tokenwise(c, tokens, seqs, context)[0])
        return total

    @staticmethod
    def _stack_plan(ops: list) -> tuple:
        """(entries, stacks) for :meth:`_tokenwise_sum`: per op in order (stack key, its row) or
        (None, the op) for one evaluated alone (analytic, phase-split, a grid not 1-D); stacks
        {key: (counts all tokens, x per token, :func:`stack_rows` of the members or None, members)}."""
        entries, members = [], {}
        for c in ops:
            g = c.resolved[0].grid
            if c.op.kind in ANALYTIC_KINDS or c.phase_split or len(getattr(g, "axes", ())) != 1:
                entries.append((None, c))
                continue
            k = (c.op.tokens == "all", c.x_per_token, g.scales[0], g.axes[0].tobytes())
            ms = members.setdefault(k, [])
            entries.append((k, len(ms)))
            ms.append(c)
        stacks = {k: (k[0], k[1], stack_rows([c.resolved[0].grid for c in ms]) if len(ms) > 1 else None, ms)
                  for k, ms in members.items()}
        return entries, stacks

    def _mixed_steps_scalar(self, gs, gb, gi, gp, dec, kv, pad) -> np.ndarray:
        """:meth:`mixed_steps_ms` step by step through the scalar twins."""
        n = dec.size
        bounds = np.searchsorted(gs, np.arange(n + 1)).tolist()
        groups = list(zip(gb.tolist(), gi.tolist(), gp.tolist()))
        out = np.zeros(n)
        for s, (d, k, p) in enumerate(zip(dec.tolist(), kv.tolist(), pad.tolist())):
            g = tuple(groups[bounds[s]:bounds[s + 1]])
            if g and p == 0.0:
                out[s] = self.mixed_groups_ms(g, d, k)
            elif g:
                out[s] = self._scalar_step(g, d, k, p, any(b > 0 and i > 0 for b, i, _ in g))
            elif d > 0:
                out[s] = self.decode_scalar(d, k, p)
        return out

    def describe_ops(self) -> list[dict]:
        rows = []
        for c in self.ops:
            d = {"op": c.name, "kind": c.op.kind, "count": c.op.count, **dict(c.op.params.items())}
            if c.op.kind in ATTENTION_KINDS or c.phase_split:
                d["context"] = c.resolved[0].describe()
                d["generation"] = c.resolved[1].describe()
            else:
                d.update(c.resolved[0].describe())
            rows.append(d)
        return rows
