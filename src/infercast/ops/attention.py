"""GQA attention: context (prefill) and generation (decode), from the attention tables.

Sites are ``(num_heads, num_kv_heads)`` per GPU at a fixed head_dim and window; curves are
``batch x isl`` (context) and ``batch x step`` (generation; ``step`` = tokens already cached, so a
decode token at KV length L is looked up at step L-1). Truncated corners of the collected grids
(large batch x length) are filled by holding utilisation from the nearest smaller batch; in
generation attention with the utilisation change between the two batches measured at the nearest
shorter length (``fill_missing(..., transport=True)``; see docs/modelling-log.md, 'Generation
attention corner fill').

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
rather than the KV traffic sets latency and the check fails). The tolerance and the rule were
chosen by leave-one-out (see docs/modelling-log.md, 'Generation attention KV diagonal'). The same
diagonal is not used below the batch axis's low edge: batch 1 often runs a different kernel
configuration altogether.

**Low edges** (``extend_low_edges``). Below a site's first measured batch or length, the site's
own curve cannot tell how utilisation changes: batch 1 often runs another kernel configuration
(b200 decode, batch 1 / batch 2 latency: 5th-95th percentile 0.61-1.15 on TensorRT-LLM), and a
one-token prefill runs at anything from a quarter of the 16-token latency to the same latency,
which the 16 -> 32 octave does not tell. Sibling sites of the same table that measured that
batch / length do: the site's value at its edge ``e`` is scaled to a coordinate ``c`` below it by
the SOL ratio and by the utilisation change ``u(c) / u(e)`` of donors chosen as transfer donors
(:func:`choose_donors` among the siblings measured at both ``c`` and ``e``), blended in log space
with the donors' weights, at every coordinate of the other axis; the cells are marked
transferred. The change is carried from each of the site's first three batches / lengths
(:data:`LOW_EDGE_OWN_POINTS`), the median of those estimates taken, so that the first row's own
noise is not carried down alone. Where no sibling reaches below the site's edge (every collected h200 / b200 site
starts at batch 1 and length 1) nothing changes, so served estimates of collected sites are
unchanged; the grid's own low-edge rule (:mod:`infercast.interp.grid`) still answers below the
lattice's lowest coordinate. The rule is not applied to GEMM's m axis, where most m = 1
deviations are per-shape noise. See docs/modelling-log.md, 'Attention low edges from siblings'.

**Off-site transfer.** An uncollected ``(heads, kv_heads)`` site is transferred through
utilisation (:mod:`infercast.interp.transfer`) from donors chosen over ``(group size, kv heads)``
(group = heads per KV head; :func:`choose_donors`), with per-table distance weights
(:data:`GROUP_WEIGHTS`). Generation attention then keeps only donors of one kernel regime
(:func:`consistent_donors`): decode kernels switch implementation at group-size limits, and the
utilisation across such a limit differs by an order of magnitude, not by the 10-30% of site-to-site
scatter. On h200 TensorRT-LLM (head_dim 128, batch 64, KV 1024) groups 1-32 run at 35-110% of the
roofline, while groups 48-128 run at 2-4% with latency proportional to the query heads (64 / 96 /
128 heads: 341 / 500 / 661 us at 1 or 2 KV heads). Two donors agree when the median
``log(u_a / u_b)`` over the blended points is within ``log 2`` (:data:`CONSISTENT_UTIL_FACTOR`); of
the pairwise-agreeing subsets the heaviest is kept, renormalised. Both rules use only the donors'
data, as an uncollected query would. Weighting the group twice isolates sites at the ends of the
group range (one donor an octave away in KV heads), so each answer carries one donor's scatter;
equal weights blend more neighbours, which generation attention uses. Context attention keeps
weights (2, 1) and no filter. Weights and filter were chosen by leave-one-out (see
docs/modelling-log.md, 'Attention off-site transfer donors').
"""

from __future__ import annotations

from functools import partial
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import NotAvailableError
from ..interp import sol
from ..interp.grid import Grid, median_rows
from ..interp.provenance import Prov
from ..interp.transfer import SiteChoice, choose_sites, consistent_subset, transfer_grid
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
#: distance weights for (group size, kv heads) when choosing transfer donors, per table (module
#: docstring, "Off-site transfer"): context attention weighs the group twice, generation attention
#: weighs both coordinates alike
GROUP_WEIGHTS = {"context_attention": (2.0, 1.0), "generation_attention": (1.0, 1.0)}
#: per table: donors whose utilisation differs by more than this factor (median over the blended
#: curve points) are not blended together; the heavier consistent subset is kept (0 = off)
CONSISTENT_UTIL_FACTOR = {"context_attention": 0.0, "generation_attention": 2.0}
#: per table: truncated corners take the utilisation change between batches from a shorter length
#: (base.fill_missing). Generation only: decode utilisation climbs with the batch up to the corner
#: (chosen by leave-one-out; see docs/modelling-log.md, 'Generation attention corner fill'); for
#: context attention the gain is within noise, so it keeps holding.
FILL_TRANSPORT = {"context_attention": False, "generation_attention": True}


def fill_site(stem: str, axes, vals, sol):
    """A site's measured ``batch x length`` grid with its truncated corners filled."""
    return fill_missing(axes, vals, sol, transport=FILL_TRANSPORT[stem])


#: fill a site's batches / lengths below its first measured ones from sibling sites that measured
#: them (``extend_low_edges``; module docstring, "Low edges")
SIBLING_LOW_EDGES = True
#: the site's own first rows (batch) / columns (length) a low edge is carried from by its siblings'
#: utilisation change (one estimate each, median in log space; module docstring, "Low edges"):
#: the first row alone carries its own noise down (3 chosen by leave-one-out; see
#: docs/modelling-log.md, 'Attention low edges from siblings').
LOW_EDGE_OWN_POINTS = 3

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


@dataclass(frozen=True)
class Siblings:
    """The other sites of a site's lattice, for :func:`extend_low_edges`: the site's own
    ``(heads, kv_heads)``, the siblings' ``(n, 2)`` sites, their measured axes (``(batch, length)``
    per sibling) and ``grid(k)``, sibling ``k``'s grid as :func:`build_site_grid` builds it without
    siblings."""

    site: tuple
    sites: np.ndarray
    axes: list
    grid: Callable[[int], Grid]


def extend_low_edges(stem: str, axes, values, prov, sol, sib: Siblings):
    """Rows (batch) and columns (length) that sibling sites measured below this site's first
    batch / length, filled from the siblings (module docstring, "Low edges"). For each such
    coordinate ``c`` below the edge of an axis, and each of the site's first
    :data:`LOW_EDGE_OWN_POINTS` coordinates ``e`` on it, the donors are :func:`choose_donors` among
    the siblings measured at both ``c`` and ``e``; the site's value at ``(e, y)`` is scaled by the
    SOL ratio and by the donors' blended utilisation change, ``exp(sum_i w_i log(u_i(c, y) /
    u_i(e, y)))``, at every coordinate ``y`` of the other axis; the cell is the median of those
    estimates in log space. Returns ``(axes, values, prov)``, unchanged when no sibling reaches
    below the site's edges; new cells are marked transferred."""
    axes = [np.asarray(a, dtype=float) for a in axes]
    values = np.asarray(values, dtype=float)
    prov = np.asarray(prov, dtype=np.int8)
    if not SIBLING_LOW_EDGES or len(sib.sites) == 0:
        return tuple(axes), values, prov
    for a in (0, 1):
        edge = float(axes[a][0])
        lower = sorted({float(x) for ax in sib.axes for x in np.asarray(ax[a]).tolist() if x < edge})
        rows, used = [], []
        y = axes[1 - a]
        for c in lower:
            at_c = (np.full(len(y), c), y) if a == 0 else (y, np.full(len(y), c))
            sol_c = np.asarray(sol(*at_c), dtype=float)
            estimates = []
            for j, e in enumerate(axes[a][:LOW_EDGE_OWN_POINTS].tolist()):
                cands = [k for k, ax in enumerate(sib.axes) if c in ax[a] and e in ax[a]]
                choice = choose_donors(stem, sib.site[0], sib.site[1], sib.sites[cands]) if cands else None
                if choice is None:
                    continue
                at_e = (np.full(len(y), e), y) if a == 0 else (y, np.full(len(y), e))
                log_du = np.zeros(len(y))
                for i, w in zip(choice.indices, choice.weights):
                    g = sib.grid(cands[i])
                    with np.errstate(divide="ignore", invalid="ignore"):
                        du = (g.sol(*at_c) / g(*at_c)[0]) / (g.sol(*at_e) / g(*at_e)[0])
                    log_du += w * np.log(np.asarray(du, dtype=float))
                v_e = values[j] if a == 0 else values[:, j]
                with np.errstate(divide="ignore", invalid="ignore"):
                    new = v_e * (sol_c / np.asarray(sol(*at_e), dtype=float)) / np.exp(log_du)
                if np.all(np.isfinite(new) & (new > 0)):
                    estimates.append(np.log(new))
            if not estimates:
                continue
            rows.append(np.exp(median_rows(np.stack(estimates))))
            used.append(c)
        if not used:
            continue
        block = np.stack(rows)  # (len(used), len(y))
        if a == 1:
            block = block.T
        axes[a] = np.concatenate([np.array(used), axes[a]])
        values = np.concatenate([block, values], axis=a)
        prov = np.concatenate([np.full(block.shape, int(Prov.TRANSFERRED), np.int8), prov], axis=a)
    return tuple(axes), values, prov


def build_site_grid(stem: str, axes, vals, sol, siblings: Siblings | None = None) -> Grid:
    """A site's grid as infercast serves it: truncated corners filled (``fill_site``), for
    generation attention the KV diagonal one doubling beyond the last step (``extend_kv_diagonal``),
    and, given its ``siblings``, the batches / lengths they measured below its own first ones
    (``extend_low_edges``)."""
    scales = CTX_SCALES if stem == "context_attention" else GEN_SCALES
    filled, prov = fill_site(stem, axes, vals, sol)
    if stem == "generation_attention":
        axes, filled, prov = extend_kv_diagonal(axes, vals, filled, prov, sol, scales)
    if siblings is not None:
        axes, filled, prov = extend_low_edges(stem, axes, filled, prov, sol, siblings)
    return Grid(axes, filled, prov, sol, scales=scales)


def choose_donors(stem: str, heads: float, kv_heads: float, sites: np.ndarray) -> SiteChoice | None:
    """Transfer donors for ``(heads, kv_heads)`` among ``sites`` ((n, 2) heads, kv heads):
    :func:`~infercast.interp.transfer.choose_sites` over ``(group size, kv heads)`` (group =
    heads per KV head) with the table's :data:`GROUP_WEIGHTS`. Indices refer to ``sites``."""
    sites = np.asarray(sites, dtype=float).reshape(-1, 2)
    group_sites = np.stack([sites[:, 0] / sites[:, 1], sites[:, 1]], axis=1)
    return choose_sites((heads / kv_heads, kv_heads), group_sites, weights=GROUP_WEIGHTS[stem])


def consistent_donors(stem: str, choice: SiteChoice, site_grid) -> SiteChoice:
    """Drop donors that run another kernel regime (module docstring, "Off-site transfer").

    :func:`~infercast.interp.transfer.consistent_subset` with the table's
    :data:`CONSISTENT_UTIL_FACTOR`: two donors agree when the median of ``log(u_a / u_b)`` over the
    points the transfer blends is within ``log(factor)``; the heaviest pairwise-agreeing subset is
    kept, renormalised."""
    factor = CONSISTENT_UTIL_FACTOR.get(stem, 0.0)
    if factor <= 1.0 or choice.how == "exact" or len(choice.indices) < 2:
        return choice
    return consistent_subset(choice, [site_grid(i) for i in choice.indices], factor)


def _ctx_sol(db: OpDB, heads, kv_heads, head_dim, kv_quant, window):
    """``f(batch, isl)``: context attention's speed-of-light ms (a partial: picklable)."""
    return partial(_ctx_sol_ms, db.system, heads, kv_heads, head_dim, KV_BYTES[kv_quant], window)


def _ctx_sol_ms(system, heads, kv_heads, head_dim, kvb, window, batch, isl):
    return sol.context_attention(system, batch, isl, 0.0, heads, kv_heads, head_dim, kvb, window)[0]


def _gen_sol(db: OpDB, heads, kv_heads, head_dim, kv_quant, window):
    """``f(batch, step)``: generation attention's speed-of-light ms (a partial: picklable)."""
    return partial(_gen_sol_ms, db.system, heads, kv_heads, head_dim, KV_BYTES[kv_quant], window)


def _gen_sol_ms(system, heads, kv_heads, head_dim, kvb, window, batch, step):
    return sol.generation_attention(system, batch, np.asarray(step) + 1.0, heads, kv_heads, head_dim, kvb, window)[0]


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
    # another KV dtype's rows of the same shapes, last (carried over through utilisation: _resolve)
    other_kv = [k for k in table.unique("kv_cache_dtype") if k != kv_quant and np.any(base & (table.keys["kv_cache_dtype"] == k))]
    combos += [(ad, k) for k in other_kv for ad in (attn_quant, k, "bfloat16")]
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

    def site_data(i: int):
        """Site ``i``'s measured axes, values and SOL function (``build_site_grid``'s arguments)."""
        h, kv = sites[i]
        ax, vals = curves[i]
        return ax, vals, solfn(db, int(h), int(kv), head_dim, kd, window)

    def plain_grid(i: int) -> Grid:
        return db.memo((stem, head_dim, kd, ad, window, "plain-site", i), lambda: build_site_grid(stem, *site_data(i)))

    def site_grid(i: int) -> Grid:
        def build():
            others = [j for j in range(len(sites)) if j != i]
            sib = Siblings(tuple(float(x) for x in sites[i]), np.asarray(sites, float)[others], [curves[j][0] for j in others],
                           lambda k: plain_grid(others[k]))
            return build_site_grid(stem, *site_data(i), sib)

        return db.memo((stem, head_dim, kd, ad, window, "site", i), build)

    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_donors(stem, heads, kv_heads, sites)
    if choice is not None:
        choice = consistent_donors(stem, choice, site_grid)
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
    if kd != kv_quant:
        g = _other_kv_dtype(g, sol_q, choice.how == "exact")
        notes = (f"no kv={kv_quant} rows at head_dim={head_dim}: kv={kd} rows carried over through utilisation "
                 f"(SOL with {kv_quant} KV / SOL with {kd} KV)",)
    return Resolved(g, stem, db.served_version(stem), kernel, choice.how, labels if choice.how != "exact" else (), notes)


def _resolve_window(db: OpDB, stem: str, heads, kv_heads, head_dim, kv_quant, attn_quant, window) -> Resolved:
    """A window the table collected at ``head_dim`` (or full attention) as it is; another window
    from the same shape's full-attention curves (:mod:`infercast.ops.window`)."""
    from .window import window_collected, windowed_from_full

    if not window or window_collected(db, stem, head_dim, window):
        return _resolve(db, stem, heads, kv_heads, head_dim, kv_quant, attn_quant, window)
    full = _resolve(db, stem, heads, kv_heads, head_dim, kv_quant, attn_quant, 0)
    phase = "context" if stem == "context_attention" else "generation"
    return windowed_from_full(db, phase, full, heads, kv_heads, head_dim, kv_quant, attn_quant, window)


def _other_kv_dtype(g: Grid, sol_q, exact: bool) -> Grid:
    """A grid read from another KV dtype's rows, for the queried one: a transferred grid is
    already on the query's SOL (:func:`~infercast.interp.transfer.transfer_grid` divides the
    query's roofline by the donors' utilisation); an exact site's grid is scaled by the two
    rooflines' ratio, i.e. it keeps its measured utilisation. Every cell is marked transferred."""
    if exact:
        mesh = np.meshgrid(*g.axes, indexing="ij")
        v, p = g(*mesh)
        g = Grid(g.axes, v * sol_q(*mesh) / g.sol(*mesh), p, sol_q, g.sites, scales=g.scales)
    return Grid(g.axes, g.values, np.maximum(g.prov, Prov.TRANSFERRED), g.sol, g.sites, scales=g.scales)


def resolve_context_attention(db: OpDB, heads, kv_heads, head_dim, kv_quant="bfloat16", attn_quant="bfloat16", window=0) -> Resolved:
    return _resolve_window(db, "context_attention", heads, kv_heads, head_dim, kv_quant, attn_quant, window)


def resolve_generation_attention(db: OpDB, heads, kv_heads, head_dim, kv_quant="bfloat16", attn_quant="bfloat16", window=0) -> Resolved:
    return _resolve_window(db, "generation_attention", heads, kv_heads, head_dim, kv_quant, attn_quant, window)


def prefix_fraction(isl, prefix):
    """Share of a causal attention over ``isl + prefix`` tokens that the ``isl`` new tokens do."""
    isl = np.asarray(isl, dtype=float)
    prefix = np.asarray(prefix, dtype=float)
    total = isl + prefix
    return (isl * prefix + isl * (isl + 1.0) / 2.0) / (total * (total + 1.0) / 2.0)


def with_prefix(full, alone, isl, prefix):
    """Context attention of ``isl`` new tokens over a cached ``prefix``: ``full`` (the measured
    causal attention over ``isl + prefix`` tokens) times :func:`prefix_fraction`, but never less
    than ``alone`` (the same ``isl`` tokens with no prefix). A short attention's time is mostly
    fixed cost (launch, tiles), which the share of query-key pairs would scale away: a 16-token
    prompt on a 64-token prefix is not cheaper than the 16 tokens alone."""
    prefix = np.asarray(prefix, dtype=float)
    return np.where(prefix > 0, np.maximum(full * prefix_fraction(isl, prefix), alone), full)


def prefixed_context(grid, batch, isl, prefix):
    """``(latency, provenance)`` of ``batch`` x ``isl`` new tokens on ``prefix`` cached ones from a
    context grid over ``(batch, length)`` (:func:`with_prefix`; the grid refuses beyond its gate)."""
    v, p = grid(batch, isl + prefix, refuse=True)
    if np.any(prefix > 0):
        alone, pa = grid(batch, isl, refuse=True)
        v = with_prefix(v, alone, isl, prefix)
        p = np.maximum(p, np.where(prefix > 0, pa, p))
    return v, p
