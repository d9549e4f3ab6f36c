"""Compiled plan -> step latency, vectorised over arrays of shapes.

:class:`CompiledEngine` resolves every plan op against a database once (tables read, sites
transferred, grids filled) and then evaluates steps with numpy only: no I/O, no model walk.

A *step* is one forward pass of the engine over a batch:

* ``prefill(batch, isl, prefix)``: ``batch`` sequences each adding ``isl`` new tokens on top of
  ``prefix`` cached ones (a prefill or a prefill chunk);
* ``decode(batch, kv_len)``: ``batch`` sequences each adding one token at KV length ``kv_len``;
* ``mixed(...)``: both in one step (continuous batching with chunked prefill): token-wise ops run
  once over all tokens, attention runs per part.

Context attention with a cached prefix is the full causal attention over ``isl + prefix`` scaled
by the share of query-key pairs the new tokens own (:func:`prefix_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..interp.provenance import Prov
from ..models.plan import Plan, PlanOp
from ..ops.attention import prefix_fraction, resolve_context_attention, resolve_generation_attention
from ..ops.base import OpDB, Resolved
from ..ops.comm import elementwise_ms, p2p_ms, resolve_collective
from ..ops.gemm import resolve_gemm


@dataclass
class CompiledOp:
    op: PlanOp
    resolved: tuple[Resolved, ...]  # gemm/comm: 1; attention: (context, generation)

    @property
    def name(self) -> str:
        return self.op.name


class CompiledEngine:
    def __init__(self, plan: Plan, db: OpDB):
        self.plan = plan
        self.db = db
        self.ops: list[CompiledOp] = [self._compile(op) for op in plan.ops]
        self._tokenwise_memo: dict = {}

    def _compile(self, op: PlanOp) -> CompiledOp:
        p = op.params
        if op.kind == "gemm":
            return CompiledOp(op, (resolve_gemm(self.db, p["quant"], int(p["n"]), int(p["k"])),))
        if op.kind == "attention":
            args = (int(p["heads"]), int(p["kv_heads"]), int(p["head_dim"]), p["kv_quant"], p["attn_quant"], int(p["window"]))
            return CompiledOp(op, (resolve_context_attention(self.db, *args), resolve_generation_attention(self.db, *args)))
        if op.kind in ("allreduce", "allgather"):
            coll = "all_reduce" if op.kind == "allreduce" else "all_gather"
            return CompiledOp(op, (resolve_collective(self.db, coll, int(p["group"])),))
        if op.kind == "elementwise":
            return CompiledOp(op, (Resolved(None, "sol", how="analytic", fixed_prov=Prov.ANALYTIC),))
        if op.kind == "p2p":
            return CompiledOp(op, (Resolved(None, "analytic", how="analytic", fixed_prov=Prov.ANALYTIC),))
        raise ValueError(f"unknown op kind {op.kind!r}")

    # ---- per-op evaluation -------------------------------------------------------------------
    def _tokenwise(self, c: CompiledOp, tokens: np.ndarray, seqs: np.ndarray):
        op, p = c.op, c.op.params
        n = tokens if op.tokens == "all" else seqs
        active = n > 0
        n_eval = np.where(active, n, 1.0)
        if op.kind == "gemm":
            v, pr = c.resolved[0].grid(n_eval)
        elif op.kind in ("allreduce", "allgather"):
            v, pr = c.resolved[0].grid(n_eval * p["elements_per_token"])
        elif op.kind == "elementwise":
            v, pr = elementwise_ms(self.db, n_eval * p["bytes_per_token"]), np.full(n_eval.shape, int(Prov.ANALYTIC), np.int8)
        elif op.kind == "p2p":
            v, pr = p2p_ms(self.db, n_eval * p["bytes_per_token"]), np.full(n_eval.shape, int(Prov.ANALYTIC), np.int8)
        else:
            raise ValueError(op.kind)
        return np.where(active, v * op.count, 0.0), pr

    def _context_attention(self, c: CompiledOp, batch, isl, prefix):
        active = batch > 0
        b = np.where(active, batch, 1.0)
        total = isl + prefix
        v, pr = c.resolved[0].grid(b, total)
        v = np.where(prefix > 0, v * prefix_fraction(isl, prefix), v)
        return np.where(active, v * c.op.count, 0.0), pr

    def _generation_attention(self, c: CompiledOp, batch, kv_len):
        active = batch > 0
        b = np.where(active, batch, 1.0)
        step = np.maximum(kv_len - 1.0, 1.0)
        v, pr = c.resolved[1].grid(b, step)
        return np.where(active, v * c.op.count, 0.0), pr

    def components(
        self,
        *,
        ctx_batch=0.0,
        ctx_isl=1.0,
        ctx_prefix=0.0,
        dec_batch=0.0,
        dec_kv=1.0,
        phase: str | None = None,
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per-op latency (ms, summed over the op's count) and provenance for one step shape."""
        ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv = np.broadcast_arrays(
            *(np.asarray(a, dtype=float) for a in (ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv))
        )
        tokens = ctx_batch * ctx_isl + dec_batch
        seqs = ctx_batch + dec_batch
        out = {}
        for c in self.ops:
            if phase is not None and c.op.phase not in ("both", phase):
                continue
            if c.op.kind == "attention":
                vc, pc = self._context_attention(c, ctx_batch, ctx_isl, ctx_prefix)
                vg, pg = self._generation_attention(c, dec_batch, dec_kv)
                out[c.name] = (vc + vg, np.maximum(np.where(ctx_batch > 0, pc, 0), np.where(dec_batch > 0, pg, 0)).astype(np.int8))
            else:
                out[c.name] = self._tokenwise(c, tokens, seqs)
        return out

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch: float, dec_kv: float) -> float:
        """One step carrying several prefill groups (arrays: sequences, new tokens, prefix each)
        and ``dec_batch`` decodes at mean KV length ``dec_kv``: token-wise ops run once over all
        tokens, attention per group."""
        cb = np.asarray(ctx_batch, dtype=float)
        ci = np.asarray(ctx_isl, dtype=float)
        cp = np.asarray(ctx_prefix, dtype=float)
        tokens = float((cb * ci).sum()) + dec_batch
        seqs = float(cb.sum()) + dec_batch
        key = (tokens, seqs)
        total = self._tokenwise_memo.get(key)
        if total is None:
            t_arr, s_arr = np.array([tokens]), np.array([seqs])
            total = sum(float(self._tokenwise(c, t_arr, s_arr)[0][0]) for c in self.ops if c.op.kind != "attention")
            if len(self._tokenwise_memo) < 200_000:
                self._tokenwise_memo[key] = total
        attn = [c for c in self.ops if c.op.kind == "attention"]
        if cb.size and cb.sum() > 0:
            total += sum(float(self._context_attention(c, cb, ci, cp)[0].sum()) for c in attn)
        if dec_batch > 0:
            b, kv = np.array([dec_batch]), np.array([dec_kv])
            total += sum(float(self._generation_attention(c, b, kv)[0][0]) for c in attn)
        return total

    def step_ms(self, **shape) -> np.ndarray:
        comps = self.components(**shape)
        return sum(v for v, _ in comps.values())

    def prefill_ms(self, batch, isl, prefix=0.0) -> np.ndarray:
        return self.step_ms(ctx_batch=batch, ctx_isl=isl, ctx_prefix=prefix, phase="prefill")

    def decode_ms(self, batch, kv_len) -> np.ndarray:
        return self.step_ms(dec_batch=batch, dec_kv=kv_len, phase="decode")

    def describe_ops(self) -> list[dict]:
        rows = []
        for c in self.ops:
            d = {"op": c.name, "kind": c.op.kind, "count": c.op.count, **{k: v for k, v in c.op.params.items()}}
            if c.op.kind == "attention":
                d["context"] = c.resolved[0].describe()
                d["generation"] = c.resolved[1].describe()
            else:
                d.update(c.resolved[0].describe())
            rows.append(d)
        return rows
