"""What every op family shares: the database handle, database modes, kernel choice, site caches."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..data.database import PerfData
from ..data.tables import Table
from ..errors import InvalidInputError, NotAvailableError
from ..interp.grid import Grid
from ..interp.provenance import Prov


class DatabaseMode(str, Enum):
    SILICON = "SILICON"  # tables, interpolation, transfer inside the gates; else NotAvailable
    HYBRID = "HYBRID"  # SILICON, else SOL / the family's learned utilisation
    EMPIRICAL = "EMPIRICAL"  # SOL / learned utilisation everywhere
    SOL = "SOL"  # speed of light only

    @classmethod
    def parse(cls, s: str | DatabaseMode) -> DatabaseMode:
        try:
            return cls(str(s.value if isinstance(s, DatabaseMode) else s).upper())
        except ValueError:
            raise InvalidInputError(f"unknown database mode {s!r}", available=[m.value for m in cls]) from None


#: Preferred kernel_source (substring match, in order) where the backend's default is known and
#: the row-count rule below would not find it. Sources: the serving engines run decode under CUDA
#: graphs, so the graph-captured custom all-reduce is the one that matters.
KERNEL_PREFERENCE: dict[tuple[str, str], tuple[str, ...]] = {
    ("trtllm", "gemm"): ("torch_flow",),  # TensorRT-LLM's PyTorch-flow linear (Hopper default)
    ("vllm", "custom_allreduce"): ("graph",),
    ("sglang", "custom_allreduce"): ("graph",),
}


def choose_kernel(table: Table, backend: str, mask: np.ndarray | None = None) -> str | None:
    """The backend's default kernel among the table's ``kernel_source`` values.

    Rule: an explicit preference (``KERNEL_PREFERENCE``) if present; otherwise the kernel with the
    most collected rows — collectors sweep the engine's default path the widest (e.g. vllm
    ``DeepGemmFp8BlockScaledMMKernel`` for fp8_block, sglang ``fa3`` on sm90 / ``trtllm_mha`` on
    sm100, vllm ``vllm_flash_attn_fa3`` on sm90); ties broken by name.
    """
    if not table.has("kernel_source"):
        return None
    ks = table.keys["kernel_source"] if mask is None else table.keys["kernel_source"][mask]
    if len(ks) == 0:
        return None
    names, counts = np.unique(ks, return_counts=True)
    for pref in KERNEL_PREFERENCE.get((backend, table.stem), ()):
        hits = [n for n in names if pref in n]
        if hits:
            return sorted(hits)[0]
    best = sorted(zip(-counts, names))[0][1]
    return str(best)


def merge_kernels(table: Table, mask: np.ndarray, key_cols: tuple[str, ...], backend: str) -> tuple[np.ndarray, list[str]]:
    """Union of kernels, in priority order, by shape: a point the default kernel lacks is taken from
    the next kernel that has it. Engines dispatch by shape (vLLM's fp8 block-scaled linear runs
    FlashInfer at small m and DeepGEMM from m=32 up), and the tables split the same way."""
    order = []
    remaining = mask.copy()
    while remaining.any():
        k = choose_kernel(table, backend, remaining)
        order.append(k)
        remaining &= table.keys["kernel_source"] != k
    if len(order) <= 1:
        return mask, order
    # per shape, the first row (in table order) of the first kernel in ``order`` that has it
    rows = np.flatnonzero(mask)
    ks = table.keys["kernel_source"][rows]
    prio = np.full(len(rows), len(order), dtype=np.int64)
    for i, k in enumerate(order):
        prio[(ks == k) & (prio == len(order))] = i
    cols = [table.keys[c][rows].astype(float) for c in key_cols]
    o = np.lexsort((rows, prio, *reversed(cols)))
    first = np.ones(len(o), dtype=bool)
    for c in cols:
        cs = c[o]
        with np.errstate(invalid="ignore"):
            first[1:] &= cs[1:] == cs[:-1]
    first[1:] = ~first[1:]  # a new shape where any key column differs from the row before (NaN: always)
    out = np.zeros_like(mask)
    out[rows[o[first]]] = True
    return out, order


@dataclass
class Resolved:
    """One op's compiled lookup plus where it came from."""

    grid: Grid | None
    source: str  # table stem / "sol" / "analytic"
    version: str | None = None
    kernel: str | None = None
    how: str = "exact"  # exact | multilinear | idw | sol | analytic | empirical
    donors: tuple = ()
    notes: tuple[str, ...] = ()
    fixed_prov: Prov | None = None

    def describe(self) -> dict:
        d = {"source": self.source, "how": self.how}
        if self.version:
            d["version"] = self.version
        if self.kernel:
            d["kernel"] = self.kernel
        if self.donors:
            d["donor_sites"] = [str(s) for s in self.donors]
        if self.notes:
            d["notes"] = list(self.notes)
        return d


@dataclass
class OpDB:
    """Per-op-family access to one PerfData, with per-process caches of site curves."""

    data: PerfData
    mode: DatabaseMode = DatabaseMode.SILICON
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def system(self):
        return self.data.system

    @property
    def backend(self) -> str:
        return self.data.backend

    def table_or_none(self, stem: str) -> Table | None:
        if self.mode is DatabaseMode.SOL:
            return None
        try:
            return self.data.table(stem)
        except NotAvailableError:
            if self.mode in (DatabaseMode.HYBRID, DatabaseMode.EMPIRICAL):
                return None
            raise

    def served_version(self, stem: str) -> str | None:
        loc = self.data.served.get(stem)
        return f"{loc.served_by}" + ("" if loc.how == "direct" else f" ({loc.how})") if loc else None

    def backfill_dbs(self) -> list[OpDB]:
        """OpDBs of the older collected versions of this system and backend, newest first: the
        versions :func:`infercast.data.versions.locate_table` backfills a missing table from,
        here offered for a shape missing from a table the chosen version does hold. SILICON mode
        only (HYBRID / EMPIRICAL answer a missing shape in their own way); none for a version
        that is itself a donor's."""
        if self.mode is not DatabaseMode.SILICON:
            return []
        return [OpDB.shared(d, self.mode) for d in self.data.older_versions()]

    def memo(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @classmethod
    def shared(cls, data: PerfData, mode: DatabaseMode = DatabaseMode.SILICON) -> OpDB:
        """One OpDB per (pack, system, backend, data version, mode) in this process, so that
        estimators of different parallel layouts build each table's site curves once (a search
        builds tens of them: 20 DeepSeek-R1 layouts on gb200 took 9.5 s, most of it the same
        lattices again). Everything it memoises is keyed by what it depends on, the kind of data
        included (a latency database and its energy reading, :mod:`infercast.engine.energy`, are
        two)."""
        key = (str(data.pack.systems_dir), data.system.name, str(data.system.data_dir), data.backend, data.version, mode,
               type(data).__name__)
        db = _SHARED.get(key)
        if db is None:
            db = _SHARED[key] = cls(data, mode)
        return db

    @staticmethod
    def release_shared() -> None:
        """Forget every :meth:`shared` instance (their memory is freed once no estimator holds
        them; estimators built later build them again, with the same values)."""
        _SHARED.clear()


#: :meth:`OpDB.shared`'s instances
_SHARED: dict[tuple, OpDB] = {}


def sol_resolved(axes: tuple, sol_fn, scales: tuple[str, ...] = (), notes: tuple[str, ...] = ()) -> Resolved:
    """SOL mode: the roofline on ``axes`` (1 or 2 curve axes), every cell marked ``sol``."""
    mesh = np.meshgrid(*axes, indexing="ij")
    v = np.asarray(sol_fn(*mesh), dtype=float)
    g = Grid(axes, v, np.full(v.shape, int(Prov.SOL), np.int8), sol_fn, scales=scales)
    return Resolved(g, "sol", how="sol", notes=tuple(notes))


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, axis=0, return_inverse=True)`` of a 2-D float array (the distinct rows in
    lexicographic order, and each row's index among them), by one lexsort rather than numpy's
    sort of the rows as structured records (several times slower)."""
    if a.ndim != 2 or a.shape[1] == 0 or len(a) == 0:
        uniq, inv = np.unique(a, axis=0, return_inverse=True)
        return uniq, inv.reshape(-1)
    o = np.lexsort(a.T[::-1])
    s = a[o]
    new = np.ones(len(o), dtype=bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    inv = np.empty(len(o), dtype=np.int64)
    inv[o] = np.cumsum(new) - 1
    return s[new], inv


def sites_and_curves(table: Table, mask: np.ndarray, site_cols: tuple[str, ...], curve_cols: tuple[str, ...]):
    """Group rows by site; return (site coords array, {site index: (axes, values, present mask)})."""
    keys = {c: table.keys[c][mask].astype(float) for c in site_cols + curve_cols}
    lat = table.latency[mask]
    site_arr = np.stack([keys[c] for c in site_cols], axis=1) if site_cols else np.zeros((len(lat), 0))
    uniq, inv = unique_rows(site_arr)
    n = len(uniq)
    curves = {}
    # per curve column, every site's distinct values at once (rows sorted by site, then value) and
    # each row's index among its site's values: what np.unique / searchsorted per site would give
    distinct, starts, rank = [], [], []
    for c in curve_cols:
        o = np.lexsort((keys[c], inv))
        kc, sc = keys[c][o], inv[o]
        new = np.ones(len(o), dtype=bool)
        new[1:] = (sc[1:] != sc[:-1]) | (kc[1:] != kc[:-1])
        st = np.searchsorted(sc[new], np.arange(n + 1))
        r = np.empty(len(o), dtype=np.int64)
        r[o] = np.cumsum(new) - 1 - st[sc]
        distinct.append(kc[new])
        starts.append(st.tolist())
        rank.append(r)
    if len(curve_cols) == 1:  # every site's curve in one flat array, despiked at once
        (d,), (st,), (r,) = distinct, starts, rank
        flat = np.full(len(d), np.nan)
        flat[np.asarray(st)[inv] + r] = lat  # site s's values at st[s] .. st[s + 1]
        flat = despike_flat(flat, np.asarray(st))
        for s in range(n):
            curves[s] = ((d[st[s]:st[s + 1]].copy(),), flat[st[s]:st[s + 1]].copy())
        return uniq, curves
    order = np.argsort(inv, kind="stable")  # each site's rows, in table order
    bounds = np.searchsorted(inv[order], np.arange(n + 1))
    for s in range(n):
        idx = order[bounds[s]:bounds[s + 1]]
        axes = tuple(d[st[s]:st[s + 1]].copy() for d, st in zip(distinct, starts))
        vals = np.full(tuple(len(a) for a in axes), np.nan)
        vals[tuple(r[idx] for r in rank)] = lat[idx]
        curves[s] = (axes, despike(vals))
    return uniq, curves


def despike_flat(flat: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """:func:`despike` of many 1-D curves laid end to end in ``flat`` (curve ``s`` at
    ``starts[s] .. starts[s + 1]``): a point is compared with its neighbours in its own curve only."""
    out = flat.copy()
    if len(out) < 3:
        return out
    mid, lo, hi = out[1:-1], out[:-2], out[2:]
    # the three points lie in one curve unless a curve starts at the middle one or the last one
    inside = np.ones(len(out), dtype=bool)
    inside[starts[:-1]] = False  # a curve's first point has no left neighbour
    inner = inside[1:-1] & inside[2:]
    with np.errstate(invalid="ignore"):
        spike = inner & (mid > SPIKE_RATIO * lo) & (mid > SPIKE_RATIO * hi)
    if spike.any():
        mid[spike] = 0.5 * (lo[spike] + hi[spike])
    return out


#: a measured point more than this many times above BOTH neighbours along a curve axis is a
#: spike (a disturbed run), not the kernel's behaviour: ~1% of the GEMM points on b200
#: vLLM/SGLang lie 1.5-6x above both neighbours (e.g. fp8 n=1536 k=65536: m=1 68 us, m=2 355 us,
#: m=3 58 us). Real steps (GEMM tile boundaries, m=256 -> 257) rise above one neighbour only.
SPIKE_RATIO = 1.5


def despike(vals: np.ndarray) -> np.ndarray:
    """Replace interior spikes along each axis by the mean of their two neighbours."""
    out = vals.copy()
    for ax in range(out.ndim):
        v = np.moveaxis(out, ax, 0)
        if v.shape[0] < 3:
            continue
        mid, lo, hi = v[1:-1], v[:-2], v[2:]
        with np.errstate(invalid="ignore"):
            spike = (mid > SPIKE_RATIO * lo) & (mid > SPIKE_RATIO * hi)
        if spike.any():
            mid[spike] = 0.5 * (lo[spike] + hi[spike])
    return out


def fill_missing(axes, vals, sol, transport: bool = False):
    """Fill truncated cells of a 2-D grid by holding utilisation from the nearest smaller batch
    (first axis) at the same length, else from the nearest shorter length. Returns (values, prov).

    ``transport=True`` (generation attention, ``ops.attention.FILL_TRANSPORT``): a cell filled
    from a smaller batch also takes the utilisation change between the two batches measured at the
    nearest shorter length where both were collected (``u(b, L) = u(b0, L) * u(b, L') / u(b0, L')``),
    capped at the grid's highest measured utilisation when it grows. Truncated corners are large
    batch x long length, where decode utilisation still climbs with the batch; holding it
    over-predicts. See docs/modelling-log.md, 'Generation attention corner fill'."""
    vals = vals.copy()
    prov = np.where(np.isnan(vals), int(Prov.HELD), int(Prov.EXACT)).astype(np.int8)
    if not np.isnan(vals).any():
        return vals, prov
    a0, a1 = axes
    measured = ~np.isnan(vals)
    if transport:
        with np.errstate(divide="ignore", invalid="ignore"):
            S = np.asarray(sol(*np.meshgrid(a0, a1, indexing="ij")), dtype=float) * np.ones(vals.shape)
            U = np.where(measured & (S > 0) & (vals > 0), S / vals, np.nan)
        plateau = np.nanmax(U) if np.isfinite(U).any() else np.nan
    for i, j in zip(*np.nonzero(~measured)):
        src = None
        rows = np.flatnonzero(measured[:i, j]) if i > 0 else []
        if len(rows):
            src = (rows[-1], j)
        else:
            cols = np.flatnonzero(measured[i, :])
            if len(cols):
                src = (i, cols[np.argmin(np.abs(cols - j))])
        if src is None:
            cols_any = np.argwhere(measured)
            src = tuple(cols_any[np.argmin(np.abs(cols_any - [i, j]).sum(axis=1))])
        si, sj = src
        f = 1.0
        if transport and si != i:
            both = np.flatnonzero(measured[i, :j] & measured[si, :j] & np.isfinite(U[i, :j]) & np.isfinite(U[si, :j]))
            if len(both) and np.isfinite(U[si, sj]):
                jj = both[-1]
                f = U[i, jj] / U[si, jj]
                if f > 1.0 and np.isfinite(plateau):
                    f = min(f, max(plateau / U[si, sj], 1.0))
        # sources are measured cells only, so filling in place never reads a filled cell
        vals[i, j] = vals[si, sj] * sol(a0[i], a1[j]) / sol(a0[si], a1[sj]) / f
    return vals, prov


def broadcast_named(**arrays) -> list[np.ndarray]:
    """``np.broadcast_arrays`` of the named arguments, or an :class:`InvalidInputError` naming
    their shapes when they do not broadcast together (numpy's ValueError would reach the caller
    untyped)."""
    try:
        return np.broadcast_arrays(*arrays.values())
    except ValueError:
        shapes = ", ".join(f"{k} {np.shape(a)}" for k, a in arrays.items())
        raise InvalidInputError("the array arguments do not broadcast to one shape", shapes) from None


def as_numbers(name: str, arr) -> np.ndarray:
    """``arr`` as a float array, or an :class:`InvalidInputError` when it holds something that is
    not a number (a string, None, ...)."""
    try:
        return np.asarray(arr, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be numbers", f"got {arr!r}") from None


def shown(a: np.ndarray, picked: np.ndarray | None = None) -> str:
    """The offending values of ``a`` (``picked``, default all) for an error message: a plain number
    when ``a`` is a scalar ("0", "nan"), else a list of at most three ("[0, -1]")."""
    vals = [f"{v:g}" for v in np.ravel(a if picked is None else picked)[:3].tolist()]
    return vals[0] if np.ndim(a) == 0 and vals else "[" + ", ".join(vals) + "]"


def check_positive(name: str, arr, upper: float | None = None) -> np.ndarray:
    a = as_numbers(name, arr)
    if a.size == 0:
        raise InvalidInputError(f"{name} is empty")
    if not np.all(np.isfinite(a)):
        raise InvalidInputError(f"{name} must be finite", f"got {shown(a, a[~np.isfinite(a)])}")
    if np.any(a <= 0):
        raise InvalidInputError(f"{name} must be > 0", f"got {shown(a, a[a <= 0])}")
    if upper is not None and np.any(a > upper):
        raise InvalidInputError(f"{name} is absurdly large", f"got {a.max():.0f}, the limit is {upper:.0f}")
    return a
