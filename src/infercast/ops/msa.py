"""MiniMax Sparse Attention (MSA: MiniMax-M3): the whole attention module of one sparse layer as
one op per phase.

What the op covers: everything the framework's MSA module runs between the layer's input norm and
the ``o_proj`` output (the TP all-reduce after it is the caller's): the GQA q/k/v projections,
q/k norms and partial RoPE, the block **indexer** (it scores every ``sparse_block_size``-token
block of the cache and keeps the top ``sparse_topk_blocks``), the attention over the selected
blocks and ``o_proj``. ``heads`` / ``kv_heads`` are per GPU.

Source: the whole-module tables ``msa_context_module`` / ``msa_generation_module``. Rows are
matched on:

* **gemm_type** (the projections' quant) and **kv_cache_dtype**: exact. A quant the tables do
  not hold is refused (:class:`~infercast.errors.NotAvailableError` naming what they hold), in
  every mode but SOL: one quant's rows never answer another's;
* **tp_size**: SGLang's collector records the TP it ran the module at (``num_heads = 64 / tp``);
  TRT-LLM / vLLM simulate TP by the head count (``tp_size`` 1). The rows of the ``tp_size``
  nearest the query's are taken (noted when it differs);
* **num_heads** (query heads per GPU) is the site axis: a head count that was not collected is
  transferred through utilisation against :func:`msa_sol` from the nearest collected ones
  (:func:`~infercast.interp.transfer.choose_sites`, provenance ``transferred``); outside the
  transfer gates SILICON refuses.

The tables are of one model each (the ``model`` column); rows of another model are not used, so
a different shape (hidden size, head size, KV heads) is refused rather than answered from
MiniMax-M3's rows.

Curves: ``batch x isl`` for ``"context"`` (rows with ``step`` 0: no cached prefix; the caller
takes a prefix as the causal share of the longer prompt, as for dense attention) and
``batch x step`` for ``"generation"``, where ``step`` = tokens already in the cache (the
collectors' metadata say the generation rows were re-keyed to that coordinate). Several
``kernel_source`` values (SGLang's decode splits ``..._topk_split`` / ``..._topk_radix`` by
shape) are merged by shape, the most-collected first (:func:`~infercast.ops.base.merge_kernels`).
Holes in a site's grid are filled by held utilisation (:func:`~infercast.ops.base.fill_missing`,
provenance ``held``).

The roofline :func:`msa_sol` anchors the transfer and fills: projections' GEMMs, attention over
``min(context, topk_blocks x block_size)`` keys per query, weights / cache / activations moved;
the indexer's own scoring pass is not in it (utilisation transfer between neighbouring head
counts carries it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.quant import COMPUTE_DTYPE, KV_BYTES, WEIGHT_BYTES
from ..errors import InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.transfer import choose_sites, transfer_grid
from .base import (
    DatabaseMode,
    OpDB,
    Resolved,
    fill_missing,
    merge_kernels,
    sites_and_curves,
    sol_resolved,
)

PHASES = ("context", "generation")
STEMS = {"context": "msa_context_module", "generation": "msa_generation_module"}
CURVE_COLS = {"context": ("batch_size", "isl"), "generation": ("batch_size", "step")}
#: axes of SOL grids (the collected spans)
CTX_BATCH = 2.0 ** np.arange(0, 9)
CTX_ISL = 2.0 ** np.arange(0, 16)
GEN_BATCH = 2.0 ** np.arange(0, 11)
GEN_STEP = 2.0 ** np.arange(0, 18) - 1.0
GEN_STEP[0] = 1.0
SCALES = ("log", "log")


def msa_sol(system, phase: str, batch, x, *, hidden: int, heads: int, kv_heads: int, head_dim: int,
            topk_tokens: int, weight_bytes: float, kv_bytes: float, gemm_compute: str = "bfloat16"):
    """Roofline (ms) of one MSA module on one GPU. ``phase`` ``"context"``: ``x`` = new tokens per
    request, no prefix; ``"generation"``: one token per request after ``x`` cached ones. Each
    query attends ``min(position, topk_tokens)`` keys (the selected blocks); projection weights
    ``hidden x (heads + 2 kv_heads) x head_dim`` (q/k/v) and ``heads x head_dim x hidden`` (o)
    at ``weight_bytes``; the cache read/written at ``kv_bytes``; hidden states in/out in bf16."""
    batch, x = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(x, dtype=float))
    w = float(hidden) * (heads + 2 * kv_heads) * head_dim + float(heads) * head_dim * hidden
    kv_tok = 2.0 * kv_heads * head_dim * kv_bytes
    if phase == "context":
        new = batch * x
        cap = np.minimum(x, topk_tokens)
        # sum over positions 1..x of min(pos, cap): the first cap positions causal, the rest capped
        pairs = batch * (cap * (cap + 1) / 2 + (x - cap) * cap)
        cache = new * kv_tok
    else:
        new = batch
        pairs = batch * np.minimum(x + 1, topk_tokens)
        cache = batch * np.minimum(x + 1, topk_tokens) * kv_tok + new * kv_tok
    gemm_ms = 2.0 * new * w / sol._flops(system, gemm_compute) * 1e3
    attn_ms = 4.0 * pairs * heads * head_dim / sol._flops(system, "bfloat16") * 1e3
    nbytes = w * weight_bytes + cache + 2.0 * 2.0 * new * hidden + 2.0 * 2.0 * new * heads * head_dim
    mem_ms = nbytes / system.gpu.effective_mem_bw * 1e3
    return np.maximum(gemm_ms + attn_ms, mem_ms) + system.gpu.mem_latency_s * 1e3


@dataclass
class _Lattice:
    sites: np.ndarray  # rows of (num_heads,)
    curves: dict
    kernels: tuple[str, ...]
    notes: tuple[str, ...]


def _refuse(db: OpDB, what: str, why: str, available):
    raise NotAvailableError(what, f"{why} ({db.backend} {db.data.version} on {db.system.name})", available)


def _lattice(db: OpDB, phase: str, gemm_quant: str, kv_quant: str, tp: int) -> _Lattice:
    stem = STEMS[phase]
    if not db.data.has_table(stem):
        _refuse(db, f"no {stem}_perf table", "MiniMax sparse attention needs the msa tables", db.data.available_tables())
    t = db.data.table(stem)
    for col in ("num_heads", "gemm_type", "kv_cache_dtype") + CURVE_COLS[phase]:
        if not t.has(col):
            _refuse(db, f"{stem}_perf has no column {col!r}", str(t.path), list(t.keys))
    gt, kv = t.keys["gemm_type"].astype(str), t.keys["kv_cache_dtype"].astype(str)
    mask = (gt == gemm_quant) & (kv == kv_quant)
    if not mask.any():
        held = sorted({f"gemm {a} / kv {b}" for a, b in zip(gt.tolist(), kv.tolist())})
        _refuse(db, f"{stem}_perf holds no rows for gemm {gemm_quant} with {kv_quant} KV cache",
                "another quant's rows are not used for it", held)
    if phase == "context" and t.has("step"):
        mask &= t.keys["step"] == 0
    notes = []
    if t.has("tp_size"):
        tps = np.unique(t.keys["tp_size"][mask].astype(int))
        near = int(tps[np.argmin(np.abs(np.log2(tps) - np.log2(tp)))])
        mask &= t.keys["tp_size"] == near
        if near != tp and len(tps) > 1:
            notes.append(f"rows collected at tp_size {near} (nearest the query's {tp})")
    merged, kernels = merge_kernels(t, mask, ("num_heads",) + CURVE_COLS[phase], db.backend)
    if len(kernels) > 1:
        notes.append(f"kernels merged by shape: {', '.join(kernels)}")
    sites, curves = sites_and_curves(t, merged, ("num_heads",), CURVE_COLS[phase])
    return _Lattice(sites, curves, tuple(kernels), tuple(notes))


def resolve_msa(db: OpDB, phase: str, *, hidden: int, heads: int, kv_heads: int, head_dim: int, topk_tokens: int,
                gemm_quant: str, kv_quant: str, tp: int = 1) -> Resolved:
    """Compile one MSA module (per GPU: ``heads`` query heads, ``kv_heads`` KV heads of
    ``head_dim``) for ``phase``: a grid over ``(batch, isl)`` (context) or ``(batch, step)``
    (generation, step = cached tokens). ``topk_tokens`` = ``sparse_topk_blocks x
    sparse_block_size`` (the keys each query attends at most)."""
    if phase not in PHASES:
        raise InvalidInputError(f"unknown MSA phase {phase!r}", available=PHASES)
    for name, v in (("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim),
                    ("topk_tokens", topk_tokens), ("tp", tp)):
        if isinstance(v, bool) or int(v) != v or v <= 0:
            raise InvalidInputError(f"MSA {name} must be a positive integer", f"got {v!r}")
    if gemm_quant not in WEIGHT_BYTES or kv_quant not in KV_BYTES:
        raise InvalidInputError(f"MSA quant gemm {gemm_quant!r} / kv {kv_quant!r} is not known",
                                available=sorted(WEIGHT_BYTES))
    shape = {"hidden": int(hidden), "kv_heads": int(kv_heads), "head_dim": int(head_dim), "topk_tokens": int(topk_tokens),
             "weight_bytes": WEIGHT_BYTES[gemm_quant], "kv_bytes": KV_BYTES[kv_quant],
             "gemm_compute": COMPUTE_DTYPE.get(gemm_quant, "bfloat16")}

    def sol_at(h: int):
        def f(batch, x):
            return msa_sol(db.system, phase, batch, x, heads=int(h), **shape)

        return f

    query_sol = sol_at(heads)
    axes = (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, SCALES)
    lat = db.memo(("msa-lattice", phase, gemm_quant, kv_quant, int(tp)), lambda: _lattice(db, phase, gemm_quant, kv_quant, int(tp)))

    def site_grid(i: int) -> Grid:
        def build():
            s = sol_at(int(lat.sites[i][0]))
            ax, vals = lat.curves[i][0], lat.curves[i][1]
            filled, prov = fill_missing(ax, vals, s)
            return Grid(ax, filled, prov, s, scales=SCALES)

        return db.memo(("msa-site", phase, gemm_quant, kv_quant, int(tp), i, tuple(shape.items())), build)

    choice = choose_sites((float(heads),), lat.sites)
    if choice is None:
        _refuse(db, f"MSA {phase} at {heads} heads per GPU is outside the collected head counts' gates",
                "no collected head count is near enough to transfer from", [int(s[0]) for s in lat.sites])
    labels = tuple(f"num_heads={int(lat.sites[i][0])} w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
    g = transfer_grid(choice, site_grid, query_sol, labels)
    stem = STEMS[phase]
    return Resolved(g, stem, db.served_version(stem), "+".join(lat.kernels), choice.how,
                    labels if choice.how != "exact" else (), lat.notes)
