"""The public per-op API: ask one op family for latencies of arrays of shapes.

>>> db = PerfDB("h200_sxm", "trtllm")                                        # doctest: +SKIP
>>> r = db.gemm("fp8_block", m=[1, 64, 4096], n=1280, k=5120)               # doctest: +SKIP
>>> r.ms, r.provenance                                                       # doctest: +SKIP

Every method broadcasts its shape arguments together, resolves each distinct site once (cached on
the object) and returns an :class:`OpResult`: latency per shape (ms), the provenance label per
shape (exact / interpolated / transferred / held / empirical / sol), and how each site was
answered (table, version, kernel, donor sites).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data.database import PerfData
from ..data.quant import GEMM_QUANTS, KV_QUANTS
from ..errors import InvalidInputError
from ..interp.provenance import Prov
from .attention import (
    prefixed_context,
    resolve_context_attention,
    resolve_generation_attention,
)
from .base import (
    DatabaseMode,
    OpDB,
    Resolved,
    as_numbers,
    broadcast_named,
    check_positive,
    shown,
)
from .comm import resolve_collective
from .gemm import resolve_gemm

_LABELS = np.array([p.label for p in Prov])
#: the attention compute dtypes the tables hold
ATTENTION_DTYPES = ("bfloat16", "fp8")


def _known(what: str, value, allowed) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInputError(f"unknown {what} {value!r}", available=list(allowed))


def _whole(name: str, a: np.ndarray) -> np.ndarray:
    """``a`` when every value is a whole number (head counts, GEMM widths, windows), else an error:
    a fractional size would be rounded to some collected site silently."""
    frac = a != np.round(a)
    if np.any(frac):
        raise InvalidInputError(f"{name} must be whole numbers", f"got {shown(a, a[frac])}")
    return a


@dataclass
class OpResult:
    ms: np.ndarray
    provenance: np.ndarray  # str labels, same shape as ms
    sources: list[dict] = field(default_factory=list)  # one per distinct site resolved

    def __len__(self) -> int:
        return int(self.ms.size)


class PerfDB:
    """Per-op queries for one system, backend and data version in one database mode."""

    def __init__(self, system: str, backend: str, backend_version: str | None = None,
                 database_mode: str | DatabaseMode = DatabaseMode.SILICON, systems_path: str | Path | None = None):
        self.db = OpDB(PerfData.open(system, backend, backend_version, systems_path), DatabaseMode.parse(database_mode))
        self._sites: dict = {}

    def _site(self, key, build) -> Resolved:
        if key not in self._sites:
            self._sites[key] = build()
        return self._sites[key]

    @staticmethod
    def _finish(ms, prov, sources) -> OpResult:
        return OpResult(np.asarray(ms, float), _LABELS[np.asarray(prov, np.int64)], sources)

    def _by_site(self, site_arrays: dict, curve_eval):
        """Group broadcast shapes by their site, evaluate each group on its resolved grid."""
        names = list(site_arrays)
        stacked = np.stack([np.asarray(site_arrays[n], float).ravel() for n in names], axis=1)
        out = np.empty(len(stacked))
        prov = np.empty(len(stacked), np.int64)
        sources = []
        uniq, inv = np.unique(stacked, axis=0, return_inverse=True)
        for u, site in enumerate(uniq):
            sel = np.flatnonzero(inv.reshape(-1) == u)
            v, p, src = curve_eval(dict(zip(names, site)), sel)
            out[sel], prov[sel] = v, p
            sources.append(src)
        return out, prov, sources

    def gemm(self, quant: str, m, n, k) -> OpResult:
        _known("GEMM quant mode", quant, GEMM_QUANTS)
        m, n, k = broadcast_named(m=check_positive("m", m), n=_whole("n", check_positive("n", n)),
                                  k=_whole("k", check_positive("k", k)))
        mf = m.ravel()

        def ev(site, sel):
            r = self._site(("gemm", quant, site["n"], site["k"]), lambda: resolve_gemm(self.db, quant, int(site["n"]), int(site["k"])))
            v, p = r.grid(mf[sel], refuse=True)
            return v, p, {"n": int(site["n"]), "k": int(site["k"]), **r.describe()}

        v, p, src = self._by_site({"n": n, "k": k}, ev)
        return self._finish(v.reshape(m.shape), p.reshape(m.shape), src)

    def _attention(self, phase: str, batch, length, heads, kv_heads, head_dim, kv_quant, attn_quant, window, prefix=0.0):
        _known("KV-cache dtype", kv_quant, KV_QUANTS)
        _known("attention dtype", attn_quant, ATTENTION_DTYPES)
        length_name = "isl" if phase == "context" else "kv_len"
        arrs = broadcast_named(**{name: as_numbers(name, x) for name, x in (
            ("batch", batch), (length_name, length), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim),
            ("window", window), ("prefix", prefix))})
        b, L, h, kv, hd, w, pre = (a.ravel() for a in arrs)
        check_positive("batch", b)
        check_positive(length_name, L)
        for name, a in (("heads", h), ("kv_heads", kv), ("head_dim", hd)):
            _whole(name, check_positive(name, a))
        if np.any(h % kv):  # also catches kv_heads > heads
            raise InvalidInputError("kv_heads must divide heads (grouped-query attention shares each KV head "
                                    "among a whole group of query heads)", f"heads {shown(h)}, kv_heads {shown(kv)}")
        for name, a, what in (("window", w, "a sliding window in tokens, 0 for full attention"),
                              ("prefix", pre, "cached tokens before the new ones")):
            if not np.all(np.isfinite(a)) or np.any(a < 0):
                raise InvalidInputError(f"{name} must be a finite number >= 0 ({what})", f"got {shown(a)}")
        _whole("window", w)

        def ev(site, sel):
            args = (int(site["heads"]), int(site["kv"]), int(site["hd"]), kv_quant, attn_quant, int(site["w"]))
            fn = resolve_context_attention if phase == "context" else resolve_generation_attention
            r = self._site((phase, *args), lambda: fn(self.db, *args))
            if phase == "context":
                v, p = prefixed_context(r.grid, b[sel], L[sel], pre[sel])
            else:
                v, p = r.grid(b[sel], np.maximum(L[sel] - 1.0, 1.0), refuse=True)
            return v, p, {"heads": int(site["heads"]), "kv_heads": int(site["kv"]), **r.describe()}

        v, p, src = self._by_site({"heads": h, "kv": kv, "hd": hd, "w": w}, ev)
        return self._finish(v.reshape(arrs[0].shape), p.reshape(arrs[0].shape), src)

    def context_attention(self, batch, isl, heads, kv_heads, head_dim, *, prefix=0, kv_quant="bfloat16",
                          attn_quant="bfloat16", window=0) -> OpResult:
        """Prefill attention: ``batch`` sequences of ``isl`` new tokens on ``prefix`` cached ones."""
        return self._attention("context", batch, isl, heads, kv_heads, head_dim, kv_quant, attn_quant, window, prefix)

    def generation_attention(self, batch, kv_len, heads, kv_heads, head_dim, *, kv_quant="bfloat16",
                             attn_quant="bfloat16", window=0) -> OpResult:
        """Decode attention: ``batch`` sequences at KV length ``kv_len`` (tokens incl. the new one)."""
        return self._attention("generation", batch, kv_len, heads, kv_heads, head_dim, kv_quant, attn_quant, window)

    def collective(self, op: str, elements, group: int) -> OpResult:
        """``op`` in all_reduce / all_gather / reduce_scatter / alltoall of ``elements`` 16-bit
        elements over ``group`` GPUs."""
        e = check_positive("elements", elements)
        r = self._site(("comm", op, int(group)), lambda: resolve_collective(self.db, op, int(group)))
        v, p = r.grid(e, refuse=True)
        return self._finish(v, p, [r.describe()])

    def moe(self, num_tokens, *, quant: str, hidden: int, inter: int, topk: int, experts: int,
            moe_tp: int = 1, moe_ep: int = 1, distribution: str = "balanced", kernel: str | None = None) -> OpResult:
        """Routed experts of one MoE layer on one rank, for ``num_tokens`` entering the block;
        ``kernel``: a kernel family (:data:`infercast.ops.moe.MOE_KERNELS`) instead of the table's own."""
        from .moe import resolve_moe

        t = check_positive("num_tokens", num_tokens)
        key = ("moe", quant, hidden, inter, topk, experts, moe_tp, moe_ep, distribution, kernel)
        r = self._site(key, lambda: resolve_moe(self.db, quant=quant, hidden=hidden, inter=inter, topk=topk, experts=experts,
                                                moe_tp=moe_tp, moe_ep=moe_ep, distribution=distribution, kernel=kernel))
        v, p = r.grid(t, refuse=True)
        return self._finish(v, p, [r.describe()])
