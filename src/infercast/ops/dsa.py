"""DeepSeek Sparse Attention (DSA: DeepSeek-V3.2, GLM-5): the whole attention module of one layer as one op.

One op per phase covers everything the framework's DSA attention module runs between the layer's
input norm and the o_proj output (the TP all-reduce after o_proj is the caller's): the MLA
projections (``q_a`` + ``q_b``, ``kv_a``, ``o_proj``; ``kv_b`` in prefill), the **lightning
indexer** (its q/k projections, FP8 MQA logits over every cached token and the top-k selection)
and the sparse MLA attention over the ``index_topk`` selected tokens. ``heads`` is the per-GPU
head count.

Curves, as in :mod:`infercast.ops.mla`: ``batch x isl`` for ``"context"`` (``isl`` = new tokens per
request, no cached prefix) and ``batch x step`` for ``"generation"``, where **step = tokens
already in the KV cache** (a decode token at KV length L is looked up at ``step = L - 1``).

Source: the whole-module tables ``dsa_context_module`` / ``dsa_generation_module`` (rows with
``op_name`` ``dsa_context_module`` / ``dsa_generation_module``; the ``*_skip_indexer`` rows time
GLM-5.2's indexer-reuse layers and are never used). Rows are matched on:

* **model**: the exact id, else a model whose MLA dimensions (hidden, q/kv LoRA ranks, nope /
  rope / v head dims, from the pack's model configs) are equal — e.g. ``zai-org/GLM-5-FP8``
  rows serve ``zai-org/GLM-5``, ``zhipuai/GLM-5`` and ``nvidia/GLM-5-NVFP4``; the note says so.
  Among equal candidates the GEMM quant decides first, then the exact id, then the same base
  name (``GLM-5`` before ``GLM-5.2``);
* **gemm_type** (the projections' quant): exact, else the nearest collected one (weight bytes,
  then compute dtype: ``nvfp4 -> fp8_block -> bfloat16``), carried over at equal utilisation
  against the module SOL (provenance ``transferred``, noted);
* **kv_cache_dtype**: exact (no substitute in SILICON: e.g. TRT-LLM's FP8-KV DSA is
  Blackwell-only and the h200 tables have bf16 KV only);
* **tp_size**: SGLang's collector runs the module at ``num_heads = native_heads / tp`` and
  records that ``tp``; TRT-LLM / vLLM simulate TP by the head count alone (``tp_size`` 1).
  Per head count the rows of the ``tp_size`` nearest the query's are taken (noted when it
  differs);
* **num_heads** (per GPU) is the site axis: a head count that was not collected is transferred
  through utilisation against :func:`infercast.interp.sol.mla_context` /
  :func:`~infercast.interp.sol.mla_generation` (the dense-MLA roofline of the module; the
  indexer's cost and the top-k cap are not in it, which utilisation transfer between
  neighbouring head counts tolerates).

*Kernels.* Each table holds several ``kernel_source`` values; they are merged by shape
(:func:`~infercast.ops.base.merge_kernels`), the most-collected first. In the data they are
disjoint by shape: SGLang's NSA backend runs a dense MHA prefill (``sglang_dsa_dense_mha_fa3`` on
Hopper, ``..._trtllm_ragged`` on Blackwell) whenever ``isl + prefix <= index_topk`` (2048; every
dense row has isl+step <= 2048, every sparse row > 128) and the indexer + sparse path above it; the
sparse kernel is the engine default for the KV dtype (Hopper: ``flashmla_sparse`` prefill /
``fa3`` decode for bf16 KV, ``flashmla_kv`` for fp8 KV; Blackwell: ``flashmla_sparse`` prefill
for bf16 KV, ``trtllm`` otherwise) and only that one is present per (model, gemm, KV). vLLM's
Blackwell tables split ``FLASHINFER_MLA_SPARSE`` / ``FLASHMLA_SPARSE`` by shape the same way;
TRT-LLM has one (``default``).

*Generation step convention* (read from the AIC collectors): SGLang's prefills ``step`` tokens
then decodes one (``step = seq_length``, the past-KV length; its steps ``163839`` / ``202751`` are
DeepSeek-V3.2's / GLM-5's ``max_position_embeddings - 1``); TRT-LLM's caches ``step`` tokens
(``num_cached_tokens_per_seq = step``); vLLM's records the sequence length *including* the
decoded token ("generation caches only seq_len - 1"). ``MODULE_STEP_OFFSET`` shifts each axis so
that the grid's ``step`` is always tokens already cached.

*Decode-curve cleanup* (:func:`~infercast.ops.module_tables.graph_rows`, :func:`clean_generation`, each noted when it acts):
batch rows timed without CUDA graph (SGLang's collector goes eager above its 1-GPU
``cuda_graph_max_bs``: batch >= 512 on h200, 1024 on b200/b300) are dropped, so larger batches
hold graph-mode utilisation; steps collected at batch 1 only are interpolated along step within
each batch row; a point > 10% above a longer-cache point of its row is lowered to it.

With no matching rows: SILICON raises :class:`~infercast.errors.NotAvailableError` listing what
the tables hold; HYBRID / EMPIRICAL give the SOL over a utilisation learned from the collected
DSA sites; SOL mode gives the roofline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..data.quant import COMPUTE_DTYPE, KV_BYTES, WEIGHT_BYTES
from ..errors import InvalidInputError, NotAvailableError
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import choose_sites, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, fill_missing, sol_resolved
from .empirical import empirical_resolved
from .mla import MLADims, model_dims as _model_dims, mla_sol_fn
from .module_tables import EAGER_RATIO, module_curves, narrow_module_rows, nearest_tp_rows

PHASES = ("context", "generation")
MODULE_STEMS = {"context": "dsa_context_module", "generation": "dsa_generation_module"}
#: the op_name of the full module rows (the ``*_skip_indexer`` rows are GLM-5.2 reuse layers)
OP_NAMES = {"context": "dsa_context_module", "generation": "dsa_generation_module"}

#: module-table ``step`` minus tokens already cached, per backend (see the module docstring)
MODULE_STEP_OFFSET = {"sglang": 0, "trtllm": 0, "vllm": 1}
DEFAULT_MODULE_STEP_OFFSET = 0

#: axes of SOL / empirical grids (the collected grids' spans)
CTX_BATCH = 2.0 ** np.arange(0, 11)
CTX_ISL = np.array([4, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240, 12288, 16384, 32768], float)
GEN_BATCH = 2.0 ** np.arange(0, 11)
GEN_STEP = 2.0 ** np.arange(1, 18)
CTX_SCALES = ("linear", "log")
GEN_SCALES = ("linear", "linear")


def _axes(phase: str):
    return (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)


def _scales(phase: str):
    return CTX_SCALES if phase == "context" else GEN_SCALES


# --------------------------------------------------------------------------------------------
# model / quant matching
# --------------------------------------------------------------------------------------------


_QUANT_SUFFIX = re.compile(r"[-_](fp8|fp4|nvfp4|bf16|int4|int8|awq|gptq)$", re.IGNORECASE)


def _base_name(model: str) -> str:
    """``zai-org/GLM-5-FP8`` -> ``glm-5``: the checkpoint family without org and quant suffix."""
    name = model.split("/")[-1]
    while True:
        stripped = _QUANT_SUFFIX.sub("", name)
        if stripped == name:
            return name.lower()
        name = stripped


def gemm_distance(have: str, want: str) -> float:
    """How far a collected GEMM quant is from the wanted one (0 = same): weight bytes (log2),
    plus half a unit when the tensor-core dtype differs. nvfp4 -> fp8_block (2.3) before
    bfloat16 (3.3); fp8 -> fp8_block (1.0)."""
    if have == want:
        return 0.0
    if have not in WEIGHT_BYTES or want not in WEIGHT_BYTES:
        return 10.0
    d = 1.0 + abs(math.log2(WEIGHT_BYTES[have] / WEIGHT_BYTES[want]))
    return d + (0.5 if COMPUTE_DTYPE[have] != COMPUTE_DTYPE[want] else 0.0)


@dataclass(frozen=True)
class _Pick:
    model: str
    gemm_type: str
    notes: tuple[str, ...]


def _pick_rows(db: OpDB, table, phase: str, model_id: str | None, dims: MLADims, gemm_quant: str, kv_quant: str):
    """Best (model, gemm_type) with ``kv_quant`` rows; (pick | None, reason)."""
    base = table.keys["op_name"] == OP_NAMES[phase] if table.has("op_name") else np.ones(len(table), bool)
    if not base.any():
        return None, f"{table.stem} has no op_name={OP_NAMES[phase]} rows"
    models = sorted(set(table.keys["model"][base].tolist())) if table.has("model") else [""]
    cands = []
    for m in models:
        exact = bool(model_id) and m.lower() == str(model_id).lower()
        mdims = _model_dims(db, m) if m else None
        if mdims is not None and mdims != dims:
            continue  # another model's shape (even under the queried id)
        if mdims is None and not exact:
            continue
        mm = base & (table.keys["model"] == m) if m else base
        for g in sorted(set(table.keys["gemm_type"][mm].tolist())):
            if not (mm & (table.keys["gemm_type"] == g) & (table.keys["kv_cache_dtype"] == kv_quant)).any():
                continue
            same_base = bool(model_id) and _base_name(m) == _base_name(str(model_id))
            cands.append(((gemm_distance(g, gemm_quant), not exact, not same_base, m, g), m, g, exact))
    if not cands:
        same = [m for m in models if _model_dims(db, m) == dims or (model_id and m.lower() == str(model_id).lower())]
        if not same:
            return None, f"{table.stem} has no model with MLA dimensions {dims.label()} (collected: {', '.join(models)})"
        kvs = sorted(set(table.keys["kv_cache_dtype"][base & np.isin(table.keys["model"], same)].tolist()))
        return None, f"{table.stem} has no kv_cache_dtype={kv_quant} rows for {', '.join(same)} (collected: {', '.join(kvs)})"
    cands.sort(key=lambda c: c[0])
    _, m, g, exact = cands[0]
    notes: list[str] = []
    if not exact:
        who = model_id or "the query"
        notes.append(f"module rows of {m} (same MLA dimensions: {dims.label()}) serve {who}")
    if g != gemm_quant:
        have = sorted({c[2] for c in cands if c[1] == m})
        notes.append(f"no gemm_type={gemm_quant} rows: served by gemm_type={g} rows (collected for {m}: {', '.join(have)}), "
                     "carried at equal utilisation against the module SOL")
    return _Pick(m, g, tuple(notes)), None


# --------------------------------------------------------------------------------------------
# lattice: sites (per-GPU heads) and their curves
# --------------------------------------------------------------------------------------------


@dataclass
class _Lattice:
    stem: str
    kernel: str
    sites: np.ndarray
    curves: dict
    site_tp: dict
    notes: tuple[str, ...]
    model: str
    gemm_type: str
    kv_quant: str
    dims: MLADims


def _lattice(db: OpDB, phase: str, pick: _Pick, kv_quant: str, tp: int, dims: MLADims):
    stem = MODULE_STEMS[phase]
    table = db.data.table(stem)
    base = table.keys["op_name"] == OP_NAMES[phase] if table.has("op_name") else np.ones(len(table), bool)
    if pick.model:
        base &= table.keys["model"] == pick.model
    base &= (table.keys["gemm_type"] == pick.gemm_type) & (table.keys["kv_cache_dtype"] == kv_quant)
    base = narrow_module_rows(table, base, phase)  # bf16 attention compute; context: no cached prefix
    if phase == "generation" and table.has("isl"):
        base &= table.keys["isl"] == 1
    notes = list(pick.notes)
    base, site_tp = nearest_tp_rows(table, base, tp)
    off = MODULE_STEP_OFFSET.get(db.backend, DEFAULT_MODULE_STEP_OFFSET)
    sites, curves, kernels, dropped = module_curves(table, base, phase, db.backend, off)
    if phase == "generation":
        if off:
            notes.append(f"{stem} step counts the decoded token ({db.backend} collector): looked up at step+{off}")
        if dropped:
            first = sorted(set(dropped.values()))
            notes.append(f"decode rows from batch {'/'.join(map(str, first))} up were timed without CUDA graph (collector's "
                         f"cuda_graph_max_bs; >{EAGER_RATIO:g}x the next smaller batch): dropped, graph-mode utilisation held beyond")
        n_low = sum(int(clean_generation(v)[1].sum()) for _, v in curves.values())
        if n_low:
            notes.append(f"{n_low} decode point(s) more than {NOISE - 1:.0%} above a longer-cache point of the same batch lowered to it")
    kernel = "+".join(k for k in kernels if k)
    return _Lattice(stem, kernel, sites, curves, site_tp, tuple(notes), pick.model, pick.gemm_type, kv_quant, dims)


#: relative wobble along a decode row treated as noise by :func:`clean_generation`
NOISE = 1.10


def clean_generation(vals: np.ndarray):
    """Decode-curve cleanup before filling, per batch row (second axis = step):

    1. **suffix minimum**: decode latency cannot fall as the cache grows, so a measured point more
       than ``NOISE`` above a later measured point of its row is lowered to it (smaller wobbles are
       measurement noise and stay). In the SGLang tables these are eager
       runs: the collector drops the CUDA graph above its own ``cuda_graph_max_bs`` (h200: batch
       512 and 1024 at steps <= 512 take 1.3 ms, the same rows at step 1024 0.35 / 0.67 ms);
    2. **interior gaps** (steps collected at batch 1 only: 1536, 3072, 6144, 10000, 10240, 12288)
       are interpolated linearly along step between the row's measured neighbours instead of being
       held from batch 1 through the dense-MLA SOL, which does not know the top-k cap.

    Returns (values, lowered mask, interpolated mask)."""
    v = vals.copy()
    lowered = np.zeros(v.shape, bool)
    interp = np.zeros(v.shape, bool)
    for i in range(v.shape[0]):
        row = v[i]
        run = np.inf
        for j in range(len(row) - 1, -1, -1):
            if np.isnan(row[j]):
                continue
            if row[j] > NOISE * run:
                row[j] = run
                lowered[i, j] = True
            run = min(run, row[j])
        meas = np.flatnonzero(~np.isnan(row))
        if len(meas) >= 2:
            for j in range(meas[0] + 1, meas[-1]):
                if np.isnan(row[j]):
                    interp[i, j] = True
    return v, lowered, interp


def _site_grid(db: OpDB, phase: str, lat: _Lattice, i: int) -> Grid:
    def build():
        h = int(lat.sites[i][0])
        s = mla_sol_fn(db, phase, h, lat.dims, lat.gemm_type, lat.kv_quant)
        ax, vals = lat.curves[i]
        interp = None
        if phase == "generation":
            vals, _, interp = clean_generation(vals)
            if interp.any():
                steps = ax[1]
                for r, c in zip(*np.nonzero(interp)):
                    row = vals[r]
                    meas = np.flatnonzero(~np.isnan(row) & ~interp[r])
                    vals[r, c] = np.interp(steps[c], steps[meas], row[meas])
        filled, prov = fill_missing(ax, vals, s)
        if interp is not None and interp.any():
            prov = np.where(interp, int(Prov.INTERPOLATED), prov).astype(np.int8)
        return Grid(ax, filled, prov, s, scales=_scales(phase))

    return db.memo(("dsa-site", phase, lat.model, lat.gemm_type, lat.kv_quant, lat.dims, id(lat), i), build)


def _retarget(g: Grid, query_sol) -> Grid:
    """Carry a grid to another SOL (GEMM quant) at equal utilisation; provenance transferred."""
    mesh = np.meshgrid(*g.axes, indexing="ij")
    values = g.values * query_sol(*mesh) / g.sol(*mesh)
    prov = np.maximum(g.prov, int(Prov.TRANSFERRED)).astype(np.int8)
    return Grid(g.axes, values, prov, query_sol, g.sites, scales=g.scales)


def _donor_grids(db: OpDB, phase: str, dims: MLADims, gemm_quant: str, kv_quant: str, tp: int, model_id: str | None):
    """Collected site grids to learn a utilisation from (HYBRID / EMPIRICAL): the query model's
    (or a same-dims model's) rows at any KV dtype, else every model with known dimensions."""
    stem = MODULE_STEMS[phase]
    if db.mode is DatabaseMode.SOL or not db.data.has_table(stem):
        return None
    table = db.data.table(stem)
    kvs = [kv_quant] + [k for k in sorted(set(table.keys["kv_cache_dtype"].tolist())) if k != kv_quant]
    for kv in kvs:
        pick, _ = _pick_rows(db, table, phase, model_id, dims, gemm_quant, kv)
        if pick is not None:
            lat = _lattice(db, phase, pick, kv, tp, dims)
            return [_site_grid(db, phase, lat, i) for i in range(len(lat.sites))]
    grids = []
    models = sorted(set(table.keys["model"].tolist())) if table.has("model") else []
    for m in models:
        mdims = _model_dims(db, m)
        if mdims is None:
            continue
        for kv in kvs:
            pick, _ = _pick_rows(db, table, phase, m, mdims, gemm_quant, kv)
            if pick is not None:
                lat = _lattice(db, phase, pick, kv, tp, mdims)
                grids += [_site_grid(db, phase, lat, i) for i in range(len(lat.sites))]
                break
    return grids or None


# --------------------------------------------------------------------------------------------
# resolution
# --------------------------------------------------------------------------------------------


def _check(phase, tp, heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, gemm_quant, kv_quant):
    if phase not in PHASES:
        raise InvalidInputError(f"unknown DSA phase {phase!r}", available=PHASES)
    if gemm_quant not in WEIGHT_BYTES:
        raise InvalidInputError(f"unknown GEMM quant {gemm_quant!r}", available=WEIGHT_BYTES)
    if kv_quant not in KV_BYTES:
        raise InvalidInputError(f"unknown KV-cache quant {kv_quant!r}", available=KV_BYTES)
    for name, v in (("tp", tp), ("heads", heads), ("hidden", hidden), ("q_lora_rank", q_lora_rank), ("kv_lora_rank", kv_lora_rank),
                    ("qk_nope_head_dim", qk_nope_head_dim), ("v_head_dim", v_head_dim)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or int(v) != v or v <= 0:
            raise InvalidInputError(f"DSA {name} must be a positive integer", f"got {v!r}")
    if isinstance(qk_rope_head_dim, bool) or int(qk_rope_head_dim) != qk_rope_head_dim or qk_rope_head_dim < 0:
        raise InvalidInputError("DSA qk_rope_head_dim must be an integer >= 0", f"got {qk_rope_head_dim!r}")


def resolve_dsa(
    db: OpDB,
    phase: str,
    *,
    hidden: int,
    heads: int,
    q_lora_rank: int,
    kv_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
    gemm_quant: str,
    kv_quant: str,
    model_id: str | None = None,
    tp: int = 1,
) -> Resolved:
    """Compile one DSA attention module (one layer, one GPU) for ``phase``.

    ``heads`` is per GPU (``num_attention_heads / tp``); ``tp`` picks the SGLang rows collected
    at that TP. The grid is ``(batch, isl)`` for context and ``(batch, step)`` for generation with
    ``step`` = tokens already cached (pass ``kv_len - 1``).
    """
    _check(phase, tp, heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, gemm_quant, kv_quant)
    heads, tp = int(heads), int(tp)
    dims = MLADims(int(hidden), int(q_lora_rank), int(kv_lora_rank), int(qk_nope_head_dim), int(qk_rope_head_dim), int(v_head_dim))
    query_sol = mla_sol_fn(db, phase, heads, dims, gemm_quant, kv_quant)
    query_sol(1.0, 1.0)  # raises early if the GPU has no tensor cores for the quant mode
    family = f"dsa_{phase}"
    axes = _axes(phase)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, _scales(phase))

    stem = MODULE_STEMS[phase]
    reason = None
    donors = None
    if db.mode is not DatabaseMode.EMPIRICAL:
        if not db.data.has_table(stem):
            reason = f"no {stem} table for {db.backend} {db.data.version} on {db.system.name}"
        else:
            table = db.data.table(stem)
            pick, reason = db.memo(("dsa-pick", phase, model_id, dims, gemm_quant, kv_quant),
                                   lambda: _pick_rows(db, table, phase, model_id, dims, gemm_quant, kv_quant))
            if pick is not None:
                lat = db.memo(("dsa-lattice", phase, pick, kv_quant, tp, dims), lambda: _lattice(db, phase, pick, kv_quant, tp, dims))
                choice = choose_sites((heads,), lat.sites)
                if choice is None:
                    donors = [_site_grid(db, phase, lat, i) for i in range(len(lat.sites))]
                    reason = f"{stem} heads={heads} is outside the collected sites' gates (collected: {[int(s[0]) for s in lat.sites]})"
                else:
                    labels = tuple(f"(heads={int(lat.sites[i][0])}) w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
                    site_sol = mla_sol_fn(db, phase, heads, dims, lat.gemm_type, kv_quant)
                    g = transfer_grid(choice, lambda i: _site_grid(db, phase, lat, i), site_sol, labels)
                    if lat.gemm_type != gemm_quant:
                        g = _retarget(g, query_sol)
                    notes = list(lat.notes)
                    used_tp = sorted({lat.site_tp.get(int(lat.sites[i][0]), tp) for i in choice.indices})
                    if lat.site_tp and used_tp != [tp]:
                        why = ("the collector simulates TP by the per-GPU head count" if set(lat.site_tp.values()) == {1}
                               else "no rows at the query's tp_size for these heads")
                        notes.append(f"rows at tp_size={'/'.join(map(str, used_tp))} serve tp={tp} ({why})")
                    how = choice.how if lat.gemm_type == gemm_quant else f"{choice.how}+gemm-transfer"
                    return Resolved(g, stem, db.served_version(stem), lat.kernel or None, how,
                                    labels if choice.how != "exact" else (), tuple(notes))

    if db.mode is not DatabaseMode.SILICON:
        if not donors:
            donors = _donor_grids(db, phase, dims, gemm_quant, kv_quant, tp, model_id)
        r = empirical_resolved(family, query_sol, axes, donors, _scales(phase))
        if reason:
            r.notes = r.notes + (f"no silicon answer: {reason}",)
        return r
    models = []
    if db.data.has_table(stem):
        t = db.data.table(stem)
        if t.has("model"):
            models = sorted(set(t.keys["model"].tolist()))
    raise NotAvailableError(
        f"no DSA {phase} data for heads={heads} gemm={gemm_quant} kv={kv_quant} model={model_id or dims.label()} "
        f"({db.backend} {db.data.version}, {db.system.name})",
        f"{reason}; looked for table {stem}" + (f" (models: {', '.join(models)})" if models else "")
        + "; use --database-mode HYBRID for an empirical estimate",
        db.data.available_tables(),
    )
