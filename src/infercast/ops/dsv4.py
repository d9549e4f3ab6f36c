"""DeepSeek-V4 attention (CSA / HCA): the whole attention module of one layer as one op per phase.

DeepSeek-V4 gives every decoder layer one of three attention kinds, by its entry of the config's
``compress_ratios`` (one entry per layer, MTP layers last):

* **CSA** (compressed sparse attention, ratio 4 in the released checkpoints): a compressor folds
  every ``ratio`` tokens of the layer's latent KV into one compressed entry; a lightning indexer
  (``index_n_heads`` heads of ``index_head_dim``, FP8 keys compressed at the same ratio) scores
  the compressed entries and keeps the top ``index_topk``; the query attends those plus the last
  ``sliding_window`` uncompressed tokens;
* **HCA** (heavily compressed attention, ratio 128): no indexer; the query attends every
  compressed entry plus the sliding window;
* **window-only** (ratio 0): the sliding window alone.

The attention itself is MQA over one latent head of ``head_dim`` (K and V share it; the last
``qk_rope_head_dim`` channels carry RoPE), queries through a LoRA (``q_lora_rank``), output through
a grouped LoRA (``o_groups`` groups, ``o_lora_rank`` each) back to ``hidden``. Sources for the
layout: the checkpoints' ``config.json`` (``compress_ratios``, ``o_groups``, ``index_*``), the
DeepSeek-V4 support in SGLang (its DSV4 KV pool configurator: compressed entries per ``ratio``
tokens, an indexer cache on the ratio-4 layers only) and Megatron-Core's DSv4 layer symbols
(``C`` = CSA at ratio 4, ``H`` = HCA at ratio 128, ``W`` = window at ratio 0).

What the op covers: everything the framework's attention module runs between the layer's input
norm and the output projection (the TP all-reduce after it is the caller's). ``heads`` is per GPU.

Source: the whole-module tables ``dsv4_csa_{context,generation}_module`` and
``dsv4_hca_{context,generation}_module`` (sparse_attention family). Rows are matched on:

* **compress_ratio**: the layer's ratio exactly; window-only layers (ratio 0) have no table of
  their own and are served by the HCA rows (a window plus 1/128 of the context in compressed
  entries: an upper bound for them, noted by the plan);
* **model**: the rows of a model whose DeepSeek-V4 attention shape (:class:`DSV4Dims`, read
  from the pack's model configs) equals the query's; the exact id first. Another shape's rows
  are never used in SILICON;
* **gemm_type** (the projections' quant): exact, else the nearest collected
  (:func:`infercast.ops.dsa.gemm_distance`), carried at equal utilisation against
  :func:`dsv4_sol` (provenance ``transferred``, noted);
* **kv_cache_dtype**: exact (the tables' ``fp8_e4m3`` counts as ``fp8``);
* **tp_size**: per head count the rows of the ``tp_size`` nearest the query's (the collectors
  run ``num_heads = native heads / tp``);
* **num_heads** (per GPU) is the site axis: an uncollected head count is transferred through
  utilisation against :func:`dsv4_sol` from the nearest collected ones.

Curves: ``batch x isl`` for context (rows with the smallest ``step``: no cached prefix; a prefix
is taken as the causal share, as for dense attention) and ``batch x step`` for generation, ``step``
= tokens already cached; vLLM's generation ``step`` counts the decoded token and is shifted by
:data:`infercast.ops.dsa.MODULE_STEP_OFFSET`. Generation curves get the DSA cleanup (eager batch
rows dropped, noise above a longer-cache point lowered: :func:`infercast.ops.module_tables.graph_rows`,
:func:`~infercast.ops.dsa.clean_generation`). The kernel-level tables of the same family
(``dsv4_paged_mqa_logits_module``, ``dsv4_csa_topk_calib``, ``dsv4_hca_attn_module``) time pieces
the module tables already include and are not added.

With no table: SILICON raises :class:`~infercast.errors.NotAvailableError`; HYBRID / EMPIRICAL
give :func:`dsv4_sol` over a utilisation learned from the collected DeepSeek-V4 module sites (or
the default attention utilisation when there are none), provenance ``empirical``; SOL mode gives
the roofline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..data.model_configs import resolve_model
from ..data.quant import COMPUTE_DTYPE, KV_BYTES, WEIGHT_BYTES
from ..errors import InfercastError, InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import choose_sites, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, fill_missing, sol_resolved
from .dsa import DEFAULT_MODULE_STEP_OFFSET, MODULE_STEP_OFFSET, clean_generation, gemm_distance
from .empirical import empirical_resolved
from .module_tables import module_curves, narrow_module_rows, nearest_tp_rows

PHASES = ("context", "generation")
KINDS = ("csa", "hca")
#: the tables' KV dtype spellings -> infercast's
KV_NAMES = {"fp8_e4m3": "fp8", "fp8": "fp8", "bfloat16": "bfloat16", "bf16": "bfloat16"}

CTX_BATCH = 2.0 ** np.arange(0, 11)
CTX_ISL = np.array([1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536], float)
GEN_BATCH = 2.0 ** np.arange(0, 11)
GEN_STEP = 2.0 ** np.arange(0, 21)
CTX_SCALES = ("log", "log")
GEN_SCALES = ("log", "log")


def stem(kind: str, phase: str) -> str:
    return f"dsv4_{kind}_{phase}_module"


@dataclass(frozen=True)
class DSV4Dims:
    """The whole-model attention shape a module table row was timed for (before TP)."""

    hidden: int
    q_lora_rank: int
    o_lora_rank: int
    head_dim: int
    qk_rope_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    window: int

    def label(self) -> str:
        return (f"hidden {self.hidden}, q_lora {self.q_lora_rank}, o_lora {self.o_lora_rank}, head_dim {self.head_dim}, "
                f"index {self.index_n_heads}x{self.index_head_dim} top {self.index_topk}, window {self.window}")


def dims_of_config(text: dict) -> DSV4Dims:
    """:class:`DSV4Dims` from a DeepSeek-V4 ``config.json`` (KeyError / TypeError / ValueError on a
    field it lacks)."""
    return DSV4Dims(int(text["hidden_size"]), int(text["q_lora_rank"]), int(text["o_lora_rank"]), int(text["head_dim"]),
                    int(text["qk_rope_head_dim"]), int(text["index_n_heads"]), int(text["index_head_dim"]),
                    int(text["index_topk"]), int(text["sliding_window"]))


def model_dims(db: OpDB, model: str) -> DSV4Dims | None:
    """:class:`DSV4Dims` of a model named in a module table, from the pack's model configs."""

    def build():
        try:
            mc = resolve_model(db.data.pack, model)
            cfg = mc.config if isinstance(mc.config, dict) else {}
            return dims_of_config(cfg.get("text_config") or cfg)
        except (InfercastError, KeyError, TypeError, ValueError):
            return None

    return db.memo(("dsv4-model-dims", model), build)


# --------------------------------------------------------------------------------------------
# roofline
# --------------------------------------------------------------------------------------------


def kv_entry_bytes(head_dim: int, rope_dim: int, kv_bytes: float) -> float:
    """Bytes of one cached latent entry: the non-RoPE channels at the KV dtype, the RoPE
    channels in bf16 (SGLang's FP8 layout: 448 FP8 + 64 BF16 channels)."""
    return (head_dim - rope_dim) * kv_bytes + rope_dim * 2.0


def _window_pairs(x, window):
    """sum over positions 1..x of min(position, window)."""
    w = np.minimum(x, window)
    return w * (w + 1) / 2 + (x - w) * window


def _compressed_pairs(x, ratio, cap):
    """sum over positions 1..x of min(position / ratio, cap) (cap = inf: no top-k)."""
    knee = np.minimum(x, cap * ratio) if np.isfinite(cap) else x
    return knee * (knee + 1) / (2.0 * ratio) + (x - knee) * (cap if np.isfinite(cap) else 0.0)


def dsv4_sol(system, phase: str, batch, x, *, dims: DSV4Dims, heads: int, o_groups: int, ratio: int,
             weight_bytes: float, kv_bytes: float, gemm_compute: str = "bfloat16", indexer: bool = False):
    """Roofline (ms) of one DeepSeek-V4 attention module on one GPU. ``phase`` ``"context"``: ``x``
    new tokens per request, no prefix; ``"generation"``: one token per request after ``x`` cached.

    Per new token: q LoRA (``hidden x q_lora + q_lora x heads x head_dim``), the latent KV
    projection (``hidden x head_dim``), the grouped output LoRA (``heads x head_dim x o_lora`` +
    ``o_groups x o_lora x hidden``), with ``ratio > 0`` the compressor (``hidden x 2 head_dim``
    per compressed stream, two overlapping streams on CSA), and on CSA (``indexer``) the indexer's
    q / weight projections and key compressor. Attention: each query attends
    ``min(position, window)`` window entries plus ``position / ratio`` compressed ones, capped at
    ``index_topk`` on CSA, 4 x head_dim FLOPs per pair and head; the CSA indexer scores every
    compressed entry (2 x index heads x index_head_dim FLOPs each). Memory: weights, the cache
    entries read / written, hidden states in and out (bf16)."""
    batch, x = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(x, dtype=float))
    d = dims
    csa = bool(indexer) and ratio > 0
    streams = (2 if csa else 1) if ratio else 0
    w = (d.hidden * d.q_lora_rank + d.q_lora_rank * heads * d.head_dim + d.hidden * d.head_dim
         + heads * d.head_dim * d.o_lora_rank + o_groups * d.o_lora_rank * d.hidden
         + streams * d.hidden * 2 * d.head_dim)
    if csa:
        w += d.q_lora_rank * d.index_n_heads * d.index_head_dim + d.hidden * d.index_n_heads \
            + 2 * d.hidden * 2 * d.index_head_dim
    entry = kv_entry_bytes(d.head_dim, d.qk_rope_head_dim, kv_bytes)
    cap = float(d.index_topk) if csa else math.inf
    r = max(ratio, 1)
    if phase == "context":
        new = batch * x
        pairs = batch * (_window_pairs(x, d.window) + (_compressed_pairs(x, r, cap) if ratio else 0.0))
        scored = batch * x * (x + 1) / (2.0 * r) if csa else 0.0
        cache = new * entry * (1.0 + (1.0 / r if ratio else 0.0))
    else:
        new = batch
        ctx = x + 1
        comp = np.minimum(ctx / r, cap) if ratio else 0.0
        pairs = batch * (np.minimum(ctx, d.window) + comp)
        scored = batch * ctx / r if csa else 0.0
        cache = pairs * entry + (batch * ctx / r * d.index_head_dim if csa else 0.0) + new * entry
    gemm_ms = 2.0 * new * w / sol._flops(system, gemm_compute) * 1e3
    bf16 = sol._flops(system, "bfloat16")
    attn_ms = (4.0 * pairs * heads * d.head_dim + 2.0 * scored * d.index_n_heads * d.index_head_dim) / bf16 * 1e3
    nbytes = w * weight_bytes + cache + 2.0 * 2.0 * new * d.hidden
    mem_ms = nbytes / system.gpu.effective_mem_bw * 1e3
    return np.maximum(gemm_ms + attn_ms, mem_ms) + system.gpu.mem_latency_s * 1e3


# --------------------------------------------------------------------------------------------
# table rows
# --------------------------------------------------------------------------------------------


@dataclass
class _Lattice:
    stem: str
    kernel: str
    sites: np.ndarray
    curves: dict
    notes: tuple[str, ...]
    gemm_type: str


def _refuse(db: OpDB, what: str, why: str, available=None):
    raise NotAvailableError(what, f"{why} ({db.backend} {db.data.version} on {db.system.name})", available)


def _base_mask(table, phase: str, ratio: int, kv_quant: str):
    mask = np.ones(len(table), bool)
    if table.has("compress_ratio"):
        mask &= table.keys["compress_ratio"].astype(int) == ratio
    kv = np.array([KV_NAMES.get(str(v), str(v)) for v in table.keys["kv_cache_dtype"].tolist()])
    mask &= kv == kv_quant
    if phase == "generation" and table.has("isl"):
        mask &= table.keys["isl"] == 1
    return mask


def _pick(db: OpDB, table, phase: str, ratio: int, dims: DSV4Dims, model_id: str | None, gemm_quant: str,
          kv_quant: str):
    """(model, gemm_type, notes) of the rows to use, or (None, reason)."""
    base = _base_mask(table, phase, ratio, kv_quant)
    if not base.any():
        held = sorted({f"ratio {int(r)} / kv {k}" for r, k in zip(
            (table.keys["compress_ratio"] if table.has("compress_ratio") else np.full(len(table), ratio)).tolist(),
            table.keys["kv_cache_dtype"].tolist())})
        return None, f"{table.stem} holds no compress_ratio={ratio} rows with {kv_quant} KV (held: {', '.join(held)})"
    models = sorted(set(table.keys["model"][base].tolist())) if table.has("model") else [""]
    cands = []
    for m in models:
        exact = bool(model_id) and m.lower() == str(model_id).lower()
        md = model_dims(db, m) if m else dims
        if md != dims:
            continue
        mm = base & (table.keys["model"] == m) if m else base
        for g in sorted(set(table.keys["gemm_type"][mm].tolist())):
            cands.append(((gemm_distance(g, gemm_quant), not exact, m, g), m, g, exact))
    if not cands:
        return None, (f"{table.stem} has no model with the query's DeepSeek-V4 attention shape ({dims.label()}); "
                      f"collected: {', '.join(models)}")
    cands.sort(key=lambda c: c[0])
    _, m, g, exact = cands[0]
    notes = []
    if not exact and m:
        notes.append(f"module rows of {m} (same DeepSeek-V4 attention shape) serve {model_id or 'the query'}")
    if g != gemm_quant:
        notes.append(f"no gemm_type={gemm_quant} rows: served by gemm_type={g} rows, carried at equal utilisation "
                     "against the module roofline")
    return (m, g, tuple(notes)), None


def _lattice(db: OpDB, kind: str, phase: str, ratio: int, pick, kv_quant: str, tp: int) -> _Lattice:
    st = stem(kind, phase)
    table = db.data.table(st)
    model, gemm_type, pnotes = pick
    mask = _base_mask(table, phase, ratio, kv_quant) & (table.keys["gemm_type"] == gemm_type)
    if model:
        mask &= table.keys["model"] == model
    mask = narrow_module_rows(table, mask, phase)  # bf16 attention compute; context: no cached prefix
    notes = list(pnotes)
    mask, _ = nearest_tp_rows(table, mask, tp)
    off = MODULE_STEP_OFFSET.get(db.backend, DEFAULT_MODULE_STEP_OFFSET)
    sites, curves, kernels, dropped = module_curves(table, mask, phase, db.backend, off)
    if phase == "generation" and off:
        notes.append(f"{st} step counts the decoded token ({db.backend} collector): looked up at step+{off}")
    for heads, batch in dropped.items():
        notes.append(f"{st} heads={heads}: batch rows from {batch} up timed eagerly, dropped")
    return _Lattice(st, "+".join(k for k in kernels if k), sites, curves, tuple(notes), gemm_type)


def _site_grid(db: OpDB, phase: str, lat: _Lattice, i: int, sol_at, key: tuple) -> Grid:
    """Site ``i``'s filled grid; ``key`` names the roofline ``sol_at`` (the query's shape)."""
    def build():
        s = sol_at(int(lat.sites[i][0]), lat.gemm_type)
        ax, vals = lat.curves[i]
        interp = None
        if phase == "generation":
            vals, _, interp = clean_generation(vals)
            for r, c in zip(*np.nonzero(interp)):
                meas = np.flatnonzero(~np.isnan(vals[r]) & ~interp[r])
                vals[r, c] = np.interp(ax[1][c], ax[1][meas], vals[r][meas])
        filled, prov = fill_missing(ax, vals, s)
        if interp is not None and interp.any():
            prov = np.where(interp, int(Prov.INTERPOLATED), prov).astype(np.int8)
        return Grid(ax, filled, prov, s, scales=CTX_SCALES if phase == "context" else GEN_SCALES)

    return db.memo(("dsv4-site", lat.stem, id(lat), i, key), build)


# --------------------------------------------------------------------------------------------
# resolution
# --------------------------------------------------------------------------------------------


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or int(v) != v or v <= 0:
        raise InvalidInputError(f"DeepSeek-V4 attention {name} must be a positive integer", f"got {v!r}")
    return int(v)


def resolve_dsv4_attention(db: OpDB, phase: str, *, kind: str, ratio: int, dims: DSV4Dims, heads: int, o_groups: int,
                           gemm_quant: str, kv_quant: str, tp: int = 1, model_id: str | None = None) -> Resolved:
    """Compile one DeepSeek-V4 attention module (one layer, one GPU) for ``phase``: ``kind``
    ``"csa"`` or ``"hca"`` names the tables; ``ratio`` is the compress ratio of the rows to use
    (and of the roofline); ``heads`` / ``o_groups`` are per GPU. The grid is ``(batch, isl)``
    for context and ``(batch, step)`` for generation, step = tokens already cached."""
    if phase not in PHASES:
        raise InvalidInputError(f"unknown DeepSeek-V4 attention phase {phase!r}", available=PHASES)
    if kind not in KINDS:
        raise InvalidInputError(f"unknown DeepSeek-V4 attention kind {kind!r}", available=KINDS)
    heads, o_groups, tp = _positive("heads", heads), _positive("o_groups", o_groups), _positive("tp", tp)
    if isinstance(ratio, bool) or int(ratio) != ratio or ratio < 0:
        raise InvalidInputError("DeepSeek-V4 compress ratio must be an integer >= 0", f"got {ratio!r}")
    if gemm_quant not in WEIGHT_BYTES or kv_quant not in KV_BYTES:
        raise InvalidInputError(f"DeepSeek-V4 attention quant gemm {gemm_quant!r} / kv {kv_quant!r} is not known",
                                available=sorted(WEIGHT_BYTES))
    ratio = int(ratio)

    def sol_at(h: int, gq: str):
        # output groups per GPU follow the heads per GPU (both split over TP)
        kw = {"dims": dims, "heads": int(h), "o_groups": max(1, o_groups * int(h) // heads), "ratio": ratio, "weight_bytes": WEIGHT_BYTES[gq],
              "kv_bytes": KV_BYTES[kv_quant], "gemm_compute": COMPUTE_DTYPE.get(gq, "bfloat16"), "indexer": kind == "csa"}

        def f(batch, x):
            return dsv4_sol(db.system, phase, batch, x, **kw)

        return f

    query_sol = sol_at(heads, gemm_quant)
    query_sol(1.0, 1.0)  # raises early when the GPU lacks tensor cores for the quant
    axes = (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)
    scales = CTX_SCALES if phase == "context" else GEN_SCALES
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, scales)
    st = stem(kind, phase)
    skey = (dims, o_groups, heads)
    reason = None
    donors = None
    if not db.data.has_table(st):
        reason = f"no {st}_perf table"
    else:
        table = db.data.table(st)
        pick, reason = db.memo(("dsv4-pick", st, ratio, dims, model_id, gemm_quant, kv_quant),
                               lambda: _pick(db, table, phase, ratio, dims, model_id, gemm_quant, kv_quant))
        if pick is not None:
            lat = db.memo(("dsv4-lattice", st, ratio, pick, kv_quant, tp),
                          lambda: _lattice(db, kind, phase, ratio, pick, kv_quant, tp))
            choice = choose_sites((float(heads),), lat.sites)
            if choice is None:
                donors = [_site_grid(db, phase, lat, i, sol_at, skey) for i in range(len(lat.sites))]
                reason = f"{st} heads={heads} is outside the collected head counts' gates ({[int(s[0]) for s in lat.sites]})"
            else:
                labels = tuple(f"num_heads={int(lat.sites[i][0])} w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
                g = transfer_grid(choice, lambda i: _site_grid(db, phase, lat, i, sol_at, skey), sol_at(heads, lat.gemm_type),
                                  labels)
                how = choice.how
                if lat.gemm_type != gemm_quant:
                    mesh = np.meshgrid(*g.axes, indexing="ij")
                    g = Grid(g.axes, g.values * query_sol(*mesh) / g.sol(*mesh),
                             np.maximum(g.prov, int(Prov.TRANSFERRED)).astype(np.int8), query_sol, g.sites, scales=g.scales)
                    how = f"{how}+gemm-transfer"
                return Resolved(g, st, db.served_version(st), lat.kernel or None, how,
                                labels if choice.how != "exact" else (), lat.notes)
    if db.mode is not DatabaseMode.SILICON:
        r = empirical_resolved(f"{phase}_attention", query_sol, axes, donors, scales)
        r.notes = r.notes + (f"no silicon answer: {reason}",)
        return r
    _refuse(db, f"no DeepSeek-V4 {kind.upper()} {phase} data for {heads} heads per GPU, gemm {gemm_quant}, "
                f"{kv_quant} KV, compress ratio {ratio}", f"{reason}; use --database-mode HYBRID for an estimate",
            db.data.available_tables())
