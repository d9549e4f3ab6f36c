"""Other tables of the same GPU: another serving backend's (or another collected version's) moe
table as the source of a kernel family, of a preferred quant form, or of an uncollected shape
(rule 5 of :mod:`infercast.ops.moe.block`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...data.database import PEER_AGREEMENT
from ...data.versions import SERVING_BACKENDS, version_key
from ...errors import InfercastError
from ...interp.grid import Grid, median_rows
from ...interp.provenance import Prov
from ..base import OpDB, Resolved
from .kernels import kernel_family
from .query import TOKEN_SCALE
from .tables import _get_lattice, _Lattice, _site_index, _site_label, default_family

def _other_db(db: OpDB, *, backend: str | None = None, version: str | None = None) -> OpDB | None:
    """The same system's data of another serving ``backend`` at its current version, or of this
    backend at another collected ``version``; shared with every estimator that reads it
    (:meth:`OpDB.shared`); None when the pack has no such data."""

    def build():
        try:
            data = db.data.for_backend(backend) if backend is not None else replace(db.data, version=version, served={})
            return OpDB.shared(data, db.mode)
        except InfercastError:
            return None

    return db.memo(("moe-other-db", backend, version), build)


def _peer_preferred(db: OpDB, preferred: str, fallback: str, lat: _Lattice, query: tuple, tp: int, ep: int,
                    gated: bool, distribution: str):
    """(peer db, preferred quant, its lattice, note) when this backend's table lacks the preferred
    quant mode at the query's exact site and pair but another backend's table on the same system
    has it there, and the two tables agree (within ``PEER_AGREEMENT``, median over shared token
    counts) on the fallback quant at that same site and pair: the engines run the same kernels, so
    the peer's measurement of the preferred mode stands in for the missing one (:mod:`infercast.ops.moe.block`)."""
    mine = _site_index(lat, query, tp, ep)
    if mine is None:
        return None
    (m_ax,), m_vals = lat.curves[mine]
    for backend in SERVING_BACKENDS:
        if backend == db.backend:
            continue
        pdb = _other_db(db, backend=backend)
        if pdb is None:
            continue
        try:
            plat, pfall = _get_lattice(pdb, preferred, gated, distribution), _get_lattice(pdb, fallback, gated, distribution)
        except InfercastError:
            continue
        if plat is None or pfall is None or _site_index(plat, query, tp, ep) is None:
            continue
        j = _site_index(pfall, query, tp, ep)
        if j is None:
            continue
        (p_ax,), p_vals = pfall.curves[j]
        shared, mi, pi = np.intersect1d(m_ax, p_ax, return_indices=True)
        ok = ~np.isnan(m_vals[mi]) & ~np.isnan(p_vals[pi])
        if ok.sum() < 3:
            continue
        r = float(median_rows(m_vals[mi][ok] / p_vals[pi][ok]))
        if 1.0 / PEER_AGREEMENT <= r <= PEER_AGREEMENT:
            note = (f"{preferred} from {backend} {pdb.data.version}'s moe table: {db.backend}'s has no {preferred} "
                    f"at this site, and the two agree on {fallback} here ({db.backend}/{backend} = {r:.2f} over "
                    f"{int(ok.sum())} token counts)")
            return pdb, preferred, plat, note
    return None


def _kernel_db(db: OpDB, candidates: tuple[str, ...], kernel: str, gated: bool, distribution: str) -> OpDB | None:
    """The database whose moe table measured ``kernel``'s family in the preferred quant mode, in
    this order: this backend's data version; this backend's other collected versions, newest
    first (a kernel an engine stopped defaulting to drops out of the newer collections: vLLM's
    b200 tables measured the Triton ``fused_moe`` in 0.19.0 and 0.22.0, FlashInfer's kernels in
    0.24.0); another serving backend's current data on the same system (in
    :data:`~infercast.data.versions.SERVING_BACKENDS` order) -- the kernels are the same library's,
    whichever engine called them. None when no table has them."""

    def measured(kdb: OpDB | None) -> bool:
        if kdb is None:
            return False
        try:
            return _get_lattice(kdb, candidates[0], gated, distribution, kernel=kernel) is not None
        except InfercastError:
            return False

    if measured(db):
        return db
    for version in sorted((v for v in db.data.versions.collected if v != db.data.version), key=version_key, reverse=True):
        kdb = _other_db(db, version=version)
        if measured(kdb):
            return kdb
    for backend in (b for b in SERVING_BACKENDS if b != db.backend):
        kdb = _other_db(db, backend=backend)
        if measured(kdb):
            return kdb
    return None


#: peer-engine transfer (:func:`peer_curve`, :mod:`infercast.ops.moe.block` rule 5): at least this many sites at
#: the query's pair that both engines measured with the query's kernel family, ...
PEER_MIN_SITES = 3
#: ... whose latency ratio (log, per token count) varies across those sites by at most this median
#: absolute deviation (0.05: about 5%): the two engines run the same kernels there at a steady ratio
PEER_RATIO_SPREAD = 0.05


@dataclass(frozen=True)
class PeerCurve:
    """The query site's curve from another engine's table: ``values`` (ms, on ``axis``) = the peer's
    measured curve x this engine's latency ratio to it, per token count; ``ratio`` is the median
    over every point of the ``shared`` sites, ``spread`` the gate's statistic (:func:`peer_curve`)."""

    index: int  # the query site's index in the peer's lattice
    axis: np.ndarray
    values: np.ndarray
    shared: int
    spread: float
    ratio: float


def _log_ratios(own_curve, peer_curve) -> dict[float, float]:
    (oax,), ov = own_curve
    (pax,), pv = peer_curve
    common, oi, pi = np.intersect1d(oax, pax, return_indices=True)
    r = np.log(ov[oi] / pv[pi])
    return {float(t): float(x) for t, x in zip(common, r) if np.isfinite(x)}


def peer_curve(query, moe_tp: int, moe_ep: int, family: str | None, own_sites: np.ndarray, own_curves,
               own_kernels, peer_sites: np.ndarray, peer_curves, peer_kernels) -> PeerCurve | None:
    """The query shape's curve at ``(moe_tp, moe_ep)`` from a peer engine's lattice on the same GPU
    (``peer_*``: sites (n, 6) hidden, inter, topk, experts, moe_tp, moe_ep; curves by index;
    kernel names), when the peer measured that exact site with the kernel ``family`` the query is
    assumed to run, and the two engines' latencies stand in a steady ratio at that pair: over the
    sites both measured there with that family (at least :data:`PEER_MIN_SITES`), the median
    absolute deviation of the per-site log ratios, median over token counts, is at most
    :data:`PEER_RATIO_SPREAD`. The answer is the peer's curve x the median ratio at each token
    count (the median over every shared point where fewer than :data:`PEER_MIN_SITES` sites measured
    that count). None otherwise. ``own_*`` are this engine's lattice in the same layout."""
    if family is None:
        return None
    q = np.asarray(query, dtype=float)
    pair = lambda sites: (sites[:, 4] == moe_tp) & (sites[:, 5] == moe_ep)
    p_at = pair(peer_sites)
    hit = np.flatnonzero(p_at & np.all(peer_sites[:, :4] == q, axis=1))
    if not len(hit) or kernel_family(peer_kernels[int(hit[0])]) != family:
        return None
    j = int(hit[0])
    peer_index = {tuple(row): i for i, row in enumerate(peer_sites[:, :4].tolist()) if p_at[i]}
    by_token: dict[float, list[float]] = {}
    shared = 0
    for i in np.flatnonzero(pair(own_sites)):
        k = peer_index.get(tuple(own_sites[i, :4].tolist()))
        if k is None or k == j or kernel_family(own_kernels[i]) != family or kernel_family(peer_kernels[k]) != family:
            continue
        r = _log_ratios(own_curves[int(i)], peer_curves[int(k)])
        if not r:
            continue
        shared += 1
        for t, x in r.items():
            by_token.setdefault(t, []).append(x)
    if shared < PEER_MIN_SITES:
        return None
    steady = {t: np.asarray(v) for t, v in by_token.items() if len(v) >= PEER_MIN_SITES}
    if not steady:
        return None
    spread = float(median_rows([median_rows(np.abs(v - median_rows(v))) for v in steady.values()]))
    if spread > PEER_RATIO_SPREAD:
        return None
    overall = float(median_rows(np.concatenate(list(by_token.values()))))
    (axis,), vals = peer_curves[j]
    ratio = np.array([float(median_rows(steady[float(t)])) if float(t) in steady else overall for t in axis])
    return PeerCurve(j, axis, vals * np.exp(ratio), shared, spread, float(np.exp(overall)))


def best_peer_curve(query, moe_tp: int, moe_ep: int, family: str | None, own_sites: np.ndarray, own_curves,
                    own_kernels, peers) -> tuple[int, PeerCurve] | None:
    """:func:`peer_curve` against each of ``peers`` (lattices: ``sites``, ``curves``,
    ``site_kernel``); the steadiest ratio wins, ties to the earlier peer. (index into ``peers``,
    curve), or None when no peer serves."""
    best = None
    for n, plat in enumerate(peers):
        pc = peer_curve(query, moe_tp, moe_ep, family, own_sites, own_curves, own_kernels,
                        plat.sites, plat.curves, plat.site_kernel)
        if pc is not None and (best is None or pc.spread < best[1].spread):
            best = (n, pc)
    return best


def peer_grid(pc: PeerCurve, sol_q, label: str = "") -> Grid:
    """:class:`PeerCurve` as a transferred grid holding beyond its tokens range through ``sol_q``."""
    return Grid((pc.axis,), pc.values, np.full(len(pc.axis), int(Prov.TRANSFERRED), np.int8), sol_q,
                (label,) if label else (), scales=TOKEN_SCALE)


def peer_lattices(db: OpDB, lat: _Lattice, gated: bool, distribution: str, kernel: str | None = None) -> list:
    """(peer db, lattice) of every other serving backend's current moe table on this system with
    ``lat``'s quant mode, routing distribution and activation class, in
    :data:`~infercast.data.versions.SERVING_BACKENDS` order."""
    peers = []
    for backend in SERVING_BACKENDS:
        pdb = None if backend == db.backend else _other_db(db, backend=backend)
        if pdb is None:
            continue
        try:
            plat = _get_lattice(pdb, lat.quant, gated, distribution, kernel=kernel)
        except InfercastError:
            continue
        if plat is not None and plat.distribution == lat.distribution and plat.site_gated == lat.site_gated:
            peers.append((pdb, plat))
    return peers


def _peer_site(db: OpDB, lat: _Lattice, query: tuple, moe_tp: int, moe_ep: int, gated: bool, distribution: str,
               kernel: str | None, sol_q) -> Resolved | None:
    """:func:`best_peer_curve` over :func:`peer_lattices`, as a resolved curve; None when no peer serves."""
    family = default_family(lat)
    peers = peer_lattices(db, lat, gated, distribution, kernel)
    best = best_peer_curve(query, moe_tp, moe_ep, family, lat.sites, lat.curves, lat.site_kernel,
                           [plat for _, plat in peers])
    if best is None:
        return None
    pdb, plat = peers[best[0]]
    pc = best[1]
    label = f"{pdb.backend} {pdb.data.version} {_site_label(plat.sites[pc.index])}"
    why = (f"shape not collected in {db.backend} {db.data.version}'s moe table: {pdb.backend} "
           f"{pdb.data.version}'s curve of it ({plat.site_kernel[pc.index]}) x {db.backend}/{pdb.backend} latency "
           f"ratio {pc.ratio:.2f} (median over {pc.shared} shapes both measured with {family} kernels at "
           f"moe_tp={moe_tp} moe_ep={moe_ep}; spread {pc.spread:.3f})")
    return Resolved(peer_grid(pc, sol_q, label), "moe", db.served_version("moe"), lat.kernel, "peer-transfer",
                    (label,), (why,))
