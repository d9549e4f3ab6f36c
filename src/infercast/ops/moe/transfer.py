"""Moving the expert block's curves where the table has none: to an uncollected
``(moe_tp, moe_ep)`` pair of a collected shape (the ``a + b / split`` trend, the same-width
donor) and to an uncollected shape at a collected pair (utilisation transfer over SOL plus a fixed
cost, at equal expert rows, from consistent donors). Rules and their leave-one-out numbers:
:mod:`infercast.ops.moe.block`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...interp.grid import Grid
from ...interp.provenance import Prov
from ...interp.transfer import SiteChoice, choose_sites, consistent_subset, transfer_grid
from ..base import OpDB
from .query import TOKEN_SCALE
from .tables import _Lattice, _site_grid

def _tp_trend(db: OpDB, lat: _Lattice, sites: np.ndarray, site_hit: np.ndarray, moe_tp: int, moe_ep: int,
              gated: bool, sol_q) -> tuple[Grid, tuple[str, str]] | None:
    """The site's curve at an uncollected ``moe_tp`` one octave beyond the two largest collected
    below it at the same ``moe_ep`` (``moe_tp = 2 t1 = 4 t2``, the case the leave-one-out
    measures), by the fixed-plus-parallel split of the two (:func:`_fixed_plus_split`: at
    ``2 t1``, ``1.5 l(t1) - 0.5 l(t2)``); None otherwise
    (:mod:`infercast.ops.moe.block`)."""
    same = np.flatnonzero(site_hit & (sites[:, 5] == moe_ep) & (sites[:, 4] < moe_tp))
    if len(same) < 2:
        return None
    order = same[np.argsort(sites[same, 4])]
    i1, i2 = int(order[-1]), int(order[-2])
    t1, t2 = float(sites[i1, 4]), float(sites[i2, 4])
    if moe_tp != 2 * t1 or t1 != 2 * t2:
        return None
    labels = (f"moe_tp={int(t1)} moe_ep={moe_ep}", f"moe_tp={int(t2)} moe_ep={moe_ep}")
    g = _fixed_plus_split(_site_grid(db, lat, i1, gated), t1, _site_grid(db, lat, i2, gated), t2, moe_tp, sol_q, labels)
    return None if g is None else (g, labels)


def _fixed_plus_split(ga: Grid, xa: float, gb: Grid, xb: float, x: float, sol_q, labels: tuple = ()) -> Grid | None:
    """The curve at a split ``x`` (moe_tp or EP) from curves measured at ``xa`` (``ga``) and ``xb``
    (``gb``): at every token count both measured, latency is ``a + b / x`` -- a part that does not
    shrink as the experts are split (routing, permutation, launches, the dispatch's fixed cost)
    and a part that does -- fitted through the two; never below perfect scaling of the curve
    measured at the larger split below ``x`` (its latency times ``SOL(query) / SOL(that curve)``).
    Answered at those token counts, marked transferred; None where the curves share fewer than two
    token counts."""
    ta, tb = ga.axes[0], gb.axes[0]
    axis = np.unique(np.concatenate([ta, tb]))
    axis = axis[(axis >= max(ta[0], tb[0])) & (axis <= min(ta[-1], tb[-1]))]
    if len(axis) < 2:
        return None
    la, lb = ga(axis)[0], gb(axis)[0]
    per_split = (la - lb) / (1.0 / xa - 1.0 / xb)  # b in a + b / x
    v = la - per_split / xa + per_split / x
    curves = ((xa, ga), (xb, gb))
    below = [c for c in curves if c[0] <= x] or [min(curves, key=lambda c: c[0])]
    near = max(below, key=lambda c: c[0])[1]
    v = np.maximum(v, near(axis)[0] * sol_q(axis) / near.sol(axis))
    return Grid((axis,), v, np.full(len(axis), Prov.TRANSFERRED, np.int8), sol_q, labels, scales=TOKEN_SCALE)


def _pair_donor(sites: np.ndarray, site_hit: np.ndarray, moe_tp: int, moe_ep: int) -> int | None:
    """Index of the collected (moe_tp, moe_ep) at this site with the same width, closest moe_tp."""
    idx = np.flatnonzero(site_hit & (sites[:, 4] * sites[:, 5] == moe_tp * moe_ep))
    if not len(idx):
        return None
    dist = np.abs(np.log2(sites[idx, 4]) - np.log2(moe_tp))
    order = np.lexsort((sites[idx, 4], dist))
    return int(idx[order[0]])


#: fixed per-call cost (routing, permutation, the block's kernel launches) added to the speed of
#: light when utilisation is carried between sites, as a fraction of the lowest latency measured
#: at the (moe_tp, moe_ep) pair (that floor = the fixed cost + the smallest site's weight traffic)
FIXED_COST_FRACTION = 0.5


def expert_rows(site) -> float:
    """Rows each expert receives per token entering the block under balanced routing:
    ``topk / experts`` (the grouped GEMMs' per-expert ``m`` is ``num_tokens`` times this)."""
    return float(site[2]) / float(site[3])


def fixed_cost(curve_values) -> float:
    """The pair's fixed per-call cost (ms): :data:`FIXED_COST_FRACTION` x its lowest measured latency."""
    lows = [float(np.nanmin(v)) for v in curve_values if np.isfinite(v).any()]
    return FIXED_COST_FRACTION * min(lows) if lows else 0.0


def choose_donors(query, sites: np.ndarray, primary: np.ndarray) -> SiteChoice | None:
    """Donor sites for ``query`` among ``sites`` ((n, 4) hidden, inter, topk, experts at one pair):
    an exact hit if collected; else :func:`~infercast.interp.transfer.choose_sites` among the
    sites whose curves come from the default kernel (``primary``: the kernel an uncollected
    shape is assumed to run); else among all of them. Indices refer to ``sites``."""
    sites = np.asarray(sites, dtype=float)
    primary = np.asarray(primary, dtype=bool)
    hit = np.flatnonzero(np.all(sites == np.asarray(query, dtype=float), axis=1))
    if len(hit):
        return SiteChoice((int(hit[0]),), (1.0,), "exact", 0.0)
    if primary.any() and not primary.all():
        idx = np.flatnonzero(primary)
        c = choose_sites(query, sites[idx])
        if c is not None:
            return replace(c, indices=tuple(int(idx[i]) for i in c.indices))
    return choose_sites(query, sites)


#: donors whose utilisation (over SOL + the fixed cost, at equal expert rows) differs by more than
#: this factor are not blended together; the heaviest consistent subset is kept (rule 4)
CONSISTENT_UTIL_FACTOR = 1.5


def consistent_moe_donors(choice: SiteChoice, query, sites: np.ndarray, site_grid, cost: float) -> SiteChoice:
    """Rule 4 (:mod:`infercast.ops.moe.block`): :func:`~infercast.interp.transfer.consistent_subset` over the
    donors as :func:`transfer_sites` blends them (read at the query's expert rows, utilisation over
    SOL + ``cost``), with :data:`CONSISTENT_UTIL_FACTOR`. Indices refer to ``sites``."""
    if choice.how == "exact" or len(choice.indices) < 2:
        return choice
    rows_q = expert_rows(query)
    grids = [_AtExpertRows(site_grid(i), rows_q / expert_rows(sites[i]), cost) for i in choice.indices]
    return consistent_subset(choice, grids, CONSISTENT_UTIL_FACTOR)


class _AtExpertRows:
    """A donor site's grid read at the query's expert rows (``tokens x rows_q / rows_d``) over the
    speed of light plus the fixed cost: what :func:`~infercast.interp.transfer.transfer_grid`
    blends (it uses ``axes``, ``scales``, ``__call__`` and ``sol``)."""

    def __init__(self, grid: Grid, ratio: float, cost: float):
        self.grid, self.ratio, self.cost = grid, ratio, cost
        self.axes, self.scales = grid.axes, grid.scales

    def __call__(self, tokens):
        return self.grid(np.asarray(tokens, dtype=float) * self.ratio)

    def sol(self, tokens):
        return self.grid.sol(np.asarray(tokens, dtype=float) * self.ratio) + self.cost


def transfer_sites(choice: SiteChoice, query, sites: np.ndarray, site_grid, sol_q, cost: float, labels=()) -> Grid:
    """The query site's grid from ``choice``'s donors (indices into ``sites``; ``site_grid(i)``
    gives donor ``i``'s grid): utilisation ``(SOL + cost) / latency`` of each donor at the same
    expert rows, blended with the choice's weights, answers ``(SOL(query) + cost) / u``. The
    grid's own SOL (holding beyond the tokens range) stays ``sol_q``."""
    if choice.how == "exact":
        return site_grid(choice.indices[0])
    rows_q = expert_rows(query)
    g = transfer_grid(
        choice,
        lambda i: _AtExpertRows(site_grid(i), rows_q / expert_rows(sites[i]), cost),
        lambda t: sol_q(t) + cost,
        labels,
    )
    return Grid(g.axes, g.values, g.prov, sol_q, g.sites, scales=g.scales)
