"""Row choice and curve building shared by the whole-attention-module tables (DSA, DeepSeek-V4).

The module tables (``dsa_*_module``, ``dsv4_*_module``) are collected the same way: one row per
(per-GPU ``num_heads``, batch, ``isl`` or ``step``), with a ``tp_size`` column that SGLang's
collector fills with the TP it ran the module at (``num_heads = native heads / tp``) and TRT-LLM /
vLLM leave at 1. Three steps are the same for every such table and live here:

* :func:`narrow_module_rows`: one attention compute dtype (``mla_dtype``, bf16 first; every
  collected row is bf16 today) and, for context, the rows without a cached prefix (smallest
  ``step``);
* :func:`nearest_tp_rows`: per head count, keep the rows of the ``tp_size`` nearest the query's
  (log2 distance, the smaller TP on a tie);
* :func:`module_curves`: merge the kernels by shape (:func:`~infercast.ops.base.merge_kernels`),
  split the rows into head-count sites and their ``batch x isl`` / ``batch x step`` curves
  (:func:`~infercast.ops.base.sites_and_curves`) and, for generation, shift ``step`` by the
  collector's offset (so it means "tokens already cached") and cut the batch rows timed without
  CUDA graph (:func:`graph_rows`).

Callers keep their own matching (model, quant, KV dtype, compress ratio) and their own notes on
the dropped rows; this module only reports what it did.
"""

from __future__ import annotations

import math

import numpy as np

from ..interp.grid import median_rows
from .base import merge_kernels, sites_and_curves

#: a decode batch row whose latency is this many times the next smaller batch's (median over the
#: steps both measured) is an eager run: doubling the batch cannot cost 4x under the same graph
EAGER_RATIO = 4.0


def graph_rows(vals: np.ndarray) -> int:
    """Number of leading batch rows (first axis) timed under CUDA graph: rows are cut from the
    first one that jumps more than ``EAGER_RATIO`` over its predecessor. SGLang's collector mirrors
    its own ``cuda_graph_max_bs`` for a 1-GPU server (256 on h200, 512 on b200/b300) and times the
    batches above it eagerly: GLM-5 heads=8 decode at batch 512 on h200 takes 1.31 ms at every
    step <= 512 against 0.10-0.15 ms at batch 256."""
    for i in range(1, vals.shape[0]):
        both = ~np.isnan(vals[i]) & ~np.isnan(vals[i - 1])
        if both.any() and median_rows(vals[i][both] / vals[i - 1][both]) > EAGER_RATIO:
            return i
    return vals.shape[0]


def narrow_module_rows(table, mask: np.ndarray, phase: str) -> np.ndarray:
    """``mask`` narrowed to one ``mla_dtype`` (``bfloat16`` when present, else the first by name)
    and, for ``"context"``, to the smallest ``step`` (no cached prefix). Columns a table lacks
    are not filtered on."""
    if table.has("mla_dtype"):
        mdts = sorted(set(table.keys["mla_dtype"][mask].tolist()), key=lambda v: (v != "bfloat16", v))
        mask = mask & (table.keys["mla_dtype"] == mdts[0])
    if phase == "context" and table.has("step"):
        mask = mask & (table.keys["step"] == table.keys["step"][mask].min())
    return mask


def nearest_tp_rows(table, mask: np.ndarray, tp: int) -> tuple[np.ndarray, dict[int, int]]:
    """``mask`` narrowed, per ``num_heads`` value, to the rows of the ``tp_size`` nearest ``tp``
    (smallest ``|log2(tp_size / tp)|``, the smaller ``tp_size`` on a tie); also {heads: tp_size
    taken}. A table without a ``tp_size`` column is returned unchanged with an empty dict."""
    if not table.has("tp_size"):
        return mask, {}
    keep = np.zeros_like(mask)
    site_tp: dict[int, int] = {}
    heads_col = table.keys["num_heads"]
    tp_col = table.keys["tp_size"]
    for h in sorted(set(heads_col[mask].tolist())):
        hm = mask & (heads_col == h)
        tps = sorted(set(tp_col[hm].astype(int).tolist()))
        best = min(tps, key=lambda t: (abs(math.log2(t / tp)), t))
        site_tp[int(h)] = int(best)
        keep |= hm & (tp_col == best)
    return keep, site_tp


def module_curves(table, mask: np.ndarray, phase: str, backend: str, step_offset: int):
    """Sites (``num_heads``) and curves of the module rows in ``mask``.

    Curves are ``batch_size x isl`` for ``"context"`` and ``batch_size x step`` for
    ``"generation"``; generation steps are shifted down by ``step_offset`` and each site's curve
    keeps only its leading CUDA-graph batch rows (:func:`graph_rows`).

    Returns (sites, curves, kernels, dropped): ``kernels`` as :func:`merge_kernels` gives them,
    ``dropped`` {heads: first batch dropped} for the sites that lost rows (in site order)."""
    curve = ("batch_size", "isl") if phase == "context" else ("batch_size", "step")
    mask, kernels = merge_kernels(table, mask, ("num_heads",) + curve, backend)
    sites, curves = sites_and_curves(table, mask, ("num_heads",), curve)
    dropped: dict[int, int] = {}
    if phase == "generation":
        if step_offset:
            curves = {s: ((ax[0], ax[1] - step_offset), v) for s, (ax, v) in curves.items()}
        for s, (ax, v) in list(curves.items()):
            keep = graph_rows(v)
            if keep < len(ax[0]):
                dropped[int(sites[s][0])] = int(ax[0][keep])
                curves[s] = ((ax[0][:keep], ax[1]), v[:keep])
    return sites, curves, kernels, dropped
