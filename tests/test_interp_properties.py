"""Property tests for the interpolation layer (infercast.interp.grid / .transfer).

tests/test_interp.py already pins exact hits (bit for bit), the between-neighbours bound and the
analytic blends; this file checks properties over hypothesis-generated grids, queries and site sets:

1. monotone in, monotone out: a curve measured non-decreasing along an axis interpolates
   non-decreasing along it (1-D and 2-D, linear and log axes), and so does the held region beyond
   the grid when the SOL function is non-decreasing;
2. determinism: repeated calls, concurrent threads (chunks of one query array, cold PerfDB caches)
   and BLAS/OpenMP thread counts in a subprocess all give bit-identical floats;
3. ``Grid.__call__`` and ``Grid.scalar`` agree (1e-12 relative) everywhere, held region included;
4. ``choose_sites`` returns None or a normalised, non-negative choice that respects its gates, and a
   SILICON PerfDB raises the typed NotAvailableError beyond the gates instead of a number;
5. ``choose_sites`` does not depend on the order of the sites.

Each property was checked to fail against a deliberately broken scratch copy of src/ (noted at
each test as "Fails if ..."). Every hypothesis run is derandomised (no example database).

Three defects the properties found in the first beyond-range edge rule are pinned at the end of
the file as minimal reproducers: two fixed (plain tests), one a known limitation (strict xfail).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import synthpack as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infercast
from infercast import PerfDB
from infercast.errors import NotAvailableError
from infercast.interp.grid import LINEAR, LOG, TILE, BeyondRangeError, Grid
from infercast.interp.transfer import DEFAULT_BEYOND_GATE, DEFAULT_GATE, choose_sites

PROPS = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
FEW = settings(PROPS, max_examples=25)

SCALES = st.sampled_from((LINEAR, LOG))
RTOL = 1e-12


# ---------------------------------------------------------------------------------------------
# strategies and helpers
# ---------------------------------------------------------------------------------------------
@st.composite
def axes_st(draw, min_size=1, max_size=6):
    """A positive, strictly increasing axis, neighbours at least 0.1 octave (7%) apart.

    Closer knots make axes whose whole span is a few percent, where the edge growth exponent
    (measured over the span) reaches the hundreds; that pathology has its own test at the end."""
    x0 = draw(st.floats(0.05, 500.0))
    steps = draw(st.lists(st.floats(0.1, 4.0), min_size=min_size - 1, max_size=max_size - 1))
    return x0 * np.exp2(np.concatenate([[0.0], np.cumsum(steps)]))


def _floats(draw, n, lo, hi, zero=False):
    elem = st.one_of(st.just(0.0), st.floats(lo, hi)) if zero else st.floats(lo, hi)
    return np.array(draw(st.lists(elem, min_size=n, max_size=n)), dtype=float)


@st.composite
def monotone_values(draw, shape, axis):
    """Positive values, non-decreasing along ``axis`` (plateaus included), arbitrary across it."""
    n = int(np.prod(shape))
    base = _floats(draw, n, 1e-3, 1e3).reshape(shape)
    inc = _floats(draw, n, 0.0, 1e3, zero=True).reshape(shape)
    return np.take(base, [0], axis=axis) + np.cumsum(inc, axis=axis)


@st.composite
def monotone_sol(draw, ndim, separable):
    """A positive SOL function non-decreasing in every coordinate (numpy arrays or floats)."""
    c = draw(st.lists(st.floats(1e-3, 10.0), min_size=4, max_size=4))
    p = draw(st.lists(st.floats(0.0, 2.5), min_size=2, max_size=2))
    if ndim == 1:
        return lambda a: c[0] + c[1] * np.asarray(a, float) ** p[0]
    if separable:
        return lambda a, b: (c[0] + c[1] * np.asarray(a, float) ** p[0]) * (c[2] + c[3] * np.asarray(b, float) ** p[1])
    return lambda a, b: c[0] + c[1] * np.asarray(a, float) ** p[0] * np.asarray(b, float) ** p[1] + c[2] * np.asarray(b, float)


@st.composite
def any_sol(draw, ndim):
    """A positive SOL function, not necessarily monotone."""
    c = draw(st.lists(st.floats(1e-3, 10.0), min_size=3, max_size=3))
    p = draw(st.lists(st.floats(-1.0, 2.5), min_size=2, max_size=2))
    if ndim == 1:
        return lambda a: c[0] + c[1] * np.asarray(a, float) ** p[0]
    return lambda a, b: c[0] + c[1] * np.asarray(a, float) ** p[0] + c[2] * np.asarray(b, float) ** p[1]


@st.composite
def grids(draw, ndim=None, zeros=False):
    """A random 1-D or 2-D grid with per-axis scales, random provenance and a positive SOL."""
    ndim = draw(st.sampled_from((1, 2))) if ndim is None else ndim
    axes = tuple(draw(st.one_of(axes_st(min_size=2), axes_st(min_size=2), axes_st())) for _ in range(ndim))
    shape = tuple(len(a) for a in axes)
    n = int(np.prod(shape))
    vals = _floats(draw, n, 1e-3, 1e3, zero=zeros).reshape(shape)
    prov = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int8).reshape(shape)
    scales = tuple(draw(SCALES) for _ in range(ndim))
    return Grid(axes, vals, prov, draw(any_sol(ndim)), scales=scales)


def _probe_points(draw, axis, lo, hi, n_max=40):
    """Sorted unique points in [lo, hi]: random ones, the knots, and the floats next to each knot."""
    f = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=n_max)))
    q = lo * (hi / lo) ** f
    knots = np.concatenate([axis, np.nextafter(axis, -np.inf), np.nextafter(axis, np.inf)])
    return np.unique(np.clip(np.concatenate([q, knots, [lo, hi]]), lo, hi))


def _queries(draw, axis, n_max=30, spread=64.0):
    """Points on the knots, between them, and up to ``spread`` times beyond either end."""
    knots = st.sampled_from(axis.tolist())
    inside = st.floats(axis[0], axis[-1])
    anywhere = st.floats(axis[0] / spread, axis[-1] * spread)
    return np.array(draw(st.lists(st.one_of(knots, inside, inside, anywhere), min_size=1, max_size=n_max)))


def assert_nondecreasing(q, v, rtol=RTOL):
    d = np.diff(v)
    bad = np.flatnonzero(d < -rtol * np.maximum(np.abs(v[:-1]), np.abs(v[1:])))
    assert not len(bad), f"decreases at q={q[bad[0]]!r}->{q[bad[0] + 1]!r}: {v[bad[0]]!r}->{v[bad[0] + 1]!r}"


def _along(grid, axis, q, other):
    """Evaluate ``grid`` at ``q`` along ``axis``, the other coordinate (2-D) fixed at ``other``."""
    if len(grid.axes) == 1:
        return grid(q)[0]
    return grid(q, other)[0] if axis == 0 else grid(other, q)[0]


# ---------------------------------------------------------------------------------------------
# 1. monotone along a monotone axis (inside the grid, and in the held region)
# ---------------------------------------------------------------------------------------------
# Fails if (each checked on a scratch copy of src/): a blend is not monotone in t (``v1 * t * t`` in
# the linear blend, ``np.power(v1, t * t)`` in the geometric one) or the 2-D blend takes its two
# rows in the wrong order.
@PROPS
@given(data=st.data(), ndim=st.sampled_from((1, 2)), axis=st.sampled_from((0, 1)))
def test_monotone_inside_the_grid(data, ndim, axis):
    axis = min(axis, ndim - 1)
    axes = tuple(data.draw(axes_st()) for _ in range(ndim))
    scales = tuple(data.draw(SCALES) for _ in range(ndim))
    vals = data.draw(monotone_values(tuple(len(a) for a in axes), axis))
    g = Grid(axes, vals, np.zeros(vals.shape, np.int8), None, scales=scales)  # no SOL: nothing may be held
    ax = axes[axis]
    q = _probe_points(data.draw, ax, ax[0], ax[-1])
    other = None
    if ndim == 2:
        oa = axes[1 - axis]
        other = oa[0] * (oa[-1] / oa[0]) ** data.draw(st.floats(0.0, 1.0))  # anywhere inside the other axis
        other = float(np.clip(other, oa[0], oa[-1]))
    assert_nondecreasing(q, _along(g, axis, q, other))


# Beyond the high edge (the edge rule of interp/grid.py: utilisation held, or still climbing at the
# damped edge rate up to a plateau) the latency stays non-decreasing for SOL functions of the
# roofline kind (a constant plus power terms: log-convex, their log-slope only grows outwards).
# The other coordinate (2-D) stays inside its axis: see the strict xfail at the end of the file for
# curves extrapolated at different rates, which may cross beyond the edge. Fails if (checked) the hold ratio is
# inverted (``sol(clamped) / sol(q)``), a blend is not monotone in t, or a climbing edge climbs
# faster than measured (damping 4.0 instead of 0.5 on ``g_hi``).
@PROPS
@given(data=st.data(), ndim=st.sampled_from((1, 2)), axis=st.sampled_from((0, 1)))
def test_monotone_through_the_held_region_above(data, ndim, axis):
    axis = min(axis, ndim - 1)
    axes = tuple(data.draw(axes_st()) for _ in range(ndim))
    scales = tuple(data.draw(SCALES) for _ in range(ndim))
    vals = data.draw(monotone_values(tuple(len(a) for a in axes), axis))
    sol = data.draw(monotone_sol(ndim, separable=data.draw(st.booleans())))
    g = Grid(axes, vals, np.zeros(vals.shape, np.int8), sol, scales=scales)
    ax = axes[axis]
    q = _probe_points(data.draw, ax, ax[0], ax[-1] * 100.0)
    other = None
    if ndim == 2:
        oa = axes[1 - axis]
        other = float(np.clip(oa[0] * (oa[-1] / oa[0]) ** data.draw(st.floats(0.0, 1.0)), oa[0], oa[-1]))
    v = _along(g, axis, q, other)
    assert np.all(np.isfinite(v)) and np.all(v > 0)
    assert_nondecreasing(q, v)


# A tile axis (GEMM m) on the collection lattice (1..16, (a, a+1) pairs every 16 rows to 256, then
# every 256) with random points missing: still monotone in, monotone out (filled holes included,
# up to 100x beyond the edge), and the scalar path agrees. Fails if a filled hole is not clipped
# to its neighbours or the robust knots reorder a monotone curve.
def _tile_lattice():
    small = np.arange(1.0, 17.0)
    pairs = [a + d for a in [*range(16, 257, 16), *range(512, 4353, 256)] for d in (0.0, 1.0)]
    return np.concatenate([small, pairs, [8192.0, 16384.0]])


@PROPS
@given(data=st.data())
def test_tile_axis_monotone_with_holes_and_scalar_agrees(data):
    full = _tile_lattice()
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(full), max_size=len(full))))
    keep[[0, -1]] = True
    x = full[keep | (np.arange(len(full)) % 3 == 0)]
    vals = data.draw(monotone_values((len(x),), 0))
    sol = data.draw(monotone_sol(1, separable=False))
    g = Grid((x,), vals, np.zeros(len(x), np.int8), sol, scales=(TILE,))
    q = _probe_points(data.draw, x, x[0], x[-1] * 100.0)
    q = np.unique(np.concatenate([q, np.arange(1.0, 4400.0)]))
    v = g(q)[0]
    assert np.all(np.isfinite(v)) and np.all(v > 0)
    assert_nondecreasing(q, v)
    for qq in q[:: max(len(q) // 200, 1)]:
        assert g.scalar(float(qq))[0] == pytest.approx(float(g(qq)[0]), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# 2. identical results across runs and thread counts
# ---------------------------------------------------------------------------------------------
def _query_arrays(data, g, n_max=30):
    qs = [_queries(data.draw, a, n_max) for a in g.axes]
    if len(qs) == 2:  # pair every a with every b: a mesh of in-range, held and exact-hit queries
        return tuple(m.ravel() for m in np.meshgrid(*qs, indexing="ij"))
    return tuple(qs)


# Fails if: the result depends on anything but the query (e.g. noise, or state kept on the grid
# between calls).
@PROPS
@given(data=st.data(), g=grids())
def test_same_queries_twice_bit_identical(data, g):
    q = _query_arrays(data, g)
    v1, p1 = g(*q)
    v2, p2 = g(*q)
    assert v1.tobytes() == v2.tobytes() and p1.tobytes() == p2.tobytes()
    s1 = [g.scalar(*c) for c in zip(*q)]
    s2 = [g.scalar(*c) for c in zip(*q)]
    assert repr(s1) == repr(s2)


# Fails if (checked): __call__ keeps intermediates on the instance (``v`` stored on ``self`` and
# read back after a sleep), the lazily computed edge parameters are published before they are
# ready, or the value of one query depends on the size of the rest of its array.
@FEW
@given(data=st.data(), g=grids(), n_chunks=st.integers(2, 9))
def test_threaded_chunks_match_one_serial_call(data, g, n_chunks):
    q = _query_arrays(data, g, n_max=40)
    bounds = np.linspace(0, len(q[0]), n_chunks + 1).astype(int)
    chunks = [tuple(c[lo:hi] for c in q) for lo, hi in itertools.pairwise(bounds)]
    with ThreadPoolExecutor(4) as ex:
        # the threads go first, on a cold grid (its edge parameters are computed lazily)
        cold = list(ex.map(lambda c: g(*c), chunks))
        cold_scalar = list(ex.map(lambda c: g.scalar(*c), zip(*q)))
        twin = Grid(g.axes, g.values, g.prov, g.sol, scales=g.scales)  # a fresh grid, evaluated serially
        v, p = twin(*q)
        want_scalar = repr([twin.scalar(*c) for c in zip(*q)])
        for parts, scal in ((cold, cold_scalar), (list(ex.map(lambda c: g(*c), chunks)), list(ex.map(lambda c: g.scalar(*c), zip(*q))))):
            assert np.concatenate([x for x, _ in parts]).tobytes() == v.tobytes()
            assert np.concatenate([x for _, x in parts]).tobytes() == p.tobytes()
            assert repr(scal) == want_scalar


def _perfdb_queries(db):
    """A fixed mix of exact, interpolated, transferred and held PerfDB queries; the float results."""
    m = np.array([1.0, 3.0, 100.0, 4096.0, 9000.0])
    out = []
    for n, k in ((256, 512), (384, 512), (3000, 700), (96, 4096)):
        out.append(db.gemm("fp8_block", m, n, k).ms)
    out.append(db.context_attention([1, 3, 16], [100, 700, 3000], heads=8, kv_heads=2, head_dim=32).ms)
    out.append(db.generation_attention([1, 7, 300], [9, 500, 5000], heads=4, kv_heads=1, head_dim=32).ms)
    out.append(db.collective("all_reduce", [1000.0, 2.0**26], 4).ms)
    return [float(x) for a in out for x in np.ravel(a)]


# Fails if: the per-site caches of PerfDB/OpDB are not safe to fill from several threads at once
# (checked with a cache that publishes a placeholder before building the entry).
def test_perfdb_concurrent_cold_cache_matches_serial(synth):
    want = _perfdb_queries(PerfDB(sp.SYSTEM, "trtllm", systems_path=synth.systems_dir))
    shared = PerfDB(sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)  # cold caches, shared by 4 threads
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: _perfdb_queries(shared), range(8)))
    for g in got:
        assert repr(g) == repr(want)


_THREADS_SCRIPT = r"""
import sys
import numpy as np
from infercast import PerfDB
from infercast.interp.grid import Grid
from infercast.interp.transfer import choose_sites

a0 = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 64.0])
a1 = np.array([16.0, 64.0, 256.0, 1024.0])
A, B = np.meshgrid(a0, a1, indexing="ij")
sol = lambda a, b: 1e-3 + 1e-6 * np.asarray(a, float) * np.asarray(b, float) ** 1.5
vals = sol(A, B) / (0.2 + 0.7 * A / (A + 8.0))
for scales in (("linear", "log"), ("log", "log"), ("linear", "linear")):
    g = Grid((a0, a1), vals, np.zeros(vals.shape, np.int8), sol, scales=scales)
    qa, qb = np.meshgrid(np.geomspace(0.3, 300.0, 41), np.geomspace(3.0, 9000.0, 29), indexing="ij")
    v, p = g(qa, qb)
    print(repr(v.ravel().tolist()), repr(p.ravel().tolist()))
    print(repr([g.scalar(a, b) for a, b in zip(qa.ravel()[::7].tolist(), qb.ravel()[::7].tolist())]))
lattice = np.array([(n, k) for n in (64.0, 128.0, 512.0, 2048.0) for k in (64.0, 256.0, 1024.0)])
for q in ((100.0, 100.0), (300.0, 3000.0), (5000.0, 70.0), (1000.0, 1000.0)):
    print(repr(choose_sites(q, lattice[:-1])))
db = PerfDB(sys.argv[1], "trtllm", systems_path=sys.argv[2])
for n, k in ((256, 512), (384, 512), (3000, 700)):
    print(repr(db.gemm("fp8_block", [1.0, 3.0, 100.0, 9000.0], n, k).ms.tolist()))
print(repr(db.context_attention([1, 3, 16], [100, 700, 3000], heads=8, kv_heads=2, head_dim=32).ms.tolist()))
"""

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# Fails if: any result depends on the BLAS/OpenMP thread count (checked by folding
# ``OMP_NUM_THREADS`` into the held ratio in a scratch copy of src/).
def test_results_identical_under_1_and_2_blas_threads(synth):
    src_dir = str(Path(infercast.__file__).resolve().parents[1])  # the same infercast as this process
    procs = {}
    for threads in ("1", "2"):
        env = dict(os.environ, **{v: threads for v in _THREAD_VARS})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src_dir, os.environ.get("PYTHONPATH")) if p)
        env.pop("INFERCAST_SYSTEMS_PATH", None)
        procs[threads] = subprocess.Popen(
            [sys.executable, "-c", _THREADS_SCRIPT, sp.SYSTEM, str(synth.systems_dir)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    out = {}
    for threads, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out[threads] = stdout
    assert out["1"].count("\n") == 14
    assert out["1"] == out["2"]


# ---------------------------------------------------------------------------------------------
# 3. vectorised __call__ and the plain-Python .scalar() agree, held region included
# ---------------------------------------------------------------------------------------------
def _refuses(fn, coords) -> bool:
    try:
        fn(*coords, refuse=True)
    except BeyondRangeError:
        return True
    return False


# Fails if either path changes on its own, e.g. (checked) the linear blend, the hold ratio, the
# provenance of held cells, ``t`` measured from the first knot instead of the cell's left one, the
# scalar 2-D blend using the wrong axis' weight, the scalar edge climb without its plateau cap, the
# vectorised edge parameters not blended along the other axis, or the scalar refusing later.
@PROPS
@given(data=st.data(), g=grids(zeros=True))
def test_scalar_agrees_with_vectorised(data, g):
    q = _query_arrays(data, g, n_max=12)
    v, p = g(*q)
    for i, c in enumerate(zip(*q)):
        sv, sp_ = g.scalar(*c)
        assert isinstance(sv, float) and isinstance(sp_, int)
        assert abs(sv - v[i]) <= RTOL * max(abs(sv), abs(v[i])), (c, sv, v[i])
        assert sp_ == int(p[i]), (c, sp_, int(p[i]))
        # a scalar through __call__ is the same as that element of the array call
        v1, p1 = g(*c)
        assert float(v1) == v[i] and int(p1) == int(p[i])
        # refuse=True (what PerfDB and the engine pass): both paths refuse, or neither does
        refused = [_refuses(g, c), _refuses(g.scalar, c)]
        assert refused[0] == refused[1], (c, refused)


# ---------------------------------------------------------------------------------------------
# 4./5. choose_sites: normalised, within its gates, order-independent; SILICON raises beyond
# ---------------------------------------------------------------------------------------------
@st.composite
def lattice_sites(draw, ndim):
    """A random log2 lattice (some cells missing, some duplicated, a few sites off it) and a query
    mostly strictly inside it (multilinear, or IDW where a corner is missing), sometimes outside."""
    levels = [sorted(draw(st.lists(st.integers(0, 12), min_size=2, max_size=4, unique=True))) for _ in range(ndim)]
    cells = [tuple(2.0**e for e in c) for c in itertools.product(*levels)]
    drop = draw(st.sets(st.sampled_from(range(len(cells))), max_size=len(cells) - 1))  # empty: a full lattice
    pts = [c for i, c in enumerate(cells) if i not in drop]
    pts += draw(st.lists(st.sampled_from(pts), max_size=3))  # duplicated sites
    pts += draw(st.lists(st.tuples(*[st.floats(1.0, 4096.0)] * ndim), max_size=2))  # off the lattice

    def coord(lv):  # log2 coordinate
        inside = st.floats(lv[0], lv[-1], exclude_min=True, exclude_max=True)
        near = st.floats(lv[0] - 5.0, lv[-1] + 5.0)
        return st.one_of(inside, inside, inside, near, st.sampled_from(lv)).map(lambda e: 2.0**e)

    if draw(st.integers(0, 9)) == 9:
        return np.array(draw(st.sampled_from(pts)), float), np.array(pts, float)  # an exact hit
    return np.array([draw(coord(lv)) for lv in levels], float), np.array(pts, float)


@st.composite
def scattered_sites(draw, ndim):
    """Sites scattered on integer log2 points (bracketing corners mostly missing: IDW) and a query on
    integer or half-integer log2 points, so that distance ties, duplicates and the k cut-off meet."""
    point = st.tuples(*[st.integers(0, 8)] * ndim)
    pts = draw(st.lists(point, min_size=2, max_size=10))
    query = draw(st.tuples(*[st.integers(-4, 20)] * ndim))
    return np.exp2(np.array(query, float) / 2.0), np.exp2(np.array(pts, float))


@st.composite
def tied_sites(draw, ndim):
    """Sites at equal log2 distances either side of the query along its axes (a cross around it,
    the query itself not a site; ``ndim`` >= 2): ties in IDW distance the k cut-off has to break."""
    centre = np.array(draw(st.tuples(*[st.integers(4, 8)] * ndim)), float)
    # arms along at least two axes, so that no axis brackets the query: no multilinear corners
    arms = [(0, draw(st.integers(1, 3))), (1, draw(st.integers(1, 3)))]
    arms += draw(st.lists(st.tuples(st.integers(0, ndim - 1), st.integers(1, 3)), max_size=4))
    pts = [centre + sign * r * np.eye(ndim)[d] for d, r in arms for sign in (1.0, -1.0)]
    pts += [np.array(p, float) for p in draw(st.lists(st.tuples(*[st.integers(0, 12)] * ndim), max_size=3))]
    pts = [p for p in pts if not np.array_equal(p, centre)]
    return np.exp2(centre), np.exp2(np.array(pts))


@st.composite
def site_sets(draw):
    """A query, sites (1-3 coordinates) and random gates, k and per-coordinate distance weights."""
    ndim = draw(st.integers(1, 3))
    layouts = [lattice_sites(ndim), scattered_sites(ndim)] + ([tied_sites(ndim)] if ndim > 1 else [])
    query, sites = draw(st.one_of(*layouts))
    opts = {
        "gate": draw(st.one_of(st.just(DEFAULT_GATE), st.floats(0.25, 6.0))),
        "beyond_gate": draw(st.one_of(st.just(DEFAULT_BEYOND_GATE), st.floats(0.0, 4.0))),
        "k": draw(st.one_of(st.just(4), st.integers(1, 6))),
        "weights": draw(st.one_of(st.none(), st.tuples(*[st.sampled_from((0.5, 1.0, 2.0))] * ndim), st.tuples(*[st.floats(0.1, 3.0)] * ndim))),
    }
    return query, sites, opts


def _log_geometry(query, sites, weights):
    """Clamped query, weighted clamp distance and weighted distance of every site, in log2 space."""
    w = 1.0 if weights is None else np.asarray(weights, float)
    lq, ls = np.log2(query), np.log2(sites)
    lqc = np.clip(lq, ls.min(axis=0), ls.max(axis=0))
    return ls, lqc, float(np.linalg.norm((lq - lqc) * w)), np.linalg.norm((ls - lqc) * w, axis=1)


# Fails if (checked): the IDW gate is loosened (``dist <= 2 * gate``), the weights are 1/d instead
# of 1/d^2 or not normalised, beyond_gate is not applied, or complete bracketing corners are ignored.
#
# Note what "within the gate" means here (by design, transfer.py docstring steps 2-4): the gate
# bounds the IDW donors only. Multilinear corners bracket the (clamped) query at whatever distance
# the lattice spacing puts them (sites 1 and 1024 answer 32 from 5 log2 units each), and a query
# up to ``beyond_gate`` (2.0) outside the hull is answered from the hull even when every site is
# further than ``gate`` (1.5) away. So the check for multilinear choices is "bracketing corners
# that reproduce the clamped query", and None is only allowed when both gates fail.
@settings(PROPS, max_examples=100)
@given(case=site_sets())
def test_choose_sites_normalised_and_within_gates(case):
    query, sites, opts = case
    ch = choose_sites(query, sites, **opts)
    ls, lqc, clamp, dist = _log_geometry(query, sites, opts["weights"])
    eps = 1e-9
    if ch is None:
        assert clamp > opts["beyond_gate"] - eps or dist.min() > opts["gate"] - eps
        return
    idx, w = np.array(ch.indices), np.array(ch.weights)
    assert len(idx) == len(w) >= 1 and len(set(ch.indices)) == len(idx)
    assert np.all((idx >= 0) & (idx < len(sites)))
    assert np.all(np.isfinite(w)) and np.all(w >= 0.0)
    assert abs(w.sum() - 1.0) <= 1e-12
    assert ch.clamp_distance <= opts["beyond_gate"] and ch.clamp_distance == pytest.approx(clamp, abs=1e-12)
    if ch.how == "exact":
        assert np.array_equal(sites[idx[0]], query) and ch.weights == (1.0,)
    elif ch.how == "idw":
        assert len(idx) <= opts["k"]
        assert np.all(dist[idx] <= opts["gate"] * (1 + 1e-12))  # every donor within the gate
        others = np.setdiff1d(np.arange(len(sites)), idx)
        if len(others):  # the nearest ones: nobody left out is closer than a chosen donor
            assert dist[others].min() >= dist[idx].max() - eps
            if len(idx) < opts["k"]:
                assert np.all(dist[others] > opts["gate"])
        np.testing.assert_allclose(w * dist[idx] ** 2, np.full(len(w), w[0] * dist[idx[0]] ** 2), rtol=1e-9)
    else:
        assert ch.how == ("multilinear" if clamp == 0.0 else "multilinear-held")
        for d in range(ls.shape[1]):  # each corner brackets the clamped query on every axis
            levels = np.unique(ls[:, d])
            lo, hi = levels[levels <= lqc[d]].max(), levels[levels >= lqc[d]].min()
            assert set(ls[idx, d].tolist()) <= {lo, hi}
        np.testing.assert_allclose(w @ ls[idx], lqc, rtol=0, atol=1e-9)  # the blend reproduces the query


def _same_choice_after_permutation(query, sites, opts, perm):
    a = choose_sites(query, sites, **opts)
    b = choose_sites(query, sites[perm], **opts)
    assert (a is None) == (b is None)
    if a is None:
        return None
    assert (a.how, a.clamp_distance) == (b.how, b.clamp_distance)
    pa = sorted((tuple(sites[i].tolist()), w) for i, w in zip(a.indices, a.weights))
    pb = sorted((tuple(sites[perm][i].tolist()), w) for i, w in zip(b.indices, b.weights))
    assert pa == pb  # same donor coordinates, bit-identical weights
    return a


# Fails if: the choice depends on the position of a site (checked: IDW ties broken by position, or
# the multilinear path disabled so that position-ordered IDW answers instead).
@settings(PROPS, max_examples=100)
@given(case=site_sets(), data=st.data())
def test_choose_sites_independent_of_site_order(case, data):
    query, sites, opts = case
    _same_choice_after_permutation(query, sites, opts, np.array(data.draw(st.permutations(range(len(sites))))))


# The same on crosses of equidistant sites with k smaller than the number of ties, so the cut-off
# falls inside a tie. Fails if ties are broken by site order (``np.argsort(dist, kind="stable")``
# instead of the coordinate lexsort).
@PROPS
@given(ndim=st.integers(2, 3), k=st.integers(1, 3), data=st.data())
def test_choose_sites_ties_independent_of_site_order(ndim, k, data):
    query, sites = data.draw(tied_sites(ndim))
    perm = np.array(data.draw(st.permutations(range(len(sites)))))
    ch = _same_choice_after_permutation(query, sites, {"gate": 4.0, "k": k}, perm)
    assert ch is not None and ch.how == "idw"


@pytest.fixture(scope="module")
def silicon_db(synth):
    return PerfDB(sp.SYSTEM, "trtllm", database_mode="SILICON", systems_path=synth.systems_dir)


GEMM_LATTICE = np.array(list(itertools.product(sp.GEMM_NK, sp.GEMM_NK)), dtype=float)


# Fails if: resolve_gemm answers beyond the gates (checked: ``choose_sites(..., beyond_gate=10)`` in
# ops/gemm.py, or no beyond_gate in choose_sites) or the error is untyped.
@FEW
@given(
    n_exp=st.one_of(st.floats(4.0, 13.0), st.floats(0.0, 17.0)),
    k_exp=st.one_of(st.floats(4.0, 13.0), st.floats(0.0, 17.0)),
    m=st.lists(st.integers(1, 20000), min_size=1, max_size=4),
    quant=st.sampled_from(sp.GEMM_DTYPES),
)
def test_silicon_gemm_beyond_the_gates_raises_not_available(silicon_db, n_exp, k_exp, m, quant):
    n, k = max(1, round(2.0**n_exp)), max(1, round(2.0**k_exp))
    q = np.array([n, k], float)
    _, _, clamp, _ = _log_geometry(q, GEMM_LATTICE, None)
    if clamp > DEFAULT_BEYOND_GATE:
        # further than the gate from every collected site (the clamp distance bounds them all)
        assert np.linalg.norm(np.log2(GEMM_LATTICE) - np.log2(q), axis=1).min() > DEFAULT_GATE
        assert choose_sites((n, k), GEMM_LATTICE) is None
        with pytest.raises(NotAvailableError):
            silicon_db.gemm(quant, m, n, k)
    else:  # the dense synthetic lattice answers everything up to beyond_gate outside its hull
        r = silicon_db.gemm(quant, m, n, k)
        assert np.all(np.isfinite(r.ms)) and np.all(r.ms > 0)


def test_silicon_gemm_far_queries_examples(silicon_db):
    """The hypothesis test above, pinned at a few shapes well outside the (n, k) lattice."""
    hi, lo = max(sp.GEMM_NK), min(sp.GEMM_NK)
    for n, k in ((hi * 8, 512), (512, hi * 5), (lo // 8, 512), (lo // 8, hi * 8), (1, 1)):
        with pytest.raises(NotAvailableError):
            silicon_db.gemm("fp8_block", [1, 64], n, k)


# ---------------------------------------------------------------------------------------------
# Defects the properties above found in the first edge rule (commit c17426e), pinned as minimal
# reproducers. The first and third are fixed (the low edge scales the SOL ratio by an exponent in
# [0, 1]; the high-edge climb is capped in log space); the second is a known limitation, kept as a
# strict xfail so that a fix shows up.
# ---------------------------------------------------------------------------------------------
def test_low_edge_latency_never_rises_as_the_shape_shrinks():
    # Launch-bound first octave (flat latency) under a roofline with a fixed cost: the first rule
    # divided by (q / x0) ** g while SOL flattened, giving 0.99 at q = 0.5, 2.3 at 0.1, 10.5 at 0.01
    # against 1.0 measured at 1.
    g = Grid((np.array([1.0, 2.0]),), np.array([1.0, 1.0]), np.zeros(2, np.int8), lambda x: 1.0 + np.asarray(x, float) ** 2)
    q = np.array([0.01, 0.1, 0.5, 1.0])
    assert_nondecreasing(q, g(q)[0])
    assert np.all(g(q)[0] <= 1.0)
    assert [g.scalar(x)[0] for x in q] == pytest.approx(g(q)[0].tolist(), rel=RTOL)


@pytest.mark.xfail(strict=True, reason="2-D high edge: per-curve climb and cap reverse the order of the measured curves")
def test_known_defect_held_2d_edge_reverses_measured_order():
    # Latency is non-decreasing in a on every measured column (b = 1, 2), SOL = a * b. Beyond the
    # b edge each a-curve extrapolates with its own exponent and plateau cap: a = 1 is saturated
    # (u = 2, held), a = 2 still climbs (u 1 -> 1.6) up to the a = 64 plateau (u = 10, cap 6.25).
    # At b = 32 (16x beyond) a = 2 answers 15.6 < 16.0 for a = 1; at b = 2048, 410 < 1024.
    a0, a1 = np.array([1.0, 2.0, 64.0]), np.array([1.0, 2.0])
    u = np.array([[2.0, 2.0], [1.0, 1.6], [10.0, 10.0]])
    A, B = np.meshgrid(a0, a1, indexing="ij")
    g = Grid((a0, a1), A * B / u, np.zeros(u.shape, np.int8), lambda a, b: np.asarray(a, float) * np.asarray(b, float))
    assert np.all(np.diff(g.values, axis=0) >= 0)
    q = np.array([1.0, 2.0])
    for b in (32.0, 2048.0):
        assert_nondecreasing(q, g(q, b)[0])


def test_scalar_survives_a_steep_edge():
    # An axis spanning under one octave measures the edge exponent over the whole span (here
    # log(1e4) / log(1.008) ~ 1150 before clipping to the roofline's slope); the first rule's
    # scalar() computed r ** g_hi in Python floats and raised OverflowError.
    g = Grid((np.array([0.5, 0.504]),), np.array([1.0, 1e-4]), np.zeros(2, np.int8), lambda x: 1.0 + 0.0 * np.asarray(x, float))
    with np.errstate(over="ignore"):
        v, p = g(2.0)
    assert g.scalar(2.0) == (pytest.approx(float(v), rel=RTOL), int(p))
