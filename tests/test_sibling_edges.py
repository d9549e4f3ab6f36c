"""A curve that stops short of its siblings' range is extended by their utilisation trend
(infercast.interp.transfer.extend_from_siblings; GEMM site grids use it beyond their high edge)."""

import numpy as np
import pytest

from infercast.interp.grid import Grid
from infercast.interp.provenance import Prov
from infercast.interp.transfer import extend_from_siblings, siblings_by_distance
from infercast.ops.gemm import build_site_grid, lattice_reach


def sol_fn(scale):
    """A roofline-like speed of light: fixed cost plus linear work."""
    return lambda m: scale * (2.0 + np.asarray(m, dtype=float))


def trend(m):
    """Utilisation shape shared by every site: climbs then saturates."""
    m = np.asarray(m, dtype=float)
    return m / (m + 8.0)


def curve(scale, c, xs):
    """Latency of a site whose utilisation is ``c * trend``."""
    xs = np.asarray(xs, dtype=float)
    return xs, sol_fn(scale)(xs) / (c * trend(xs))


FULL = np.array([1, 2, 4, 8, 16, 32, 64], float)


def test_extension_recovers_a_shared_trend_exactly():
    x, v = curve(3.0, 0.7, FULL[:5])  # stops at 16
    sibs = [(*curve(s, c, FULL), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    xe, ve, pe = extend_from_siblings(x, v, sol_fn(3.0), sibs, k=3, own_points=2)
    np.testing.assert_array_equal(xe, FULL)
    _, want = curve(3.0, 0.7, FULL)
    np.testing.assert_allclose(ve, want, rtol=1e-12)
    np.testing.assert_array_equal(ve[:5], v)  # measured points untouched, bit for bit
    assert list(pe) == [Prov.EXACT] * 5 + [Prov.HELD] * 2


def test_median_over_siblings_ignores_one_outlier():
    x, v = curve(3.0, 0.7, FULL[:5])
    good = [(*curve(s, c, FULL), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9))]
    ox, ov = curve(4.0, 0.8, FULL)
    ov = ov.copy()
    ov[5:] *= 3.0  # an outlier sibling: 3x slower beyond the edge
    sibs = [good[0], (ox, ov, sol_fn(4.0)), good[1]]
    _, ve, _ = extend_from_siblings(x, v, sol_fn(3.0), sibs, k=3, own_points=1)
    _, want = curve(3.0, 0.7, FULL)
    np.testing.assert_allclose(ve, want, rtol=1e-12)


def test_extension_is_carried_from_several_own_points_so_a_disturbed_edge_does_not_move_it():
    """The curve's last measured point is a disturbed run (2x). Carried from the last two points
    the trend inherits part of the disturbance (the median of two utilisations, u and u / 2, is
    their mean, 0.75 u: latency x 4 / 3); from the
    default number of own points the undisturbed ones outvote it and the extension is exact."""
    dense = np.arange(1.0, 65.0)
    x, v = curve(3.0, 0.7, dense[:16])
    v = v.copy()
    v[-1] *= 2.0
    sibs = [(*curve(s, c, dense), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    _, want = curve(3.0, 0.7, dense)
    _, ve, _ = extend_from_siblings(x, v, sol_fn(3.0), sibs, k=3)
    np.testing.assert_allclose(ve[16:], want[16:], rtol=1e-12)
    _, ve2, _ = extend_from_siblings(x, v, sol_fn(3.0), sibs, k=3, own_points=2)
    np.testing.assert_allclose(ve2[16:], want[16:] * 4.0 / 3.0, rtol=1e-12)


def test_only_the_k_nearest_siblings_count():
    x, v = curve(3.0, 0.7, FULL[:5])
    near = (*curve(1.0, 0.5, FULL), sol_fn(1.0))
    fx, fv = curve(2.0, 0.5, FULL)
    far = (fx, fv * np.where(fx > 16, 2.0, 1.0), sol_fn(2.0))  # a different trend, further away
    _, ve, _ = extend_from_siblings(x, v, sol_fn(3.0), [near, far], k=1, own_points=1)
    np.testing.assert_allclose(ve, curve(3.0, 0.7, FULL)[1], rtol=1e-12)
    _, ve2, _ = extend_from_siblings(x, v, sol_fn(3.0), [far, near], k=1, own_points=1)
    assert ve2[-1] == pytest.approx(2.0 * ve[-1], rel=1e-12)


def test_no_sibling_beyond_the_edge_leaves_the_curve_alone():
    x, v = curve(3.0, 0.7, FULL)
    sibs = [(*curve(1.0, 0.5, FULL[:4]), sol_fn(1.0))]
    xe, ve, pe = extend_from_siblings(x, v, sol_fn(3.0), sibs)
    np.testing.assert_array_equal(xe, x)
    np.testing.assert_array_equal(ve, v)
    assert not pe.any()


def test_reach_short_circuits_without_walking_the_siblings():
    x, v = curve(3.0, 0.7, FULL)

    def siblings():
        raise AssertionError("siblings walked although the curve reaches the lattice's range")
        yield  # pragma: no cover

    _, ve, _ = extend_from_siblings(x, v, sol_fn(3.0), siblings(), reach=64.0)
    np.testing.assert_array_equal(ve, v)


def test_siblings_by_distance_is_nearest_first_and_stable():
    sites = np.array([[1024, 1024], [2048, 1024], [512, 1024], [1024, 4096], [4096, 4096]], float)
    order = siblings_by_distance((1024, 1024), sites, exclude=0)
    # 2048 and 512 are one octave away each: the tie keeps the sites' order
    assert list(order) == [1, 2, 3, 4]


def test_gemm_site_grid_is_exact_on_its_points_and_held_beyond():
    x, v = curve(3.0, 0.7, FULL[:5])
    sibs = [(*curve(s, c, FULL), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    g = build_site_grid(x, v, sol_fn(3.0), sibs, reach=64.0)
    val, prov = g(x)
    np.testing.assert_array_equal(val, v)
    assert not prov.any()
    val, prov = g(np.array([32.0, 64.0]))
    np.testing.assert_allclose(val, curve(3.0, 0.7, [32.0, 64.0])[1], rtol=1e-12)
    assert list(prov) == [Prov.HELD, Prov.HELD]
    assert lattice_reach({0: ((x,), v), 1: ((FULL,), curve(1.0, 0.5, FULL)[1])}) == 64.0


def test_transfer_donors_drop_only_disturbed_points():
    from infercast.ops.gemm import DONOR_CLIP, donor_values

    v = np.array([10.0, 10.2, 10.1, 14.0, 10.3, 10.4, 10.6, 10.5])  # one disturbed run at index 3
    d = donor_values(v)
    assert d[3] == pytest.approx(10.3)  # the median of its five nearest points
    keep = np.arange(len(v)) != 3
    np.testing.assert_array_equal(d[keep], v[keep])  # the rest bit for bit
    small = v.copy()
    small[3] = 10.2 * (1.0 + 0.5 * DONOR_CLIP)  # within the clip: kept
    assert donor_values(small)[3] == small[3]


# ---- holes inside a curve (infercast.interp.transfer.fill_holes_from_siblings) -----------------
def test_hole_is_the_weighted_geometric_mean_of_own_and_sibling_estimates():
    """sol(m) = m; the own curve has utilisation 0.5 at 2 and 8 and lacks 4; the siblings step up
    to twice their utilisation at 4. Sibling estimate: u(4) = 0.5 x 2 = 1 -> 4 ms; own linear grid:
    4 + (16 - 4) x (4 - 2) / (8 - 2) = 8 ms; the answer 4^w x 8^(1 - w)."""
    from infercast.interp.transfer import SIBLING_WEIGHT as w
    from infercast.interp.transfer import fill_holes_from_siblings

    def sol(m):
        return np.asarray(m, dtype=float)

    x = np.array([2.0, 8.0])
    v = x / 0.5
    sx = np.array([2.0, 4.0, 8.0])
    sibs = [(sx, sx / np.array([0.4, 0.8, 0.4]) * s, lambda m, s=s: s * np.asarray(m, dtype=float)) for s in (1.0, 3.0)]
    hx, hv = fill_holes_from_siblings(x, v, sol, sibs, k=2)
    np.testing.assert_array_equal(hx, [4.0])
    np.testing.assert_allclose(hv, [4.0 ** w * 8.0 ** (1.0 - w)], rtol=1e-12)
    hx, hv = fill_holes_from_siblings(x, v, sol, sibs, k=2, weight=0.5)
    np.testing.assert_allclose(hv, [np.sqrt(4.0 * 8.0)], rtol=1e-12)


def test_hole_is_carried_from_several_own_points_so_one_disturbed_neighbour_does_not_move_it():
    """sol(m) = m, every curve at utilisation 0.5 (so latency 2 m) except the own curve's point at
    6, disturbed to 3x. The hole at 8 has the disturbed 6 as a neighbour; carried from up to three
    own points per side (2, 4, 6 | 10, 12, 14) by the siblings' flat ratios, the median of the six
    estimates is the undisturbed 16 ms, whatever the own grid says there."""
    from infercast.interp.transfer import fill_holes_from_siblings

    def sol(m):
        return np.asarray(m, dtype=float)

    x = np.array([2.0, 4.0, 6.0, 10.0, 12.0, 14.0])
    v = 2.0 * x
    v[2] *= 3.0
    sx = np.arange(2.0, 16.0, 2.0)
    sibs = [(sx, 2.0 * sx * s, lambda m, s=s: s * np.asarray(m, dtype=float)) for s in (1.0, 2.0, 4.0)]
    own = float(Grid((x,), v, np.zeros(len(x), np.int8), sol)(np.array([8.0]))[0][0])
    for anchors, sib in ((3, 16.0), (1, 16.0 * np.sqrt(3.0))):   # one per side: the disturbed 6 counts half
        hx, hv = fill_holes_from_siblings(x, v, sol, sibs, k=3, own_points=anchors, weight=0.5)
        np.testing.assert_array_equal(hx, [8.0])
        np.testing.assert_allclose(hv, [np.sqrt(sib * own)], rtol=1e-12)


def test_only_majority_holes_inside_the_range_are_filled():
    from infercast.interp.transfer import fill_holes_from_siblings

    x, v = curve(3.0, 0.7, [2, 8, 16])
    sibs = [(*curve(1.0, 0.5, [1, 2, 4, 8, 16, 32]), sol_fn(1.0)),   # 4 and 32 ...
            (*curve(2.0, 0.9, [2, 4, 8, 12, 16]), sol_fn(2.0)),       # 4, and 12 (one of three: no hole)
            (*curve(5.0, 0.6, [2, 4, 8, 16, 64]), sol_fn(5.0))]
    hx, hv = fill_holes_from_siblings(x, v, sol_fn(3.0), sibs, k=3)
    np.testing.assert_array_equal(hx, [4.0])  # 1, 32, 64 lie outside (2, 16): the edge rules' business
    # a shared utilisation trend: both estimates are exact away from steps, the hole lands on the curve
    assert hv[0] == pytest.approx(curve(3.0, 0.7, [4])[1][0], rel=0.2)
    assert fill_holes_from_siblings(x[:1], v[:1], sol_fn(3.0), sibs)[0].size == 0   # one point: nothing inside
    assert fill_holes_from_siblings(x, v, sol_fn(3.0), [])[0].size == 0


def test_gemm_site_grid_keeps_measured_points_and_marks_filled_holes():
    x, v = curve(3.0, 0.7, [2, 8, 16])
    sibs = [(*curve(s, c, [2, 4, 8, 16]), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    g = build_site_grid(x, v, sol_fn(3.0), iter(sibs))
    vals, prov = g(np.array([2.0, 4.0, 8.0, 16.0]))
    np.testing.assert_array_equal(vals[[0, 2, 3]], v)   # exact hits bit for bit
    assert prov[1] == Prov.INTERPOLATED and (prov[[0, 2, 3]] == Prov.EXACT).all()


# ---- below the low edge (infercast.interp.transfer.extend_below_from_siblings) -----------------
def _batch_one_path(xs, factor):
    """A site of the shared trend whose kernel takes ``factor`` times as long at m = 1."""
    x, v = curve(*xs)
    return x, np.where(x == 1.0, v * factor, v)


def test_below_edge_takes_the_siblings_regime_when_it_departs_from_the_own_rule():
    """Every sibling runs m = 1 three times slower than the trend; the curve lost its m = 1. Its
    own rule (the trend's shape) cannot know; the siblings' utilisation ratio u(1) / u(2) carries
    it from the curve's first point: exactly 3x the trend's latency at m = 1."""
    from infercast.interp.transfer import extend_below_from_siblings

    x, v = curve(3.0, 0.7, FULL[1:])
    sibs = [(*_batch_one_path((s, c, FULL), 3.0), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    own_at_1 = curve(3.0, 0.7, [1.0])[1][0]  # an own rule that follows the trend exactly
    xe, ve, pe = extend_below_from_siblings(x, v, sol_fn(3.0), sibs, lambda t: own_at_1, floor=1.0, k=3, own_points=1)
    np.testing.assert_array_equal(xe, FULL)
    assert ve[0] == pytest.approx(3.0 * own_at_1, rel=1e-12)
    np.testing.assert_array_equal(ve[1:], v)  # measured points untouched, bit for bit
    assert list(pe) == [Prov.HELD] + [Prov.EXACT] * (len(FULL) - 1)


def test_below_edge_blends_with_the_own_rule_where_the_siblings_agree_with_it():
    from infercast.interp.transfer import (
        SIBLING_LOW_GATE,
        SIBLING_WEIGHT,
        extend_below_from_siblings,
    )

    x, v = curve(3.0, 0.7, FULL[1:])
    own_at_1 = curve(3.0, 0.7, [1.0])[1][0]
    inside = np.exp(0.9 * SIBLING_LOW_GATE)  # a departure just inside the gate: blended, not taken
    sibs = [(*_batch_one_path((s, c, FULL), inside), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9))]
    xe, ve, pe = extend_below_from_siblings(x, v, sol_fn(3.0), sibs, lambda t: own_at_1, floor=1.0, k=2)
    np.testing.assert_array_equal(xe, FULL)
    assert ve[0] == pytest.approx(own_at_1 * inside ** SIBLING_WEIGHT, rel=1e-12)
    np.testing.assert_array_equal(ve[1:], v)
    assert list(pe) == [Prov.HELD] + [Prov.EXACT] * (len(FULL) - 1)
    outside = np.exp(1.1 * SIBLING_LOW_GATE)
    sibs = [(*_batch_one_path((s, c, FULL), outside), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9))]
    xe, ve, _ = extend_below_from_siblings(x, v, sol_fn(3.0), sibs, lambda t: own_at_1, floor=1.0, k=2)
    assert xe[0] == 1.0 and ve[0] == pytest.approx(outside * own_at_1, rel=1e-12)


def test_below_edge_floor_short_circuits_without_walking_the_siblings():
    from infercast.interp.transfer import extend_below_from_siblings

    x, v = curve(3.0, 0.7, FULL)

    def siblings():
        raise AssertionError("siblings walked although the curve starts at the lattice's floor")
        yield  # pragma: no cover

    _, ve, _ = extend_below_from_siblings(x, v, sol_fn(3.0), siblings(), lambda t: 1.0, floor=1.0)
    np.testing.assert_array_equal(ve, v)


def test_gemm_site_grid_serves_a_lost_first_point_from_its_siblings():
    from infercast.ops.gemm import lattice_floor

    x, v = curve(3.0, 0.7, FULL[1:])
    sibs = [(*_batch_one_path((s, c, FULL), 3.0), sol_fn(s)) for s, c in ((1.0, 0.5), (2.0, 0.9), (5.0, 0.6))]
    floor = lattice_floor({0: ((x,), v), 1: ((FULL,), sibs[0][1])})
    assert floor == 1.0
    g = build_site_grid(x, v, sol_fn(3.0), sibs, reach=64.0, floor=floor)
    val, prov = g(np.array([1.0]))
    assert prov[0] == Prov.HELD
    assert val[0] == pytest.approx(3.0 * curve(3.0, 0.7, [1.0])[1][0], rel=1e-12)
    np.testing.assert_array_equal(g(x)[0], v)
    # without a floor (or a curve that starts at it) the grid is the own points' alone
    val_own, _ = build_site_grid(x, v, sol_fn(3.0), sibs, reach=64.0)(np.array([1.0]))
    assert val_own[0] < val[0] / 2


# ---- attention low edges (infercast.ops.attention.extend_low_edges) ----------------------------
def test_attention_low_edge_is_carried_from_several_own_rows_so_a_disturbed_first_row_does_not_move_it():
    """Every site runs at utilisation 0.5 of sol(batch, step) = batch x step. The site lost its
    batch-1 row and its first remaining row (batch 2) is a disturbed run (2x). Carried from that
    row alone by the siblings' flat utilisation change, batch 1 comes out 2x too slow; from the
    first LOW_EDGE_OWN_POINTS rows, the median, the undisturbed rows outvote it: exactly 2 x sol."""
    from infercast.interp.grid import LINEAR
    from infercast.ops import attention as attn

    def sol(b, s):
        return np.asarray(b, dtype=float) * np.asarray(s, dtype=float)

    batches, steps = np.array([2.0, 4.0, 8.0, 16.0]), np.array([1.0, 2.0, 4.0])
    vals = 2.0 * sol(batches[:, None], steps[None, :])
    vals[0] *= 2.0
    sib_b = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    sib_grid = Grid((sib_b, steps), 2.0 * sol(sib_b[:, None], steps[None, :]), np.zeros((5, 3), np.int8), sol,
                    scales=(LINEAR, LINEAR))
    sib = attn.Siblings(site=(32, 8), sites=np.array([[16.0, 4.0], [64.0, 16.0]]), axes=[(sib_b, steps)] * 2,
                        grid=lambda k: sib_grid)
    prov = np.zeros(vals.shape, np.int8)
    axes, out, p = attn.extend_low_edges("generation_attention", (batches, steps), vals, prov, sol, sib)
    np.testing.assert_array_equal(axes[0], sib_b)
    np.testing.assert_allclose(out[0], 2.0 * sol(1.0, steps), rtol=1e-12)
    np.testing.assert_array_equal(out[1:], vals)   # measured cells bit for bit
    assert (p[0] == Prov.TRANSFERRED).all() and not p[1:].any()
