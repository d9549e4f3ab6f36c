"""Whole-forward (``fpm``) tables: measured iteration times per configuration and workload point.

A table row is one configuration identity (:data:`IDENTITY_COLUMNS`), one iteration kind, its
workload point on the kind's axes (:data:`KIND_AXES`) and the measured milliseconds. File form:
Parquet or Arrow IPC with the schema metadata key ``infercast.fpm`` =
``{"format": "infercast-fpm", "version": 1}`` (docs/forward-pass-model.md).

:meth:`FpmTable.lookup` answers, in order:

1. **exact identity**: the rows of that identity and kind; the point must lie inside their range
   on every axis, and the ``2**d`` rows around it (the neighbouring measured values on each axis)
   must all exist; the answer interpolates them multilinearly (an exact hit returns the row).
2. **transfer**: otherwise the nearest identity with the same model, system, backend and version
   whose layout differs by at most ``max_doublings`` (the sum over tp, pp, attention_dp, moe_tp,
   moe_ep of ``|log2(a / b)|``; ties broken by the identity's sort order) and that answers the
   point by (1) gives ``donor_ms * roofline(target) / roofline(donor)``, the target's roofline
   time over the donor's at the same point (the donor's share of its roofline is carried over).
3. nothing: ``None`` with the reason (the domain gate refuses instead of extrapolating).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np

from ..errors import DataFileError, InvalidInputError

FORMAT_NAME = "infercast-fpm"
FORMAT_VERSION = 1
METADATA_KEY = b"infercast.fpm"
IDENTITY_COLUMNS = ("model", "system", "backend", "backend_version", "tp", "pp", "attention_dp", "moe_tp", "moe_ep")
LAYOUT_COLUMNS = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
KIND_AXES = {
    "prefill": ("prefill_tokens",),
    "decode": ("decode_requests", "decode_kv_tokens"),
    "mixed": ("prefill_tokens", "decode_kv_tokens"),
}
AXIS_COLUMNS = ("prefill_tokens", "decode_requests", "decode_kv_tokens")
#: layouts at most this many doublings apart may transfer (default of :meth:`FpmTable.lookup`)
MAX_DOUBLINGS = 1.0


def identity_key(identity: dict) -> tuple:
    """The identity columns of ``identity`` as a tuple (missing layout entries count as 1)."""
    missing = [c for c in IDENTITY_COLUMNS[:4] if c not in identity]
    if missing:
        raise InvalidInputError(f"an fpm identity needs {', '.join(IDENTITY_COLUMNS[:4])}", f"missing {missing}")
    return tuple(str(identity[c]) for c in IDENTITY_COLUMNS[:4]) + tuple(int(identity.get(c) or 1) for c in LAYOUT_COLUMNS)


@dataclass(frozen=True)
class FpmAnswer:
    ms: float | None
    how: str  # exact / interpolated / transferred / none
    reason: str = ""
    donor: tuple | None = None


class FpmTable:
    """Rows of measured iteration times (see the module docstring), indexed for lookups."""

    def __init__(self, rows: list[dict]):
        self._rows = []
        self._index: dict = {}
        for r in rows:
            kind = r.get("kind")
            if kind not in KIND_AXES:
                raise InvalidInputError(f"fpm row kind {kind!r} unknown", "kinds", KIND_AXES)
            ms = float(r["measured_ms"])
            if not (ms > 0 and math.isfinite(ms)):
                raise InvalidInputError("fpm measured_ms must be a finite number > 0", f"got {ms!r}")
            key = identity_key(r)
            point = tuple(float(r[a]) for a in KIND_AXES[kind])
            row = {**dict(zip(IDENTITY_COLUMNS, key)), "kind": kind, **{a: float(r.get(a) or 0.0) for a in AXIS_COLUMNS},
                   "measured_ms": ms}
            self._rows.append(row)
            self._index.setdefault((key, kind), {})[point] = ms

    def __len__(self) -> int:
        return len(self._rows)

    def rows(self) -> list[dict]:
        return [dict(r) for r in self._rows]

    # ---- files -------------------------------------------------------------------------------
    def to_arrow(self):
        import pyarrow as pa

        cols = {c: [r[c] for r in self._rows] for c in (*IDENTITY_COLUMNS, "kind", *AXIS_COLUMNS, "measured_ms")}
        schema = pa.schema([(c, pa.string()) for c in IDENTITY_COLUMNS[:4]] + [(c, pa.int32()) for c in LAYOUT_COLUMNS]
                           + [("kind", pa.string())] + [(c, pa.float64()) for c in (*AXIS_COLUMNS, "measured_ms")],
                           metadata={METADATA_KEY: json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}).encode()})
        return pa.table(cols, schema=schema)

    def write(self, path) -> Path:
        """Parquet when ``path`` ends in ``.parquet``, else Arrow IPC."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        t = self.to_arrow()
        if path.suffix == ".parquet":
            pq.write_table(t, path)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
                w.write_table(t)
        return path

    @classmethod
    def read(cls, path) -> FpmTable:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            t = pq.read_table(path) if str(path).endswith(".parquet") else pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataFileError(f"cannot read fpm table {path}", str(exc)) from None
        meta = json.loads((t.schema.metadata or {}).get(METADATA_KEY, b"{}"))
        if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
            raise DataFileError(f"{path} is not an infercast fpm table (version {FORMAT_VERSION})",
                                f"its metadata says {meta or 'nothing'}")
        return cls(t.to_pylist())

    # ---- lookups -----------------------------------------------------------------------------
    def _interpolate(self, key: tuple, kind: str, point: tuple) -> FpmAnswer:
        pts = self._index.get((key, kind))
        if not pts:
            return FpmAnswer(None, "none", f"no {kind} rows for this identity")
        if point in pts:
            return FpmAnswer(pts[point], "exact")
        d = len(point)
        brackets = []
        for a in range(d):
            vals = sorted({p[a] for p in pts})
            q = point[a]
            if q < vals[0] or q > vals[-1]:
                return FpmAnswer(None, "none", f"{KIND_AXES[kind][a]} {q:g} is outside the measured {vals[0]:g}..{vals[-1]:g}")
            hi = next(i for i, v in enumerate(vals) if v >= q)
            lo = hi if vals[hi] == q else hi - 1
            brackets.append((vals[lo], vals[hi]))
        total = 0.0
        for corner in product((0, 1), repeat=d):
            c = tuple(brackets[a][corner[a]] for a in range(d))
            if c not in pts:
                return FpmAnswer(None, "none", f"the measured point {c} around the query is missing")
            w = 1.0
            for a in range(d):
                lo, hi = brackets[a]
                t = 0.0 if hi == lo else (point[a] - lo) / (hi - lo)
                w *= t if corner[a] else 1.0 - t
            total += w * pts[c]
        return FpmAnswer(total, "interpolated")

    def lookup(self, identity: dict, kind: str, point: dict, roofline=None, max_doublings: float = MAX_DOUBLINGS) -> FpmAnswer:
        """The time of a ``kind`` iteration at ``point`` (a dict with the kind's axes) for
        ``identity``: exact / interpolated from its own rows, else transferred from the nearest
        layout through ``roofline(identity, kind, point) -> ms`` (module docstring)."""
        if kind not in KIND_AXES:
            return FpmAnswer(None, "none", f"kind {kind!r} has no table axes")
        key = identity_key(identity)
        q = tuple(float(point[a]) for a in KIND_AXES[kind])
        own = self._interpolate(key, kind, q)
        if own.ms is not None or (key, kind) in self._index:
            return own
        donors = []
        for k2, kind2 in self._index:
            if kind2 != kind or k2[:4] != key[:4]:
                continue
            dist = sum(abs(math.log2(a / b)) for a, b in zip(k2[4:], key[4:]))
            donors.append((dist, k2))
        if not donors:
            return FpmAnswer(None, "none", "no measured identity of this model, system, backend and version")
        donors.sort()
        dist, k2 = donors[0]
        if dist > max_doublings:
            return FpmAnswer(None, "none", f"the nearest measured layout is {dist:g} doublings away (gate {max_doublings:g})")
        if roofline is None:
            return FpmAnswer(None, "none", "a transfer needs a roofline to carry the donor's time over")
        got = self._interpolate(k2, kind, q)
        if got.ms is None:
            return FpmAnswer(None, "none", f"donor layout: {got.reason}", k2)
        donor_id = dict(zip(IDENTITY_COLUMNS, k2))
        r_t, r_d = roofline(identity, kind, point), roofline(donor_id, kind, point)
        if not (r_t > 0 and r_d > 0):
            return FpmAnswer(None, "none", "the roofline gave no positive time", k2)
        return FpmAnswer(got.ms * r_t / r_d, "transferred", donor=k2)


def cell_centre(k: int) -> float:
    """The geometric centre of power-of-two cell ``k`` (values in ``[2**(k-1), 2**k)``), as
    :func:`infercast.engine.forward_pass._cell` numbers them."""
    return 2.0 ** (k - 0.5) if k > 0 else 0.5


def grid_rows(identity: dict, kind: str, obs: list, carry=None) -> list[dict]:
    """Table rows from observations ``(axes point, measured_ms, engine_ms or None)`` of one kind:
    one row per power-of-two cell at its centre, the median over the cell of each observation's
    time carried to the centre by ``carry(point, centre) -> ratio`` (the engine's time there over
    its time at the observation; None: not carried)."""
    cells: dict = {}
    for point, ms, _ in obs:
        k = tuple(0 if v < 1 else 1 + int(math.floor(math.log2(v))) for v in point)
        cells.setdefault(k, []).append((point, ms))
    rows = []
    for k in sorted(cells):
        centre = tuple(cell_centre(c) for c in k)
        vals = [ms * (carry(p, centre) if carry else 1.0) for p, ms in cells[k]]
        row = {**identity, "kind": kind, "prefill_tokens": 0.0, "decode_requests": 0.0, "decode_kv_tokens": 0.0,
               "measured_ms": float(np.median(vals))}
        row.update(dict(zip(KIND_AXES[kind], centre)))
        rows.append(row)
    return rows

