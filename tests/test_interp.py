"""Interpolation grids and off-site transfer (infercast.interp), checked against analytic forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infercast.errors import NotAvailableError
from infercast.interp import grid as grid_mod
from infercast.interp.grid import BeyondRangeError, Grid
from infercast.interp.provenance import Prov, worst
from infercast.interp.transfer import choose_sites, transfer_grid

HYP = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _grid1(xs, vs, sol=None, prov=None, scale="log"):
    xs = np.asarray(xs, float)
    prov = np.zeros(len(xs), np.int8) if prov is None else np.asarray(prov, np.int8)
    return Grid((xs,), np.asarray(vs, float), prov, sol, scales=(scale,))


# ---------------------------------------------------------------------------------------------
# Grid: exact hits, power-law blend, monotonicity, clamping
# ---------------------------------------------------------------------------------------------
def test_exact_hits_bit_for_bit_1d():
    xs = [1.0, 2.0, 4.0, 8.0, 16.0]
    vs = [0.1 + 1e-17, 0.123456789012345, 0.3, 0.7, 1.9]
    g = _grid1(xs, vs)
    v, p = g(np.array(xs))
    assert v.tolist() == vs  # exact equality, not approx
    assert p.tolist() == [Prov.EXACT] * 5
    for x, want in zip(xs, vs):
        got, _ = g(x)
        assert float(got) == want


def test_exact_hits_bit_for_bit_2d_and_interior_provenance():
    a0, a1 = np.array([1.0, 2.0, 4.0]), np.array([16.0, 32.0, 64.0, 128.0])
    rng = np.random.default_rng(7)
    vals = rng.uniform(0.01, 10.0, size=(3, 4))
    prov = np.zeros((3, 4), np.int8)
    prov[1, 1] = Prov.HELD  # a filled cell must not taint its neighbours' exact hits
    g = Grid((a0, a1), vals, prov)
    A, B = np.meshgrid(a0, a1, indexing="ij")
    v, p = g(A, B)
    np.testing.assert_array_equal(v, vals)
    # cells whose lower-left bracket is themselves (not on the last row/column)
    np.testing.assert_array_equal(p[:2, :3], prov[:2, :3])
    # off-grid queries next to the held cell are tainted by it
    assert int(g(1.5, 20.0)[1]) == Prov.HELD
    assert int(g(1.5, 100.0)[1]) == Prov.INTERPOLATED


def test_exact_hit_provenance_is_the_cells_own():
    g1 = _grid1([1.0, 2.0, 4.0], [1.0, 2.0, 3.0], prov=[0, Prov.HELD, 0])
    v, p = g1(np.array([1.0, 2.0, 4.0]))
    assert v.tolist() == [1.0, 2.0, 3.0]
    assert p.tolist() == [Prov.EXACT, Prov.HELD, Prov.EXACT]
    a0, a1 = np.array([1.0, 2.0, 4.0]), np.array([16.0, 32.0, 64.0, 128.0])
    prov = np.zeros((3, 4), np.int8)
    prov[2, 3] = Prov.HELD
    g2 = Grid((a0, a1), np.ones((3, 4)), prov)
    A, B = np.meshgrid(a0, a1, indexing="ij")
    np.testing.assert_array_equal(g2(A, B)[1], prov)


def test_power_law_between_two_points_is_geometric_blend():
    x0, x1, v0, v1 = 16.0, 64.0, 0.25, 3.0
    g = _grid1([x0, x1], [v0, v1])
    for q in (17.0, 20.0, 32.0, 50.0, 63.5):
        t = math.log(q / x0) / math.log(x1 / x0)
        want = v0 ** (1 - t) * v1**t
        got, p = g(q)
        assert float(got) == pytest.approx(want, rel=1e-13)
        assert int(p) == Prov.INTERPOLATED
    # at the geometric midpoint the value is the geometric mean
    assert float(g(32.0)[0]) == pytest.approx(math.sqrt(v0 * v1), rel=1e-14)


def test_power_law_curves_reproduced_exactly():
    xs = 2.0 ** np.arange(0, 12)
    q = np.array([1.5, 3.0, 100.0, 777.0, 2047.0])
    for c, a in ((0.02, 0.0), (3e-4, 1.0), (1e-6, 2.0), (0.5, -0.5)):
        g = _grid1(xs, c * xs**a)
        np.testing.assert_allclose(g(q)[0], c * q**a, rtol=1e-12)


def test_2d_power_law_surface_reproduced():
    a0, a1 = 2.0 ** np.arange(0, 6), 2.0 ** np.arange(4, 12)
    A, B = np.meshgrid(a0, a1, indexing="ij")
    g = Grid((a0, a1), 1e-3 * A * B**2, np.zeros(A.shape, np.int8), scales=("log", "log"))
    qa, qb = np.array([1.3, 5.0, 31.0]), np.array([17.0, 100.0, 2000.0])
    v, p = g(qa, qb)
    np.testing.assert_allclose(v, 1e-3 * qa * qb**2, rtol=1e-12)
    assert p.tolist() == [Prov.INTERPOLATED] * 3


def test_linear_axis_blend_and_affine_curves_exact():
    xs = np.array([1.0, 2.0, 4.0, 16.0, 64.0])
    g = _grid1(xs, 0.02 + 3e-3 * xs, scale="linear")
    q = np.array([1.5, 3.0, 10.0, 50.0])
    np.testing.assert_allclose(g(q)[0], 0.02 + 3e-3 * q, rtol=1e-13)
    g2 = _grid1([16.0, 64.0], [0.25, 3.0], scale="linear")
    assert float(g2(40.0)[0]) == pytest.approx(0.25 + (3.0 - 0.25) * (40.0 - 16.0) / 48.0, rel=1e-14)


def test_scalar_path_agrees_with_vectorised():
    a0, a1 = np.array([1.0, 2.0, 8.0]), np.array([16.0, 64.0, 256.0])
    rng = np.random.default_rng(3)
    vals = rng.uniform(0.1, 5.0, size=(3, 3))
    for scales in (("linear", "log"), ("linear", "linear"), ("log", "log")):
        g = Grid((a0, a1), vals, np.zeros((3, 3), np.int8), lambda b, s: np.asarray(b, float) * np.asarray(s, float), scales=scales)
        for qa, qb in ((1.0, 16.0), (1.5, 20.0), (8.0, 256.0), (3.0, 100.0), (20.0, 1000.0), (0.5, 8.0)):
            v, p = g(qa, qb)
            sv, sp_ = g.scalar(qa, qb)
            assert sv == pytest.approx(float(v), rel=1e-12) and sp_ == int(p)
    g1 = _grid1([1.0, 4.0, 16.0], [1.0, 2.0, 5.0], sol=lambda m: np.asarray(m, float), scale="linear")
    for q in (1.0, 2.0, 4.0, 9.0, 16.0, 40.0):
        v, p = g1(q)
        assert g1.scalar(q) == (pytest.approx(float(v), rel=1e-12), int(p))


def test_nonpositive_neighbour_blends_linearly():
    g = _grid1([1.0, 4.0], [0.0, 2.0])
    t = math.log(2.0) / math.log(4.0)
    assert float(g(2.0)[0]) == pytest.approx(2.0 * t, rel=1e-14)


def test_monotone_between_neighbours():
    xs = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    vs = np.array([0.01, 0.011, 0.05, 0.051, 0.4, 2.0])
    g = _grid1(xs, vs)
    q = np.geomspace(1.0, 32.0, 400)
    v, _ = g(q)
    assert np.all(np.diff(v) >= 0)
    i = np.clip(np.searchsorted(xs, q, side="right") - 1, 0, len(xs) - 2)
    assert np.all(v >= vs[i] * (1 - 1e-15)) and np.all(v <= vs[i + 1] * (1 + 1e-15))


def test_clamp_and_hold_sol_ratio_beyond_range():
    # a saturated curve (constant utilisation 0.5) holds its utilisation on both sides, exactly
    # (below the low edge for one halving: LOW_OCTAVES, then latency holds)
    xs = [4.0, 8.0, 16.0]

    def sol(m):
        return 0.1 + 0.01 * np.asarray(m, float)

    vs = [float(sol(x)) / 0.5 for x in xs]
    g = _grid1(xs, vs, sol=sol)
    for q, edge, v_edge, q_sol in ((64.0, 16.0, vs[2], 64.0), (1000.0, 16.0, vs[2], 1000.0), (1.0, 4.0, vs[0], 2.0), (2.5, 4.0, vs[0], 2.5)):
        v, p = g(q)
        assert float(v) == pytest.approx(v_edge * sol(q_sol) / sol(edge), rel=1e-14)
        assert int(p) == Prov.HELD
        assert g.scalar(q)[0] == pytest.approx(float(v), rel=1e-14)
    # vectorised, mixed inside/outside
    v, p = g(np.array([8.0, 32.0]))
    assert v[0] == vs[1] and p.tolist() == [Prov.EXACT, Prov.HELD]


def _climbing_1d():
    """Utilisation u = x / (x + 8): still climbing at the edge x = 16 (growth exponent
    log(u16 / u8) / log 2 = log2(4/3) over the last octave)."""
    xs = np.array([2.0, 4.0, 8.0, 16.0])

    def sol(x):
        return np.asarray(x, float)

    return xs, xs + 8.0, sol


def test_unsaturated_high_edge_is_held_then_refused():
    xs, vs, sol = _climbing_1d()
    g = _grid1(xs, vs, sol=sol, scale="linear")
    # a 1-D curve has no neighbouring curve to borrow a plateau from: held up to
    # UNSATURATED_HOLD_OCTAVES doublings ...
    lim = 16.0 * 2.0**grid_mod.UNSATURATED_HOLD_OCTAVES
    for q in (20.0, lim):
        v, p = g(q)
        assert float(v) == pytest.approx(24.0 * q / 16.0, rel=1e-14) and int(p) == Prov.HELD
        assert g.scalar(q)[0] == pytest.approx(float(v), rel=1e-14)
    # ... and refused beyond, with a typed "not available" that says why
    for call in (lambda: g(np.array([8.0, lim + 1.0]), refuse=True), lambda: g.scalar(lim + 1.0, refuse=True)):
        with pytest.raises(NotAvailableError, match="still climbing"):
            call()
    with pytest.raises(BeyondRangeError):
        g(10 * lim, refuse=True)
    # compile-time composition (transfer donors, module sums) does not refuse: it holds, marked held
    assert float(g(10 * lim)[0]) == pytest.approx(24.0 * 10 * lim / 16.0, rel=1e-14)


def test_saturated_edge_never_refuses():
    xs = np.array([2.0, 4.0, 8.0, 16.0])
    g = _grid1(xs, 2.0 * xs, sol=lambda x: np.asarray(x, float), scale="linear")
    assert float(g(1e6)[0]) == pytest.approx(2e6, rel=1e-14)


def test_unsaturated_2d_edge_climbs_to_the_plateau_of_a_neighbouring_curve():
    # axis 0 (batch) edge at 4; row-wise utilisation: the short-length curve (len 1) climbs
    # 0.25 -> 0.5 over the last octave, the long-length curve (len 2) is saturated at 0.8
    a0, a1 = np.array([2.0, 4.0]), np.array([1.0, 2.0])

    def sol(b, s):
        return np.asarray(b, float) * np.asarray(s, float)

    u = np.array([[0.25, 0.8], [0.5, 0.8]])
    mesh = np.meshgrid(a0, a1, indexing="ij")
    g = Grid((a0, a1), sol(*mesh) / u, np.zeros((2, 2), np.int8), sol)
    gamma = grid_mod.EDGE_DAMPING * 1.0  # measured exponent log2(0.5 / 0.25) = 1, damped
    # one doubling out on the climbing curve: u = 0.5 * 2**gamma, below the 0.8 plateau
    v, p = g(8.0, 1.0)
    assert float(v) == pytest.approx(8.0 / (0.5 * 2.0**gamma), rel=1e-12) and int(p) == Prov.HELD
    # far out: capped at the borrowed plateau 0.8 (and not refused: there is a plateau)
    v, _ = g(4096.0, 1.0)
    assert float(v) == pytest.approx(4096.0 / 0.8, rel=1e-12)
    assert g.scalar(4096.0, 1.0)[0] == pytest.approx(float(v), rel=1e-12)
    # the saturated curve holds
    assert float(g(64.0, 2.0)[0]) == pytest.approx(128.0 / 0.8, rel=1e-12)


def test_low_edge_flat_latency_is_clamped():
    # launch-bound start: latency flat from 1 to 4 while SOL grows linearly -> below the first
    # point latency stays at the edge value (utilisation falls at the SOL's rate)
    xs = np.array([1.0, 2.0, 4.0, 8.0])
    g = _grid1(xs, [3.0, 3.0, 3.0, 4.0], sol=lambda x: np.asarray(x, float), scale="linear")
    assert float(g(0.5)[0]) == pytest.approx(3.0, rel=1e-12)
    # half-way: utilisation grows at half the SOL's rate over the first octave -> latency scales as
    # SOL ** (1 - 1/2), for one halving (LOW_OCTAVES), then held
    g = _grid1(xs, [1.0, 2.0**0.5, 2.0, 4.0], sol=lambda x: np.asarray(x, float), scale="linear")
    assert float(g(0.5)[0]) == pytest.approx(0.5**0.5, rel=1e-12)
    assert float(g(0.25)[0]) == pytest.approx(0.5**0.5, rel=1e-12)
    assert g.scalar(0.25)[0] == pytest.approx(0.5**0.5, rel=1e-12)


def test_clamp_2d_holds_on_each_axis():
    a0, a1 = np.array([1.0, 2.0]), np.array([10.0, 20.0])

    def sol(b, s):
        return np.asarray(b, float) * np.asarray(s, float) ** 2

    vals = np.array([[1.0, 3.0], [2.0, 5.0]])
    g = Grid((a0, a1), vals, np.zeros((2, 2), np.int8), sol)
    v, p = g(8.0, 40.0)  # beyond both axes -> corner (2, 20) scaled
    assert float(v) == pytest.approx(5.0 * sol(8.0, 40.0) / sol(2.0, 20.0), rel=1e-14)
    assert int(p) == Prov.HELD


def test_outside_without_sol_raises():
    with pytest.raises(ValueError, match="outside the grid"):
        _grid1([1.0, 2.0], [1.0, 2.0])(3.0)


def test_wrong_number_of_coordinates():
    with pytest.raises(ValueError, match="2 axes"):
        Grid((np.array([1.0, 2.0]), np.array([1.0, 2.0])), np.ones((2, 2)), np.zeros((2, 2), np.int8))(1.0)


def test_single_point_axis():
    g = _grid1([8.0], [0.5], sol=lambda m: np.asarray(m, float))
    assert float(g(8.0)[0]) == 0.5
    assert float(g(16.0)[0]) == pytest.approx(1.0)


def test_provenance_worst():
    assert worst([]) == Prov.EXACT
    assert worst(np.array([0, 2, 1])) == Prov.TRANSFERRED
    assert Prov.HELD.label == "held"


sorted_axis = st.lists(st.floats(1.0, 1e6, allow_nan=False), min_size=2, max_size=10, unique=True).map(sorted).filter(
    lambda a: all(b / a_ > 1.0 + 1e-9 for a_, b in zip(a, a[1:]))
)


@HYP
@given(data=st.data(), axis=sorted_axis)
def test_property_exact_hits(data, axis):
    vals = data.draw(st.lists(st.floats(1e-6, 1e4, allow_nan=False), min_size=len(axis), max_size=len(axis)))
    g = _grid1(axis, vals)
    v, p = g(np.array(axis))
    assert v.tolist() == vals
    assert not p.any()


@HYP
@given(data=st.data(), axis=sorted_axis)
def test_property_between_neighbours(data, axis):
    vals = data.draw(st.lists(st.floats(1e-6, 1e4, allow_nan=False), min_size=len(axis), max_size=len(axis)))
    i = data.draw(st.integers(0, len(axis) - 2))
    f = data.draw(st.floats(0.0, 1.0))
    q = axis[i] * (axis[i + 1] / axis[i]) ** f
    g = _grid1(axis, vals)
    v = float(g(q)[0])
    lo, hi = sorted((vals[i], vals[i + 1]))
    assert lo * (1 - 1e-12) <= v <= hi * (1 + 1e-12)
    assert float(g(q)[0]) == v  # deterministic


# ---------------------------------------------------------------------------------------------
# choose_sites
# ---------------------------------------------------------------------------------------------
LATTICE = np.array([(n, k) for n in (64.0, 128.0, 256.0, 512.0) for k in (64.0, 128.0, 256.0)])


def _idx(sites, pt):
    return int(np.flatnonzero(np.all(np.asarray(sites) == pt, axis=1))[0])


def test_choose_exact():
    ch = choose_sites((256, 128), LATTICE)
    assert (ch.how, ch.indices, ch.weights, ch.clamp_distance) == ("exact", (_idx(LATTICE, (256, 128)),), (1.0,), 0.0)


def test_choose_multilinear_one_axis():
    ch = choose_sites((96, 128), LATTICE)
    t = math.log2(96 / 64)
    assert ch.how == "multilinear" and ch.clamp_distance == 0.0
    got = dict(zip(ch.indices, ch.weights))
    assert got.keys() == {_idx(LATTICE, (64, 128)), _idx(LATTICE, (128, 128))}
    assert got[_idx(LATTICE, (64, 128))] == pytest.approx(1 - t, rel=1e-14)
    assert got[_idx(LATTICE, (128, 128))] == pytest.approx(t, rel=1e-14)


def test_choose_multilinear_two_axes_weights_in_log2():
    q = (384.0, 100.0)
    ch = choose_sites(q, LATTICE)
    tn, tk = math.log2(384 / 256), math.log2(100 / 64)
    want = {
        _idx(LATTICE, (256, 64)): (1 - tn) * (1 - tk),
        _idx(LATTICE, (512, 64)): tn * (1 - tk),
        _idx(LATTICE, (256, 128)): (1 - tn) * tk,
        _idx(LATTICE, (512, 128)): tn * tk,
    }
    assert ch.how == "multilinear"
    got = dict(zip(ch.indices, ch.weights))
    assert got.keys() == want.keys()
    for i, w in want.items():
        assert got[i] == pytest.approx(w, rel=1e-13)
    assert sum(ch.weights) == pytest.approx(1.0, abs=1e-15)


def test_choose_idw_when_a_corner_is_missing():
    sites = np.array([s for s in LATTICE if tuple(s) != (512.0, 128.0)])
    q = np.array([384.0, 100.0])
    ch = choose_sites(q, sites)
    assert ch.how == "idw"
    lq, ls = np.log2(q), np.log2(sites)
    d = np.linalg.norm(ls - lq, axis=1)
    near = sorted(range(len(sites)), key=lambda i: (d[i], *ls[i]))[:4]
    near = [i for i in near if d[i] <= 1.5]
    assert list(ch.indices) == near
    w = np.array([1 / d[i] ** 2 for i in near])
    np.testing.assert_allclose(ch.weights, w / w.sum(), rtol=1e-13)
    assert sum(ch.weights) == pytest.approx(1.0, abs=1e-15)


def test_choose_multilinear_held_beyond_hull():
    ch = choose_sites((1024.0, 128.0), LATTICE)  # one log2 unit beyond n=512
    assert ch.how == "multilinear-held" and ch.clamp_distance == pytest.approx(1.0)
    assert ch.indices == (_idx(LATTICE, (512, 128)),) and ch.weights == (1.0,)


def test_choose_none_outside_gates():
    assert choose_sites((512.0 * 8, 128.0), LATTICE) is None  # clamp distance 3 > beyond_gate 2
    assert choose_sites((512.0 * 8, 128.0), LATTICE, beyond_gate=3.0) is not None
    sparse = np.array([[1.0, 1.0], [1024.0, 1024.0]])
    assert choose_sites((32.0, 32.0), sparse) is None  # inside the hull, no corners, nobody near
    assert choose_sites((0.0, 32.0), LATTICE) is None  # non-positive coordinates


def test_choose_no_sites_is_none():
    assert choose_sites((64.0, 64.0), np.zeros((0, 2))) is None


def test_choose_tie_order_is_by_coordinates_and_permutation_invariant():
    base = [(1.0, 4.0), (4.0, 1.0), (16.0, 4.0), (4.0, 16.0)]  # all 2 log2 units from (4, 4)
    want = [(1.0, 4.0), (4.0, 1.0), (4.0, 16.0)]  # distance tie -> ascending coordinates
    rng = np.random.default_rng(0)
    for _ in range(8):
        perm = rng.permutation(len(base))
        sites = np.array([base[i] for i in perm])
        ch = choose_sites((4.0, 4.0), sites, gate=3.0, k=3)
        assert ch.how == "idw"
        assert [tuple(sites[i]) for i in ch.indices] == want
        assert ch.weights == pytest.approx((1 / 3, 1 / 3, 1 / 3), rel=1e-15)


@HYP
@given(
    q=st.tuples(st.floats(40.0, 800.0), st.floats(40.0, 400.0)),
    seed=st.integers(0, 10_000),
    drop=st.integers(-1, len(LATTICE) - 1),
)
def test_property_choice_deterministic_and_normalised(q, seed, drop):
    sites = LATTICE if drop < 0 else np.delete(LATTICE, drop, axis=0)
    a = choose_sites(q, sites)
    perm = np.random.default_rng(seed).permutation(len(sites))
    b = choose_sites(q, sites[perm])
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a.how == b.how
    assert sum(a.weights) == pytest.approx(1.0, abs=1e-12)
    assert all(w > 0 for w in a.weights)
    pa_ = sorted((tuple(sites[i]), w) for i, w in zip(a.indices, a.weights))
    pb_ = sorted((tuple(sites[perm][i]), w) for i, w in zip(b.indices, b.weights))
    assert [s for s, _ in pa_] == [s for s, _ in pb_]
    np.testing.assert_allclose([w for _, w in pa_], [w for _, w in pb_], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# transfer_grid
# ---------------------------------------------------------------------------------------------
def _sol_factory(n, k):
    """A toy roofline for site (n, k): latency ~ a + m*n*k*c (affine in m, site-dependent)."""

    def f(m):
        m = np.asarray(m, float)
        return 1e-3 + m * n * k * 1e-12 + (n * k) * 1e-9

    return f


def _util(m):
    """Utilisation that varies along the curve but not across sites."""
    m = np.asarray(m, float)
    return 0.2 + 0.6 * m / (m + 64.0)


def _site_grids(sites, axes_per_site):
    grids = []
    for (n, k), ax in zip(sites, axes_per_site):
        s = _sol_factory(n, k)
        grids.append(Grid((ax,), s(ax) / _util(ax), np.zeros(len(ax), np.int8), s))
    return grids


@pytest.mark.parametrize("drop_corner", [False, True])
def test_transfer_reproduces_site_when_utilisation_is_shared(drop_corner):
    sites = LATTICE if not drop_corner else np.array([s for s in LATTICE if tuple(s) != (512.0, 128.0)])
    m_axis = 2.0 ** np.arange(0, 13)
    grids = _site_grids(sites, [m_axis] * len(sites))
    q = (384.0, 100.0)
    ch = choose_sites(q, sites)
    assert ch.how == ("idw" if drop_corner else "multilinear")
    sol_q = _sol_factory(*q)
    g = transfer_grid(ch, lambda i: grids[i], sol_q, ("a", "b"))
    np.testing.assert_array_equal(g.axes[0], m_axis)
    np.testing.assert_allclose(g.values, sol_q(m_axis) / _util(m_axis), rtol=1e-13)
    assert g.prov.tolist() == [Prov.TRANSFERRED] * len(m_axis)
    assert g.sol is sol_q and g.sites == ("a", "b")
    # between grid points the transferred grid still interpolates, beyond it holds via sol_q
    v, p = g(np.array([3.0, 10000.0]))
    assert int(p[0]) == Prov.TRANSFERRED and int(p[1]) == Prov.HELD
    assert float(v[1]) == pytest.approx(sol_q(10000.0) / _util(4096.0), rel=1e-12)


def test_transfer_union_of_donor_axes():
    sites = np.array([[64.0, 64.0], [128.0, 64.0]])
    axes = [np.array([1.0, 4.0, 16.0]), np.array([1.0, 2.0, 8.0, 16.0])]
    grids = _site_grids(sites, axes)
    ch = choose_sites((90.0, 64.0), sites)
    sol_q = _sol_factory(90.0, 64.0)
    g = transfer_grid(ch, lambda i: grids[i], sol_q)
    assert g.axes[0].tolist() == [1.0, 2.0, 4.0, 8.0, 16.0]
    # at m=2 the first donor is interpolated: its utilisation there is the blend, not _util(2)
    v0 = grids[0](2.0)[0]
    t = math.log2(90 / 64)
    u = (1 - t) * _sol_factory(64, 64)(2.0) / v0 + t * _util(2.0)
    assert g.values[1] == pytest.approx(float(sol_q(2.0) / u), rel=1e-13)
    assert g.values[0] == pytest.approx(float(sol_q(1.0) / _util(1.0)), rel=1e-13)


def test_transfer_exact_choice_returns_donor_grid():
    grids = _site_grids(LATTICE, [np.array([1.0, 2.0])] * len(LATTICE))
    ch = choose_sites((128.0, 256.0), LATTICE)
    assert transfer_grid(ch, lambda i: grids[i], _sol_factory(128, 256)) is grids[ch.indices[0]]


def test_transfer_held_marks_provenance():
    grids = _site_grids(LATTICE, [np.array([1.0, 2.0, 4.0])] * len(LATTICE))
    ch = choose_sites((1024.0, 128.0), LATTICE)
    sol_q = _sol_factory(1024.0, 128.0)
    g = transfer_grid(ch, lambda i: grids[i], sol_q)
    assert g.prov.tolist() == [Prov.HELD] * 3
    np.testing.assert_allclose(g.values, sol_q(g.axes[0]) / _util(g.axes[0]), rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# tile axes (GEMM m): robust knots, pair holes, the high edge
# ---------------------------------------------------------------------------------------------
def test_robust_knots_median_windows():
    v = np.array([1.0, 5.0, 2.0, 3.0, 9.0, 4.0, 5.0])
    assert grid_mod.robust_knots(v, 1).tolist() == [1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0]
    assert grid_mod.robust_knots(v, 2).tolist() == [1.0, 2.0, 3.0, 4.0, 4.0, 5.0, 5.0]
    mono = np.array([1.0, 1.0, 2.0, 7.0, 7.5, 30.0])
    assert grid_mod.robust_knots(mono, 2).tolist() == mono.tolist()


def test_tile_axis_blends_robust_knots_but_hits_stored_values():
    # knots with a window of 1 or 2 either side: [1, 2, 4, 5, 5] (the 9 is an outlier)
    g = _grid1([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 9.0, 4.0, 5.0], scale="tile")
    v, p = g(np.array([2.5, 3.0, 3.5, 1.5]))
    assert v.tolist() == [3.0, 9.0, 4.5, 1.5]
    assert p.tolist() == [Prov.INTERPOLATED, Prov.EXACT, Prov.INTERPOLATED, Prov.INTERPOLATED]
    assert [g.scalar(q)[0] for q in (2.5, 3.0, 3.5, 1.5)] == [3.0, 9.0, 4.5, 1.5]
    lin = _grid1([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 9.0, 4.0, 5.0], scale="linear")
    assert float(lin(2.5)[0]) == 5.5


def test_tile_hole_in_a_small_group_takes_its_groups_other_end():
    # 16-row groups: m=49 (one row into the tile after 48) is missing; it shares its tile with 64
    x = [16.0, 17.0, 32.0, 33.0, 48.0, 64.0, 65.0, 80.0, 81.0]
    v = [1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 6.0]
    g = _grid1(x, v, scale="tile")
    val, p = g(49.0)
    assert float(val) == 4.0 and int(p) == Prov.INTERPOLATED
    assert g.scalar(49.0) == (4.0, int(Prov.INTERPOLATED))
    assert float(_grid1(x, v, scale="linear")(49.0)[0]) == 3.0625
    # the group (33, 48] ends at 48 (present): its value is 33's, up to the ramp into 48
    assert float(g(47.0)[0]) == 3.0
    assert 47.0 in g.axes[0].tolist() and 49.0 in g.axes[0].tolist()


def test_tile_hole_in_a_32_row_group_takes_its_groups_other_end():
    # 32-row groups (pairs at 160, 192, 224): m=192 is missing; rows 161..192 share a tile, so the
    # hole takes 161's value (robust knot 3), not a straight line from 161 towards 193
    x = [128.0, 129.0, 160.0, 161.0, 193.0, 224.0, 225.0]
    v = [1.0, 2.0, 2.0, 3.0, 5.0, 5.0, 6.0]
    g = _grid1(x, v, scale="tile")
    val, p = g(192.0)
    assert float(val) == 3.0 and int(p) == Prov.INTERPOLATED
    assert g.scalar(192.0) == (3.0, int(Prov.INTERPOLATED))
    assert float(_grid1(x, v, scale="linear")(192.0)[0]) == 4.9375
    # the a+1 member missing instead (193): it shares its tile with 224
    x2 = [128.0, 129.0, 160.0, 161.0, 192.0, 224.0, 225.0]
    v2 = [1.0, 2.0, 2.0, 3.0, 3.0, 5.0, 6.0]
    assert float(_grid1(x2, v2, scale="tile")(193.0)[0]) == 5.0
    # a 64-row group is still left linear
    x3 = [128.0, 129.0, 192.0, 193.0, 257.0, 320.0]
    v3 = [1.0, 2.0, 2.0, 3.0, 5.0, 5.0]
    assert 256.0 not in _grid1(x3, v3, scale="tile").axes[0].tolist()


def test_tile_hole_in_a_large_group_follows_the_same_pair_members():
    # 256-row groups, latency = whole tiles of 256 rows: a -> a/256, a+1 -> a/256 + 1; 768 missing
    x = [256.0, 257.0, 512.0, 513.0, 769.0, 1024.0, 1025.0]
    v = [1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 5.0]
    g = _grid1(x, v, scale="tile")
    assert float(g(768.0)[0]) == 3.0  # between 512 (2) and 1024 (4), not next to 769's step
    assert float(_grid1(x, v, scale="linear")(768.0)[0]) == pytest.approx(3.99609375, rel=1e-12)
    # the a+1 member missing instead (769): between 513 (3) and 1025 (5)
    x2 = [256.0, 257.0, 512.0, 513.0, 768.0, 1024.0, 1025.0]
    v2 = [1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0]
    assert float(_grid1(x2, v2, scale="tile")(769.0)[0]) == 4.0


def test_tile_complete_lattice_is_not_filled():
    x = [1.0, 2.0, 3.0, 16.0, 17.0, 32.0, 33.0, 256.0, 257.0, 512.0, 513.0, 8192.0, 16384.0]
    v = np.linspace(1.0, 9.0, len(x))
    g = _grid1(x, v, scale="tile")
    assert g.axes[0].tolist() == x and g.values.tolist() == v.tolist()


def test_tile_high_edge_does_not_fall():
    # u = SOL / latency falls by half over the last octave; linear axes keep falling for one
    # doubling at half the rate (x 2 x sqrt 2), a tile axis holds utilisation (x 2)
    sol = lambda m: np.asarray(m, float)  # noqa: E731
    x, v = [2.0, 4.0, 8.0, 16.0], [2.0, 4.0, 8.0, 32.0]
    assert float(_grid1(x, v, sol, scale="tile")(32.0)[0]) == pytest.approx(64.0, rel=1e-12)
    assert float(_grid1(x, v, sol, scale="linear")(32.0)[0]) == pytest.approx(64.0 * math.sqrt(2.0), rel=1e-12)


def test_tile_low_edge_is_lowered_to_its_octaves_median_never_raised():
    # flat roofline (memory-bound decode sizes): u = 1 / latency. The edge m=2 reads 3 while its
    # octave (m = 2, 3, 4) has median utilisation 1/2: below the edge latency is 2, not 3
    flat = lambda m: np.ones(np.shape(m))  # noqa: E731
    g = _grid1([2.0, 3.0, 4.0, 5.0], [3.0, 2.0, 2.0, 2.0], flat, scale="tile")
    v, p = g(np.array([1.0, 1.5, 2.0]))
    assert v.tolist() == [2.0, 2.0, 3.0]  # the edge itself still returns its stored value
    assert p.tolist() == [Prov.HELD, Prov.HELD, Prov.EXACT]
    assert g.scalar(1.0) == (2.0, int(Prov.HELD))
    # an edge below its octave's median is kept (never raised): latency holds at 1.5
    low = _grid1([2.0, 3.0, 4.0, 5.0], [1.5, 2.0, 2.0, 2.0], flat, scale="tile")
    assert float(low(1.0)[0]) == 1.5 and low.scalar(1.0)[0] == 1.5
    # linear axes keep the edge value
    assert float(_grid1([2.0, 3.0, 4.0, 5.0], [3.0, 2.0, 2.0, 2.0], flat, scale="linear")(1.0)[0]) == 3.0
    # the high edge is not affected
    assert float(g(10.0)[0]) == 2.0


def test_tile_axis_only_on_1d_grids():
    with pytest.raises(ValueError):
        Grid((np.array([1.0, 2.0]), np.array([1.0, 2.0])), np.ones((2, 2)), np.zeros((2, 2), np.int8), scales=("tile", "linear"))


# ---------------------------------------------------------------------------------------------
# truncated corners of 2-D site grids (ops.base.fill_missing)
# ---------------------------------------------------------------------------------------------
def test_fill_missing_transport_takes_the_batch_change_from_a_shorter_length():
    from infercast.ops.base import fill_missing

    sol = lambda b, n: np.asarray(b, float) * np.asarray(n, float)  # noqa: E731
    axes = (np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 4.0]))
    u = np.array([[0.25, 0.5, 0.5], [0.5, 0.75, np.nan], [1.0, np.nan, np.nan]])
    vals = sol(*np.meshgrid(*axes, indexing="ij")) / u
    held, prov = fill_missing(axes, vals, sol)
    assert prov.tolist() == [[0, 0, 0], [0, 0, Prov.HELD], [0, Prov.HELD, Prov.HELD]]
    assert held[1, 2] == pytest.approx(16.0, rel=1e-12)  # u 0.5 held from batch 1
    assert held[2, 1] == pytest.approx(8.0 / 0.75, rel=1e-12)
    assert held[2, 2] == pytest.approx(32.0, rel=1e-12)
    got, prov_t = fill_missing(axes, vals, sol, transport=True)
    assert prov_t.tolist() == prov.tolist()
    np.testing.assert_array_equal(got[~np.isnan(u)], vals[~np.isnan(u)])
    # (2, 4): u 0.5 x (0.75 / 0.5 at length 2) = 0.75
    assert got[1, 2] == pytest.approx(8.0 / 0.75, rel=1e-12)
    # (4, 2): u 0.75 x (1.0 / 0.5 at length 1) = 1.5, capped at the grid's highest u, 1.0
    assert got[2, 1] == pytest.approx(8.0, rel=1e-12)
    # (4, 4): from batch 1 (batch 2 is missing there), x (1.0 / 0.25 at length 1), capped at 1.0
    assert got[2, 2] == pytest.approx(16.0, rel=1e-12)
    # a falling change is followed, not capped: u 0.5 x (0.25 / 0.5) = 0.25
    ax2 = (np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    v2 = np.array([[2.0, 4.0], [8.0, np.nan]])
    assert fill_missing(ax2, v2, sol, transport=True)[0][1, 1] == pytest.approx(16.0, rel=1e-12)
    assert fill_missing(ax2, v2, sol)[0][1, 1] == pytest.approx(8.0, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# batch axes: beyond the high edge latency keeps at least its last interval's linear trend
# ---------------------------------------------------------------------------------------------
def test_batch_axis_high_edge_keeps_the_linear_trend_of_its_edge_interval():
    flat = lambda x: np.ones(np.shape(x))  # noqa: E731  (a flat roofline: the edge rule holds)
    x, v = [1.0, 2.0, 4.0], [1.0, 1.5, 3.0]
    g = _grid1(x, v, flat, scale="batch")
    # edge interval 2 -> 4: slope 0.75 per unit; 3 + 0.75 * 4 = 6 at batch 8, 3 + 0.75 * 2 at 6
    assert g(np.array([8.0, 6.0, 4.0, 3.0]))[0].tolist() == [6.0, 4.5, 3.0, 2.25]
    assert g.scalar(8.0)[0] == 6.0 and g.scalar(6.0)[0] == 4.5
    assert int(g(8.0)[1]) == Prov.HELD
    assert float(_grid1(x, v, flat, scale="linear")(8.0)[0]) == 3.0  # held, no trend
    # the held / climbing edge rule wins where it is higher: utilisation held at sol = x**2
    sq = lambda x: np.asarray(x, float) ** 2  # noqa: E731
    g2 = _grid1(x, [1.0, 4.0, 16.0], sq, scale="batch")
    assert float(g2(8.0)[0]) == pytest.approx(64.0, rel=1e-12)
    # latency falling over both the last octave and the last two sets no floor
    g3 = _grid1(x, [2.0, 2.0, 1.5], flat, scale="batch")
    assert float(g3(8.0)[0]) == 1.5


def test_batch_axis_high_edge_trend_is_the_steeper_of_one_and_two_octaves():
    flat = lambda x: np.ones(np.shape(x))  # noqa: E731
    x = [1.0, 2.0, 4.0]
    # last octave nearly flat (2.5 -> 3: relative slope 1/3); over two octaves 1 -> 3: (2/3) * (4/3)
    g = _grid1(x, [1.0, 2.5, 3.0], flat, scale="batch")
    assert float(g(8.0)[0]) == pytest.approx(3.0 * (1.0 + 8.0 / 9.0), rel=1e-12)
    assert g.scalar(8.0)[0] == pytest.approx(3.0 * (1.0 + 8.0 / 9.0), rel=1e-12)
    # a falling last octave after a rise: the two-octave line still sets the floor
    g2 = _grid1(x, [1.0, 2.0, 1.5], flat, scale="batch")
    assert float(g2(8.0)[0]) == pytest.approx(1.5 * (1.0 + 4.0 / 9.0), rel=1e-12)
    # the one-octave slope wins where it is steeper (as in the test above)
    assert float(_grid1(x, [1.0, 1.5, 3.0], flat, scale="batch")(8.0)[0]) == 6.0


def test_batch_axis_trend_blends_along_the_other_axis():
    flat = lambda b, s: np.ones(np.broadcast(np.asarray(b), np.asarray(s)).shape)  # noqa: E731
    a0, a1 = np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0])
    # relative slopes 1.0 and 0.5 at batch 4 (over one and over two octaves alike for the second curve)
    vals = np.array([[1.0, 2.5], [1.5, 3.0], [3.0, 4.0]])
    g = Grid((a0, a1), vals, np.zeros((3, 2), np.int8), flat, scales=("batch", "linear"))
    # at length 1.5: value 3.5 at the edge, relative slope 0.75: 3.5 * (1 + 0.75 * (8 / 4 - 1))
    assert float(g(8.0, 1.5)[0]) == pytest.approx(6.125, rel=1e-12)
    assert g.scalar(8.0, 1.5)[0] == pytest.approx(6.125, rel=1e-12)
    lin = Grid((a0, a1), vals, np.zeros((3, 2), np.int8), flat, scales=("linear", "linear"))
    assert float(lin(8.0, 1.5)[0]) == pytest.approx(3.5, rel=1e-12)
    # the length axis (linear) beyond its edge is unaffected by the batch rule
    assert float(g(4.0, 4.0)[0]) == float(lin(4.0, 4.0)[0]) == 4.0


def test_low_edge_falls_for_one_halving_then_holds():
    sol = lambda x: np.asarray(x, float)  # noqa: E731
    g = _grid1([4.0, 8.0, 16.0], [4.0, 8.0, 16.0], sol, scale="linear")  # u = 1 held below the edge
    assert g(np.array([3.0, 2.0, 1.0, 0.5]))[0].tolist() == [3.0, 2.0, 2.0, 2.0]
    assert [g.scalar(q)[0] for q in (3.0, 2.0, 1.0)] == [3.0, 2.0, 2.0]
    # 2-D: only the axis beyond its low edge is limited
    sol2 = lambda b, s: np.asarray(b, float) * np.asarray(s, float)  # noqa: E731
    a = np.array([4.0, 8.0])
    g2 = Grid((a, a), np.outer(a, a), np.zeros((2, 2), np.int8), sol2)
    assert float(g2(1.0, 4.0)[0]) == 8.0 and g2.scalar(1.0, 4.0)[0] == 8.0
    assert float(g2(1.0, 1.0)[0]) == 4.0 and g2.scalar(1.0, 1.0)[0] == 4.0


# ---------------------------------------------------------------------------------------------
# generation attention: one more step column along the batch x KV-length diagonal
# ---------------------------------------------------------------------------------------------
def test_kv_diagonal_extends_generation_grids_one_doubling():
    from infercast.ops.attention import GEN_SCALES, build_site_grid, extend_kv_diagonal

    sol = lambda b, step: np.asarray(b, float) * (np.asarray(step, float) + 1.0)  # noqa: E731  (b x KV)
    axes = (np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 7.0]))  # KV lengths 2, 4, 8
    # latency a function of the cached tokens b x KV: f(2, 4, 8, 16, 32) = 1, 1, 2, 3, 5
    vals = np.array([[1.0, 1.0, 2.0], [1.0, 2.0, 3.0], [2.0, 3.0, 5.0]])
    prov = np.zeros((3, 3), np.int8)
    base = Grid(axes, vals, prov, sol, scales=GEN_SCALES)
    ax, got, p = extend_kv_diagonal(axes, vals, vals, prov, sol, GEN_SCALES)
    assert ax[1].tolist() == [1.0, 3.0, 7.0, 15.0] and ax[0].tolist() == [1.0, 2.0, 4.0]
    np.testing.assert_array_equal(got[:, :3], vals)
    # (1, KV 16) = (2, KV 8): 3; (2, KV 16) = (4, KV 8): 5 (equal SOL on the diagonal)
    assert got[0, 3] == pytest.approx(3.0, rel=1e-12) and got[1, 3] == pytest.approx(5.0, rel=1e-12)
    # the largest batch has no diagonal source: the grid's own edge rule
    assert got[2, 3] == float(base(4.0, 15.0)[0])
    assert p[:, 3].tolist() == [Prov.HELD] * 3
    # a diagonal that did not hold one octave in ((1, KV 8) 1.5 vs (2, KV 4) 2.0) is not followed
    v2 = vals.copy()
    v2[0, 2] = 1.5
    _, got2, _ = extend_kv_diagonal(axes, v2, v2, prov, sol, GEN_SCALES)
    assert got2[0, 3] == float(Grid(axes, v2, prov, sol, scales=GEN_SCALES)(1.0, 15.0)[0])
    assert got2[1, 3] == pytest.approx(5.0, rel=1e-12)
    # a source cell that was filled, not measured, is not a diagonal source
    v3 = vals.copy()
    v3[2, 2] = np.nan
    filled3 = vals.copy()
    _, got3, _ = extend_kv_diagonal(axes, v3, filled3, prov, sol, GEN_SCALES)
    assert got3[1, 3] == float(Grid(axes, filled3, prov, sol, scales=GEN_SCALES)(2.0, 15.0)[0])
    # steps that are not KV doublings: unchanged
    odd = (axes[0], np.array([1.0, 3.0, 6.0]))
    assert extend_kv_diagonal(odd, vals, vals, prov, sol, GEN_SCALES)[0] is odd
    # build_site_grid serves the extension for generation attention only
    g = build_site_grid("generation_attention", axes, vals, sol)
    assert float(g(1.0, 15.0)[0]) == pytest.approx(3.0, rel=1e-12)
    assert float(g(1.0, 11.0)[0]) == pytest.approx(2.5, rel=1e-12)  # linear in step, 7 -> 15
    ctx = build_site_grid("context_attention", axes, vals, sol)
    assert ctx.axes[1].tolist() == [1.0, 3.0, 7.0]


# ---------------------------------------------------------------------------------------------
# attention transfer: donors over (group, kv heads); generation drops donors of another regime
# ---------------------------------------------------------------------------------------------
def test_attention_donor_weights_per_table():
    from infercast.ops.attention import choose_donors

    sites = np.array([[8.0, 2.0], [16.0, 2.0], [64.0, 8.0]])  # groups 4, 8, 8; kv 2, 2, 8
    # query (24, 4): group 6, kv 4 -- no bracketing corners, so inverse squared distances
    # generation: log2 distances (weights 1, 1): sqrt(0.585^2 + 1), sqrt(0.415^2 + 1), sqrt(0.415^2 + 1)
    g = choose_donors("generation_attention", 24, 4, sites)
    d2 = np.array([math.log2(1.5) ** 2 + 1.0, math.log2(4 / 3) ** 2 + 1.0, math.log2(4 / 3) ** 2 + 1.0])
    w = (1.0 / d2) / (1.0 / d2).sum()
    assert g.how == "idw" and g.indices == (1, 2, 0)
    np.testing.assert_allclose(g.weights, [w[1], w[2], w[0]], rtol=1e-12)
    # context: the group distance counts twice, which puts (8, 2) beyond the gate (1.54 > 1.5)
    c = choose_donors("context_attention", 24, 4, sites)
    assert math.sqrt(4 * math.log2(1.5) ** 2 + 1.0) > 1.5
    assert c.indices == (1, 2)
    np.testing.assert_allclose(c.weights, [0.5, 0.5], rtol=1e-12)


def test_generation_transfer_drops_donors_of_another_regime():
    from infercast.interp.transfer import SiteChoice
    from infercast.ops.attention import consistent_donors

    sol = lambda b, s: np.asarray(b, float) * (np.asarray(s, float) + 1.0)  # noqa: E731
    axes = (np.array([1.0, 2.0]), np.array([1.0, 3.0]))
    prov = np.zeros((2, 2), np.int8)
    s = sol(*np.meshgrid(*axes, indexing="ij"))

    def grid_at(util):
        return Grid(axes, s / util, prov, sol)

    # donors 0 and 2 agree (utilisation 0.5 and 0.6), donor 1 runs 10x slower (0.05)
    grids = {0: grid_at(0.5), 1: grid_at(0.05), 2: grid_at(0.6)}
    ch = SiteChoice((0, 1, 2), (0.3, 0.45, 0.25), "idw", 0.0)
    got = consistent_donors("generation_attention", ch, grids.__getitem__)
    assert got.indices == (0, 2) and got.how == "idw"
    np.testing.assert_allclose(got.weights, [0.3 / 0.55, 0.25 / 0.55], rtol=1e-12)
    # the heavier side wins: with donor 1 at weight 0.6 it is kept alone
    ch2 = SiteChoice((0, 1, 2), (0.2, 0.6, 0.2), "multilinear", 0.0)
    got2 = consistent_donors("generation_attention", ch2, grids.__getitem__)
    assert got2.indices == (1,) and got2.weights == (1.0,) and got2.how == "multilinear"
    # within the factor (0.5 vs 0.9: 1.8x) both are kept, unchanged
    ch3 = SiteChoice((0, 3), (0.5, 0.5), "multilinear", 0.0)
    grids[3] = grid_at(0.9)
    assert consistent_donors("generation_attention", ch3, grids.__getitem__) is ch3
    # context attention does not filter; one donor is returned as is
    assert consistent_donors("context_attention", ch, grids.__getitem__) is ch
    one = SiteChoice((1,), (1.0,), "idw", 0.0)
    assert consistent_donors("generation_attention", one, grids.__getitem__) is one


# ---------------------------------------------------------------------------------------------
# attention low edges: batches / lengths below a site's first ones, from sibling sites
# ---------------------------------------------------------------------------------------------
def test_low_edges_filled_from_siblings():
    from infercast.ops import attention as A

    def sol(b, n):
        return np.asarray(b, float) * np.asarray(n, float)

    # sibling (16, 16): utilisation halves from batch 2 to 1 and quarters from length 16 to 1
    sb, sl = np.array([1.0, 2.0, 4.0]), np.array([1.0, 16.0, 32.0])
    ub, ul = np.array([0.5, 1.0, 1.0]), np.array([0.25, 1.0, 1.0])
    sib_vals = np.outer(sb, sl) / np.outer(ub, ul)
    sib_grid = A.build_site_grid("context_attention", (sb, sl), sib_vals, sol)
    # the site (8, 8) starts at batch 2 and length 16, at utilisation 1/3
    axes = (np.array([2.0, 4.0]), np.array([16.0, 32.0]))
    vals = 3.0 * np.outer(*axes)
    sib = A.Siblings((8.0, 8.0), np.array([[16.0, 16.0]]), [(sb, sl)], lambda k: sib_grid)
    g = A.build_site_grid("context_attention", axes, vals, sol, sib)
    assert g.axes[0].tolist() == [1.0, 2.0, 4.0] and g.axes[1].tolist() == [1.0, 16.0, 32.0]
    # batch 1: 6 l x SOL ratio 1/2 / utilisation ratio 1/2; length 1: v(b, 16) / 16 / (1/4)
    np.testing.assert_allclose(g.values[0, 1:], [96.0, 192.0], rtol=1e-12)
    np.testing.assert_allclose(g.values[:, 0], [24.0, 24.0, 48.0], rtol=1e-12)
    np.testing.assert_array_equal(g.values[1:, 1:], vals)  # measured cells untouched
    assert (g.prov[0, :] == Prov.TRANSFERRED).all() and (g.prov[:, 0] == Prov.TRANSFERRED).all()
    assert (g.prov[1:, 1:] == Prov.EXACT).all()
    assert float(g(1.0, 1.0)[0]) == pytest.approx(24.0, rel=1e-12)
    # without siblings the grid's own low-edge rule answers (a different value)
    plain = A.build_site_grid("context_attention", axes, vals, sol)
    assert float(plain(1.0, 16.0)[0]) != pytest.approx(96.0, rel=1e-3)
    # no sibling below the site's edges, or siblings outside the donor gates: unchanged
    same = A.Siblings((8.0, 8.0), np.array([[16.0, 16.0]]), [axes], lambda k: sib_grid)
    assert A.build_site_grid("context_attention", axes, vals, sol, same).axes[0].tolist() == [2.0, 4.0]
    far = A.Siblings((8.0, 8.0), np.array([[1024.0, 1.0]]), [(sb, sl)], lambda k: sib_grid)
    assert A.build_site_grid("context_attention", axes, vals, sol, far).axes[0].tolist() == [2.0, 4.0]


@pytest.mark.parametrize("scale", ["linear", "log", "tile"])
def test_latency_and_memoised_scalar_equal_the_full_answer(scale):
    """Grid.latency gives __call__'s latencies (inside, between points and held beyond both
    edges), and a repeated Grid.scalar query gives its first answer, on 1-D and 2-D grids."""
    xs = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    g = Grid((np.asarray(xs),), np.asarray([1.0, 1.1, 1.3, 2.0, 3.5, 6.0, 11.0]), np.zeros(7, np.int8),
             lambda x: np.asarray(x, float) * 0.2 + 0.5, scales=(scale,))
    q = np.array([0.25, 0.5, 1.0, 1.5, 3.0, 7.9, 8.0, 40.0, 64.0, 90.0, 150.0])
    assert g.latency(q).tolist() == g(q)[0].tolist()
    first = [g.scalar(x) for x in q]
    assert [g.scalar(x) for x in q] == first == [g._scalar((x,), False) for x in q]
    a0, a1 = np.array([1.0, 4.0, 16.0]), np.array([128.0, 512.0, 2048.0])
    g2 = Grid((a0, a1), np.outer(a0, a1) * 1e-4 + 0.1, np.zeros((3, 3), np.int8),
              lambda b, s: np.asarray(b, float) * np.asarray(s, float) * 1e-4 + 0.1)
    b, s = np.meshgrid([0.5, 1.0, 3.0, 16.0, 20.0], [100.0, 128.0, 700.0, 3000.0], indexing="ij")
    assert g2.latency(b, s).tolist() == g2(b, s)[0].tolist()


@pytest.mark.parametrize("scales", [("linear", "linear"), ("log", "log"), ("linear", "log")])
def test_scalar_inside_a_2d_grid_equals_the_general_path(scales):
    """Grid.scalar's written-out path for queries inside a 2-D grid gives exactly the latency and
    provenance of the general scalar path, on grid points, between them and off the grid."""
    rng = np.random.default_rng(7)
    a0, a1 = np.array([1.0, 2.0, 8.0, 32.0]), np.array([16.0, 100.0, 1000.0, 4096.0, 8192.0])
    vals = np.outer(a0, np.sqrt(a1)) * 1e-3 + rng.uniform(0.01, 0.2, (4, 5))
    prov = rng.integers(0, 3, (4, 5)).astype(np.int8)
    g = Grid((a0, a1), vals, prov, lambda b, s: np.asarray(b, float) * np.asarray(s, float) * 1e-4 + 0.1, scales=scales)
    qs = [(float(b), float(s)) for b in [0.5, 1.0, 1.5, 2.0, 7.3, 8.0, 31.9, 32.0, 40.0]
          for s in [8.0, 16.0, 17.0, 100.0, 555.5, 4096.0, 8000.0, 8192.0, 9000.0]]
    qs += [(float(b), float(s)) for b, s in zip(rng.uniform(1, 32, 200), rng.uniform(16, 8192, 200))]
    for b, s in qs:
        assert g.scalar(b, s) == g._scalar((b, s), False)


def _table(cols: dict, latency) -> "object":
    from pathlib import Path

    from infercast.data.tables import Table

    keys = {k: np.asarray(v) for k, v in cols.items()}
    return Table("gemm", Path("synthetic"), keys, {"latency": np.asarray(latency, dtype=float)}, len(latency))


def test_merge_kernels_by_hand():
    """Per (n, k, m) shape the first row of the kernel with the most rows (the backend's default),
    then the next kernel's rows where the default has no point; a repeated shape of one kernel
    keeps its first row; a NaN shape equals nothing (each such row kept); rows outside the mask
    stay out."""
    from infercast.ops.base import merge_kernels, sites_and_curves

    nan = float("nan")
    cols = {
        "kernel_source": ["a", "a", "a", "b", "b", "a", "b", "b", "c"],
        "n": [1, 1, 1, 1, 1, 2, 2, nan, 9],
        "k": [1, 1, 1, 1, 1, 1, 1, 1, 9],
        "m": [1, 2, 1, 2, 4, 1, 1, 1, 9],
    }
    t = _table(cols, range(9))
    mask = np.array([True] * 8 + [False])
    out, order = merge_kernels(t, mask, ("n", "k", "m"), "vllm")
    assert order == ["a", "b"]  # four rows of a, four of b: ties go by name
    # rows: 0 (1,1,1) a; 1 (1,1,2) a; 2 repeats 0; 3 repeats 1 in b; 4 (1,1,4) only b; 5 (2,1,1) a;
    # 6 repeats 5 in b; 7 a NaN shape; 8 outside the mask
    assert np.flatnonzero(out).tolist() == [0, 1, 4, 5, 7]
    one, order1 = merge_kernels(t, np.array([True, True] + [False] * 7), ("n", "k", "m"), "vllm")
    assert order1 == ["a"] and one.tolist() == [True, True] + [False] * 7
    # one site (n, k) = (1, 1) with its m axis; the masked rows' latencies on it
    sites, curves = sites_and_curves(t, np.array([True, True, False, False, True, True, False, False, False]), ("n", "k"), ("m",))
    assert sites.tolist() == [[1.0, 1.0], [2.0, 1.0]]
    (axis,), vals = curves[0]
    assert axis.tolist() == [1.0, 2.0, 4.0] and vals.tolist() == [0.0, 1.0, 4.0]
    (axis,), vals = curves[1]
    assert axis.tolist() == [1.0] and vals.tolist() == [5.0]


def test_unique_rows_is_numpys():
    from infercast.ops.base import unique_rows

    rng = np.random.default_rng(7)
    for _ in range(100):
        a = rng.integers(-3, 4, size=(int(rng.integers(1, 40)), int(rng.integers(1, 4)))).astype(float)
        u, i = np.unique(a, axis=0, return_inverse=True)
        u2, i2 = unique_rows(a)
        assert np.array_equal(u, u2) and np.array_equal(i.reshape(-1), i2)
    u, i = unique_rows(np.array([[2.0, 1.0], [1.0, 5.0], [2.0, 1.0], [1.0, 0.5]]))
    assert u.tolist() == [[1.0, 0.5], [1.0, 5.0], [2.0, 1.0]] and i.tolist() == [2, 1, 2, 0]
    assert unique_rows(np.zeros((3, 0)))[1].tolist() == [0, 0, 0]


def test_despike_flat_is_despike_per_curve():
    """Curves laid end to end are despiked as each on its own: a point is never compared across a
    curve boundary (a curve's last point above the next curve's first is no spike)."""
    from infercast.ops.base import despike, despike_flat

    rng = np.random.default_rng(3)
    for _ in range(50):
        lens = rng.integers(1, 7, size=int(rng.integers(1, 8)))
        curves = [np.exp(rng.normal(size=k)) * np.where(rng.random(k) < 0.3, 5.0, 1.0) for k in lens]
        for c in curves:
            c[rng.random(len(c)) < 0.1] = np.nan
        starts = np.concatenate([[0], np.cumsum(lens)])
        flat = despike_flat(np.concatenate(curves), starts)
        for s, c in enumerate(curves):
            assert np.array_equal(flat[starts[s]:starts[s + 1]], despike(c), equal_nan=True)
    # by hand: [1, 10, 1 | 10, 1]: the 10 inside the first curve is a spike; the second curve's 10 is its edge
    assert despike_flat(np.array([1.0, 10.0, 1.0, 10.0, 1.0]), np.array([0, 3, 5])).tolist() == [1.0, 1.0, 1.0, 10.0, 1.0]


def test_grid_axis_must_be_sorted_with_distinct_last_points():
    """_locate relies on it: the weight of the right neighbour is (x - x0) / (x1 - x0) with x1 > x0."""
    for bad in ([1.0, 4.0, 2.0], [1.0, 2.0, 2.0], [1.0, float("nan"), 4.0]):
        with pytest.raises(ValueError, match="sorted 1-D array whose last two points differ"):
            Grid((np.array(bad),), np.ones(3), np.zeros(3, np.int8))
    # a repeated point inside the axis is never an interval's left end: the same values as without it
    g = Grid((np.array([1.0, 2.0, 2.0, 4.0]),), np.array([1.0, 3.0, 3.0, 7.0]), np.zeros(4, np.int8))
    h = Grid((np.array([1.0, 2.0, 4.0]),), np.array([1.0, 3.0, 7.0]), np.zeros(3, np.int8))
    q = np.array([1.0, 1.5, 2.0, 3.0, 4.0])
    assert np.array_equal(g.latency(q), h.latency(q)) and np.array_equal(h.latency(q), [1.0, 2.0, 3.0, 5.0, 7.0])


@HYP
@given(st.integers(1, 9), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_median_rows_is_numpys_median_over_the_first_axis(n, m, seed):
    """grid.median_rows (used instead of np.median, whose first call imports numpy.ma) gives
    np.median(a, axis=0) bit for bit, NaN and infinities included."""
    rng = np.random.default_rng(seed)
    a = rng.lognormal(size=(n, m)) * 10.0 ** rng.integers(-3, 3)
    for v in (np.nan, np.inf, -np.inf):
        if rng.random() < 0.3:
            a[rng.integers(n), rng.integers(m)] = v
    with np.errstate(invalid="ignore"):
        want, got = np.median(a, axis=0), grid_mod.median_rows(a)
    assert np.array_equal(got, want, equal_nan=True)
