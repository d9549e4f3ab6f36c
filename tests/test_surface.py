"""Compiled latency surfaces (infercast.engine.surface) against the op-by-op path, on the
synthetic pack: random shapes (hypothesis), the closed-form decode mean, the file form read back
by a minimal independent reader (pyarrow + numpy only), and the CLI's compile subcommand."""

from __future__ import annotations

import json
from bisect import bisect_left

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import synthpack as sp
from infercast import Estimator
from infercast.engine.surface import Curve, OutsideSurfaceError, Surface, build_curve
from infercast.errors import InfercastError

TOL = 1e-3  # the bound: 0.1% on every tested shape


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


@pytest.fixture(scope="module")
def surf(est):
    return est.surface()


def _close(a, b):
    return abs(a / b - 1.0) <= TOL


def test_curve_keeps_the_value_on_a_knot_apart_from_its_limits():
    c = Curve([1.0, 2.0, 4.0], [10.0, 99.0, 30.0], [11.0, 21.0], [19.0, 29.0])
    assert c(2.0) == 99.0  # the stored point, not the blend either side
    assert c(1.5) == pytest.approx(15.0)
    assert c(3.0) == pytest.approx(25.0)
    assert c(4.0) == 30.0
    np.testing.assert_allclose(c.eval(np.array([1.0, 1.5, 2.0, 3.0, 4.0])), [10.0, 15.0, 99.0, 25.0, 30.0])


def test_build_curve_refines_a_nonlinear_function_to_tolerance():
    c = build_curve(lambda x: np.asarray(x, float) ** 2 + 1.0, [], 1000.0, tol=1e-5)
    q = np.linspace(1.0, 1000.0, 5001)
    assert np.max(np.abs(c.eval(q) / (q**2 + 1.0) - 1.0)) < 5e-5


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 64), isl=st.integers(1, 8192), prefix=st.one_of(st.just(0), st.integers(1, 4096)))
def test_prefill_matches_op_by_op(surf, est, b, isl, prefix):
    try:
        exact = est.engine.prefill_scalar(float(b), float(isl), float(prefix))
    except InfercastError:
        with pytest.raises(InfercastError):
            surf.prefill_ms(b, isl, prefix)
        return
    assert _close(surf.prefill_ms(b, isl, prefix), exact)


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 512), kv=st.integers(1, 65536))
def test_decode_step_matches_op_by_op(surf, est, b, kv):
    try:
        exact = est.engine.decode_scalar(float(b), float(kv))
    except InfercastError:
        return
    assert _close(surf.decode_step_ms(b, kv), exact)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 256), isl=st.integers(1, 8192), osl=st.integers(1, 3000))
def test_decode_mean_closed_form_matches_every_step(surf, est, b, isl, osl):
    n = max(osl - 1, 1)
    kv = isl + 1.0 + np.arange(n)
    try:
        exact = float(np.mean(est.engine.decode_ms(float(b), kv)))
    except InfercastError:
        return
    assert _close(surf.decode_ms(b, isl, osl), exact)


def test_decode_mean_agrees_with_estimator_for_short_outputs(surf, est):
    for b, isl, osl in [(1, 1, 2), (8, 1000, 100), (32, 4000, 257), (3, 77, 5)]:
        assert _close(surf.decode_ms(b, isl, osl), est.decode_ms(b, isl, osl))


def test_mixed_step_matches_engine(surf, est):
    for pb, pi, pp, db, dk in [(1, 512, 0, 8, 2000), (2, 1000, 300, 32, 700), (4, 64, 4000, 1, 2)]:
        assert _close(surf.mixed_ms(pb, pi, pp, db, dk), est.engine.mixed_step_ms([pb], [pi], [pp], db, dk))


@settings(max_examples=100, deadline=None)
@given(pb=st.integers(1, 8), pi=st.integers(1, 4096), pp=st.one_of(st.just(0), st.integers(1, 4096)),
       db=st.integers(1, 256), dk=st.integers(2, 32768))
def test_mixed_step_matches_op_by_op(surf, est, pb, pi, pp, db, dk):
    try:
        exact = est.engine.mixed_step_ms([pb], [pi], [pp], db, dk)
    except InfercastError:
        return
    assert _close(surf.mixed_ms(pb, pi, pp, db, dk), exact)


def test_vectorised_forms_match_scalar(surf):
    rng = np.random.default_rng(3)
    b = rng.integers(1, 8, 500).astype(float)
    i = rng.integers(1, 8192, 500).astype(float)
    p = np.where(rng.random(500) < 0.3, rng.integers(1, 2000, 500), 0).astype(float)
    np.testing.assert_allclose(surf.prefill_many(b, i, p), [surf.prefill_ms(*x) for x in zip(b, i, p)], rtol=1e-12)
    np.testing.assert_allclose(surf.decode_step_many(b, i), [surf.decode_step_ms(*x) for x in zip(b, i)], rtol=1e-12)
    n = np.where(rng.random(500) < 0.2, 0, rng.integers(1, 64, 500)).astype(float)
    kv = rng.integers(2, 9000, 500).astype(float)
    b0 = np.where(rng.random(500) < 0.2, 0.0, b)
    np.testing.assert_allclose(surf.mixed_many(b0, i, p, n, kv), [surf.mixed_ms(*x) for x in zip(b0, i, p, n, kv)], rtol=1e-12)
    o = rng.integers(1, 600, 500).astype(float)
    np.testing.assert_allclose(surf.decode_many(b, i, o), [surf.decode_ms(*x) for x in zip(b, i, o)], rtol=1e-10)


# ---- file form ---------------------------------------------------------------------------------
def _mini_reader(path):
    """An independent reader: the format as docs/surface-format.md states it, pyarrow + numpy."""
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
    meta = json.loads(table.schema.metadata[b"infercast.surface"])
    rows = table.to_pylist()

    def curve(name, q):
        r = next(r for r in rows if r["name"] == name)
        x = r["x"]
        i = min(int(np.searchsorted(x, q, side="right")) - 1, len(x) - 1)
        if x[i] == q:
            return r["values"][i]
        return float(np.interp(q, [x[i], x[i + 1]], [r["left"][i], r["right"][i]]))

    def sheet(name, qx, qy):
        ex, ey = meta["tiles"][name]
        tx, ty = bisect_left(ex[1:-1], qx), bisect_left(ey[1:-1], qy)
        r = next(r for r in rows if r["name"] == name and r["tile_x"] == tx and r["tile_y"] == ty)
        x, y = np.array(r["x"]), np.array(r["y"])
        V = np.array(r["values"]).reshape(len(x), len(y))
        fy = np.log if r["y_scale"] == "log" else (lambda v: v)
        col = [np.interp(qx, x, V[:, j]) for j in range(len(y))]  # linear along x at every y knot
        if r["y_scale"] == "log":
            return float(np.exp(np.interp(fy(qy), fy(y), np.log(col))))
        return float(np.interp(qy, y, col))

    return meta, curve, sheet


def test_written_file_evaluates_the_same_with_a_minimal_reader(surf, tmp_path):
    path = surf.write(tmp_path / "s.arrow")
    meta, curve, sheet = _mini_reader(path)
    assert meta["format"] == "infercast-surface" and meta["version"] == 1
    assert meta["identity"]["model"] == sp.MODEL_ID and meta["identity"]["backend"] == "trtllm"
    w = meta["decode_width"]
    # shapes inside tabulated tiles (a region left to the op-by-op path has no row)
    shapes = [(b, isl) for b, isl in [(1, 1), (4, 1000), (16, 2000), (2, 5000), (7, 333), (3, 20000)]
              if surf._actx.tile(b, isl) is not None and b * isl <= surf._tok_hi]
    assert len(shapes) >= 4
    for b, isl in shapes:
        v = curve("tok_ctx", b * isl) + (curve("seq_ctx", b) if "seq_ctx" in meta["curves"] else 0.0) + sheet("actx", b, isl)
        assert _close(v, surf.prefill_ms(b, isl))
    steps = [(b, kv) for b, kv in [(1, 2), (8, 1000), (100, 5000), (3, 8000), (2, 40000)]
             if surf._gen.tile(b, max(kv - 1, 1)) is not None]
    assert len(steps) >= 3
    for b, kv in steps:
        v = curve("dec", b) + sheet("gen", b, max(kv - 1, 1))
        assert _close(v, surf.decode_step_ms(b, kv))
    assert w == surf.decode_width


def test_surface_read_back_is_identical_and_refuses_outside(surf, tmp_path):
    path = surf.write(tmp_path / "s.arrow")
    back = Surface.read(path)
    assert Estimator.from_surface(path).identity == back.identity == surf.identity
    for args in [(1, 1), (4, 1000, 0), (16, 1000, 500)]:
        assert back.prefill_ms(*args) == surf.prefill_ms(*args)
    assert back.decode_ms(8, 1000, 300) == surf.decode_ms(8, 1000, 300)
    with pytest.raises(OutsideSurfaceError):
        back.prefill_ms(1, 1e9)


def test_read_rejects_a_file_that_is_not_a_surface(tmp_path):
    p = tmp_path / "x.arrow"
    t = pa.table({"a": [1]})
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(InfercastError, match="not an infercast surface"):
        Surface.read(p)


def test_cli_compile_writes_a_surface(synth, tmp_path, capsys):
    from infercast.cli.main import main

    out = tmp_path / "c.arrow"
    rc = main(["compile", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
               "--systems-path", str(synth.systems_dir), "--out", str(out)])
    assert rc == 0 and out.exists()
    back = Surface.read(out)
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    assert _close(back.prefill_ms(4, 1000), est.prefill_ms(4, 1000))


def test_cli_compile_without_out_is_a_one_line_error(synth, capsys):
    from infercast.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["compile", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm"])
    assert e.value.code == 2


def test_fractional_batch_and_uncovered_regions_answer_op_by_op(surf, est):
    # the batch axis is checked at whole numbers only: a fractional batch goes to the op-by-op path
    assert surf.prefill_ms(2.5, 1000) == est.engine.prefill_scalar(2.5, 1000.0, 0.0)
    assert surf.decode_step_ms(3.5, 700) == est.engine.decode_scalar(3.5, 700.0)
    missing = [(i, j) for i, row in enumerate(surf._actx.tiles) for j, t in enumerate(row) if t is None]
    for i, j in missing:  # a tile left out (too many cells for the tolerance): the op-by-op path
        ex, ey = surf._actx.ends
        b, L = float(int((ex[i] + ex[i + 1]) / 2)), float(int((ey[j] + ey[j + 1]) / 2))
        if b * L <= surf._tok_hi:
            assert surf.prefill_ms(b, L) == est.engine.prefill_scalar(b, L, 0.0)


# ---- the real pack -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(real_pack_available):
    est = Estimator("Qwen/Qwen3-32B", "h200_sxm", "vllm", tp=1)
    return est, est.surface()


@pytest.mark.real_pack
@settings(max_examples=150, deadline=None)
@given(b=st.integers(1, 256), isl=st.integers(1, 32768), prefix=st.one_of(st.just(0), st.integers(1, 16384)),
       kv=st.integers(2, 131072))
def test_real_pack_surfaces_match_op_by_op(real, b, isl, prefix, kv):
    est, surf = real
    try:
        exact = est.engine.prefill_scalar(float(b), float(isl), float(prefix))
    except InfercastError:
        exact = None
    if exact is not None:
        assert _close(surf.prefill_ms(b, isl, prefix), exact)
    try:
        exact = est.engine.decode_scalar(float(b), float(kv))
    except InfercastError:
        return
    assert _close(surf.decode_step_ms(b, kv), exact)
