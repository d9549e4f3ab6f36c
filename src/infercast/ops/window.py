"""Sliding-window GQA attention at a window the attention tables did not collect, carried over
from the same shape's full-attention curves.

The tables collect windows per model (128 at head size 64 / 128 / 192, 1024 at 256, 8192 at 128;
b300 SGLang alone 512 at 128), so a checkpoint with another window (Step-3.7-Flash's 512-token
window at head size 128) has no rows of its own. A window-``w`` layer runs the full-attention
kernel over at most the last ``w`` keys of each query, so its cost follows from the measured
full-attention grid of the same ``(heads, kv_heads, head_dim)`` and KV dtype:

* **generation** (``step`` = tokens already cached): a decode token reads ``min(step + 1, w)``
  cached tokens, which is a full-attention decode at ``step' = min(step, w - 1)``. Below the window
  the two are the same measurement (provenance unchanged); from it on the value is the
  full-attention cell at ``w - 1`` (provenance ``transferred``) and does not grow with the cache.
* **context** (``isl`` new tokens, no prefix): while ``isl <= w`` every query sees its whole prefix,
  as in full attention (unchanged); beyond, the measured full-attention latency is scaled by the
  two rooflines' ratio at that point (:func:`infercast.interp.sol.context_attention` with and
  without the window: the attended query-key pairs and the KV read), i.e. the window runs at the
  full-attention utilisation of the same shape (provenance ``transferred``).

The answer keeps the full-attention resolution's source, version, kernel and donors, and adds a
note naming the transfer. Applied only where the table holds no row of the window at that head
size (:func:`window_collected`); a collected window is read as it is.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..data.quant import KV_BYTES
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from .base import OpDB, Resolved


def window_collected(db: OpDB, stem: str, head_dim: int, window: int) -> bool:
    """Whether ``stem``'s table holds any row of ``window`` at ``head_dim`` (True without a
    table: the full-attention path then says what is missing)."""
    table = db.table_or_none(stem)
    if table is None:
        return True
    if not table.has("window_size"):
        return False
    return bool(np.any(table.mask(head_dim=head_dim) & (table.keys["window_size"] == window)))


def _context(db: OpDB, full: Grid, heads: int, kv_heads: int, head_dim: int, kvb: float, window: int) -> Grid:
    b_ax, l_ax = full.axes
    B, L = np.meshgrid(b_ax, l_ax, indexing="ij")
    v, p = full(B, L)
    s_w = sol.context_attention(db.system, B, L, 0.0, heads, kv_heads, head_dim, kvb, window)[0]
    s_0 = sol.context_attention(db.system, B, L, 0.0, heads, kv_heads, head_dim, kvb, 0)[0]
    beyond = L > window
    values = np.where(beyond, v * s_w / s_0, v)
    prov = np.where(beyond, np.maximum(p, Prov.TRANSFERRED), p)

    def sol_w(batch, isl):
        return sol.context_attention(db.system, batch, isl, 0.0, heads, kv_heads, head_dim, kvb, window)[0]

    return Grid((b_ax, l_ax), values, prov, sol=sol_w, sites=full.sites, scales=full.scales)


def _generation(db: OpDB, full: Grid, heads: int, kv_heads: int, head_dim: int, kvb: float, window: int) -> Grid:
    b_ax, s_ax = full.axes
    edge = float(window - 1)
    steps = np.unique(np.concatenate([s_ax[s_ax < edge], [edge], [max(edge, float(s_ax[-1]))]]))
    B, S = np.meshgrid(b_ax, steps, indexing="ij")
    v, p = full(B, np.minimum(S, edge))
    prov = np.where(S >= edge, np.maximum(p, Prov.TRANSFERRED), p)

    def sol_w(batch, step):
        return sol.generation_attention(db.system, batch, np.asarray(step) + 1.0, heads, kv_heads, head_dim, kvb, window)[0]

    return Grid((b_ax, steps), v, prov, sol=sol_w, sites=full.sites, scales=full.scales)


def windowed_from_full(db: OpDB, phase: str, full: Resolved, heads: int, kv_heads: int, head_dim: int, kv_quant: str,
                       attn_quant: str, window: int) -> Resolved:
    """The window-``window`` attention of one layer from ``full``, the same shape's
    full-attention resolution for ``phase`` (``"context"`` / ``"generation"``); see the module
    docstring."""
    kvb = KV_BYTES[kv_quant]
    build = _context if phase == "context" else _generation
    grid = db.memo(("window-transfer", phase, heads, kv_heads, head_dim, kv_quant, attn_quant, window),
                   lambda: build(db, full.grid, heads, kv_heads, head_dim, kvb, window))
    note = (f"window {window} not collected at head_dim={head_dim}: full-attention curves "
            + ("read at min(step, window - 1)" if phase == "generation" else "scaled by the windowed roofline beyond the window"))
    return replace(full, grid=grid, notes=full.notes + (note,))
