"""Mamba2 mixer core (Nemotron-H hybrids) as two attention-like ops, each a context grid over
``(batch, isl)`` and a generation grid over ``(batch, step)``:

* ``mamba_conv``: the depthwise causal conv1d over the ``x``, ``B``, ``C`` channels, from the
  pack's ``mamba2_perf`` table (family ``linear_attention``; ``causal_conv1d_fn`` in context,
  ``causal_conv1d_update`` in generation). The table's ``kernel_source`` names only these conv
  kernels, so it is read as timing the conv alone.
* ``mamba_ssm``: the selective-state-space scan (context: the chunked state-space-dual scan;
  generation: the recurrent state update). No table in the pack times it, so it is a roofline
  over the GPU's memory bandwidth and tensor-core peak (:func:`infercast.interp.sol.mamba2_ssm`),
  provenance ``analytic`` with source ``sol: mamba2 ssm scan`` / ``sol: mamba2 ssm state
  update``, the convention of the other ops that have no table by nature (norms, P2P): every
  database mode answers it, and the answer says it is a roofline.

The in/out projections, the gated RMSNorm and the residual are not part of either op (the plan
adds them as GEMMs / elementwise ops). Head and group counts are **per GPU**.

Conv sites are ``(channels, d_conv)`` with ``channels = nheads*head_dim + 2*n_groups*d_state``:
the conv is depthwise, the same work for every channel, so how the channels split into heads,
groups and state does not enter it, nor does ``d_model``. A channel count that was not collected
(a TP split of a collected model) is transferred through utilisation against
:func:`infercast.interp.sol.mamba2_conv` (provenance ``transferred``). Two collected models with
the same channel count (the 0.12.0 pack's Nano and ``MAMBA2_GENERIC_4K``, 6,144) are one site: the
query's model's rows if it was collected there, else the first model by name.

Where the backend has no ``mamba2_perf`` table (the 0.12.0 pack collects it for TensorRT-LLM
only; vLLM and SGLang run their own conv kernels, so TensorRT-LLM's timings are not theirs) the
conv is the same kind of roofline as the scan, provenance ``analytic``, its source saying so
(``sol: mamba2 causal conv1d``): the conv moves a few bytes per channel and token, so it is a
small term beside the projections. A table that exists but lacks a phase, or a site outside the
transfer gates, raises :class:`~infercast.errors.NotAvailableError` in SILICON (HYBRID and
EMPIRICAL: the utilisation learned from the collected sites).

Curves: context latency is a launch cost plus a term linear in tokens, interpolated linearly on
both axes (as :mod:`infercast.ops.gdn`); generation does not depend on the cached tokens, so its
grid has a step axis of two equal points (:data:`GEN_STEP`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.tables import Table
from ..errors import InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import choose_sites, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, choose_kernel, fill_missing, sites_and_curves, sol_resolved
from .empirical import empirical_resolved

STEM = "mamba2"
PHASES = ("context", "generation")
#: table columns that make a site's channel count, and the site coordinates
CHANNEL_COLS = ("nheads", "head_dim", "n_groups", "d_state")
SITE_COLS = ("channels", "d_conv")
CURVE_COLS = ("batch_size", "seq_len")

#: axes of table-less (roofline) grids: wide enough that a served step stays inside them
CTX_BATCH = 2.0 ** np.arange(0, 13)
CTX_ISL = 2.0 ** np.arange(0, 22)
GEN_BATCH = 2.0 ** np.arange(0, 15)
#: the generation grid's step axis: two points with identical values (cost is step-independent)
GEN_STEP = np.array([1.0, 2.0**24])
SCALES = ("linear", "linear")

SSM_SOURCE = {"context": "sol: mamba2 ssm scan", "generation": "sol: mamba2 ssm state update"}
CONV_SOURCE = "sol: mamba2 causal conv1d"


def mamba_state_bytes(nheads: int, head_dim: int, d_state: int, n_groups: int, conv_kernel: int,
                      state_bytes: float = 4.0, conv_bytes: float = 2.0) -> float:
    """Cache bytes one request holds per Mamba2 layer on one GPU (per-GPU counts): the SSM state
    ``nheads x head_dim x d_state`` at ``state_bytes`` (fp32: the checkpoints'
    ``mamba_ssm_cache_dtype``) plus the conv state, the last ``conv_kernel - 1`` inputs of the
    ``nheads*head_dim + 2*n_groups*d_state`` conv channels at ``conv_bytes`` (bf16). Fixed-size:
    it does not grow with the sequence."""
    for name, v in (("nheads", nheads), ("head_dim", head_dim), ("d_state", d_state), ("n_groups", n_groups),
                    ("conv_kernel", conv_kernel)):
        if isinstance(v, bool) or int(v) != v or v <= 0:
            raise InvalidInputError(f"Mamba2 {name} must be a positive integer", f"got {v!r}")
    if state_bytes <= 0 or conv_bytes <= 0:
        raise InvalidInputError("Mamba2 state and conv bytes per element must be > 0", f"got {state_bytes!r}, {conv_bytes!r}")
    channels = sol.mamba2_conv_channels(nheads, head_dim, n_groups, d_state)
    return float(nheads) * head_dim * d_state * state_bytes + (conv_kernel - 1.0) * channels * conv_bytes


def _check(phase: str, **dims) -> None:
    if phase not in PHASES:
        raise InvalidInputError(f"unknown Mamba2 phase {phase!r}", available=PHASES)
    for name, v in dims.items():
        if isinstance(v, bool) or int(v) != v or v <= 0:
            raise InvalidInputError(f"Mamba2 {name} must be a positive integer", f"got {v!r}")


def _axes(phase: str):
    return (CTX_BATCH, CTX_ISL) if phase == "context" else (GEN_BATCH, GEN_STEP)


def _phase_fn(fn, phase: str):
    """``fn(batch, seq_len)`` as a grid function: context ``f(batch, isl)``, generation
    ``f(batch, step)`` with one token per request whatever the step."""
    if phase == "context":
        return fn

    def gen(batch, step):
        b, s = np.broadcast_arrays(np.asarray(batch, dtype=float), np.asarray(step, dtype=float))
        return fn(b, np.ones_like(s))

    return gen


def conv_sol_fn(db: OpDB, phase: str, channels, conv_kernel=4):
    system = db.system
    c, k = float(channels), int(conv_kernel)
    return _phase_fn(lambda b, s: sol.mamba2_conv(system, phase, b, s, c, k)[0], phase)


def ssm_sol_fn(db: OpDB, phase: str, nheads, head_dim, d_state, n_groups, chunk=128, state_bytes=4.0):
    system = db.system
    args = (int(nheads), int(head_dim), int(d_state), int(n_groups), int(chunk), float(state_bytes))
    return _phase_fn(lambda b, s: sol.mamba2_ssm(system, phase, b, s, *args)[0], phase)


def _roofline(db: OpDB, phase: str, fn, source: str, notes: tuple[str, ...] = ()) -> Resolved:
    """A table-less op: the roofline on the phase's axes, provenance ``analytic`` (``sol`` in SOL
    mode, where every op is a roofline)."""
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(_axes(phase), fn, SCALES, notes)
    axes = _axes(phase)
    v = np.asarray(fn(*np.meshgrid(*axes, indexing="ij")), dtype=float)
    g = Grid(axes, v, np.full(v.shape, int(Prov.ANALYTIC), np.int8), fn, scales=SCALES)
    return Resolved(g, source, how="analytic", notes=notes, fixed_prov=Prov.ANALYTIC)


def resolve_mamba_ssm(db: OpDB, phase: str, *, nheads: int, head_dim: int, d_state: int, n_groups: int,
                      chunk: int = 128, state_bytes: float = 4.0) -> Resolved:
    """The Mamba2 SSM scan (context) / state update (generation) of one layer on one GPU: a
    roofline in every database mode (no table times it; see the module docstring)."""
    _check(phase, nheads=nheads, head_dim=head_dim, d_state=d_state, n_groups=n_groups, chunk=chunk)
    fn = ssm_sol_fn(db, phase, nheads, head_dim, d_state, n_groups, chunk, state_bytes)
    what = "chunked scan" if phase == "context" else "recurrent state update, fp32 state read and written per request"
    note = (f"roofline over the effective memory bandwidth {db.system.gpu.effective_mem_bw / 1e12:.2f} TB/s and the bf16 "
            f"tensor-core peak: {what}; no table times the Mamba2 SSM")
    return _roofline(db, phase, fn, SSM_SOURCE[phase], (note,))


@dataclass
class _Lattice:
    kernel: str
    sites: np.ndarray
    curves: dict
    notes: tuple[str, ...]


def _lattice(db: OpDB, phase: str, model_name: str | None) -> _Lattice | None:
    """The conv rows of ``phase`` by channel count, one model per site; None when the backend
    has no table."""
    if db.mode is DatabaseMode.SOL or not db.data.has_table(STEM):
        return None
    where = f"{db.backend} {db.data.version} on {db.system.name}"
    table = db.data.table(STEM)
    for col in CHANNEL_COLS + ("d_conv", "phase") + CURVE_COLS:
        if not table.has(col):
            raise NotAvailableError(f"{STEM}_perf for {where} has no column {col!r}", str(table.path), table.keys)
    mask = table.keys["phase"] == phase
    if not mask.any():
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(f"{STEM}_perf for {where} has no {phase} rows", "no such phase was collected",
                                    table.unique("phase"))
        return None
    if phase == "generation":  # decode rows are one token per request
        mask &= table.keys["seq_len"] == table.keys["seq_len"][mask].min()
    kernel = choose_kernel(table, db.backend, mask) or "?"
    if table.has("kernel_source"):
        mask &= table.keys["kernel_source"] == kernel
    k = {c: table.keys[c].astype(float) for c in CHANNEL_COLS}
    channels = sol.mamba2_conv_channels(k["nheads"], k["head_dim"], k["n_groups"], k["d_state"])
    site_arr = np.stack([channels, table.keys["d_conv"].astype(float)], axis=1)
    models = table.keys["model_name"] if table.has("model_name") else np.full(len(table), "", dtype=str)
    notes = []
    chosen: dict[tuple, str] = {}
    for site in sorted({tuple(r) for r in site_arr[mask].tolist()}):
        here = sorted(set(models[mask & np.all(site_arr == site, axis=1)].tolist()))
        chosen[site] = model_name if model_name in here else here[0]
        if len(here) > 1:
            notes.append(f"{int(site[0])} channels collected for {', '.join(here)}: rows of {chosen[site]} used")
    keep = mask & np.array([chosen.get(tuple(r)) == m for r, m in zip(site_arr.tolist(), models.tolist())])
    keys = {"channels": channels[keep], "d_conv": site_arr[keep, 1]}
    keys.update({c: table.keys[c][keep] for c in CURVE_COLS})
    sub = Table(STEM, table.path, keys, {"latency": table.latency[keep]}, int(keep.sum()))
    sites, curves = sites_and_curves(sub, np.ones(len(sub), bool), SITE_COLS, CURVE_COLS)
    if phase == "generation":
        curves = {s: ((ax[0], GEN_STEP.copy()), np.repeat(v[:, :1], len(GEN_STEP), axis=1)) for s, (ax, v) in curves.items()}
    return _Lattice(kernel, sites, curves, tuple(notes))


def resolve_mamba_conv(db: OpDB, phase: str, *, d_model: int, nheads: int, head_dim: int, n_groups: int,
                       d_state: int, conv_kernel: int = 4, model_name: str | None = None) -> Resolved:
    """The Mamba2 causal conv1d of one layer on one GPU for ``phase``, from ``mamba2_perf``
    (exact at a collected channel count, transferred between them), or the roofline where the
    backend has no such table (see the module docstring). ``d_model`` is checked, not used: the
    conv does not depend on it."""
    _check(phase, d_model=d_model, nheads=nheads, head_dim=head_dim, n_groups=n_groups, d_state=d_state,
           conv_kernel=conv_kernel)
    C = sol.mamba2_conv_channels(int(nheads), int(head_dim), int(n_groups), int(d_state))
    K = int(conv_kernel)
    query_sol = conv_sol_fn(db, phase, C, K)
    axes = _axes(phase)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, query_sol, SCALES)
    lat = db.memo(("mamba2-lattice", phase, model_name), lambda: _lattice(db, phase, model_name))
    if lat is None:
        why = f"no {STEM}_perf table for {db.backend} {db.data.version} on {db.system.name}"
        return _roofline(db, phase, query_sol, CONV_SOURCE, (f"roofline: {why} (the pack collects it for TensorRT-LLM only)",))

    def site_grid(i: int) -> Grid:
        def build():
            sc, sk = lat.sites[i]
            s = conv_sol_fn(db, phase, sc, int(sk))
            ax, vals = lat.curves[i]
            filled, prov = fill_missing(ax, vals, s)
            return Grid(ax, filled, prov, s, scales=SCALES)

        return db.memo(("mamba2-site", phase, model_name, i), build)

    notes = list(lat.notes)
    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_sites((C, float(K)), lat.sites)
    if choice is None:
        if db.mode is not DatabaseMode.SILICON:
            return empirical_resolved(f"mamba2_conv_{phase}", query_sol, axes,
                                      [site_grid(i) for i in range(len(lat.sites))], SCALES)
        raise NotAvailableError(
            f"Mamba2 conv {phase} over {int(C)} channels ({nheads} heads x {head_dim}, {n_groups} groups x {d_state}), "
            f"conv {K}, is outside the collected sites' gates",
            f"{db.backend} {db.data.version} on {db.system.name}; use --database-mode HYBRID for an empirical estimate",
            [f"channels={int(s[0])} conv={int(s[1])}" for s in lat.sites],
        )
    labels = tuple(f"(channels={int(lat.sites[i][0])}) w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
    g = transfer_grid(choice, site_grid, query_sol, labels)
    notes.insert(0, f"{int(C)} conv channels per GPU")
    if phase == "generation":
        notes.append("per-step cost independent of the cached length (fixed-size conv state)")
    return Resolved(g, STEM, db.served_version(STEM), lat.kernel, choice.how,
                    labels if choice.how != "exact" else (), tuple(notes))
