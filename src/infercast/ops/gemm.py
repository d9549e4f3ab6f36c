"""GEMM: latency of an (m x k) @ (k x n) product in a weight quant mode, from ``gemm_perf``.

Sites are ``(n, k)``; the curve axis is ``m`` (tokens). Off-lattice ``(n, k)`` (e.g. a TP shard of
an FFN width) is transferred through utilisation (:mod:`infercast.interp.transfer`).
"""

from __future__ import annotations

from functools import partial
from dataclasses import replace

import numpy as np

from ..data.quant import COMPUTE_DTYPE, WEIGHT_BYTES
from ..errors import InfercastError, NotAvailableError
from ..interp import sol
from ..interp.grid import TILE, Grid, median_rows, robust_knots
from ..interp.provenance import Prov
from ..interp.transfer import (
    Replayable,
    choose_sites,
    extend_below_from_siblings,
    extend_from_siblings,
    fill_holes_from_siblings,
    siblings_by_distance,
    transfer_grid,
)
from .base import (
    DatabaseMode,
    OpDB,
    Resolved,
    merge_kernels,
    sites_and_curves,
    sol_resolved,
)
from .empirical import empirical_resolved

#: the tokens axis used for SOL / empirical grids (same span as the collected m axis)
M_AXIS = np.array(sorted({*range(1, 17), *(2.0 ** k for k in range(4, 18))}), dtype=float)
#: interpolation space of the measured m axis (infercast.interp.grid): linear, tile-step aware
M_SCALE = (TILE,)


def gemm_sol_fn(db: OpDB, quant: str, n: int, k: int):
    """``f(m)``: the speed-of-light ms of an (m, n, k) GEMM in ``quant`` on the database's system
    (a partial of a module-level function, so that a compiled op can be pickled:
    :mod:`infercast.engine.compile_cache`)."""
    return partial(_gemm_sol, db.system, COMPUTE_DTYPE[quant], WEIGHT_BYTES[quant], n, k)


def _gemm_sol(system, cdt: str, wb: float, n: int, k: int, m):
    return sol.gemm(system, cdt, wb, m, n, k)[0]


def build_site_grid(axis, vals, sol_fn, siblings=(), reach: float | None = None, floor: float | None = None) -> Grid:
    """One collected ``(n, k)`` site's m-curve as a grid: its measured points; beyond its last
    one the positions its sibling sites measured, carried by their utilisation trend
    (:func:`infercast.interp.transfer.extend_from_siblings`); below its first one, where it starts
    above ``floor``, the positions its siblings measured where their trend departs from the curve's
    own low-edge rule (:func:`infercast.interp.transfer.extend_below_from_siblings`); and the
    lattice points inside its range that it lacks and its siblings measured, from its own curve and
    theirs (:func:`infercast.interp.transfer.fill_holes_from_siblings`, provenance interpolated).
    ``siblings``: ``(m, latency, sol)`` of the lattice's other sites, nearest first; ``reach`` /
    ``floor``: the largest / smallest m any of them measured."""
    siblings = Replayable(siblings)
    x, v, prov = extend_from_siblings(axis, vals, sol_fn, siblings, reach=reach)
    if floor is not None and len(axis) and axis[0] > floor:
        own = Grid((np.asarray(axis, dtype=float),), np.asarray(vals, dtype=float), np.zeros(len(axis), np.int8),
                   sol_fn, scales=M_SCALE)
        lx, lv, lp = extend_below_from_siblings(axis, vals, sol_fn, siblings, lambda t: float(own(np.array([t]))[0][0]),
                                                floor=floor)
        added = len(lx) - len(axis)
        if added:
            x, v, prov = (np.concatenate([a[:added], b]) for a, b in ((lx, x), (lv, v), (lp, prov)))
    hx, hv = fill_holes_from_siblings(axis, vals, sol_fn, siblings, scales=M_SCALE)
    if len(hx):
        x, v = np.concatenate([x, hx]), np.concatenate([v, hv])
        prov = np.concatenate([prov, np.full(len(hx), int(Prov.INTERPOLATED), np.int8)])
        order = np.argsort(x, kind="stable")
        x, v, prov = x[order], v[order], prov[order]
    return Grid((x,), v, prov, sol_fn, scales=M_SCALE)


#: A transfer donor's point more than this far (relative) from the median of the five nearest
#: points of its m-curve is a disturbed run: the donor contributes that median instead. A donor's
#: own tile steps are not the query site's (another n, k tiles differently), and one disturbed
#: donor point otherwise passes straight into the transferred curve, where the query site's own
#: lookups keep every measured value bit for bit. The SGLang GEMM tables (also serving vLLM's
#: fp8_block and TensorRT-LLM's nvfp4 on b200) scatter: 9-13% of their points lie more than 15%
#: from that median, against 1-5% in TensorRT-LLM's and vLLM's own. The 0.2 threshold was chosen by
#: leave-one-out interpolation error (see docs/modelling-log.md, 'GEMM transfer donor clipping').
DONOR_CLIP = 0.2


def donor_values(vals: np.ndarray) -> np.ndarray:
    """A site's m-curve as a transfer donor (:data:`DONOR_CLIP`)."""
    vals = np.asarray(vals, dtype=float)
    k = robust_knots(vals)
    return np.where(np.abs(vals / k - 1.0) > DONOR_CLIP, k, vals)


def _measured_m(curves) -> np.ndarray:
    """Every m any site of a lattice measured (its curves' points with a value), in one array."""
    m = np.concatenate([ax[0] for ax, _ in curves.values()])
    return m[~np.isnan(np.concatenate([v for _, v in curves.values()]))]


def lattice_reach(curves) -> float:
    """The largest m any site of a lattice measured."""
    m = _measured_m(curves)
    return float(m.max()) if m.size else -np.inf


def lattice_floor(curves) -> float:
    """The smallest m any site of a lattice measured."""
    m = _measured_m(curves)
    return float(m.min()) if m.size else np.inf


def lattice_siblings(sites, curves, i: int, sol_for, dropped: int | None = None):
    """``(m, latency, sol)`` of the lattice's other sites (but ``dropped``), nearest to site ``i``
    first, lazily; ``sol_for(site)`` gives a site's speed of light."""
    for j in siblings_by_distance(sites[i], sites, exclude=i):
        j = int(j)
        if j != dropped:
            (axis,), vals = curves[j]
            yield axis, vals, sol_for(sites[j])


def _lattice(db: OpDB, quant: str):
    table = db.table_or_none("gemm")
    if table is None:
        return None
    m = table.mask(gemm_dtype=quant)
    if not m.any():
        if db.mode is DatabaseMode.HYBRID:
            return None
        raise NotAvailableError(
            f"no {quant} GEMM data for {db.backend} on {db.system.name}",
            "the gemm table was not collected in this quant mode",
            table.unique("gemm_dtype"),
        )
    m, kernels = merge_kernels(table, m, ("n", "k", "m"), db.backend)
    kernel = "+".join(kernels)
    util = median_utilisation(db, table, m, quant)
    if util < HOST_BOUND_UTILISATION:
        borrowed = _sibling_lattice(db, quant, util)
        if borrowed is not None:
            return borrowed
    excess, floor, sib = host_floor_excess(db, table, m, quant)
    borrowed = _decode_gap_lattice(db, table, m, quant, excess, floor)
    if borrowed is not None:
        return borrowed
    sites, curves = sites_and_curves(table, m, ("n", "k"), ("m",))
    notes: tuple[str, ...] = ()
    if excess > 0:
        curves = {i: (ax, remove_host_floor(v, excess, floor)) for i, (ax, v) in curves.items()}
        notes = (f"{quant} GEMM rows of {db.backend} have a {1e3 * floor:.1f} us floor, {1e3 * excess:.1f} us above "
                 f"{sib}'s on the same GPU: per-call host overhead, removed where a kernel is that short",)
    return table, kernel, sites, curves, notes


#: Decode-size GEMMs (m <= DECODE_M) of one quant mode are compared with the same table's bf16 rows
#: and with the sibling backends' rows of the same GPU and quant mode, shape by shape (median ratio
#: over the shapes both collected, host floor removed). At decode sizes a GEMM streams its weights,
#: so where the weights are large (n*k >= 2**24) a quantised kernel runs well under the bf16 time:
#: 0.59-0.68x for nvfp4 and 0.63-0.88x for fp8 in the SGLang and vLLM tables of every GPU. One table
#: breaks the pattern: TensorRT-LLM's nvfp4 ``torch_flow`` rows take 0.89-0.97x the bf16 time, and
#: over all decode shapes 1.65-1.8x SGLang's nvfp4 kernels (1.24-1.36x vLLM's) on b200, b300, gb200
#: and gb300 -- the same GPU, the same shapes. The dev silicon rows side with the fast kernels
#: (see docs/modelling-log.md, 'GEMM decode-gap rule').
#: Rule: a table slower than ``DECODE_BF16_RATIO`` x its own bf16 on the large decode shapes, and
#: more than ``DECODE_GAP_RATIO`` x its fastest sibling's over all decode shapes, is not measuring
#: the kernel the engine runs; the fastest sibling's table answers for it. (vLLM's nvfp4 rows, at
#: 1.2-1.4x SGLang's but 0.64x bf16, are under the rule's thresholds and stay.)
DECODE_M, DECODE_MIN_SHAPES, DECODE_BIG_NK = 16, 20, 2**24
DECODE_BF16_RATIO = 0.8
DECODE_GAP_RATIO = 1.5


def _decode_latencies(table, mask, min_nk: int = 0) -> dict:
    """{(n, k, m): least latency} over the decode-size rows of ``mask`` with n*k >= ``min_nk``."""
    sel = mask & (table.keys["m"] <= DECODE_M) & (table.keys["n"] * table.keys["k"] >= min_nk)
    out: dict = {}
    for key, v in zip(zip(table.keys["n"][sel].tolist(), table.keys["k"][sel].tolist(), table.keys["m"][sel].tolist()),
                      table.latency[sel].tolist()):
        if key not in out or v < out[key]:
            out[key] = v
    return out


def _median_ratio(a: dict, b: dict) -> float | None:
    common = a.keys() & b.keys()
    if len(common) < DECODE_MIN_SHAPES:
        return None
    return float(median_rows([a[c] / b[c] for c in common]))


def decode_gap(db: OpDB, table, mask, quant: str, excess: float = 0.0, floor: float = 0.0):
    """(ratio to the fastest sibling, that sibling's (backend, PerfData, table, mask)) when this
    table's large decode-size GEMMs take more than ``DECODE_BF16_RATIO`` x its own bf16 time; else
    (None, None). ``excess``/``floor``: the host floor already removed from this table."""
    if quant == "bfloat16":
        return None, None
    own = _decode_latencies(table, mask)
    if excess > 0:
        own = {k: max(v - excess, floor - excess) for k, v in own.items()}
    big = {k: v for k, v in own.items() if k[0] * k[1] >= DECODE_BIG_NK}
    vs_bf16 = _median_ratio(big, _decode_latencies(table, table.mask(gemm_dtype="bfloat16"), DECODE_BIG_NK))
    if vs_bf16 is None or vs_bf16 <= DECODE_BF16_RATIO:
        return None, None
    best = (None, None)
    for be, sib, t, m in _sibling_tables(db, quant):
        if median_utilisation(db, t, m, quant) < HOST_BOUND_UTILISATION:
            continue
        r = _median_ratio(own, _decode_latencies(t, m))
        if r is not None and (best[0] is None or r > best[0]):
            best = (r, (be, sib, t, m))
    return best


def _decode_gap_lattice(db: OpDB, table, mask, quant: str, excess: float, floor: float):
    ratio, sib = decode_gap(db, table, mask, quant, excess, floor)
    if ratio is None or ratio <= DECODE_GAP_RATIO:
        return None
    be, data, t, m = sib
    m, kernels = merge_kernels(t, m, ("n", "k", "m"), be)
    note = (f"{quant} GEMM rows of {db.backend} run {ratio:.2f}x {be} {data.version}'s at decode sizes (m <= {DECODE_M}) "
            f"on the same GPU and near their own bf16 time on large weights; using {be} ({'+'.join(kernels)})")
    return _borrowed_lattice(t, m, be, kernels, note)


def _borrowed_lattice(table, merged_mask, backend: str, kernels: list[str], note: str):
    """A sibling backend's GEMM rows as this backend's lattice (``_lattice``'s return shape)."""
    sites, curves = sites_and_curves(table, merged_mask, ("n", "k"), ("m",))
    return table, f"{backend}:{'+'.join(kernels)}", sites, curves, (note,)


#: A GEMM table whose median speed-of-light utilisation is below this is measuring host overhead,
#: not the GPU: vLLM 0.24.0's fp8_block tables sit at 2-18% of the roofline (DeepGEMM on b200 is a
#: flat 0.17-0.26 ms from m=1 to m=4096 for n=2048 k=3072) while the same DeepGEMM kernels in the
#: SGLang and TensorRT-LLM tables of the same GPUs reach 49-60%, and the dev silicon rows' TPOT
#: agree with the latter. Such a table is replaced by a sibling backend's table of the same system
#: and quant mode (the pack's reuse manifest shares kernel rows across backends the same way).
HOST_BOUND_UTILISATION = 0.25
SIBLING_ORDER = ("sglang", "trtllm", "vllm")


def median_utilisation(db: OpDB, table, mask, quant: str) -> float:
    if not mask.any():
        return 0.0
    M, N, K = (table.keys[c][mask].astype(float) for c in ("m", "n", "k"))
    s = sol.gemm(db.system, COMPUTE_DTYPE[quant], WEIGHT_BYTES[quant], M, N, K)[0]
    return float(median_rows(s / table.latency[mask]))


def _sibling_tables(db: OpDB, quant: str):
    """(backend, PerfData, gemm table, rows of ``quant``) of every other backend on this GPU that
    collected the quant mode, in ``SIBLING_ORDER``."""
    for be in SIBLING_ORDER:
        if be == db.backend:
            continue
        try:
            sib = db.data.for_backend(be)
            t = sib.table("gemm")
        except InfercastError:
            continue
        m = t.mask(gemm_dtype=quant)
        if m.any():
            yield be, sib, t, m


def _sibling_lattice(db: OpDB, quant: str, own_util: float):
    for be, sib, t, m in _sibling_tables(db, quant):
        m, kernels = merge_kernels(t, m, ("n", "k", "m"), be)
        util = median_utilisation(db, t, m, quant)
        if util >= HOST_BOUND_UTILISATION:
            note = (f"{quant} GEMM rows of {db.backend} sit at {100 * own_util:.0f}% of the roofline (host-overhead bound); "
                    f"using {be} {sib.version} ({'+'.join(kernels)}, {100 * util:.0f}%)")
            return _borrowed_lattice(t, m, be, kernels, note)
    return None


#: The small shapes whose latency sets a table's *floor* (its 10th percentile): m <= 16 and
#: n*k <= 2**22, a few MB of weights, microseconds of GPU time on any GPU in the pack.
FLOOR_M, FLOOR_NK, FLOOR_QUANTILE = 16, 2**22, 10
#: A GEMM table whose floor is more than this many times the lowest floor among its sibling
#: backends' tables (same GPU, same quant mode) carries per-call host overhead. TensorRT-LLM's
#: fp8 (per-tensor) ``torch_flow`` rows floor at 12.2-12.7 us on every GPU from h100 to gb300 --
#: a constant across four GPU generations is the host, not the GPU -- while SGLang's and vLLM's
#: fp8 kernels floor at 4.6-5.7 us; the excess is there at every m (large-m rows differ by the
#: same few microseconds). Decode runs under CUDA graphs, with no per-call host cost, so the
#: excess is subtracted from every measured point of such a table. The ratio 2 leaves the nvfp4
#: tables only 1.5-1.7x above their siblings' floor alone (see docs/modelling-log.md, 'GEMM host
#: floor').
HOST_FLOOR_RATIO = 2.0


def table_floor(table, mask) -> float | None:
    sel = mask & (table.keys["m"] <= FLOOR_M) & (table.keys["n"] * table.keys["k"] <= FLOOR_NK)
    if sel.sum() < 5:
        return None
    return float(np.percentile(table.latency[sel], FLOOR_QUANTILE))


def host_floor_excess(db: OpDB, table, mask, quant: str) -> tuple[float, float, str]:
    """(excess ms, own floor ms, sibling label): how far this table's floor sits above the lowest
    floor among the sibling backends' tables of the same GPU and quant mode, when it is more than
    ``HOST_FLOOR_RATIO`` times that; else (0, own floor, "")."""
    own = table_floor(table, mask)
    if own is None:
        return 0.0, 0.0, ""
    # cheap gate before reading sibling tables: a floor within HOST_FLOOR_RATIO x the same table's
    # bf16 floor (the plainest kernel it has) cannot carry a host excess worth removing
    bf16 = table_floor(table, table.mask(gemm_dtype="bfloat16")) if quant != "bfloat16" else own
    if bf16 is not None and own <= HOST_FLOOR_RATIO * bf16:
        return 0.0, own, ""
    key = (str(db.data.pack.systems_dir), db.system.name, db.backend, quant)
    if key in _FLOOR_CACHE:
        return _FLOOR_CACHE[key]
    best, label = own, ""
    for be, sib, t, m in _sibling_tables(db, quant):
        if median_utilisation(db, t, m, quant) < HOST_BOUND_UTILISATION:
            continue
        f = table_floor(t, m)
        if f is not None and f < best:
            best, label = f, f"{be} {sib.version}"
    out = (own - best, own, label) if own > HOST_FLOOR_RATIO * best else (0.0, own, "")
    _FLOOR_CACHE[key] = out
    return out


_FLOOR_CACHE: dict = {}


def remove_host_floor(vals: np.ndarray, excess: float, floor: float) -> np.ndarray:
    """Subtract the host excess from measured points, never below the sibling's floor."""
    return np.maximum(vals - excess, floor - excess)


#: Quant modes whose GEMM tables include a separately measured activation-quantisation kernel
#: that an engine can fuse into the op producing the GEMM's input: ``gemm_dtype`` -> the pack's
#: ``quantize`` table of that kernel (``scale_matrix_perf``: casting bf16 activations to fp8 with
#: a static per-tensor scale, timed per ``(m, k)``). Every collector times its fp8 per-tensor GEMM
#: from bf16 activations, quantisation included (TensorRT-LLM's ``Linear`` quantises dynamically,
#: vLLM's with the static scale); the engines fuse that cast into the RMSNorm or SwiGLU before
#: the GEMM (:attr:`infercast.models.plan.Fusions.norm_quant`, ``act_quant``). The pack has no such table for
#: nvfp4 or fp8_block activations, so their GEMMs stay as measured.
FUSABLE_INPUT_QUANT = {"fp8": "scale_matrix"}


def _input_quant_lattice(db: OpDB, quant: str):
    """(m values, k values, latency[m, k]) of ``quant``'s activation-quantisation table, or None."""
    stem = FUSABLE_INPUT_QUANT.get(quant)
    if stem is None or not db.data.has_table(stem):
        return None
    table = db.data.table(stem)
    sel = table.mask(quant_dtype=quant) if table.has("quant_dtype") else np.ones(len(table.latency), bool)
    if not sel.any():
        return None
    ms, ks = (np.unique(table.keys[c][sel].astype(float)) for c in ("m", "k"))
    grid = np.full((len(ms), len(ks)), np.nan)
    grid[np.searchsorted(ms, table.keys["m"][sel].astype(float)), np.searchsorted(ks, table.keys["k"][sel].astype(float))] = table.latency[sel]
    if np.isnan(grid).any():  # a ragged table: rows measured at every k only
        keep = ~np.isnan(grid).any(axis=1)
        ms, grid = ms[keep], grid[keep]
        if not len(ms):
            return None
    return ms, ks, grid


def input_quant_cost(db: OpDB, quant: str, k: int):
    """``f(m) -> ms``: the activation-quantisation kernel of a ``quant`` GEMM with inner size
    ``k``, from the pack's ``quantize`` table (bilinear in log2 ``m`` and log2 ``k``, clamped to
    the collected range); None when the quant mode or this backend's data has no such table."""
    lattice = db.memo(("input-quant", quant), lambda: _input_quant_lattice(db, quant))
    if lattice is None:
        return None
    ms, ks, grid = lattice
    lk = np.log2(ks)
    x = float(np.clip(np.log2(k), lk[0], lk[-1]))
    j = int(np.clip(np.searchsorted(lk, x), 1, max(1, len(lk) - 1)))
    if len(lk) == 1:
        col = grid[:, 0]
    else:
        t = (x - lk[j - 1]) / (lk[j] - lk[j - 1])
        col = (1.0 - t) * grid[:, j - 1] + t * grid[:, j]
    lm = np.log2(ms)

    def f(m):
        return np.interp(np.clip(np.log2(np.asarray(m, dtype=float)), lm[0], lm[-1]), lm, col)

    return f


def _without_input_quant(db: OpDB, r: Resolved, quant: str, n: int, k: int) -> Resolved:
    """``r`` with the activation-quantisation kernel taken out of every point of its m-curve
    (never below the GEMM's roofline), for a GEMM whose producer op emits the quantised input."""
    cost = input_quant_cost(db, quant, k)
    if cost is None or r.grid is None:
        return r
    g = r.grid
    sol_m = gemm_sol_fn(db, quant, n, k)
    vals = np.maximum(g.values - cost(g.axes[0]), sol_m(g.axes[0]))
    note = f"{quant} activation quantisation fused into the producer op: {FUSABLE_INPUT_QUANT[quant]} taken out"
    return replace(r, grid=Grid(g.axes, vals, g.prov, g.sol, g.sites, scales=g.scales), notes=r.notes + (note,))


def resolve_gemm(db: OpDB, quant: str, n: int, k: int, fused_input_quant: bool = False) -> Resolved:
    """Compile the m-curve of one GEMM shape. ``fused_input_quant``: the op producing the GEMM's
    input also quantises it (:data:`FUSABLE_INPUT_QUANT`), so the table's quantisation kernel is
    not paid."""
    r = _resolve_gemm(db, quant, n, k)
    if fused_input_quant and quant in FUSABLE_INPUT_QUANT and db.mode is not DatabaseMode.SOL:
        r = _without_input_quant(db, r, quant, n, k)
    return r


def _resolve_gemm(db: OpDB, quant: str, n: int, k: int) -> Resolved:
    sol_q = gemm_sol_fn(db, quant, n, k)
    sol_q(1.0)  # raises early if the GPU has no tensor cores for the quant mode
    if db.mode is DatabaseMode.SOL:
        return sol_resolved((M_AXIS,), sol_q)
    lat = db.memo(("gemm-lattice", quant), lambda: _lattice(db, quant))
    if lat is None:
        return empirical_resolved("gemm", sol_q, (M_AXIS,), None)
    table, kernel, sites, curves, notes = lat
    reach = db.memo(("gemm-reach", quant), lambda: lattice_reach(curves))
    floor = db.memo(("gemm-floor", quant), lambda: lattice_floor(curves))

    def site_sol(site):
        return gemm_sol_fn(db, quant, int(site[0]), int(site[1]))

    def site_grid(i: int, donor: bool = False) -> Grid:
        (axis,), vals = curves[i]
        return build_site_grid(axis, donor_values(vals) if donor else vals, site_sol(sites[i]),
                               lattice_siblings(sites, curves, i, site_sol), reach=reach, floor=floor)

    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_sites((n, k), sites)
    if choice is None:
        if db.mode in (DatabaseMode.HYBRID, DatabaseMode.EMPIRICAL):
            donors = [site_grid(i) for i in range(len(sites))]
            return empirical_resolved("gemm", sol_q, (M_AXIS,), donors)
        raise NotAvailableError(
            f"GEMM {quant} n={n} k={k} is outside the collected (n, k) lattice's gates",
            f"{len(sites)} sites collected for {db.backend} on {db.system.name}; use --database-mode HYBRID for an empirical estimate",
        )
    labels = tuple(f"(n={int(sites[i][0])}, k={int(sites[i][1])}) w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
    g = transfer_grid(choice, lambda i: site_grid(i, donor=choice.how != "exact"), sol_q, labels)
    return Resolved(g, "gemm", db.served_version("gemm"), kernel, choice.how, labels if choice.how != "exact" else (), tuple(notes))

