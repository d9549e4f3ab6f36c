"""Leave-one-out accuracy of infercast's interpolation, hold and transfer on the real perf data.

``python -m benchmarks.interp_loo [--points N] [--seed S] [--json] [--detail]``

For every system in ``--systems`` and the current data version of each serving backend, the
measured curves of five op families are built exactly the way ``infercast.ops`` builds them
(``ops.gemm._lattice``, ``ops.attention._lattice`` + ``build_site_grid``, ``ops.moe._lattice`` per
(moe_tp, moe_ep) pair, ``ops.comm._curve``), then
held-out measured points are predicted from the rest along three paths:

* ``in-curve``: one interior point of a curve is removed (one ``m`` of a GEMM ``(n, k)`` site; one
  batch row or one length column of an attention site, so the query sits between its two measured
  neighbours on that axis; one message size of an all-reduce curve) and predicted from that
  site's remaining points with :class:`infercast.interp.grid.Grid` (per-axis linear / power-law / tile
  scales, as the ops use them; a GEMM site also from its siblings' measurements at that
  position, as ``ops.gemm.build_site_grid`` fills a lattice hole; the alternatives below are
  scored on the measured points alone);
* ``hold-high`` / ``hold-low``: the same for an edge point (last / first measured on its axis):
  the query lies outside the remaining grid, which applies the edge rule of
  :mod:`infercast.interp.grid` (hold a saturated edge's utilisation, extend a climbing or falling
  one, scale the SOL ratio by an exponent below the first point). ``hold-high`` is what infercast does for batches, lengths, m or
  messages beyond the collected range; ``hold-low`` rarely happens in use, since most axes start
  at 1 (the smallest valid query). An attention cell at the edge of a truncated corner is filled
  by ``ops.attention.build_site_grid`` (utilisation from a smaller batch; generation grids also get
  one step column along the KV diagonal; a batch row or length column the held-out edge removed
  is filled from sibling sites that measured it, ``ops.attention.extend_low_edges``), as infercast
  serves such a query;
* ``transfer``: a whole site is removed and its measured points are predicted through
  :func:`~infercast.interp.transfer.choose_sites` + :func:`~infercast.interp.transfer.transfer_grid`
  from the remaining sites (MoE: ``ops.moe.choose_donors`` + ``ops.moe.transfer_sites``, the
  engine's own MoE rule). A removed site outside the gates has no answer: it counts against
  coverage, not accuracy. All-reduce has no transfer path in infercast (group sizes are never
  transferred), so it has none here;
* ``pair`` (MoE only): a collected ``(moe_tp, 1)`` pair of a site whose ``(moe_tp/2, 1)`` and
  ``(moe_tp/4, 1)`` pairs were also collected is removed and predicted from them with
  ``ops.moe._tp_trend`` (latency split as ``a + b / moe_tp`` through the last octave), the rule
  the engine applies to an uncollected moe_tp such as vLLM's TP 8 experts.

Each path is also scored with a simpler alternative on the same held-out points, so the choice
in infercast is backed by numbers: in-curve vs **linear** interpolation between the same
neighbours; hold vs **clamp only** (boundary value, no SOL scaling); transfer vs a **latency
blend** (the donors' latencies with the same weights, no utilisation normalisation); pair vs the
**same width** rule it replaced (``ops.moe._pair_donor``: a collected pair of the same
``moe_tp x moe_ep``, utilisation held). The in-curve
path is further compared, per axis, across four rules (``METHODS``): infercast (per-axis scales), power law,
linear, semilog (linear latency, log-spaced weights) and sol-util (utilisation SOL/latency
interpolated, then SOL(query)/u).

APE = |pred - meas| / meas. Sampling is seeded and stratified by backend (``--points`` per family,
system and path, split evenly across backends; fewer where the data has fewer points).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from infercast.data.database import PerfData
from infercast.errors import InfercastError
from infercast.interp.grid import BeyondRangeError, Grid
from infercast.interp.transfer import choose_sites, transfer_grid
from infercast.ops import attention as attn_ops
from infercast.ops import comm as comm_ops
from infercast.ops import gemm as gemm_ops
from infercast.ops import moe as moe_ops
from infercast.ops.base import DatabaseMode, OpDB, choose_kernel

SYSTEMS = ("h200_sxm", "b200_sxm")
BACKENDS = ("trtllm", "vllm", "sglang")
FAMILIES = ("gemm", "context_attention", "generation_attention", "moe", "custom_allreduce")
FAMILY_LABEL = {
    "gemm": "GEMM",
    "context_attention": "context attn",
    "generation_attention": "generation attn",
    "moe": "MoE",
    "custom_allreduce": "all-reduce",
}
PATHS = ("in-curve", "hold-high", "hold-low", "transfer")
ALT_LABEL = {"in-curve": "linear", "hold-high": "clamp only", "hold-low": "clamp only", "transfer": "latency blend",
             "pair": "same width"}
#: (median APE goal, p90 APE goal or None) per family
GOALS = {
    "gemm": (0.05, 0.15),
    "context_attention": (0.05, 0.15),
    "generation_attention": (0.05, 0.15),
    "moe": (0.08, None),
    "custom_allreduce": (0.08, None),
}
AXIS_NAMES = {
    "gemm": ("m",),
    "context_attention": ("batch", "isl"),
    "generation_attention": ("batch", "step"),
    "moe": ("tokens",),
    "custom_allreduce": ("message",),
}


# ---- lattices: the per-family site curves, built by infercast's own helpers ---------------------
@dataclass
class Lattice:
    """The sites and measured curves of one family in one configuration (quant, head_dim...)."""

    family: str
    backend: str
    label: str
    sites: np.ndarray  # (S, d) site coordinates
    curves: dict  # site index -> (axes tuple, values array; NaN = not measured)
    sol_for: Callable  # site coordinates -> SOL function of the curve coordinates
    _full: dict = field(default_factory=dict, repr=False)
    _plain: dict = field(default_factory=dict, repr=False)
    _reach: dict = field(default_factory=dict, repr=False)
    _floor: dict = field(default_factory=dict, repr=False)

    def build(self, s: int, axes: tuple, vals: np.ndarray, plain: bool = False) -> Grid:
        """A site grid from (possibly reduced) curve data, as the ops modules build it (``plain``:
        linear scales, no tile-axis rules -- the data the alternative rules are scored on)."""
        sol = self.sol_for(self.sites[s])
        if plain and len(axes) == 1:
            keep = ~np.isnan(vals)
            return Grid((axes[0][keep],), vals[keep], np.zeros(int(keep.sum()), np.int8), sol)
        if len(axes) == 2:
            # ops/attention.py: site_grid = build_site_grid(stem, ax, vals, sol, siblings)
            return attn_ops.build_site_grid(self.family, axes, vals, sol, self.siblings(s))
        keep = ~np.isnan(vals)
        if self.family == "gemm":
            # ops/gemm.py: the measured points, extended beyond the high edge by the siblings' trend
            return gemm_ops.build_site_grid(axes[0][keep], vals[keep], sol,
                                            gemm_ops.lattice_siblings(self.sites, self.curves, s, self.sol_for), reach=self.reach(),
                                            floor=self.floor())
        # ops/comm.py: a 1-D grid of the measured points, provenance exact
        return Grid((axes[0][keep],), vals[keep], np.zeros(int(keep.sum()), np.int8), sol, scales=SCALES.get(self.family, ()))

    def reach(self, dropped: int | None = None) -> float:
        """The largest m the lattice's sites (but ``dropped``) measured."""
        if dropped not in self._reach:
            self._reach[dropped] = gemm_ops.lattice_reach({j: c for j, c in self.curves.items() if j != dropped})
        return self._reach[dropped]

    def floor(self, dropped: int | None = None) -> float:
        """The smallest m the lattice's sites (but ``dropped``) measured."""
        if dropped not in self._floor:
            self._floor[dropped] = gemm_ops.lattice_floor({j: c for j, c in self.curves.items() if j != dropped})
        return self._floor[dropped]

    def siblings(self, s: int):
        """The other sites of the lattice, as ops/attention.py passes them to ``build_site_grid``."""
        others = [j for j in range(len(self.sites)) if j != s]
        return attn_ops.Siblings(tuple(float(x) for x in self.sites[s]), self.sites[others],
                                 [self.curves[j][0] for j in others], lambda k: self._plain_grid(others[k]))

    def _plain_grid(self, j: int) -> Grid:
        if j not in self._plain:
            axes, vals = self.curves[j]
            self._plain[j] = attn_ops.build_site_grid(self.family, axes, vals, self.sol_for(self.sites[j]))
        return self._plain[j]

    def donor(self, s: int, dropped: int) -> Grid:
        """Site ``s``'s grid as a transfer donor when site ``dropped`` is left out, as ops/gemm.py
        builds donors (``donor_values``; the sibling extension must not see the dropped site)."""
        if self.family != "gemm":
            return self.full(s)
        axes, vals = self.curves[s]
        keep = ~np.isnan(vals)
        return gemm_ops.build_site_grid(axes[0][keep], gemm_ops.donor_values(vals[keep]), self.sol_for(self.sites[s]),
                                        gemm_ops.lattice_siblings(self.sites, self.curves, s, self.sol_for, dropped),
                                        reach=self.reach(dropped), floor=self.floor(dropped))

    def full(self, s: int) -> Grid:
        if s not in self._full:
            axes, vals = self.curves[s]
            self._full[s] = self.build(s, axes, vals)
        return self._full[s]


def gemm_lattices(db: OpDB, backend: str) -> list[Lattice]:
    table = db.table_or_none("gemm")
    out = []
    for quant in table.unique("gemm_dtype"):
        try:
            gemm_ops.gemm_sol_fn(db, quant, 1, 1)(1.0)  # no tensor cores for the mode: skip
            lat = gemm_ops._lattice(db, quant)
        except (InfercastError, KeyError):
            continue
        if lat is None:
            continue
        _, kernel, sites, curves, _notes = lat

        def sol_for(site, q=quant):
            return gemm_ops.gemm_sol_fn(db, q, int(site[0]), int(site[1]))

        out.append(Lattice("gemm", backend, f"{quant} [{kernel}]", sites, curves, sol_for))
    return out


def attention_lattices(db: OpDB, backend: str, stem: str) -> list[Lattice]:
    table = db.table_or_none(stem)
    solfn = attn_ops._ctx_sol if stem == "context_attention" else attn_ops._gen_sol
    n = len(table)
    cols = [
        table.keys["head_dim"].astype(np.int64),
        table.keys["window_size"].astype(np.int64) if table.has("window_size") else np.zeros(n, np.int64),
    ]
    kv = table.keys["kv_cache_dtype"]
    ad = table.keys["attn_dtype"] if table.has("attn_dtype") else np.full(n, "bfloat16")
    combos = sorted({(int(h), int(w), str(k), str(a)) for h, w, k, a in zip(cols[0], cols[1], kv, ad)})
    out, seen = [], set()
    for head_dim, window, kv_q, attn_q in combos:
        try:
            lat = attn_ops._lattice(db, stem, head_dim, kv_q, attn_q, window)
        except (InfercastError, KeyError):
            continue
        if lat is None:
            continue
        _, kern, (a_d, k_d), sites, curves = lat
        key = (head_dim, window, kern, a_d, k_d)
        if key in seen:
            continue
        seen.add(key)

        def sol_for(site, h=head_dim, kd=k_d, w=window):
            return solfn(db, int(site[0]), int(site[1]), h, kd, w)

        label = f"hd={head_dim} win={window} attn={a_d} kv={k_d} [{kern}]"
        out.append(Lattice(stem, backend, label, sites, curves, sol_for))
    return out


@dataclass
class MoeLattice(Lattice):
    """A MoE lattice also knows which sites' curves come from the default kernel (ops.moe donors)."""

    primary: np.ndarray | None = None
    pair: tuple[int, int] = (1, 1)
    site_kernel: np.ndarray | None = None
    assumed_family: str | None = None  # the kernel family an uncollected shape is assumed to run
    peers: list = field(default_factory=list)  # other engines' lattices on this GPU (ops.moe.peer_lattices)


def moe_quant_lattices(db: OpDB, table):
    """(quant, ``ops.moe`` lattice, gated) of each quant mode of a moe table that this GPU has
    tensor cores for (gated kernels, the default routing distribution)."""
    for quant in table.unique("moe_dtype"):
        try:
            moe_ops.moe_sol_fn(db, quant, 1024, 1024, 1, 8, 1, 1)(1.0)  # no tensor cores: skip
            lat = moe_ops._lattice(db, quant, True, moe_ops.DEFAULT_DISTRIBUTION)
        except (InfercastError, KeyError):
            continue
        if lat is not None:
            yield quant, lat, True if lat.site_gated is None else lat.site_gated


def moe_lattices(db: OpDB, backend: str) -> list[Lattice]:
    """moe_perf per quant mode (gated kernels, balanced routing, as ``ops.moe._lattice`` picks
    them) and per (moe_tp, moe_ep) pair: infercast transfers only between sites of the same pair,
    over (hidden, inter, topk, experts), with ``ops.moe.choose_donors`` / ``transfer_sites``."""
    table = db.table_or_none("moe")
    out = []
    if table is None:
        return out
    for quant, lat, gated in moe_quant_lattices(db, table):
        pairs = sorted({(int(a), int(b)) for a, b in lat.sites[:, 4:6]})
        peers = [plat for _, plat in moe_ops.peer_lattices(db, lat, gated, lat.distribution)]
        for tp, ep in pairs:
            idx = np.flatnonzero((lat.sites[:, 4] == tp) & (lat.sites[:, 5] == ep))
            sites = lat.sites[idx, :4]
            curves = {j: lat.curves[int(i)] for j, i in enumerate(idx)}

            def sol_for(site, q=quant, tp=tp, ep=ep, g=gated):
                h, n, k, e = (int(x) for x in site)
                return moe_ops.moe_sol_fn(db, q, h, n, k, e, tp, ep, g)

            out.append(MoeLattice("moe", backend, f"{quant} tp{tp}xep{ep} [{lat.kernel}]", sites, curves, sol_for,
                                  primary=lat.primary[idx], pair=(tp, ep), site_kernel=lat.site_kernel[idx],
                                  assumed_family=moe_ops.default_family(lat), peers=peers))
    return out


def comm_lattices(db: OpDB, backend: str) -> list[Lattice]:
    """custom_allreduce curves per group size, with the kernel ops/comm.py would pick."""
    t = db.table_or_none("custom_allreduce")
    groups = [int(g) for g in t.unique("num_gpus")]
    sites, curves, kernels = [], {}, []
    for g in groups:
        m = t.mask(num_gpus=g)
        if t.has("allreduce_dtype"):
            m &= t.keys["allreduce_dtype"] == "bfloat16"
        if not m.any():
            continue
        kernel = choose_kernel(t, db.backend, m)
        m &= t.keys["kernel_source"] == kernel
        g_grid = comm_ops._curve(t, m, comm_ops._sol_fn(db, "all_reduce", g))
        curves[len(sites)] = (g_grid.axes, g_grid.values)
        sites.append([float(g)])
        kernels.append(kernel)

    def sol_for(site):
        return comm_ops._sol_fn(db, "all_reduce", int(site[0]))

    label = f"bfloat16 [{'+'.join(sorted(set(kernels)))}]"
    return [Lattice("custom_allreduce", backend, label, np.array(sites, float), curves, sol_for)]


def load_lattices(system: str, backend: str, family: str) -> list[Lattice]:
    db = OpDB(PerfData.open(system, backend), DatabaseMode.SILICON)
    if family == "gemm":
        return gemm_lattices(db, backend)
    if family == "custom_allreduce":
        return comm_lattices(db, backend)
    if family == "moe":
        return moe_lattices(db, backend)
    return attention_lattices(db, backend, family)


# ---- alternatives -------------------------------------------------------------------------------
#: in-curve interpolation rules compared on the same held-out points: (x space, y space)
#: the per-axis interpolation spaces infercast's ops use (ops/attention.py CTX_SCALES / GEN_SCALES;
#: ops/gemm.py M_SCALE; MoE tokens and message size are linear)
SCALES = {"context_attention": attn_ops.CTX_SCALES, "generation_attention": attn_ops.GEN_SCALES, "gemm": gemm_ops.M_SCALE}

METHODS = {
    "power-law": ("log", "log"),
    "linear": ("lin", "lin"),
    "semilog": ("log", "lin"),  # linear latency, log-spaced weights
    "sol-util": ("log", "util"),  # utilisation SOL/latency blended linearly, log-spaced weights
}


def interp_eval(g: Grid, q: tuple[float, ...], xspace: str, yspace: str) -> float:
    """Multilinear interpolation on the grid's cells with weights in ``xspace`` (lin / log) of
    values in ``yspace`` (lin: latency; log: log latency; util: SOL / latency). ``q`` is inside."""
    idx, ts = [], []
    for a, x in zip(g.axes, q):
        if len(a) == 1:
            idx.append((0, 0))
            ts.append(0.0)
            continue
        xc = min(max(x, a[0]), a[-1])
        i = int(np.clip(np.searchsorted(a, xc, side="right") - 1, 0, len(a) - 2))
        if xspace == "log":
            t = np.log(xc / a[i]) / np.log(a[i + 1] / a[i])
        else:
            t = (xc - a[i]) / (a[i + 1] - a[i])
        idx.append((i, i + 1))
        ts.append(float(t))
    total = 0.0
    for corner in np.ndindex(*(2,) * len(g.axes)):
        w = 1.0
        cell = []
        for d, c in enumerate(corner):
            w *= ts[d] if c else 1.0 - ts[d]
            cell.append(idx[d][c])
        if w == 0.0:
            continue
        v = float(g.values[tuple(cell)])
        if yspace == "log":
            v = np.log(v)
        elif yspace == "util":
            v = float(g.sol(*(g.axes[d][cell[d]] for d in range(len(cell))))) / v
        total += w * v
    if yspace == "log":
        return float(np.exp(total))
    if yspace == "util":
        return float(g.sol(*q)) / total
    return float(total)


def clamp_eval(g: Grid, q: tuple[float, ...]) -> float:
    """The boundary value with no speed-of-light scaling."""
    qc = tuple(min(max(x, a[0]), a[-1]) for a, x in zip(g.axes, q))
    return float(g(*qc)[0])


def bracket_values(g: Grid, q: tuple[float, ...], ax: int) -> tuple[float, float]:
    """The grid values on either side of ``q`` along axis ``ax`` (``q`` on the grid elsewhere)."""
    a = g.axes[ax]
    i = int(np.clip(np.searchsorted(a, q[ax], side="right") - 1, 0, len(a) - 2))
    pos = [int(np.searchsorted(g.axes[d], q[d])) for d in range(len(q))]
    lo, hi = list(pos), list(pos)
    lo[ax], hi[ax] = i, i + 1
    return float(g.values[tuple(lo)]), float(g.values[tuple(hi)])


# ---- candidates ---------------------------------------------------------------------------------
def curve_candidates(lats: list[Lattice]):
    """All (lattice, site, cell, axis) held-out candidates: interior, low edge, high edge."""
    interior, low, high = [], [], []
    for li, L in enumerate(lats):
        for s, (axes, vals) in L.curves.items():
            meas = ~np.isnan(vals)
            for ax in range(vals.ndim):
                csum = np.cumsum(meas, axis=ax)
                total = np.take(csum, [-1], axis=ax)
                below = (csum - meas) > 0
                above = (total - csum) > 0
                inner = meas & below & above
                for mask, dest in ((inner, interior), (meas & ~below, low), (meas & below & ~above, high)):
                    cells = np.flatnonzero(mask)
                    if len(cells):
                        block = np.empty((len(cells), 4), np.int64)
                        block[:, 0], block[:, 1], block[:, 2], block[:, 3] = li, s, cells, ax
                        dest.append(block)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros((0, 4), np.int64)  # noqa: E731
    return cat(interior), cat(low), cat(high)


def _gemm_region(axis: np.ndarray, m: float) -> str:
    if m <= 16:
        return "m<=16 (dense)"
    if np.isin(m - 1, axis) or np.isin(m + 1, axis):
        return "m in an (m, m+1) step pair"
    return "other m"


def predict_curve_point(L: Lattice, s: int, cell: int, ax: int, path: str) -> dict | None:
    """Remove the held-out point's row/column along ``ax`` and predict it from the rest."""
    axes, vals = L.curves[s]
    idx = np.unravel_index(cell, vals.shape)
    q = tuple(float(a[i]) for a, i in zip(axes, idx))
    meas = float(vals[idx])
    red_axes = list(axes)
    red_axes[ax] = np.delete(axes[ax], idx[ax])
    red_vals = np.delete(vals, idx[ax], axis=ax)
    if len(red_axes[ax]) == 0 or np.isnan(red_vals).all():
        return None
    g = L.build(s, tuple(red_axes), red_vals)
    try:
        pred = float(g(*q)[0])
    except BeyondRangeError:
        return None  # refused: too far beyond a climbing edge (never happens one interval out)
    tags = {"axis": AXIS_NAMES[L.family][ax]}
    if L.family == "gemm":
        tags["quant"] = L.label.split(" ")[0]
        tags["m region"] = _gemm_region(axes[0], q[0])
    if path == "in-curve":
        g_alt = L.build(s, tuple(red_axes), red_vals, plain=True)  # the measured points only
        alts = {name: interp_eval(g_alt, q, *spec) for name, spec in METHODS.items()}
        check = 0.0  # infercast's Grid uses per-axis scales (see SCALES); compared, not re-derived
        lo, hi = sorted(bracket_values(g_alt, q, ax))
        inside = lo * 0.99 <= meas <= hi * 1.01
        tags["neighbours"] = "point between its neighbours" if inside else "point outside its neighbours' range"
    else:
        alts = {"clamp only": clamp_eval(L.build(s, tuple(red_axes), red_vals, plain=True), q)}
        check = 0.0
    return {"meas": meas, "pred": pred, "alts": alts, "tags": tags, "check": check}


def _sample_cells(L: Lattice, s: int, rng: np.random.Generator, cap: int):
    axes, vals = L.curves[s]
    cells = np.argwhere(~np.isnan(vals))
    if len(cells) > cap:
        cells = cells[np.sort(rng.choice(len(cells), cap, replace=False))]
    return tuple(axes[a][cells[:, a]] for a in range(len(axes))), vals[tuple(cells.T)]


def predict_moe_peer(L: MoeLattice, s: int, rest: np.ndarray, rng: np.random.Generator, cap: int) -> dict | None:
    """Dropped MoE site ``s`` from another engine's table (``ops.moe.best_peer_curve``), the ratio
    taken over this engine's remaining sites; None when no peer serves (the site transfers)."""
    if not L.peers:
        return None
    own = np.column_stack([L.sites[rest], np.tile(np.asarray(L.pair, float), (len(rest), 1))])
    best = moe_ops.best_peer_curve(L.sites[s], *L.pair, L.assumed_family, own, [L.curves[int(j)] for j in rest],
                                   L.site_kernel[rest], L.peers)
    if best is None:
        return None
    g = moe_ops.peer_grid(best[1], L.sol_for(L.sites[s]))
    coords, meas = _sample_cells(L, s, rng, cap)
    pred = g(*coords)[0]
    return {"meas": meas, "pred": pred, "alts": {"latency blend": pred}, "tags": {"transfer": "peer"}, "check": 0.0}


def predict_site(L: Lattice, s: int, rng: np.random.Generator, cap: int) -> dict | None:
    """Drop site ``s`` and predict (up to ``cap`` of) its measured points by transfer."""
    rest = np.delete(np.arange(len(L.sites)), s)
    if len(rest) == 0:
        return None
    if L.family in ("context_attention", "generation_attention"):
        # as ops/attention.py: donors over (group size, kv heads), then (generation) only donors
        # whose utilisation agrees within a factor
        choice = attn_ops.choose_donors(L.family, L.sites[s][0], L.sites[s][1], L.sites[rest])
        if choice is not None:
            choice = attn_ops.consistent_donors(L.family, choice, lambda i: L.full(int(rest[i])))
    elif L.family == "moe":
        # as ops/moe.py: another engine's curve of the shape when the two run the same kernels at a
        # steady ratio at this pair; else default-kernel donors first, utilisation read at equal
        # expert rows over SOL + the pair's fixed cost (from the remaining sites' lowest latency)
        peer = predict_moe_peer(L, s, rest, rng, cap)
        if peer is not None:
            return peer
        choice = moe_ops.choose_donors(L.sites[s], L.sites[rest], L.primary[rest])
    else:
        choice = choose_sites(L.sites[s], L.sites[rest])
    if choice is None:
        return None
    sol_q = L.sol_for(L.sites[s])
    if L.family == "moe":
        cost = moe_ops.fixed_cost(L.curves[int(j)][1] for j in rest)
        choice = moe_ops.consistent_moe_donors(choice, L.sites[s], L.sites[rest], lambda i: L.full(int(rest[i])), cost)
        g = moe_ops.transfer_sites(choice, L.sites[s], L.sites[rest], lambda i: L.full(int(rest[i])), sol_q, cost)
    else:
        g = transfer_grid(choice, lambda i: L.donor(int(rest[i]), s), sol_q)
    coords, meas = _sample_cells(L, s, rng, cap)
    pred = g(*coords)[0]
    blend = np.zeros(len(meas))
    for i, w in zip(choice.indices, choice.weights):
        blend += w * L.donor(int(rest[i]), s)(*coords)[0]
    tags = {"transfer": choice.how}
    if L.family == "gemm":
        tags["quant"] = L.label.split(" ")[0]
    return {"meas": meas, "pred": pred, "alts": {"latency blend": blend}, "tags": tags, "check": 0.0}


# ---- the run ------------------------------------------------------------------------------------
@dataclass
class Samples:
    meas: list = field(default_factory=list)
    pred: list = field(default_factory=list)
    alts: dict = field(default_factory=dict)  # method -> list of arrays
    tags: dict = field(default_factory=dict)  # grouping key -> one label per point
    check: float = 0.0  # largest relative gap between Grid and the re-derived power law
    sites_tried: int = 0
    sites_answered: int = 0
    available: int = 0  # candidate points in the data for this path

    def add(self, r: dict, backend: str) -> None:
        meas = np.atleast_1d(np.asarray(r["meas"], float))
        n = len(meas)
        self.meas.append(meas)
        self.pred.append(np.atleast_1d(np.asarray(r["pred"], float)))
        for k, v in r["alts"].items():
            self.alts.setdefault(k, []).append(np.atleast_1d(np.asarray(v, float)))
        total = sum(len(x) for x in self.meas)
        tags = {"backend": backend, **r["tags"]}
        for k in [*self.tags, *(k for k in tags if k not in self.tags)]:
            labels = self.tags.setdefault(k, [])
            labels.extend([None] * (total - n - len(labels)))  # a grouping first seen now
            labels.extend([tags.get(k)] * n)  # None where this point has no such label
        self.check = max(self.check, float(r["check"]))


def ape_stats(meas: np.ndarray, pred: np.ndarray) -> dict:
    if len(meas) == 0:
        return {"n": 0, "median_ape": None, "p90_ape": None, "median_signed": None}
    ape = np.abs(pred - meas) / meas
    return {
        "n": int(len(meas)),
        "median_ape": float(np.median(ape)),
        "p90_ape": float(np.percentile(ape, 90)),
        "median_signed": float(np.median((pred - meas) / meas)),
    }


def summarise(family: str, system: str, path: str, smp: Samples) -> dict:
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0)  # noqa: E731
    meas, pred = cat(smp.meas), cat(smp.pred)
    alts = {k: cat(v) for k, v in smp.alts.items()}
    main = ape_stats(meas, pred)
    goal_med, goal_p90 = GOALS[family]
    meets = None
    if main["n"]:
        meets = main["median_ape"] <= goal_med and (goal_p90 is None or main["p90_ape"] <= goal_p90)
    primary = ALT_LABEL[path]
    prim = ape_stats(meas, alts[primary]) if primary in alts else ape_stats(meas[:0], meas[:0])
    row = {
        "family": family, "system": system, "path": path, **main,
        "goal_median": goal_med, "goal_p90": goal_p90, "meets_goal": meets,
        "alt_method": primary, "alt_median_ape": prim["median_ape"], "alt_p90_ape": prim["p90_ape"],
        "methods": {"infercast": main,
                    **{k: ape_stats(meas, v) for k, v in alts.items()}},
        "available_points": smp.available,
        "grid_check_max_rel_diff": smp.check,
    }
    if path == "in-curve" and "axis" in smp.tags:
        labels = np.array([str(x) for x in smp.tags["axis"]])
        row["methods_by_axis"] = {
            ax: {"infercast": ape_stats(meas[labels == ax], pred[labels == ax]),
                 **{k: ape_stats(meas[labels == ax], v[labels == ax]) for k, v in alts.items()}}
            for ax in AXIS_NAMES[family] if (labels == ax).any()
        }
    if path == "transfer":
        row["sites_tried"] = smp.sites_tried
        row["sites_answered"] = smp.sites_answered
        row["coverage"] = smp.sites_answered / smp.sites_tried if smp.sites_tried else None
    breakdown = {}
    for key, labels in smp.tags.items():
        groups: dict = {}
        for k, lab in enumerate(labels):
            if lab is not None:
                groups.setdefault(lab, []).append(k)
        breakdown[key] = {
            g: {**ape_stats(meas[ix], pred[ix]),
                **({"alt_median_ape": ape_stats(meas[ix], alts[primary][ix])["median_ape"]} if primary in alts else {})}
            for g, ix in sorted(groups.items())
        }
    row["breakdown"] = breakdown
    return row


def moe_pair_samples(system: str, points: int, seed: int) -> Samples:
    """The ``pair`` path (module docstring): every eligible (site, moe_tp) of each backend's
    moe table, all its measured token counts, then a seeded sample of ``points`` per backend."""
    per_backend = -(-points // len(BACKENDS))
    smp = Samples()
    for b_i, backend in enumerate(BACKENDS):
        try:
            db = OpDB(PerfData.open(system, backend), DatabaseMode.SILICON)
            table = db.table_or_none("moe")
        except InfercastError:
            continue
        if table is None:
            continue
        meas, pred, alt, donors = [], [], [], []
        for quant, lat, gated in moe_quant_lattices(db, table):
            S = lat.sites
            for i in np.flatnonzero((S[:, 5] == 1) & (S[:, 4] >= 4)):
                h, n, k, e, tp, ep = (int(x) for x in S[i])
                site_hit = np.all(S[:, :4] == S[i, :4], axis=1)
                site_hit[i] = False
                sol_q = moe_ops.moe_sol_fn(db, quant, h, n, k, e, tp, ep, gated)
                trend = moe_ops._tp_trend(db, lat, S, site_hit, tp, ep, gated, sol_q)
                d = moe_ops._pair_donor(S, site_hit, tp, ep)
                if trend is None or d is None:
                    continue
                g, _ = trend
                own = moe_ops._site_grid(db, lat, int(i), gated)
                ax = np.intersect1d(own.axes[0][np.isfinite(own.values)], g.axes[0])
                if not len(ax):
                    continue
                base = moe_ops._site_grid(db, lat, d, gated)
                meas.append(own(ax)[0])
                pred.append(g(ax)[0])
                alt.append(base(ax)[0] * sol_q(ax) / base.sol(ax))
                donors += [f"tp{tp}"] * len(ax)
        if not meas:
            continue
        m, p_, a, tp_of = np.concatenate(meas), np.concatenate(pred), np.concatenate(alt), np.asarray(donors)
        smp.available += len(m)
        rng = np.random.default_rng([seed, FAMILIES.index("moe"), 99, b_i])
        keep = np.sort(rng.choice(len(m), per_backend, replace=False)) if len(m) > per_backend else np.arange(len(m))
        for tp in sorted(set(tp_of[keep].tolist())):
            ix = keep[tp_of[keep] == tp]
            smp.add({"meas": m[ix], "pred": p_[ix], "alts": {"same width": a[ix]}, "tags": {"moe_tp": tp}, "check": 0.0},
                    backend)
    return smp


def run_family(system: str, family: str, points: int, seed: int, cap: int, log) -> list[dict]:
    per_backend = -(-points // len(BACKENDS))
    out = {p: Samples() for p in PATHS}
    for b_i, backend in enumerate(BACKENDS):
        t0 = time.perf_counter()
        try:
            lats = load_lattices(system, backend, family)
        except InfercastError as exc:
            log(f"  {system} {backend} {family}: skipped ({exc})")
            continue
        sys_i = SYSTEMS.index(system) if system in SYSTEMS else len(SYSTEMS)
        rng = np.random.default_rng([seed, FAMILIES.index(family), sys_i, b_i])
        interior, low, high = curve_candidates(lats)
        for path, cand in (("in-curve", interior), ("hold-high", high), ("hold-low", low)):
            out[path].available += len(cand)
            if len(cand) > per_backend:
                cand = cand[np.sort(rng.choice(len(cand), per_backend, replace=False))]
            for li, s, cell, ax in cand:
                r = predict_curve_point(lats[li], int(s), int(cell), int(ax), path)
                if r is not None:
                    out[path].add(r, backend)
        if family != "custom_allreduce":
            site_list = [(li, s) for li, L in enumerate(lats) for s in range(len(L.sites))]
            out["transfer"].available += sum(int((~np.isnan(lats[li].curves[s][1])).sum()) for li, s in site_list)
            got = 0
            for k in rng.permutation(len(site_list)):
                if got >= per_backend:
                    break
                li, s = site_list[k]
                out["transfer"].sites_tried += 1
                r = predict_site(lats[li], s, rng, cap)
                if r is None:
                    continue
                out["transfer"].sites_answered += 1
                out["transfer"].add(r, backend)
                got += len(r["meas"])
        log(f"  {system} {backend:6s} {family:20s} {len(lats):3d} lattices  {time.perf_counter() - t0:5.1f} s")
    rows = [summarise(family, system, p, out[p]) for p in PATHS if not (family == "custom_allreduce" and p == "transfer")]
    if family == "moe":
        rows.append(summarise(family, system, "pair", moe_pair_samples(system, points, seed)))
    return rows


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _goal(row) -> str:
    g = f"med<={100 * row['goal_median']:.0f}%"
    if row["goal_p90"] is not None:
        g += f" p90<={100 * row['goal_p90']:.0f}%"
    if row["meets_goal"] is None:
        return g
    return g + ("  ok" if row["meets_goal"] else "  MISS")


def print_tables(rows: list[dict], detail: bool, elapsed: float, points: int, seed: int) -> None:
    header = ["family", "system", "path", "n", "median APE", "p90 APE", "goal", "alt", "alt median", "alt p90", "note"]
    body = []
    for r in rows:
        note = ""
        if r["path"] == "transfer" and r.get("sites_tried"):
            note = f"{r['sites_answered']}/{r['sites_tried']} dropped sites in gates"
        elif r["n"] < points and r["available_points"] <= r["n"]:
            note = "all available points"
        body.append([FAMILY_LABEL[r["family"]], r["system"], r["path"], str(r["n"]), _pct(r["median_ape"]),
                     _pct(r["p90_ape"]), _goal(r), r["alt_method"], _pct(r["alt_median_ape"]), _pct(r["alt_p90_ape"]), note])
    title = f"interpolation leave-one-out: APE = |pred - meas| / meas (seed {seed}, target {points} points per row, {elapsed:.0f} s)"
    _print_table(title, header, body)

    names = list(METHODS)
    header_m = ["family", "system", "axis", "n"] + [f"{m} med / p90" for m in names]
    body_m = []
    for r in rows:
        if r["path"] != "in-curve":
            continue
        groups = [("all", r["methods"])]
        if len(r.get("methods_by_axis", {})) > 1:
            groups += list(r["methods_by_axis"].items())
        for axis, methods in groups:
            med = {m: methods[m]["median_ape"] for m in names if methods.get(m) and methods[m]["median_ape"] is not None}
            best = min(med, key=med.get) if med else None
            cells = []
            for m in names:
                st = methods.get(m)
                txt = "-" if not st or st["median_ape"] is None else f"{_pct(st['median_ape'])} / {_pct(st['p90_ape'])}"
                cells.append(txt + (" *" if m == best else ""))
            n = methods["infercast"]["n"]
            body_m.append([FAMILY_LABEL[r["family"]], r["system"], axis, str(n)] + cells)
    _print_table("in-curve: interpolation rule vs APE on the same held-out points (* = lowest median)", header_m, body_m)

    if detail:
        header2 = ["family", "system", "path", "by", "group", "n", "median APE", "p90 APE", "median signed", "alt median"]
        body2 = []
        for r in rows:
            for key, groups in r["breakdown"].items():
                for g, st in groups.items():
                    body2.append([FAMILY_LABEL[r["family"]], r["system"], r["path"], key, str(g), str(st["n"]),
                                  _pct(st["median_ape"]), _pct(st["p90_ape"]), _pct(st["median_signed"]),
                                  _pct(st.get("alt_median_ape"))])
        _print_table("breakdown (median signed > 0 = over-prediction)", header2, body2)


def _print_table(title: str, header: list[str], body: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain aligned text
        widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
        print(title)
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in body:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        print()
        return
    t = Table(title=title)
    for h in header:
        numeric = h in ("n", "median APE", "p90 APE", "alt median", "alt p90", "median signed") or h.endswith("p90")
        t.add_column(h, justify="right" if numeric else "left")
    for r in body:
        t.add_row(*r)
    Console(width=220).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.interp_loo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=2000, help="target held-out points per family, system and path (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap", type=int, default=10, help="max points scored per transferred site (default 10: more sites, less variance)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--detail", action="store_true", help="also print the per-backend / per-axis breakdown")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = []
    for system in args.systems:
        for family in args.families:
            rows.extend(run_family(system, family, args.points, args.seed, args.cap, log))
    elapsed = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"seed": args.seed, "points": args.points, "cap": args.cap, "elapsed_s": elapsed, "rows": rows}, indent=1))
    else:
        print_tables(rows, args.detail, elapsed, args.points, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
