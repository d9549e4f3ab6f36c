"""GQA attention: context (prefill) and generation (decode), from the attention tables.

Sites are ``(num_heads, num_kv_heads)`` per GPU at a fixed head_dim and window; curves are
``batch x isl`` (context) and ``batch x step`` (generation; ``step`` = tokens already cached, so a
decode token at KV length L is looked up at step L-1). Truncated corners of the collected grids
(large batch x length) are filled by holding utilisation from the nearest smaller batch; in
generation attention with the utilisation change between the two batches measured at the nearest
shorter length (``fill_missing(..., transport=True)``; LOO numbers in
:func:`infercast.ops.base.fill_missing`).

**KV diagonal (generation).** Split-KV decode kernels spread each sequence's cached tokens over
CTAs, so until the GPU is full latency follows the total cached tokens ``batch x KV length``:
on b200 TensorRT-LLM, 16 heads / 4 KV heads, ``(1, 128K)``, ``(2, 64K)``, ``(4, 32K)`` and
``(8, 16K)`` take 38.1, 36.3, 34.4 and 33.0 us, while batch 1 alone runs 28.3 -> 29.6 us from
64K to 128K (a new split) after falling utilisation over the octave before -- the step axis's
own edge rule extrapolates that fall (+50%). Each generation site grid therefore gets one more
step column, at twice the last KV length (``extend_kv_diagonal``): row ``b`` takes the
utilisation of ``(2b, L)`` -- the same cached tokens -- where both cells were measured and the
diagonal held one octave in (``(b, L)`` against ``(2b, L/2)`` within ``KV_DIAGONAL_TOL``, 10%),
and the grid's edge rule elsewhere (the largest batch; short KV, where a per-sequence cost
rather than the KV traffic sets latency and the check fails). LOO hold-high median / p90,
h200 / b200 (with the two-octave batch trend of :mod:`infercast.interp.grid`):
2.8 / 12.8% | 2.8 / 15.9% -> 2.7 / 11.8% | 2.6 / 13.4% (seed 1: 2.7 / 12.8% | 2.6 / 16.2% ->
2.6 / 12.0% | 2.5 / 13.3%); transfer p90 b200 16.2 -> 16.3% (seed 1 unchanged), other paths
unchanged. Tolerance 5%: 2.7 / 12.0% | 2.7 / 14.8%; 20%: 2.8 / 11.8% | 2.6 / 12.6%. The same
diagonal below the batch axis's low edge (batch 1 from batch 2 at half the length) gained
little (hold-low p90 7.9 -> 7.1% | 16.3 -> 16.2%, offline) and is not used: batch 1 often runs a
different kernel configuration altogether.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import choose_sites, transfer_grid
from ..data.quant import KV_BYTES
from .base import DatabaseMode, OpDB, Resolved, choose_kernel, fill_missing, sites_and_curves, sol_resolved
from .empirical import empirical_resolved

CTX_BATCH = 2.0 ** np.arange(0, 9)
CTX_ISL = np.array([1, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240, 12288, 16384], float)
GEN_BATCH = 2.0 ** np.arange(0, 12)
GEN_STEP = 2.0 ** np.arange(1, 18) - 1
#: interpolation space per axis (see infercast.interp.grid): context length is a power law; the
#: batch axes are linear with the ``batch`` floor beyond their high edge
CTX_SCALES = ("batch", "log")
GEN_SCALES = ("batch", "linear")
#: distance weights for (group size, kv heads) when choosing transfer donors
GROUP_WEIGHTS = (2.0, 1.0)
#: per table: truncated corners take the utilisation change between batches from a shorter length
#: (base.fill_missing). Generation only: decode utilisation climbs with the batch up to the corner
#: (LOO hold-high median 4.9 / 5.3% -> 3.2 / 3.3%); for context attention the gain is within
#: noise (hold-high 2.2 / 13.8% | 2.4 / 10.1% -> 2.1 / 13.7% | 2.1 / 9.3%), so it keeps holding.
FILL_TRANSPORT = {"context_attention": False, "generation_attention": True}


def fill_site(stem: str, axes, vals, sol):
    """A site's measured ``batch x length`` grid with its truncated corners filled."""
    return fill_missing(axes, vals, sol, transport=FILL_TRANSPORT[stem])


#: generation attention: a batch row is extended one KV doubling beyond the last step along the
#: ``batch x KV length`` diagonal only where the diagonal held one octave in, within this factor
KV_DIAGONAL_TOL = 0.10


def extend_kv_diagonal(axes, vals, filled, prov, sol, scales):
    """Generation attention: one more step column at twice the last KV length (module docstring).

    ``vals`` are the measured values (NaN where not collected), ``filled`` / ``prov`` the filled
    grid. Row ``b`` of the new column takes the utilisation of ``(2b, L)`` (the same cached tokens,
    ``b x 2L``) where both cells were measured and the same diagonal held one octave in --
    ``(b, L)`` against ``(2b, L/2)`` within ``KV_DIAGONAL_TOL`` -- and the grid's own edge rule
    elsewhere. Returns ``(axes, values, prov)``; unchanged when the axes are not doublings."""
    a0, a1 = (np.asarray(a, dtype=float) for a in axes)
    if KV_DIAGONAL_TOL <= 0 or len(a0) < 2 or len(a1) < 2 or a1[-2] + 1.0 != (a1[-1] + 1.0) / 2.0:
        return axes, filled, prov
    new_step = 2.0 * (a1[-1] + 1.0) - 1.0
    base = Grid(axes, filled, prov, sol, scales=scales)
    col, _ = base(a0, np.full(len(a0), new_step))
    col = np.array(col, dtype=float)
    measured = ~np.isnan(vals)
    limit = np.log1p(KV_DIAGONAL_TOL)
    for i in range(len(a0) - 1):
        if a0[i + 1] != 2.0 * a0[i] or not (measured[i + 1, -1] and measured[i, -1] and measured[i + 1, -2]):
            continue
        held = vals[i + 1, -2] * sol(a0[i], a1[-1]) / sol(a0[i + 1], a1[-2])
        if abs(np.log(held / vals[i, -1])) < limit:
            col[i] = vals[i + 1, -1] * sol(a0[i], new_step) / sol(a0[i + 1], a1[-1])
    ax = (a0, np.append(a1, new_step))
    values = np.concatenate([filled, col[:, None]], axis=1)
    pr = np.concatenate([prov, np.full((len(a0), 1), int(Prov.HELD), np.int8)], axis=1)
    return ax, values, pr


def build_site_grid(stem: str, axes, vals, sol) -> Grid:
    """A site's grid as infercast serves it: truncated corners filled (``fill_site``) and, for
    generation attention, the KV diagonal one doubling beyond the last step (``extend_kv_diagonal``)."""
    scales = CTX_SCALES if stem == "context_attention" else GEN_SCALES
    filled, prov = fill_site(stem, axes, vals, sol)
    if stem == "generation_attention":
        axes, filled, prov = extend_kv_diagonal(axes, vals, filled, prov, sol, scales)
    return Grid(axes, filled, prov, sol, scales=scales)


def _ctx_sol(db: OpDB, heads, kv_heads, head_dim, kv_quant, window):
    kvb = KV_BYTES[kv_quant]

    def f(batch, isl):
        return sol.context_attention(db.system, batch, isl, 0.0, heads, kv_heads, head_dim, kvb, window)[0]

    return f


def _gen_sol(db: OpDB, heads, kv_heads, head_dim, kv_quant, window):
    kvb = KV_BYTES[kv_quant]

    def f(batch, step):
        return sol.generation_attention(db.system, batch, np.asarray(step) + 1.0, heads, kv_heads, head_dim, kvb, window)[0]

    return f


def _lattice(db: OpDB, stem: str, head_dim: int, kv_quant: str, attn_quant: str, window: int):
    table = db.table_or_none(stem)
    if table is None:
        return None
    base = table.mask(head_dim=head_dim)
    if table.has("window_size"):
        base &= table.keys["window_size"] == window
    elif window:
        base &= False
    if table.has("beam_width"):
        base &= table.keys["beam_width"] == 1
    if not base.any():
        if db.mode is not DatabaseMode.SILICON:
            return None
        raise NotAvailableError(
            f"no {stem} data for head_dim={head_dim} window={window} ({db.backend}, {db.system.name})",
            "the table has no such shapes",
            [f"head_dim={h}" for h in table.unique("head_dim")],
        )
    kernel = choose_kernel(table, db.backend, base)
    combos = [(attn_quant, kv_quant), (kv_quant, kv_quant), ("bfloat16", kv_quant)]
    kernels = [kernel] + [k for k in table.unique("kernel_source") if k != kernel]
    for kern in kernels:
        for ad, kd in combos:
            m = base & (table.keys["kernel_source"] == kern) & (table.keys["kv_cache_dtype"] == kd)
            if table.has("attn_dtype"):
                m &= table.keys["attn_dtype"] == ad
            if m.any():
                curve = ("batch_size", "isl") if stem == "context_attention" else ("batch_size", "step")
                sites, curves = sites_and_curves(table, m, ("num_heads", "num_key_value_heads"), curve)
                return table, kern, (ad, kd), sites, curves
    if db.mode is not DatabaseMode.SILICON:
        return None
    raise NotAvailableError(
        f"no {stem} data with kv cache {kv_quant} ({db.backend}, {db.system.name})",
        "no kernel was collected with that KV-cache dtype",
        table.unique("kv_cache_dtype"),
    )


def _resolve(db: OpDB, stem: str, heads: int, kv_heads: int, head_dim: int, kv_quant: str, attn_quant: str, window: int) -> Resolved:
    solfn = _ctx_sol if stem == "context_attention" else _gen_sol
    sol_q = solfn(db, heads, kv_heads, head_dim, kv_quant, window)
    axes = (CTX_BATCH, CTX_ISL) if stem == "context_attention" else (GEN_BATCH, GEN_STEP)
    scales = CTX_SCALES if stem == "context_attention" else GEN_SCALES
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, sol_q, scales)
    lat = db.memo((stem, head_dim, kv_quant, attn_quant, window), lambda: _lattice(db, stem, head_dim, kv_quant, attn_quant, window))
    if lat is None:
        return empirical_resolved(stem, sol_q, axes, None, scales)
    table, kernel, (ad, kd), sites, curves = lat

    def site_grid(i: int) -> Grid:
        def build():
            h, kv = sites[i]
            s = solfn(db, int(h), int(kv), head_dim, kd, window)
            ax, vals = curves[i]
            return build_site_grid(stem, ax, vals, s)

        return db.memo((stem, head_dim, kd, ad, window, "site", i), build)

    # donors are compared by GQA group size (heads per KV head) first: kernels change with the
    # group size, and utilisation transfers poorly across it (LOO: median 19-24% error for
    # donors of another group vs 2-3% within one)
    group_sites = np.stack([sites[:, 0] / sites[:, 1], sites[:, 1]], axis=1)
    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_sites((heads / kv_heads, kv_heads), group_sites, weights=GROUP_WEIGHTS)
    if choice is None:
        if db.mode is not DatabaseMode.SILICON:
            return empirical_resolved(stem, sol_q, axes, [site_grid(i) for i in range(len(sites))], scales)
        raise NotAvailableError(
            f"{stem} heads={heads} kv_heads={kv_heads} head_dim={head_dim} is outside the collected sites' gates",
            f"{db.backend} on {db.system.name}; use --database-mode HYBRID for an empirical estimate",
            [f"{int(h)}/{int(k)}" for h, k in sites],
        )
    labels = tuple(f"(heads={int(sites[i][0])}, kv={int(sites[i][1])}) w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
    g = transfer_grid(choice, site_grid, sol_q, labels)
    notes = () if (ad, kd) == (attn_quant, kv_quant) else (f"served by attn={ad} kv={kd} rows",)
    return Resolved(g, stem, db.served_version(stem), kernel, choice.how, labels if choice.how != "exact" else (), notes)


def resolve_context_attention(db: OpDB, heads, kv_heads, head_dim, kv_quant="bfloat16", attn_quant="bfloat16", window=0) -> Resolved:
    return _resolve(db, "context_attention", heads, kv_heads, head_dim, kv_quant, attn_quant, window)


def resolve_generation_attention(db: OpDB, heads, kv_heads, head_dim, kv_quant="bfloat16", attn_quant="bfloat16", window=0) -> Resolved:
    return _resolve(db, "generation_attention", heads, kv_heads, head_dim, kv_quant, attn_quant, window)


def prefix_fraction(isl, prefix):
    """Share of a causal attention over ``isl + prefix`` tokens that the ``isl`` new tokens do."""
    isl = np.asarray(isl, dtype=float)
    prefix = np.asarray(prefix, dtype=float)
    total = isl + prefix
    return (isl * prefix + isl * (isl + 1.0) / 2.0) / (total * (total + 1.0) / 2.0)
