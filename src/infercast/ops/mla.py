"""DeepSeek-style multi-head latent attention (MLA): the whole attention module of one layer as one op.

One op per phase covers everything between the layer's input norm and the o_proj output (the
TP all-reduce after o_proj is the caller's): the query path (``q_a`` + ``q_b``, or ``q_proj`` when
the model has no q LoRA), ``kv_a`` (hidden -> ``kv_lora_rank + qk_rope_head_dim``), the attention
core and ``o_proj``. ``heads`` is always the per-GPU head count: under TP ``q_b``, ``kv_b`` and
``o_proj`` are split by heads while ``q_a`` / ``kv_a`` are replicated on every rank.

Curves: ``batch x isl`` for ``"context"`` (``isl`` = new tokens per request; a cached prefix is the
caller's business, as with :func:`infercast.ops.attention.prefix_fraction`) and ``batch x step``
for ``"generation"``, where **step = tokens already in the KV cache** (a decode token at KV length
L is looked up at ``step = L - 1``), the convention of the attention tables.

Sources, in order:

1. **Whole-module tables** ``mla_context_module`` / ``mla_generation_module`` (trtllm, vllm). They
   time the framework's real attention module (projections included) at per-GPU head counts
   1..128. Rows are matched on ``gemm_type`` (= the GEMM quant), ``kv_cache_dtype``, the model (an
   exact id, else any model whose MLA dimensions are equal — the note says which) and
   ``mla_dtype`` (bf16 preferred: the engines' default; vLLM's FP8 prefill query is an opt-in).
   Kernels are merged by shape (vLLM records the backend it dispatched per shape: e.g. FLASHMLA
   decode for 1-token "prefills", FLASH_ATTN prefill above). A head count that was not collected
   is transferred through utilisation against :func:`infercast.interp.sol.mla_context` /
   :func:`~infercast.interp.sol.mla_generation`.

   *Generation step convention.* The two collectors record ``step`` differently (read from the
   AIC collectors): TRT-LLM's module collector caches ``step`` tokens and decodes one more
   (``num_cached_tokens_per_seq = step``), the same as the attention tables' ``2^k - 1`` cached
   tokens; vLLM's records the sequence length *including* the decoded token (``seq_lens = step``,
   "generation caches only seq_len - 1"). The vLLM axis is therefore shifted by one
   (``MODULE_STEP_OFFSET``) so both mean "tokens already cached".

2. **Kernel tables** (sglang, or any backend without module tables): ``context_mla`` /
   ``generation_mla`` time the attention core alone (per-GPU ``num_heads``; the ``tp_size`` column
   is only the pairing with a 128-head model), at DeepSeek-V3 dimensions. Added on the same grid:

   * generation: the absorbed BMMs of ``mla_bmm`` (``mla_gen_pre``: q_nope x W_UK, and
     ``mla_gen_post``: latent output x W_UV) at ``num_tokens = batch``;
   * the projection GEMMs through :func:`infercast.ops.gemm.resolve_gemm` at ``m = batch*isl``
     (context) or ``m = batch`` (generation): the fused ``q_a + kv_a`` GEMM (n = q_lora_rank +
     kv_lora_rank + qk_rope_head_dim, k = hidden — SGLang's ``fused_qkv_a_proj_with_mqa`` and
     TRT-LLM's ``kv_a_proj_with_mqa`` (sized q_lora + kv_lora + rope) run the two replicated
     down-projections as one GEMM), ``q_b``
     (n = heads*(qk_nope+qk_rope), k = q_lora_rank) — or ``q_proj`` + ``kv_a`` separately when
     there is no q LoRA —, for context the ``kv_b`` up-projection (n = heads*(qk_nope+v_head),
     k = kv_lora_rank), and ``o_proj`` (n = hidden, k = heads*v_head).

   Model dimensions other than the tables' are transferred through the core SOL (provenance
   ``transferred``). The notes list every summed component with its version. Checked against
   TRT-LLM, which has both sources (DeepSeek-V3, heads 128 and 16, bf16 KV, fp8_block): the sum
   is 0.97-1.12x the module table in generation and 0.65-0.92x in context on h200, 0.86-0.98x
   and 0.82-0.97x on b200 — the sum has no RMSNorms, RoPE, latent-cache writes or q/k/v copies,
   which the module times.

3. Module rows of another GEMM quant with the same compute dtype (``GEMM_TYPE_SUBSTITUTES``:
   per-tensor ``fp8`` -> ``fp8_block``) when the kernel-table path cannot answer (vLLM); noted.

4. Module rows of another KV-cache dtype at the queried heads, shifted by the two dtypes'
   difference at the queried dtype's nearest collected head count (``kv-shift``, provenance
   transferred), when the queried dtype's rows hold too few head counts to reach it (vLLM 0.24.0
   fp8-KV generation rows collected at heads=1 only): MLA caches one latent vector per token for
   every head, so the time the KV dtype changes does not grow with heads
   (:func:`_resolve_kv_shift`).

With none of these: SILICON raises :class:`~infercast.errors.NotAvailableError` listing the
tables looked for; HYBRID / EMPIRICAL give SOL / learned utilisation; SOL mode gives the roofline.
"""

from __future__ import annotations

from functools import partial
from dataclasses import dataclass

import numpy as np

from ..data.model_configs import resolve_model
from ..data.quant import COMPUTE_DTYPE, KV_BYTES, WEIGHT_BYTES
from ..errors import InfercastError, InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import choose_sites, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, fill_missing, merge_kernels, sites_and_curves, sol_resolved
from .empirical import empirical_resolved
from .gemm import resolve_gemm

PHASES = ("context", "generation")
MODULE_STEMS = {"context": "mla_context_module", "generation": "mla_generation_module"}
KERNEL_STEMS = {"context": "context_mla", "generation": "generation_mla"}
BMM_STEM = "mla_bmm"

#: module-table ``step`` minus tokens already cached, per backend (see the module docstring)
MODULE_STEP_OFFSET = {"trtllm": 0, "vllm": 1}
DEFAULT_MODULE_STEP_OFFSET = 1

#: a GEMM quant the module tables lack -> module rows that may stand in (same compute dtype),
#: used only when the kernel-table path cannot answer either
GEMM_TYPE_SUBSTITUTES = {"fp8": ("fp8_block",)}

#: axes of SOL / empirical grids (the collected grids' spans)
CTX_BATCH = 2.0 ** np.arange(0, 9)
CTX_ISL = np.array([1, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240, 12288, 16384, 32768], float)
GEN_BATCH = 2.0 ** np.arange(0, 11)
GEN_STEP = 2.0 ** np.arange(1, 18) - 1
#: interpolation space per axis (see infercast.interp.grid), as for GQA attention: batch and
#: cached length are linear (a fixed cost plus a term linear in each), prefill length is a power law
CTX_SCALES = ("linear", "log")
GEN_SCALES = ("linear", "linear")


@dataclass(frozen=True)
class MLADims:
    """The shape of one MLA layer except its head count (a site axis)."""

    hidden: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def label(self) -> str:
        return (
            f"hidden={self.hidden} q_lora={self.q_lora_rank} kv_lora={self.kv_lora_rank} "
            f"nope={self.qk_nope_head_dim} rope={self.qk_rope_head_dim} v={self.v_head_dim}"
        )

    def core(self) -> tuple:
        """What the attention core depends on (the projections' dims are resolved as GEMMs)."""
        return (self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)


#: the dimensions the kernel tables (context_mla / generation_mla / mla_bmm) were collected at:
#: the AIC collectors hard-code DeepSeek-V3's attention (q_lora 1536, kv_lora 512, nope 128,
#: rope 64, v 128; hidden 7168)
KERNEL_TABLE_DIMS = MLADims(7168, 1536, 512, 128, 64, 128)


def mla_kv_bytes_per_token(kv_lora_rank: int, qk_rope_head_dim: int, kv_quant: str) -> float:
    """Latent KV-cache bytes per token and layer: one ``kv_lora_rank + qk_rope_head_dim`` vector
    shared by all heads (no head dimension), so every TP rank holds the full amount."""
    if kv_quant not in KV_BYTES:
        raise InvalidInputError(f"unknown KV-cache quant {kv_quant!r}", available=KV_BYTES)
    if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
        raise InvalidInputError("kv_lora_rank must be > 0 and qk_rope_head_dim >= 0", f"got {kv_lora_rank}, {qk_rope_head_dim}")
    return float(kv_lora_rank + qk_rope_head_dim) * KV_BYTES[kv_quant]


# --------------------------------------------------------------------------------------------
# speed of light
# --------------------------------------------------------------------------------------------


def mla_sol_fn(db: OpDB, phase: str, heads: int, dims: MLADims, gemm_quant: str, kv_quant: str, projections: bool = True):
    """SOL (ms) of the module (``projections=True``) or of the attention core alone, as
    ``f(batch, isl)`` (context, no prefix) or ``f(batch, step)`` (generation, step = cached)."""
    kvb = KV_BYTES[kv_quant]
    wb = WEIGHT_BYTES[gemm_quant]
    cdt = COMPUTE_DTYPE[gemm_quant]
    args = (heads, dims.hidden, dims.q_lora_rank, dims.kv_lora_rank, dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim, wb, kvb)
    # a partial of a module-level function: picklable (infercast.engine.compile_cache)
    return partial(_mla_context_sol if phase == "context" else _mla_generation_sol, db.system, args, cdt, projections)


def _mla_context_sol(system, args: tuple, cdt: str, projections: bool, batch, isl):
    return sol.mla_context(system, batch, isl, 0.0, *args, gemm_compute_dtype=cdt, projections=projections)[0]


def _mla_generation_sol(system, args: tuple, cdt: str, projections: bool, batch, step):
    return sol.mla_generation(system, batch, np.asarray(step, dtype=float) + 1.0, *args, gemm_compute_dtype=cdt,
                              projections=projections)[0]


def _bmm_sol_fn(db: OpDB, op: str, dims: MLADims, bmm_dtype: str, heads: int):
    wb = 2.0 if bmm_dtype == "bfloat16" else 1.0
    cdt = "bfloat16" if bmm_dtype == "bfloat16" else "fp8"
    k, n = (dims.qk_nope_head_dim, dims.kv_lora_rank) if op == "mla_gen_pre" else (dims.kv_lora_rank, dims.v_head_dim)
    return partial(_mla_bmm_sol, db.system, cdt, wb, heads, k, n)


def _mla_bmm_sol(system, cdt: str, wb: float, heads: int, k: int, n: int, tokens):
    return sol.mla_bmm(system, cdt, wb, tokens, heads, k, n)[0]


def _axes(phase: str):
    return (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)


def _scales(phase: str):
    return CTX_SCALES if phase == "context" else GEN_SCALES


def _redim(g: Grid, query_sol) -> Grid:
    """Carry a grid to other dimensions at equal utilisation (SOL ratio); provenance transferred."""
    mesh = np.meshgrid(*g.axes, indexing="ij")
    values = g.values * query_sol(*mesh) / g.sol(*mesh)
    prov = np.maximum(g.prov, int(Prov.TRANSFERRED)).astype(np.int8)
    return Grid(g.axes, values, prov, query_sol, g.sites, scales=g.scales)


# --------------------------------------------------------------------------------------------
# table access
# --------------------------------------------------------------------------------------------


def _table(db: OpDB, stem: str):
    """The table, or None when this backend/version has none (never raises for absence)."""
    if db.mode is DatabaseMode.SOL or not db.data.has_table(stem):
        return None
    return db.data.table(stem)


def model_dims(db: OpDB, model: str) -> MLADims | None:
    """MLA dimensions of a model named in a module table (MLA or DSA), from the pack's model configs."""

    def build():
        try:
            mc = resolve_model(db.data.pack, model)
        except InfercastError:
            return None
        cfg = mc.config if isinstance(mc.config, dict) else {}
        text = cfg.get("text_config") or cfg
        try:
            q = text.get("q_lora_rank")
            return MLADims(
                int(text["hidden_size"]), int(q) if q else None, int(text["kv_lora_rank"]),
                int(text["qk_nope_head_dim"]), int(text["qk_rope_head_dim"]), int(text["v_head_dim"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    return db.memo(("mla-model-dims", model), build)


def _pick_model(db: OpDB, table, model_id: str | None, dims: MLADims):
    """(model value to filter on or None for no model column, note) — None model => no match."""
    if not table.has("model"):
        return "", "module table has no model column: rows taken as this model's"
    models = table.unique("model")
    if model_id:
        hit = [m for m in models if m.lower() == model_id.lower()]
        if hit:
            return hit[0], None
    same = [m for m in models if model_dims(db, m) == dims]
    if same:
        who = model_id or "the query"
        return same[0], f"module rows of {same[0]} (same MLA dimensions: {dims.label()}) serve {who}"
    return None, f"no module-table model has MLA dimensions {dims.label()} (collected: {', '.join(models)})"


def _rank_mla_dtype(table, mask, prefer: str) -> list[str]:
    vals = sorted(set(table.keys["mla_dtype"][mask].tolist())) if table.has("mla_dtype") else [""]
    return sorted(vals, key=lambda v: (v != prefer, v != "bfloat16", v))


@dataclass
class _Lattice:
    table: object
    stem: str
    kernel: str
    sites: np.ndarray
    curves: dict
    notes: tuple[str, ...]
    gemm_type: str
    kv_quant: str


def _module_lattice(db: OpDB, phase: str, gemm_type: str, kv_quant: str, model_id: str | None, dims: MLADims, attn_quant: str):
    """Module-table sites (per-GPU heads) and curves for one config; (lattice | None, reason)."""
    stem = MODULE_STEMS[phase]
    table = _table(db, stem)
    if table is None:
        return None, f"no {stem} table"
    model, note = _pick_model(db, table, model_id, dims)
    if model is None:
        return None, note
    notes = (note,) if note else ()
    base = table.mask(model=model) if model else np.ones(len(table), bool)
    if not (base & (table.keys["gemm_type"] == gemm_type)).any():
        return None, f"{stem} has no gemm_type={gemm_type} rows (collected: {', '.join(sorted(set(table.keys['gemm_type'][base].tolist())))})"
    base &= table.keys["gemm_type"] == gemm_type
    if not (base & (table.keys["kv_cache_dtype"] == kv_quant)).any():
        return None, f"{stem} has no kv_cache_dtype={kv_quant} rows with gemm_type={gemm_type}"
    base &= table.keys["kv_cache_dtype"] == kv_quant
    if table.has("tp_size"):
        base &= table.keys["tp_size"] == table.keys["tp_size"][base].min()
    if phase == "generation" and table.has("isl"):
        base &= table.keys["isl"] == 1
    if phase == "context" and table.has("step"):
        base &= table.keys["step"] == table.keys["step"][base].min()  # no cached prefix
    mdt = _rank_mla_dtype(table, base, attn_quant)[0]
    if table.has("mla_dtype"):
        base &= table.keys["mla_dtype"] == mdt
        if mdt != attn_quant:
            notes += (f"served by mla_dtype={mdt} rows",)
    curve = ("batch_size", "isl") if phase == "context" else ("batch_size", "step")
    who = db.data.table_backend(stem)  # a peer backend's collector when its table serves (data.database)
    if who != db.backend:
        notes += (f"{stem} of {who} ({db.data.served[stem].how})",)
    mask, kernels = merge_kernels(table, base, ("num_heads",) + curve, who)
    sites, curves = sites_and_curves(table, mask, ("num_heads",), curve)
    if phase == "generation":
        off = MODULE_STEP_OFFSET.get(who, DEFAULT_MODULE_STEP_OFFSET)
        curves = {s: ((ax[0], ax[1] - off), v) for s, (ax, v) in curves.items()}
        if off:
            notes += (f"{stem} step counts the decoded token ({who} collector): looked up at step+{off}",)
    return _Lattice(table, stem, "+".join(k for k in kernels if k), sites, curves, notes, gemm_type, kv_quant), None


def _kernel_lattice(db: OpDB, phase: str, kv_quant: str, attn_quant: str):
    stem = KERNEL_STEMS[phase]
    table = _table(db, stem)
    if table is None:
        return None, f"no {stem} table"
    base = table.keys["kv_cache_dtype"] == kv_quant
    if not base.any():
        return None, f"{stem} has no kv_cache_dtype={kv_quant} rows (collected: {', '.join(table.unique('kv_cache_dtype'))})"
    notes: tuple[str, ...] = ()
    mdt = _rank_mla_dtype(table, base, attn_quant)[0]
    if table.has("mla_dtype"):
        base &= table.keys["mla_dtype"] == mdt
        if mdt != attn_quant:
            notes += (f"core served by mla_dtype={mdt} rows",)
    curve = ("batch_size", "isl") if phase == "context" else ("batch_size", "step")
    if phase == "generation" and table.has("isl"):
        base &= table.keys["isl"] == 1
    if phase == "context" and table.has("step"):
        base &= table.keys["step"] == 0
    # num_heads is the per-GPU count; tp_size only pairs it with a 128-head model
    mask, kernels = merge_kernels(table, base, ("num_heads",) + curve, db.backend)
    sites, curves = sites_and_curves(table, mask, ("num_heads",), curve)
    return _Lattice(table, stem, "+".join(k for k in kernels if k), sites, curves, notes, "", kv_quant), None


def _bmm_lattice(db: OpDB, op: str, bmm_dtype: str):
    table = _table(db, BMM_STEM)
    if table is None:
        return None, f"no {BMM_STEM} table"
    base = table.mask(op_name=op)
    dtypes = [bmm_dtype] + (["bfloat16"] if bmm_dtype != "bfloat16" else [])
    for dt in dtypes:
        m = base & (table.keys["bmm_dtype"] == dt)
        if m.any():
            mask, kernels = merge_kernels(table, m, ("num_heads", "num_tokens"), db.backend)
            sites, curves = sites_and_curves(table, mask, ("num_heads",), ("num_tokens",))
            notes = () if dt == bmm_dtype else (f"{op} served by bmm_dtype={dt} rows",)
            return _Lattice(table, BMM_STEM, "+".join(k for k in kernels if k), sites, curves, notes, dt, ""), None
    return None, f"{BMM_STEM} has no {op} rows in {'/'.join(dtypes)}"


# --------------------------------------------------------------------------------------------
# resolution
# --------------------------------------------------------------------------------------------


def _site_choice(db: OpDB, lat: _Lattice, heads: int):
    return None if db.mode is DatabaseMode.EMPIRICAL else choose_sites((heads,), lat.sites)


def _labels(lat: _Lattice, choice) -> tuple[str, ...]:
    return tuple(f"(heads={int(lat.sites[i][0])}) w={w:.2f}" for i, w in zip(choice.indices, choice.weights))


def _resolve_module(db: OpDB, phase: str, lat: _Lattice, heads: int, dims: MLADims, gemm_quant: str, kv_quant: str, extra_notes=()):
    query_sol = mla_sol_fn(db, phase, heads, dims, gemm_quant, kv_quant)

    def site_grid(i: int) -> Grid:
        def build():
            h = int(lat.sites[i][0])
            s = mla_sol_fn(db, phase, h, dims, lat.gemm_type, lat.kv_quant)
            ax, vals = lat.curves[i]
            filled, prov = fill_missing(ax, vals, s)
            return Grid(ax, filled, prov, s, scales=_scales(phase))

        return db.memo(("mla-module-site", phase, lat.gemm_type, lat.kv_quant, dims, id(lat), i), build)

    choice = _site_choice(db, lat, heads) if heads > 0 else None
    if choice is None:
        return None, [site_grid(i) for i in range(len(lat.sites))]
    labels = _labels(lat, choice)
    g = transfer_grid(choice, site_grid, query_sol, labels)
    notes = lat.notes + tuple(extra_notes)
    r = Resolved(g, lat.stem, db.served_version(lat.stem), lat.kernel or None, choice.how, labels if choice.how != "exact" else (), notes)
    return r, None


def _resolve_kv_shift(db: OpDB, phase: str, lat: _Lattice, kv_lat, heads: int, dims: MLADims, gemm_quant: str,
                      kv_quant: str):
    """Module rows of another KV-cache dtype at ``heads``, shifted to ``kv_quant``: (Resolved | None,
    reason).

    For a KV dtype whose module rows were collected at a few head counts only (vLLM 0.24.0's
    fp8-KV MLA generation rows on one system hold heads=1 alone), the latency at ``heads`` is the
    other dtype's at ``heads`` plus the difference the two dtypes show at ``h0``, the collected
    head count of ``kv_quant`` nearest ``heads`` (log scale) that the other dtype also has,
    point by point over (batch, length), and never below ``kv_quant``'s own latency at ``h0``
    (more heads do not run faster). Assumption: the KV dtype changes the time spent reading and
    writing the cache, which MLA holds as one latent vector per token shared by every head, so
    that part does not grow with the head count; what grows with heads (projections, per-head
    attention math) is taken from the other dtype's measured rows. Provenance: transferred, with
    both donors named."""
    table = lat.table
    others = sorted({str(k) for k in table.keys["kv_cache_dtype"].tolist()} - {kv_quant},
                    key=lambda k: (k != "bfloat16", k))
    if not others:
        return None, f"{lat.stem} has no other kv_cache_dtype to shift from"
    own = sorted({int(s[0]) for s in lat.sites})
    for other in others:
        olat, _ = kv_lat(other)
        if olat is None:
            continue
        shared = [h for h in own if h in {int(s[0]) for s in olat.sites}]
        if not shared:
            continue
        r_h, _ = _resolve_module(db, phase, olat, heads, dims, gemm_quant, other)
        if r_h is None:
            continue
        h0 = min(shared, key=lambda h: (abs(np.log2(h) - np.log2(heads)), h))
        r_own, _ = _resolve_module(db, phase, lat, h0, dims, gemm_quant, kv_quant)
        r_oth, _ = _resolve_module(db, phase, olat, h0, dims, gemm_quant, other)
        if r_own is None or r_oth is None:
            continue
        g = r_h.grid
        mesh = np.meshgrid(*g.axes, indexing="ij")
        v_own, p_own = r_own.grid(*mesh)
        v_oth, _ = r_oth.grid(*mesh)
        values = np.maximum(g.values + (v_own - v_oth), v_own)
        prov = np.maximum(np.maximum(g.prov, p_own), int(Prov.TRANSFERRED)).astype(np.int8)
        query_sol = mla_sol_fn(db, phase, heads, dims, gemm_quant, kv_quant)
        grid = Grid(g.axes, values, prov, query_sol, g.sites, scales=g.scales)
        labels = (f"kv_cache_dtype={other} heads={heads}", f"{kv_quant} - {other} at heads={h0}")
        note = (f"{lat.stem} has kv_cache_dtype={kv_quant} rows at heads={own} only: {other} rows at heads={heads} "
                f"plus the {kv_quant} - {other} difference at heads={h0} (the latent KV cache is shared by every "
                f"head, so its read time does not grow with heads)")
        return Resolved(grid, lat.stem, db.served_version(lat.stem), lat.kernel or None, "kv-shift", labels,
                        lat.notes + r_h.notes + (note,)), None
    return None, f"{lat.stem}: no other kv_cache_dtype has rows at heads={heads} and at a head count {kv_quant} has"


def _curve_site_grid(db: OpDB, lat: _Lattice, i: int, sol_for_heads, key, scales):
    """One collected site as a Grid: 2-D curves get their truncated corners held
    (:func:`fill_missing`); a 1-D curve's axis holds only measured points already."""

    def build():
        h = int(lat.sites[i][0])
        s = sol_for_heads(h)
        ax, vals = lat.curves[i]
        if len(ax) == 2:
            filled, prov = fill_missing(ax, vals, s)
        else:
            filled, prov = vals, np.full(vals.shape, int(Prov.EXACT), np.int8)
        return Grid(ax, filled, prov, s, scales=scales)

    return db.memo(key + (i,), build)


def _resolve_kernel_path(db: OpDB, phase: str, heads: int, dims: MLADims, gemm_quant: str, kv_quant: str, attn_quant: str):
    """Attention core + (absorbed BMMs) + projection GEMMs summed on the core's grid.
    Returns (Resolved | None, reason | None, donor grids for an empirical fallback)."""
    core, why = db.memo(("mla-kernel-lattice", phase, kv_quant, attn_quant), lambda: _kernel_lattice(db, phase, kv_quant, attn_quant))
    if core is None:
        return None, why, None
    tdims = KERNEL_TABLE_DIMS
    notes: list[str] = list(core.notes)

    def core_sol(h, d=tdims):
        return mla_sol_fn(db, phase, h, d, "bfloat16", kv_quant, projections=False)

    def core_site(i):
        return _curve_site_grid(db, core, i, core_sol, ("mla-kernel-site", phase, kv_quant, attn_quant), _scales(phase))

    choice = _site_choice(db, core, heads)
    if choice is None:
        return None, f"{core.stem} heads={heads} is outside the collected sites' gates (collected: {[int(s[0]) for s in core.sites]})", [core_site(i) for i in range(len(core.sites))]
    labels = _labels(core, choice)
    g_core = transfer_grid(choice, core_site, core_sol(heads), labels)
    if dims.core() != tdims.core():
        g_core = _redim(g_core, core_sol(heads, dims))
        notes.append(f"core transferred from the kernel tables' dims ({tdims.label()}) to {dims.label()}")
    comps = [f"{core.stem} core ({db.served_version(core.stem)}, kernel {core.kernel}, {choice.how}{': ' + '; '.join(labels) if choice.how != 'exact' else ''})"]
    mesh = np.meshgrid(*g_core.axes, indexing="ij")
    total, prov = g_core(*mesh)
    total = total.copy()
    prov = prov.astype(np.int8)
    batch = mesh[0]
    m = batch * mesh[1] if phase == "context" else batch

    if phase == "generation":
        bmm_dtype = "bfloat16" if COMPUTE_DTYPE[gemm_quant] == "bfloat16" else "fp8"
        for op in ("mla_gen_pre", "mla_gen_post"):
            lat, why = db.memo(("mla-bmm-lattice", op, bmm_dtype), lambda op=op: _bmm_lattice(db, op, bmm_dtype))
            if lat is None:
                return None, why, None
            notes.extend(lat.notes)

            def bsol(h, d=tdims, op=op, dt=lat.gemm_type):
                return _bmm_sol_fn(db, op, d, dt, h)

            def bsite(i, lat=lat, bsol=bsol, op=op):
                return _curve_site_grid(db, lat, i, bsol, ("mla-bmm-site", op, lat.gemm_type), ("linear",))

            bchoice = _site_choice(db, lat, heads)
            if bchoice is None:
                return None, f"{BMM_STEM} {op} heads={heads} is outside the collected sites' gates", None
            blabels = _labels(lat, bchoice)
            gb = transfer_grid(bchoice, bsite, bsol(heads), blabels)
            if (dims.qk_nope_head_dim, dims.kv_lora_rank, dims.v_head_dim) != (tdims.qk_nope_head_dim, tdims.kv_lora_rank, tdims.v_head_dim):
                qs = bsol(heads, dims)
                gb = Grid(gb.axes, gb.values * qs(gb.axes[0]) / gb.sol(gb.axes[0]), np.maximum(gb.prov, int(Prov.TRANSFERRED)).astype(np.int8), qs, gb.sites, scales=gb.scales)
            v, p = gb(batch)
            total += v
            prov = np.maximum(prov, p)
            comps.append(f"{BMM_STEM} {op} {lat.gemm_type} ({db.served_version(BMM_STEM)}, kernel {lat.kernel}, {bchoice.how})")

    qk = dims.qk_nope_head_dim + dims.qk_rope_head_dim
    gemms = []
    if dims.q_lora_rank:
        gemms.append(("q_a+kv_a (fused, replicated)", dims.q_lora_rank + dims.kv_lora_rank + dims.qk_rope_head_dim, dims.hidden))
        gemms.append(("q_b", heads * qk, dims.q_lora_rank))
    else:
        gemms.append(("q_proj", heads * qk, dims.hidden))
        gemms.append(("kv_a (replicated)", dims.kv_lora_rank + dims.qk_rope_head_dim, dims.hidden))
    if phase == "context":
        gemms.append(("kv_b", heads * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank))
    gemms.append(("o_proj", dims.hidden, heads * dims.v_head_dim))
    for name, n, k in gemms:
        r = resolve_gemm(db, gemm_quant, int(n), int(k))
        v, p = r.grid(m)
        total += v
        prov = np.maximum(prov, p)
        comps.append(f"gemm {name} n={n} k={k} {gemm_quant} ({r.version or r.source}, {r.how})")

    module_sol = mla_sol_fn(db, phase, heads, dims, gemm_quant, kv_quant)
    g = Grid(g_core.axes, total, prov.astype(np.int8), module_sol, g_core.sites, scales=g_core.scales)
    notes.insert(0, "summed: " + " + ".join(comps))
    source = "+".join([core.stem] + ([BMM_STEM] if phase == "generation" else []) + ["gemm"])
    r = Resolved(g, source, db.served_version(core.stem), core.kernel or None, "summed", labels if choice.how != "exact" else (), tuple(notes))
    return r, None, None


def _foreign_module_donors(db: OpDB, phase: str, gemm_quant: str, kv_quant: str, attn_quant: str):
    """Site grids of module-table rows collected for *other* MLA dimensions (each against its own
    SOL), to learn a utilisation from when nothing matches the query (HYBRID / EMPIRICAL only)."""
    table = _table(db, MODULE_STEMS[phase])
    if table is None or not table.has("model"):
        return None
    for model in table.unique("model"):
        mdims = model_dims(db, model)
        if mdims is None:
            continue
        gqs = [gemm_quant] + [g for g in table.unique("gemm_type") if g != gemm_quant]
        for gq in gqs:
            lat, _ = db.memo(("mla-module-lattice", phase, gq, kv_quant, model, mdims, attn_quant),
                             lambda gq=gq, model=model, mdims=mdims: _module_lattice(db, phase, gq, kv_quant, model, mdims, attn_quant))
            if lat is None:
                continue
            _, grids = _resolve_module(db, phase, lat, -1, mdims, gq, kv_quant)
            return grids
    return None


def _check(phase, heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, gemm_quant, kv_quant):
    if phase not in PHASES:
        raise InvalidInputError(f"unknown MLA phase {phase!r}", available=PHASES)
    if gemm_quant not in WEIGHT_BYTES:
        raise InvalidInputError(f"unknown GEMM quant {gemm_quant!r}", available=WEIGHT_BYTES)
    if kv_quant not in KV_BYTES:
        raise InvalidInputError(f"unknown KV-cache quant {kv_quant!r}", available=KV_BYTES)
    for name, v in (("heads", heads), ("hidden", hidden), ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim), ("v_head_dim", v_head_dim)):
        if int(v) != v or v <= 0:
            raise InvalidInputError(f"MLA {name} must be a positive integer", f"got {v!r}")
    if qk_rope_head_dim < 0 or (q_lora_rank is not None and q_lora_rank <= 0):
        raise InvalidInputError("MLA qk_rope_head_dim must be >= 0 and q_lora_rank > 0 (or None)", f"got {qk_rope_head_dim!r}, {q_lora_rank!r}")


def resolve_mla(
    db: OpDB,
    phase: str,
    *,
    hidden: int,
    heads: int,
    q_lora_rank: int | None,
    kv_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
    gemm_quant: str,
    kv_quant: str,
    model_id: str | None = None,
    attn_quant: str = "bfloat16",
) -> Resolved:
    """Compile one MLA attention module (one layer, one GPU) for ``phase``.

    ``heads`` is per GPU. The grid is ``(batch, isl)`` for context and ``(batch, step)`` for
    generation with ``step`` = tokens already cached (pass ``kv_len - 1``). ``attn_quant`` is the
    attention compute dtype to prefer among the tables' ``mla_dtype`` rows (bf16 is every
    engine's default).
    """
    _check(phase, heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, gemm_quant, kv_quant)
    heads = int(heads)
    dims = MLADims(int(hidden), int(q_lora_rank) if q_lora_rank else None, int(kv_lora_rank), int(qk_nope_head_dim), int(qk_rope_head_dim), int(v_head_dim))
    query_sol = mla_sol_fn(db, phase, heads, dims, gemm_quant, kv_quant)
    query_sol(1.0, 1.0)  # raises early if the GPU has no tensor cores for the quant mode
    family = f"mla_{phase}"
    axes = _axes(phase)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, _scales(phase))

    reasons: list[str] = []
    donors = None

    # 1. whole-module tables, exact GEMM quant
    def module_lat(gq):
        return db.memo(("mla-module-lattice", phase, gq, kv_quant, model_id, dims, attn_quant),
                       lambda: _module_lattice(db, phase, gq, kv_quant, model_id, dims, attn_quant))

    lat, why = module_lat(gemm_quant)
    if lat is not None:
        r, site_donors = _resolve_module(db, phase, lat, heads, dims, gemm_quant, kv_quant)
        if r is not None:
            return r
        donors = site_donors
        reasons.append(f"{lat.stem} heads={heads} is outside the collected sites' gates (collected: {[int(s[0]) for s in lat.sites]})")
    else:
        reasons.append(why)

    # 2. kernel tables + BMMs + GEMMs
    if db.mode is not DatabaseMode.EMPIRICAL:
        try:
            r, why, kdonors = _resolve_kernel_path(db, phase, heads, dims, gemm_quant, kv_quant, attn_quant)
        except NotAvailableError as exc:
            r, why, kdonors = None, f"kernel-table path: {exc}", None
        if r is not None:
            if lat is None and reasons and reasons[0]:
                r.notes = r.notes + (f"no whole-module rows: {reasons[0]}",)
            return r
        reasons.append(why)
        donors = donors or kdonors

    # 3. module rows of a GEMM quant with the same compute dtype
    for sub in GEMM_TYPE_SUBSTITUTES.get(gemm_quant, ()):
        slat, why = module_lat(sub)
        if slat is None:
            reasons.append(why)
            continue
        r, site_donors = _resolve_module(db, phase, slat, heads, dims, gemm_quant, kv_quant,
                                         (f"served by gemm_type={sub} module rows (no {gemm_quant} rows; same compute dtype)",))
        if r is not None:
            return r
        donors = donors or site_donors

    # 4. heads outside this KV dtype's module sites: another KV dtype's rows at these heads,
    #    shifted by the two dtypes' difference at this dtype's nearest collected head count
    if lat is not None and db.mode is not DatabaseMode.EMPIRICAL:
        def kv_lat(kv):
            return db.memo(("mla-module-lattice", phase, gemm_quant, kv, model_id, dims, attn_quant),
                           lambda: _module_lattice(db, phase, gemm_quant, kv, model_id, dims, attn_quant))

        r, why = _resolve_kv_shift(db, phase, lat, kv_lat, heads, dims, gemm_quant, kv_quant)
        if r is not None:
            return r
        reasons.append(why)

    if db.mode is not DatabaseMode.SILICON:
        if not donors:
            donors = _foreign_module_donors(db, phase, gemm_quant, kv_quant, attn_quant)
        return empirical_resolved(family, query_sol, axes, donors, _scales(phase))
    tables = [MODULE_STEMS[phase], KERNEL_STEMS[phase]] + ([BMM_STEM] if phase == "generation" else [])
    raise NotAvailableError(
        f"no MLA {phase} data for heads={heads} gemm={gemm_quant} kv={kv_quant} ({db.backend} {db.data.version}, {db.system.name})",
        "; ".join(r for r in reasons if r) + f"; looked for tables {', '.join(tables)}; use --database-mode HYBRID for an empirical estimate",
        db.data.available_tables(),
    )
