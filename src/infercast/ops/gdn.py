"""Gated DeltaNet (GDN) linear attention — the recurrent core of Qwen3-Next / Qwen3.5 — as an
attention-like op: a context grid over ``(batch, isl)`` and a generation grid over
``(batch, step)``.

What the op covers: the short causal conv over the mixed q/k/v channels plus the gated
delta-rule scan of one layer on one GPU. The GDN projections (``in_proj_qkvz``, ``in_proj_ba``,
``out_proj``), the gating and the output norm are *not* part of it: the plan adds them as GEMMs /
elementwise ops. Head counts are **per GPU** (the caller divides by TP).

Source: ``gdn_perf`` (family ``linear_attention``). The table splits one layer's core into
``kernel_source`` rows that the engine runs back to back, so the op **sums** two rows per cell:

* context: ``causal_conv1d_fn`` + the chunked scan (sglang and trtllm ``chunk_gated_delta_rule``,
  vllm ``chunk_gated_delta_rule_flashinfer`` on Hopper/Blackwell and
  ``chunk_gated_delta_rule_triton`` on l40s / rtx_pro_6000);
* generation: ``causal_conv1d_update`` + the recurrent step (sglang and vllm
  ``fused_recurrent_gated_delta_rule_packed_decode``, trtllm ``fused_recurrent_gated_delta_rule``).

Every table of the 0.12.0 pack has exactly one conv and one scan kernel per phase (a100 sglang
0.5.10 has no context scan at all: SILICON raises there). Should a table carry several scan
kernels, the backend default is taken by :func:`infercast.ops.base.choose_kernel` (the kernel
with the most rows: collectors sweep the engine's default path the widest); the same for the
conv. A cell is summed only where both kernels were measured; the other cells are holes, filled
like truncated corners (:func:`infercast.ops.base.fill_missing`, provenance ``held``).

Sites are ``(d_model, num_k_heads, head_k_dim, num_v_heads, head_v_dim, d_conv)``; the pack
collects head dims 128 and ``d_conv`` 4 only, so in practice ``(d_model, num_k_heads,
num_v_heads)``. ``d_model`` does not enter the kernels (checked on the real tables: the same head
counts at two ``d_model`` agree to a median ratio of 1.000 on b200 sglang, 0.96-1.07 on the
noisier h200), so it is clamped to the collected range (noted) and weighs 0.1 in the donor
distance (key heads 0.5, see ``SITE_WEIGHTS``); head counts that were not collected are
transferred through utilisation against :func:`infercast.interp.sol.gdn` (``choose_sites`` /
``transfer_grid``, provenance ``transferred``; leave-one-out over sites in docs/modelling-log.md,
'Gated DeltaNet site transfer').

*Data caveat.* h200 sglang's context rows are noisy at large token counts: the same heads at
two d_model differ by 2-3x at some cells, and from ~64k tokens per step they run ~5x slower per
token than h200 trtllm's rows of the same FLA kernel (41.8 vs 7.1 ms at 16/64 heads and 65,536
tokens; b200/b300 do not show this). The rows are used as measured (exact at collected cells);
only isolated spikes are smoothed (:func:`infercast.ops.base.despike`).

Curves:

* context: ``batch x isl`` with ``isl`` = new tokens per request. The chunked scan is linear in
  tokens (a fixed launch cost plus a per-token term), so both axes interpolate linearly
  (``CTX_SCALES``); leave-one-out over the interior isl points of the real tables agrees (see
  ``CTX_SCALES``). A cached prefix costs nothing beyond the state it left behind: a caller
  with a prefix should look up ``isl`` new tokens, not ``isl + prefix`` with a causal share.
* generation: the cost of a decode step does **not** depend on the tokens already cached (the
  recurrent state is fixed-size), but the engine asks the generation grid at
  ``(batch, step)``. The grid therefore has a step axis of two points (``GEN_STEP`` = 1 and
  2**20) holding identical values, and its SOL is step-independent, so any step — inside or
  beyond the axis — returns the batch's value (the provenance still says ``interpolated``
  between the two points and ``held`` beyond 2**20, as for any grid; the value is the
  measured one).

With no table (or no scan kernel for the phase) or a site outside the transfer gates: SILICON
raises :class:`~infercast.errors.NotAvailableError` saying what exists; HYBRID and EMPIRICAL give
SOL / the utilisation learned from the collected GDN sites (:mod:`infercast.ops.empirical`);
SOL mode gives the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.tables import Table
from ..errors import InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.transfer import choose_sites, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, choose_kernel, fill_missing, sites_and_curves, sol_resolved
from .empirical import empirical_resolved

STEM = "gdn"
PHASES = ("context", "generation")
#: kernel_source prefix of the conv rows; every other row of a phase is a scan kernel
CONV_PREFIX = "causal_conv1d"
#: site coordinates (table columns) and their weights in the donor distance (log2 units):
#: d_model does not enter the kernels (see the module docstring), so it barely counts; the value
#: heads carry the state and most of the work, so a key-head difference counts half (chosen by
#: leave-one-out over sites; see docs/modelling-log.md, 'Gated DeltaNet site transfer')
SITE_COLS = ("d_model", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "d_conv")
SITE_WEIGHTS = (0.1, 0.5, 1.0, 1.0, 1.0, 1.0)
CURVE_COLS = ("batch_size", "seq_len")

#: axes of SOL / empirical grids (the collected grids' spans)
CTX_BATCH = 2.0 ** np.arange(0, 7)
CTX_ISL = 2.0 ** np.arange(0, 16)
GEN_BATCH = 2.0 ** np.arange(0, 11)
#: the generation grid's step axis: two points with identical values (cost is step-independent)
GEN_STEP = np.array([1.0, 2.0**20])
#: interpolation space per axis: latency here is a launch cost plus a term linear in tokens, which
#: a linear blend reproduces; leave-one-out of interior points of the real curves favours linear
#: on every axis, system and backend checked but one (see docs/modelling-log.md, 'Gated DeltaNet
#: interpolation space').
CTX_SCALES = ("linear", "linear")
GEN_SCALES = ("linear", "linear")


def gdn_state_bytes(num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_kernel: int, num_k_heads: int,
                    state_bytes: float = 4.0, conv_bytes: float = 2.0) -> float:
    """GDN cache bytes one request holds per layer on one GPU (per-GPU head counts): the
    recurrent state ``num_v_heads x head_k_dim x head_v_dim`` in fp32 (``state_bytes``;
    SGLang's default SSM-state dtype) plus the conv state — the last ``conv_kernel - 1`` inputs of
    the ``2*num_k_heads*head_k_dim + num_v_heads*head_v_dim`` conv channels, in bf16
    (``conv_bytes``). Fixed-size: it does not grow with the sequence."""
    for name, v in (("num_v_heads", num_v_heads), ("head_k_dim", head_k_dim), ("head_v_dim", head_v_dim),
                    ("conv_kernel", conv_kernel), ("num_k_heads", num_k_heads)):
        if int(v) != v or v <= 0:
            raise InvalidInputError(f"GDN {name} must be a positive integer", f"got {v!r}")
    if state_bytes <= 0 or conv_bytes <= 0:
        raise InvalidInputError("GDN state and conv bytes per element must be > 0", f"got {state_bytes!r}, {conv_bytes!r}")
    conv_dim = 2.0 * num_k_heads * head_k_dim + float(num_v_heads) * head_v_dim
    return float(num_v_heads) * head_k_dim * head_v_dim * state_bytes + (conv_kernel - 1.0) * conv_dim * conv_bytes


# --------------------------------------------------------------------------------------------
# speed of light
# --------------------------------------------------------------------------------------------


def gdn_sol_fn(db: OpDB, phase: str, num_k_heads, head_k_dim, num_v_heads, head_v_dim, conv_kernel=4):
    """SOL (ms) as ``f(batch, isl)`` (context) or ``f(batch, step)`` (generation: one token per
    request, independent of ``step``)."""
    system = db.system
    args = (int(num_k_heads), int(head_k_dim), int(num_v_heads), int(head_v_dim))
    if phase == "context":

        def f(batch, isl):
            return sol.gdn(system, "context", batch, isl, *args, conv_kernel=int(conv_kernel))[0]

    else:

        def f(batch, step):
            b, s = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(step, dtype=float))
            return sol.gdn(system, "generation", b, np.ones_like(s), *args, conv_kernel=int(conv_kernel))[0]

    return f


def _axes(phase: str):
    return (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)


def _scales(phase: str):
    return CTX_SCALES if phase == "context" else GEN_SCALES


# --------------------------------------------------------------------------------------------
# table access
# --------------------------------------------------------------------------------------------


@dataclass
class _Lattice:
    conv_kernel: str
    scan_kernel: str
    sites: np.ndarray  # rows of SITE_COLS
    curves: dict  # site index -> (axes, values) over CURVE_COLS (generation: step axis = GEN_STEP)
    notes: tuple[str, ...]

    @property
    def kernel(self) -> str:
        return f"{self.conv_kernel}+{self.scan_kernel}"


def _unavailable(db: OpDB, what: str, why: str, available) -> None:
    """Raise in SILICON; return None (no lattice) otherwise."""
    if db.mode is DatabaseMode.SILICON:
        raise NotAvailableError(what, why, available)
    return None


def _lattice(db: OpDB, phase: str, model_name: str | None, stem: str = STEM) -> _Lattice | None:
    """The summed conv + scan curves of ``stem``'s table (``gdn_perf``, or ``kda_perf`` of the
    same schema: :mod:`infercast.ops.kda`)."""
    where = f"{db.backend} {db.data.version} on {db.system.name}"
    if db.mode is DatabaseMode.SOL or not db.data.has_table(stem):
        return _unavailable(db, f"no {stem}_perf table for {where}",
                            f"{stem.upper()} needs the {stem}_perf table; use --database-mode HYBRID for an empirical estimate",
                            db.data.available_tables())
    table = db.data.table(stem)
    for col in SITE_COLS + CURVE_COLS + ("phase", "kernel_source"):
        if not table.has(col):
            return _unavailable(db, f"{stem}_perf for {where} has no column {col!r}", str(table.path), table.keys)
    in_phase = table.keys["phase"] == phase
    if not in_phase.any():
        return _unavailable(db, f"{stem}_perf for {where} has no {phase} rows", "no such phase was collected", table.unique("phase"))
    if phase == "generation":
        # decode rows are one token per request (seq_len 1); anything else is not a decode step
        in_phase &= table.keys["seq_len"] == table.keys["seq_len"][in_phase].min()
    ks = table.keys["kernel_source"]
    is_conv = np.char.startswith(ks.astype(str), CONV_PREFIX)
    conv_mask, scan_mask = in_phase & is_conv, in_phase & ~is_conv
    present = sorted(set(ks[in_phase].tolist()))
    if not conv_mask.any() or not scan_mask.any():
        missing = "conv (causal_conv1d*)" if not conv_mask.any() else "delta-rule scan"
        return _unavailable(db, f"{stem}_perf for {where} has no {phase} {missing} kernel rows",
                            "one GDN layer is the conv plus the scan; both must be measured", present)
    conv_k = choose_kernel(table, db.backend, conv_mask)
    scan_k = choose_kernel(table, db.backend, scan_mask)
    notes = []
    if len(set(ks[scan_mask].tolist())) > 1:
        notes.append(f"scan kernel {scan_k} chosen among {', '.join(sorted(set(ks[scan_mask].tolist())))} (most rows: the backend default)")

    model_col = table.keys["model_name"] if table.has("model_name") else np.full(len(table), "", dtype=str)
    cols = SITE_COLS + CURVE_COLS

    def rows(kernel):
        idx = np.flatnonzero(in_phase & (ks == kernel))
        keyarr = np.stack([table.keys[c][idx].astype(float) for c in cols], axis=1)
        return {(model_col[i],) + tuple(k): float(table.latency[i]) for i, k in zip(idx, keyarr.tolist())}

    conv, scan = rows(conv_k), rows(scan_k)
    both = sorted(set(conv) & set(scan))
    unpaired = len(set(conv) ^ set(scan))
    if unpaired:
        notes.append(f"{unpaired} cells measured by only one of {conv_k} / {scan_k}: held like truncated corners")
    if not both:
        return _unavailable(db, f"{stem}_perf for {where}: {conv_k} and {scan_k} share no measured {phase} cell",
                            "cannot sum a layer", present)

    # one model per site: the query's model if it was collected there, else the first by name
    site_models: dict[tuple, set] = {}
    for k in both:
        site_models.setdefault(k[1:1 + len(SITE_COLS)], set()).add(k[0])
    chosen = {}
    for site, models in site_models.items():
        pick = model_name if model_name in models else sorted(models)[0]
        chosen[site] = pick
        if len(models) > 1:
            notes.append(f"site {tuple(int(x) for x in site)} collected for {', '.join(sorted(models))}: rows of {pick} used")
    keep = [k for k in both if chosen[k[1:1 + len(SITE_COLS)]] == k[0]]
    keys = {c: np.array([k[1 + j] for k in keep], dtype=float) for j, c in enumerate(cols)}
    lat = np.array([conv[k] + scan[k] for k in keep])
    summed = Table(stem, table.path, keys, {"latency": lat}, len(lat))
    sites, curves = sites_and_curves(summed, np.ones(len(lat), bool), SITE_COLS, CURVE_COLS)
    if phase == "generation":
        # the state is fixed-size, so the per-step cost is the same at every cached length:
        # repeat the seq_len-1 column (one token per request) along GEN_STEP
        curves = {s: ((ax[0], GEN_STEP.copy()), np.repeat(v[:, :1], len(GEN_STEP), axis=1)) for s, (ax, v) in curves.items()}
    return _Lattice(conv_k, scan_k, sites, curves, tuple(notes))


# --------------------------------------------------------------------------------------------
# resolution
# --------------------------------------------------------------------------------------------


def _check(phase, d_model, num_k_heads, head_k_dim, num_v_heads, head_v_dim, conv_kernel):
    if phase not in PHASES:
        raise InvalidInputError(f"unknown GDN phase {phase!r}", available=PHASES)
    for name, v in (("d_model", d_model), ("num_k_heads", num_k_heads), ("head_k_dim", head_k_dim),
                    ("num_v_heads", num_v_heads), ("head_v_dim", head_v_dim), ("conv_kernel", conv_kernel)):
        if isinstance(v, bool) or int(v) != v or v <= 0:
            raise InvalidInputError(f"GDN {name} must be a positive integer", f"got {v!r}")
    if num_v_heads % num_k_heads:
        raise InvalidInputError("GDN num_v_heads must be a multiple of num_k_heads (grouped value heads)",
                                f"got {num_v_heads} value heads over {num_k_heads} key heads")


def resolve_gdn(
    db: OpDB,
    phase: str,
    *,
    d_model: int,
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    conv_kernel: int = 4,
    model_name: str | None = None,
    stem: str = STEM,
) -> Resolved:
    """Compile the GDN core (conv + gated delta-rule scan) of one layer on one GPU for ``phase``.

    Head counts are per GPU. ``"context"``: a grid over ``(batch, isl)`` (``isl`` new tokens per
    request). ``"generation"``: a grid over ``(batch, step)`` whose value does not depend on
    ``step`` (fixed-size recurrent state). ``model_name`` only picks among rows of several models
    collected at the same site (none in the 0.12.0 pack: each site is one Qwen3.5 model).
    ``stem``: the table read (``"gdn"``; :mod:`infercast.ops.kda` passes ``"kda"``, whose
    table has the same columns and the same conv + scan split).
    """
    _check(phase, d_model, num_k_heads, head_k_dim, num_v_heads, head_v_dim, conv_kernel)
    hk, dk, hv, dv, kc = int(num_k_heads), int(head_k_dim), int(num_v_heads), int(head_v_dim), int(conv_kernel)
    query_sol = gdn_sol_fn(db, phase, hk, dk, hv, dv, kc)
    axes, scales = _axes(phase), _scales(phase)
    family = f"{stem}_{phase}"
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, scales)

    lat = db.memo((f"{stem}-lattice", phase, model_name), lambda: _lattice(db, phase, model_name, stem))
    if lat is None:
        return empirical_resolved(family, query_sol, axes, None, scales)

    def site_grid(i: int) -> Grid:
        def build():
            _, shk, sdk, shv, sdv, skc = (int(x) for x in lat.sites[i])
            s = gdn_sol_fn(db, phase, shk, sdk, shv, sdv, skc)
            ax, vals = lat.curves[i]
            filled, prov = fill_missing(ax, vals, s)
            return Grid(ax, filled, prov, s, scales=scales)

        return db.memo((f"{stem}-site", phase, model_name, i), build)

    notes = list(lat.notes)
    d_lo, d_hi = float(lat.sites[:, 0].min()), float(lat.sites[:, 0].max())
    d_eff = float(np.clip(d_model, d_lo, d_hi))
    if d_eff != d_model:
        notes.append(f"d_model {d_model} is outside the collected {int(d_lo)}..{int(d_hi)}: looked up at {int(d_eff)} "
                     "(d_model does not enter the GDN conv/scan kernels)")
    query = (d_eff, hk, dk, hv, dv, kc)
    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_sites(query, lat.sites, weights=SITE_WEIGHTS)
    if choice is None:
        if db.mode is not DatabaseMode.SILICON:
            return empirical_resolved(family, query_sol, axes, [site_grid(i) for i in range(len(lat.sites))], scales)
        raise NotAvailableError(
            f"{stem.upper()} {phase} d_model={d_model} k_heads={hk}x{dk} v_heads={hv}x{dv} conv={kc} is outside the collected sites' gates",
            f"{db.backend} {db.data.version} on {db.system.name}; use --database-mode HYBRID for an empirical estimate",
            [f"d_model={int(s[0])} k={int(s[1])}x{int(s[2])} v={int(s[3])}x{int(s[4])} conv={int(s[5])}" for s in lat.sites],
        )
    labels = tuple(
        f"(d_model={int(lat.sites[i][0])}, k={int(lat.sites[i][1])}, v={int(lat.sites[i][3])}) w={w:.2f}"
        for i, w in zip(choice.indices, choice.weights)
    )
    g = transfer_grid(choice, site_grid, query_sol, labels)
    notes.insert(0, f"summed per cell: {lat.conv_kernel} + {lat.scan_kernel}")
    if phase == "generation":
        notes.append("per-step cost independent of the cached length (fixed-size state): the step axis holds two equal points")
    return Resolved(g, stem, db.served_version(stem), lat.kernel, choice.how, labels if choice.how != "exact" else (), tuple(notes))
