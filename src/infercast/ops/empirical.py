"""Empirical estimates: speed of light divided by a utilisation learned from the family's data.

Used by HYBRID (when SILICON has no answer) and EMPIRICAL modes. The utilisation at each curve
position is the median, over every collected site of the same family and quant mode, of
``SOL / measured``; with no data for the family at all, ``DEFAULT_UTILISATION`` (typical achieved
fractions of the roofline for well-tuned kernels) stands in and the result says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..interp.grid import Grid, median_rows
from ..interp.provenance import Prov
from .base import Resolved

DEFAULT_UTILISATION = {"gemm": 0.6, "context_attention": 0.5, "generation_attention": 0.5, "comm": 0.6}


def learned_utilisation(site_grids: Sequence[Grid], axes: tuple[np.ndarray, ...]) -> np.ndarray:
    mesh = np.meshgrid(*axes, indexing="ij")
    utils = []
    for g in site_grids:
        v, _ = g(*mesh)
        utils.append(g.sol(*mesh) / v)
    return median_rows(np.stack(utils))


def empirical_resolved(
    family: str,
    sol_q: Callable[..., np.ndarray],
    axes: tuple[np.ndarray, ...],
    site_grids: Sequence[Grid] | None,
    scales: tuple[str, ...] = (),
) -> Resolved:
    mesh = np.meshgrid(*axes, indexing="ij")
    if site_grids:
        util = learned_utilisation(site_grids, axes)
        note = f"utilisation learned from {len(site_grids)} collected {family} sites"
    else:
        util = np.full(mesh[0].shape, DEFAULT_UTILISATION.get(family, 0.5))
        note = f"no {family} data: default utilisation {DEFAULT_UTILISATION.get(family, 0.5)}"
    values = sol_q(*mesh) / util
    g = Grid(axes, values, np.full(values.shape, int(Prov.EMPIRICAL), np.int8), sol_q, scales=scales)
    return Resolved(g, family, how="empirical", notes=(note,))
