"""The expert-block lattice: rows of one moe table in one quant mode, activation class, routing
distribution and kernel choice, grouped by site ``(hidden, inter, topk, experts, moe_tp, moe_ep)``
into ``num_tokens`` curves, and the per-site grids built from them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ...interp.grid import Grid
from ..base import OpDB, merge_kernels, sites_and_curves
from .kernels import NONGATED_TAG, _expected_kernel, _prefer_low_latency, kernel_family, kernel_family_mask
from .query import DEFAULT_DISTRIBUTION, PAIR_COLS, SITE_COLS, TOKEN_SCALE, moe_sol_fn

def _power_law_exponent(dist: str) -> float:
    m = re.search(r"([0-9]+(?:\.[0-9]+)?)", dist)
    return float(m.group(1)) if m else math.inf


def _pick_distribution(available: list[str], requested: str) -> tuple[str, tuple[str, ...]]:
    if requested in available:
        return requested, ()
    if DEFAULT_DISTRIBUTION in available:
        return DEFAULT_DISTRIBUTION, (f"distribution {requested!r} not collected; using {DEFAULT_DISTRIBUTION!r}",)
    best = sorted(available, key=lambda d: (_power_law_exponent(d), d))[0]
    asked = repr(requested) if requested == DEFAULT_DISTRIBUTION else f"{requested!r} and {DEFAULT_DISTRIBUTION!r}"
    return best, (f"distribution {asked} not collected; using the least skewed {best!r}",)


@dataclass
class _Lattice:
    table: object
    quant: str
    kernel: str
    distribution: str
    site_gated: bool | None  # gating of the collected rows; None = the kernels do not say
    sites: np.ndarray  # (n, 6): hidden, inter, topk, experts, moe_tp, moe_ep
    curves: dict
    notes: tuple[str, ...]
    primary: np.ndarray  # (n,) bool: most of the site's points come from the default kernel
    site_kernel: np.ndarray  # (n,) object: the kernel most of the site's points come from


def _lattice(db: OpDB, quant: str, gated: bool, distribution: str, table_name: str = "moe",
             kernel: str | None = None) -> _Lattice | None:
    """Rows of one quant mode, kernel class and routing distribution, grouped by site and pair.
    None when the table (HYBRID/EMPIRICAL) or the quant mode is missing. ``kernel``: only the rows
    of that kernel family (:func:`kernel_family_mask`); None when the table has none."""
    table = db.table_or_none(table_name)
    if table is None:
        return None
    base = table.mask(moe_dtype=quant)
    if kernel is not None:
        base &= kernel_family_mask(table, kernel)
    if not base.any():
        return None
    notes: list[str] = []
    dists = sorted(np.unique(table.keys["distribution"][base]).tolist()) if table.has("distribution") else []
    dist = distribution
    if table.has("distribution"):
        dist, dnotes = _pick_distribution(dists, distribution)
        notes.extend(dnotes)
        base &= table.keys["distribution"] == dist
    kernels = np.unique(table.keys["kernel_source"][base]).tolist() if table.has("kernel_source") else []
    nongated = [k for k in kernels if NONGATED_TAG in k]
    site_gated: bool | None = None  # None: kernel names do not tell gated from non-gated
    if nongated:
        gated_k = [k for k in kernels if NONGATED_TAG not in k]
        want, site_gated = (gated_k, True) if gated else (nongated, False)
        if not want:  # only the other activation type was collected: carry utilisation across
            want, site_gated = (nongated, False) if gated else (gated_k, True)
            notes.append(
                f"no {'gated' if gated else 'non-gated'} {quant} MoE kernel collected; utilisation "
                f"carried over from the {'non-gated' if gated else 'gated'} kernels"
            )
        base &= np.isin(table.keys["kernel_source"], want)
    low_latency = False
    if table.has("kernel_source"):
        candidates = base
        base, order = merge_kernels(table, base, SITE_COLS + PAIR_COLS + ("num_tokens",), db.backend)
        if db.backend == "trtllm" and kernel is None:
            chosen = base
            base = _prefer_low_latency(table, base, candidates)
            low_latency = bool((base != chosen).any())
        kernel = "+".join(order)
    else:
        order, kernel = [], None
    sites, curves = sites_and_curves(table, base, SITE_COLS + PAIR_COLS, ("num_tokens",))
    primary = np.ones(len(sites), bool)
    site_kernel = np.full(len(sites), order[0] if order else None, dtype=object)
    if len(order) > 1:  # a site is primary when most of its points come from the expected kernel
        rows = np.flatnonzero(base)
        site_of = np.unique(np.stack([table.keys[c][rows].astype(float) for c in SITE_COLS + PAIR_COLS], axis=1),
                            axis=0, return_inverse=True)[1].reshape(-1)
        expected = (table.keys["kernel_source"][rows] == _expected_kernel(table, rows, order[0], low_latency))
        primary = np.bincount(site_of, expected.astype(float), len(sites)) * 2 > np.bincount(site_of, minlength=len(sites))
        ks = table.keys["kernel_source"][rows]
        counts = np.stack([np.bincount(site_of, (ks == k).astype(float), len(sites)) for k in order], axis=1)
        site_kernel = np.asarray(order, dtype=object)[np.argmax(counts, axis=1)]  # ties: the earlier kernel
    return _Lattice(table, quant, kernel, dist, site_gated, sites, curves, tuple(notes), primary, site_kernel)


def _get_lattice(db: OpDB, quant: str, gated: bool, distribution: str, table_name: str = "moe",
                 kernel: str | None = None) -> _Lattice | None:
    return db.memo(("moe-lattice", table_name, quant, bool(gated), distribution, kernel),
                   lambda: _lattice(db, quant, gated, distribution, table_name, kernel))


def _site_grid(db: OpDB, lat: _Lattice, i: int, query_gated: bool) -> Grid:
    gated = query_gated if lat.site_gated is None else lat.site_gated

    def build():
        h, n, k, e, tp, ep = (int(x) for x in lat.sites[i])
        s = moe_sol_fn(db, lat.quant, h, n, k, e, tp, ep, gated)
        (axis,), vals = lat.curves[i]
        return Grid((axis,), vals, np.zeros(len(axis), np.int8), s, scales=TOKEN_SCALE)

    # keyed by the table too: two tables of one kernel family (the wide-EP context and generation
    # tables are both "deepepmoe") number their sites alike
    return db.memo(("moe-site", getattr(lat.table, "stem", None), lat.quant, lat.distribution, lat.kernel, gated, i), build)


def _site_label(row) -> str:
    h, n, k, e, tp, ep = (int(x) for x in row)
    return f"(hidden={h}, inter={n}, topk={k}, experts={e}, tp={tp}, ep={ep})"


def _pairs_str(sites: np.ndarray) -> list[str]:
    return [f"tp{int(tp)}xep{int(ep)}" for tp, ep in sorted({(int(a), int(b)) for a, b in sites[:, 4:6]})]


def _site_index(lat: _Lattice, query: tuple, tp: int, ep: int) -> int | None:
    hit = np.flatnonzero(np.all(lat.sites[:, :4] == np.asarray(query, float), axis=1)
                         & (lat.sites[:, 4] == tp) & (lat.sites[:, 5] == ep))
    return int(hit[0]) if len(hit) else None


def default_family(lat: _Lattice) -> str | None:
    """The kernel family an uncollected shape of ``lat`` is assumed to run (its default kernel's)."""
    return kernel_family(lat.kernel.split("+")[0]) if lat.kernel else None
