"""Provenance codes: how a number was obtained. Larger = further from a measurement."""

from __future__ import annotations

from enum import IntEnum


class Prov(IntEnum):
    EXACT = 0  # a table value, bit for bit
    INTERPOLATED = 1  # between measured points of one collected curve
    TRANSFERRED = 2  # from neighbouring collected sites through utilisation
    HELD = 3  # beyond the collected range, boundary utilisation held
    EMPIRICAL = 4  # SOL / a utilisation learned from the family's data (HYBRID/EMPIRICAL modes)
    SOL = 5  # speed-of-light roofline, no measurement
    ANALYTIC = 6  # an analytic model with no table (e.g. P2P from link bandwidth)

    @property
    def label(self) -> str:
        return self.name.lower()


def worst(codes) -> Prov:
    import numpy as np

    return Prov(int(np.max(codes))) if len(codes) else Prov.EXACT
