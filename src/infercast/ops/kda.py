"""Kimi Delta Attention (KDA: Kimi-Linear / Kimi-K3's linear-attention layers) as an
attention-like op: a context grid over ``(batch, isl)`` and a generation grid over
``(batch, step)`` whose value does not depend on ``step`` (fixed-size recurrent state).

What the op covers: the short causal conv over the q/k/v channels plus the gated delta-rule
scan (per-channel decay) of one layer on one GPU; the projections (q/k/v, the low-rank decay and
output gates, beta, o_proj), the gating and the output norm are the caller's. Head counts are
per GPU.

Source: ``kda_perf`` (family ``kda``), a table of the same columns as ``gdn_perf``
(``d_model``, ``num_k_heads``, ``head_k_dim``, ``num_v_heads``, ``head_v_dim``, ``d_conv``,
``phase``, ``kernel_source``, ``batch_size``, ``seq_len``) and the same split of one layer into
a conv kernel (``causal_conv1d*``) and a scan kernel run back to back, so it is read by
:func:`infercast.ops.gdn.resolve_gdn`'s machinery with ``stem="kda"``: per cell the conv row
plus the scan row (context: ``causal_conv1d_fn_qkv3`` + ``chunk_kda`` / ``flashkda_fwd``;
generation: ``causal_conv1d_update`` + the decode kernel; where a phase holds two decode kernels,
e.g. SGLang's ``fused_recurrent_kda_packed_decode`` and ``kda_fused_decode``, the one with the
most rows, which the collectors sweep as the engine default, see
:func:`infercast.ops.base.choose_kernel`). The ``verify`` rows (speculative verification) are not
read. Head counts that were not collected (12 / 24 / 48 / 96 heads of 128 are) are transferred
through utilisation against the Gated DeltaNet roofline (:func:`infercast.interp.sol.gdn`): the
same conv and state sizes, the per-channel decay's few extra element-wise FLOPs left out.

The recurrent state a request holds is fixed-size (:func:`kda_state_bytes`).

**Where the chosen data version has no ``kda_perf``.** The tables were collected in a few builds
only (SGLang 0.5.16, vLLM's dev build ``0.1.dev19262`` and gb300's 0.27.0; no TensorRT-LLM), so
SGLang 0.5.14 -- the current SGLang data -- has none, and the newer 0.5.16 is out of the
version backfill's reach (it never reads a newer version). In SILICON mode the KDA op then reads,
in this order, this backend's other collected versions' ``kda_perf`` (newest first), then
another serving backend's on the same GPU (:data:`~infercast.data.versions.SERVING_BACKENDS`
order): the engines run the same kernels (flash-linear-attention's ``chunk_kda`` /
``fused_recurrent_kda`` and the ``causal_conv1d`` kernels). The cells are marked
``transferred`` and a note names the table read (:func:`_donor_dbs`). The same order answers a
head count outside the gates of the version's own table's sites (SGLang 0.5.16 collected
generation at 24 / 48 / 96 heads, so 6 heads per GPU at TP 16 is read from vLLM's table, which
also has 12)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..data.versions import SERVING_BACKENDS, version_key
from ..errors import InfercastError, NotAvailableError
from ..interp.grid import Grid
from ..interp.provenance import Prov
from .base import DatabaseMode, OpDB, Resolved
from .gdn import gdn_state_bytes, resolve_gdn

STEM = "kda"


def kda_state_bytes(num_heads: int, head_dim: int, conv_kernel: int, state_bytes: float = 4.0,
                    conv_bytes: float = 2.0) -> float:
    """KDA cache bytes one request holds per layer on one GPU (``num_heads`` per GPU, q/k/v heads
    of ``head_dim``): the recurrent state ``num_heads x head_dim x head_dim`` at ``state_bytes``
    plus the conv state of the q, k and v channels (``conv_kernel - 1`` inputs at ``conv_bytes``)
    — the Gated DeltaNet layout with as many key as value heads (:func:`gdn_state_bytes`)."""
    return gdn_state_bytes(num_heads, head_dim, head_dim, conv_kernel, num_heads, state_bytes, conv_bytes)


def resolve_kda(db: OpDB, phase: str, *, d_model: int, num_heads: int, head_dim: int, conv_kernel: int = 4,
                model_name: str | None = None) -> Resolved:
    """Compile one KDA layer's conv + scan on one GPU for ``phase`` (``num_heads`` per GPU, key
    and value heads alike) from ``kda_perf``, or, where the data version has none, from another
    version's or backend's (see the module docstring)."""
    kw = dict(d_model=d_model, num_k_heads=num_heads, head_k_dim=head_dim, num_v_heads=num_heads, head_v_dim=head_dim,
              conv_kernel=conv_kernel, model_name=model_name, stem=STEM)
    if db.mode is not DatabaseMode.SILICON:
        return resolve_gdn(db, phase, **kw)
    own = _has_table(db)
    refusal = None
    if own:
        try:
            return resolve_gdn(db, phase, **kw)
        except NotAvailableError as exc:  # the head count is outside its sites' gates
            refusal = exc
    for donor in _donor_dbs(db):
        try:
            r = resolve_gdn(donor, phase, **kw)
        except NotAvailableError:
            continue
        g = r.grid
        grid = Grid(g.axes, g.values, np.maximum(g.prov, Prov.TRANSFERRED), g.sol, g.sites, g.scales)
        why = "has no kda_perf" if not own else f"has no kda_perf site near {num_heads} heads of {head_dim}"
        served = f"{donor.backend} {donor.served_version(STEM) or donor.data.version}"
        note = (f"kda_perf from {served} on {db.system.name}: {db.backend} {db.data.version} "
                f"{why} (the same flash-linear-attention / causal_conv1d kernels)")
        return replace(r, grid=grid, version=served, notes=r.notes + (note,))
    if refusal is not None:
        raise refusal
    return resolve_gdn(db, phase, **kw)  # raises: no kda_perf anywhere for this GPU


def _has_table(db: OpDB) -> bool:
    try:
        return db.table_or_none(STEM) is not None
    except NotAvailableError:
        return False


def _donor_dbs(db: OpDB) -> list[OpDB]:
    """The other databases with a ``kda_perf`` table, in the order they are asked: this
    backend's other collected versions, newest first, then each other serving backend's current
    data on the same system."""

    def build():
        candidates = []
        for v in sorted((v for v in db.data.versions.collected if v != db.data.version), key=version_key, reverse=True):
            candidates.append(lambda v=v: replace(db.data, version=v, served={}))
        for b in SERVING_BACKENDS:
            if b != db.backend:
                candidates.append(lambda b=b: db.data.for_backend(b))
        found, seen = [], set()
        for make in candidates:
            try:
                other = OpDB.shared(make(), db.mode)
                loc = other.data.locate(STEM)
            except InfercastError:
                continue
            # one entry per table file (a version without its own table backfills an older one's)
            if loc is not None and (other.backend, loc.served_by) not in seen and _has_table(other):
                seen.add((other.backend, loc.served_by))
                found.append(other)
        return found

    return db.memo(("kda-donors",), build)
