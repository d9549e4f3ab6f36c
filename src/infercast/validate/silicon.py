"""Reader for the measured serving benchmarks in ``silicon_sample.csv``.

Each CSV row is one closed-loop benchmark: ``concurrency`` clients, each sending its
next request (fixed ``isl`` input / ``osl`` output tokens) as soon as the previous one
finishes, with the mean TTFT and TPOT the clients observed.

The reader is tolerant per row and strict per file:

* a row with a missing, NaN or unparsable value never aborts loading; the issue is
  recorded in :attr:`SiliconRow.problems` and the value becomes ``None`` (or the
  documented default);
* a file that lacks required columns raises :class:`~infercast.errors.InvalidInputError`
  naming the missing columns and the columns that were found.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from infercast.errors import DataFileError, InvalidInputError

__all__ = [
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "WorkerSpec",
    "SiliconRow",
    "load_rows",
    "load_ids",
]

_PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")

#: Columns a silicon CSV must have (the agg and both disagg column groups included).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "id",
    "backend",
    "model_path",
    "system",
    "mode",
    "isl",
    "osl",
    "batch_size",
    *_PARALLEL,
    *(f"prefill_{c}" for c in ("batch_size", "num_workers", *_PARALLEL)),
    *(f"decode_{c}" for c in ("batch_size", "num_workers", *_PARALLEL)),
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)

#: Columns read when present; when absent every row gets ``None`` for them.
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "silicon_data_source",
    "backend_version",
    "precision",
    "gemm_quant_mode",
    "moe_quant_mode",
)

_MODES = ("agg", "disagg")
_MISSING_TOKENS = frozenset({"", "nan", "none", "null", "na", "n/a"})
_SOURCE_CONC = re.compile(r"(?:^|[;\s])silicon_concurrency\s*=\s*([^;\s]*)")
_ID_CONC = re.compile(r"_c(\d+)_")


@dataclass(frozen=True)
class WorkerSpec:
    """Parallel layout of one engine instance (one agg replica, one prefill or decode worker).

    Sizes given as 0 or left empty in the CSV mean 1. ``batch_size`` is the CSV's
    batch column as given (``None`` when absent): for agg rows it is usually the
    concurrency per attention-DP rank; for disagg rows it is filled only in the
    db-dump rows.
    """

    batch_size: int | None
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1


@dataclass(frozen=True)
class SiliconRow:
    """One measured benchmark row.

    ``concurrency`` is the measured benchmark concurrency (number of closed-loop
    clients) and is what a serving model should simulate. It comes from
    ``silicon_concurrency=N`` in ``silicon_data_source``, else from the ``_c<N>_`` token
    of ``id``; when neither carries it, it is derived from the batch columns
    (agg: ``batch_size x attention_dp``; disagg: ``decode batch x decode workers x
    decode attention_dp``) and ``concurrency_source`` says ``"derived"`` (a problem
    is recorded too). ``concurrency_source`` is ``"source"``, ``"id"``, ``"derived"``
    or ``None`` (unknown).

    Parallel layout: agg rows have ``worker``; disagg rows have ``prefill`` and
    ``decode`` plus ``prefill_workers`` / ``decode_workers`` (``None`` when the CSV
    does not carry worker counts).
    """

    id: str
    backend: str
    backend_version: str | None
    model: str
    system: str
    mode: str
    isl: int | None
    osl: int | None
    concurrency: int | None
    gemm_quant: str | None
    moe_quant: str | None
    measured_ttft_ms: float | None
    measured_tpot_ms: float | None
    worker: WorkerSpec | None = None
    prefill: WorkerSpec | None = None
    decode: WorkerSpec | None = None
    prefill_workers: int | None = None
    decode_workers: int | None = None
    precision: str | None = None
    source: str | None = None
    concurrency_source: str | None = None
    line: int | None = None
    problems: tuple[str, ...] = ()
    bad_values: tuple[tuple[str, str, str], ...] = ()

    def bad_value(self, column: str) -> tuple[str, str] | None:
        """``(problem, raw text)`` of ``column`` when the reader could not use its value (e.g.
        ``("unparsable number", "abc")``, ``("missing value", "")``), else None."""
        for col, problem, raw in self.bad_values:
            if col == column:
                return problem, raw
        return None

    @property
    def fully_specified(self) -> bool:
        """Agg rows, and disagg rows that carry both worker counts."""
        if self.mode == "agg":
            return True
        return self.prefill_workers is not None and self.decode_workers is not None

    @property
    def tpot_defined(self) -> bool:
        """False when the row's TPOT is undefined: with ``osl`` 1 (or 0) a request emits no
        second token, so there is no inter-token gap to time. Such a row is validated on TTFT
        alone (see :func:`infercast.validate.report.run_validation`). ``True`` when ``osl`` is
        unknown (such a row is not predictable anyway)."""
        return self.osl is None or self.osl >= 2

    @property
    def measured(self) -> bool:
        """True when every latency the row defines was measured (finite and positive): TTFT,
        and TPOT unless :attr:`tpot_defined` is false."""
        if self.measured_ttft_ms is None:
            return False
        return self.measured_tpot_ms is not None or not self.tpot_defined

    @property
    def implied_concurrency(self) -> int | None:
        """Concurrency implied by the batch columns, for cross-checks.

        agg: ``batch_size x attention_dp`` (equals :attr:`concurrency` in most rows;
        in a few rows ``batch_size`` is already per replica). disagg: ``decode batch x
        decode workers x decode attention_dp``. ``None`` when a factor is missing.
        """
        if self.mode == "agg":
            w = self.worker
            if w is None or w.batch_size is None:
                return None
            return w.batch_size * w.attention_dp
        d = self.decode
        if d is None or d.batch_size is None or self.decode_workers is None:
            return None
        return d.batch_size * self.decode_workers * d.attention_dp

    def clients_per_replica(self, role: str = "decode") -> float | None:
        """Closed-loop clients served by one engine instance of ``role``.

        agg: the whole :attr:`concurrency` (one replica serves all clients; the
        ``role`` argument is ignored). disagg: ``concurrency / workers`` of the role
        (``"prefill"`` or ``"decode"``), ``None`` when the worker count is unknown.
        The result can be fractional when the clients do not split evenly.
        """
        if self.concurrency is None:
            return None
        if self.mode == "agg":
            return float(self.concurrency)
        if role == "decode":
            workers = self.decode_workers
        elif role == "prefill":
            workers = self.prefill_workers
        else:
            raise InvalidInputError(f"unknown worker role {role!r}", available=("prefill", "decode"))
        if workers is None or workers <= 0:
            return None
        return self.concurrency / workers

    def clients_per_rank(self, role: str = "decode") -> float | None:
        """:meth:`clients_per_replica` divided by that instance's attention-DP size."""
        per_replica = self.clients_per_replica(role)
        if per_replica is None:
            return None
        spec = self.worker if self.mode == "agg" else (self.decode if role == "decode" else self.prefill)
        adp = spec.attention_dp if spec is not None else 1
        return per_replica / adp


# --------------------------------------------------------------------------- parsing


def _is_missing(raw: str | None) -> bool:
    return raw is None or raw.strip().lower() in _MISSING_TOKENS


class _RowParser:
    """Parses one CSV record, collecting problems instead of raising."""

    def __init__(self, rec: Mapping[str, str | None], line: int):
        self.rec = rec
        self.line = line
        self.problems: list[str] = []
        self.bad: list[tuple[str, str, str]] = []  # (column, problem, raw text) of unusable values

    def flag(self, col: str, problem: str, raw: str | None, shown: str | None = None) -> None:
        """Record that ``col``'s value ``raw`` is unusable: a problem line (``"col: problem"``, with
        ``shown`` appended when given) and the structured ``(col, problem, raw)``."""
        self.problems.append(f"{col}: {problem}" + (f" {shown}" if shown else ""))
        self.bad.append((col, problem, (raw or "").strip()))

    def text(self, col: str, *, required: bool = False) -> str | None:
        raw = self.rec.get(col)
        if _is_missing(raw):
            if required:
                self.flag(col, "missing value", raw)
            return None
        assert raw is not None
        return raw.strip()

    def integer(self, col: str, *, required: bool = False, size: bool = False) -> int | None:
        """Integer column (stored as float text, e.g. ``"8.0"``).

        ``size=True``: a parallel size, where empty or 0 means 1.
        """
        raw = self.rec.get(col)
        if _is_missing(raw):
            if required:
                self.flag(col, "missing value", raw)
            return 1 if size else None
        assert raw is not None
        try:
            val = float(raw)
        except ValueError:
            self.flag(col, "unparsable number", raw, repr(raw.strip()))
            return 1 if size else None
        if not math.isfinite(val) or val != int(val) or val < 0:
            self.flag(col, "not a non-negative integer", raw, repr(raw.strip()))
            return 1 if size else None
        ival = int(val)
        if size and ival == 0:
            return 1
        return ival

    def latency(self, col: str) -> float | None:
        raw = self.rec.get(col)
        if _is_missing(raw):
            nan = raw is not None and raw.strip().lower() == "nan"
            self.flag(col, "NaN" if nan else "missing value", raw)
            return None
        assert raw is not None
        try:
            val = float(raw)
        except ValueError:
            self.flag(col, "unparsable number", raw, repr(raw.strip()))
            return None
        if not math.isfinite(val):
            self.flag(col, "not finite", raw, f"({raw.strip()})")
            return None
        if val <= 0:
            self.flag(col, "non-positive", raw, f"({raw.strip()})")
            return None
        return val

    def worker(self, prefix: str, *, batch_required: bool = False) -> WorkerSpec:
        return WorkerSpec(
            batch_size=self.integer(f"{prefix}batch_size", required=batch_required),
            tp=self._size(f"{prefix}tp_size"),
            pp=self._size(f"{prefix}pp_size"),
            attention_dp=self._size(f"{prefix}attention_dp_size"),
            moe_tp=self._size(f"{prefix}moe_tp_size"),
            moe_ep=self._size(f"{prefix}moe_ep_size"),
        )

    def _size(self, col: str) -> int:
        val = self.integer(col, size=True)
        assert val is not None
        return val

    def mode(self, row_id: str) -> str:
        raw = self.text("mode")
        if raw is not None and raw.lower() in _MODES:
            return raw.lower()
        # Infer from the id, else from which parallel column group is filled.
        if "_disagg_" in f"_{row_id}_":
            guess = "disagg"
        elif "_agg_" in f"_{row_id}_":
            guess = "agg"
        elif not _is_missing(self.rec.get("prefill_tp_size")) or not _is_missing(
            self.rec.get("decode_tp_size")
        ):
            guess = "disagg"
        else:
            guess = "agg"
        what = "missing value" if raw is None else f"unknown mode {raw!r}"
        self.problems.append(f"mode: {what}; taken as {guess!r}")
        return guess

    def concurrency(self, row_id: str, source: str | None) -> tuple[int | None, str | None]:
        from_source: int | None = None
        if source is not None:
            m = _SOURCE_CONC.search(source)
            if m is not None:
                token = m.group(1)
                if token.isdigit() and int(token) > 0:
                    from_source = int(token)
                else:
                    self.problems.append(f"silicon_data_source: unparsable silicon_concurrency {token!r}")
        m = _ID_CONC.search(row_id)
        from_id = int(m.group(1)) if m is not None and int(m.group(1)) > 0 else None
        if from_source is not None:
            if from_id is not None and from_id != from_source:
                self.problems.append(
                    f"concurrency: silicon_concurrency={from_source} disagrees with id token "
                    f"_c{from_id}_; using {from_source}"
                )
            return from_source, "source"
        if from_id is not None:
            return from_id, "id"
        return None, None


def _parse_record(rec: Mapping[str, str | None], line: int) -> SiliconRow:
    p = _RowParser(rec, line)
    row_id = p.text("id", required=True) or f"<line {line}>"
    source = p.text("silicon_data_source")
    mode = p.mode(row_id)

    worker = prefill = decode = None
    prefill_workers = decode_workers = None
    if mode == "agg":
        worker = p.worker("", batch_required=True)
    else:
        prefill = p.worker("prefill_")
        decode = p.worker("decode_")
        prefill_workers = p.integer("prefill_num_workers")
        decode_workers = p.integer("decode_num_workers")
        if prefill_workers == 0:
            p.flag("prefill_num_workers", "zero; treated as missing", "0")
            prefill_workers = None
        if decode_workers == 0:
            p.flag("decode_num_workers", "zero; treated as missing", "0")
            decode_workers = None
        if (prefill_workers is None) != (decode_workers is None):
            have = "prefill" if prefill_workers is not None else "decode"
            lack = "decode" if have == "prefill" else "prefill"
            p.problems.append(f"{lack}_num_workers: missing value while {have}_num_workers is set")

    concurrency, conc_source = p.concurrency(row_id, source)

    row = SiliconRow(
        id=row_id,
        backend=(p.text("backend", required=True) or ""),
        backend_version=p.text("backend_version"),
        model=(p.text("model_path", required=True) or ""),
        system=(p.text("system", required=True) or ""),
        mode=mode,
        isl=p.integer("isl", required=True),
        osl=p.integer("osl", required=True),
        concurrency=concurrency,
        gemm_quant=p.text("gemm_quant_mode"),
        moe_quant=p.text("moe_quant_mode"),
        measured_ttft_ms=p.latency("silicon_ttft_ms"),
        measured_tpot_ms=p.latency("silicon_tpot_ms"),
        worker=worker,
        prefill=prefill,
        decode=decode,
        prefill_workers=prefill_workers,
        decode_workers=decode_workers,
        precision=p.text("precision"),
        source=source,
        concurrency_source=conc_source,
        line=line,
    )
    for col, val in (("isl", row.isl), ("osl", row.osl)):
        if val == 0:
            p.problems.append(f"{col}: zero")
    if concurrency is None:
        derived = row.implied_concurrency
        if derived is not None and derived > 0:
            p.problems.append(
                "concurrency: not in silicon_data_source or id; derived from the batch columns "
                f"as {derived}"
            )
            row = _replace(row, concurrency=derived, concurrency_source="derived")
        else:
            p.problems.append("concurrency: not in silicon_data_source, id or batch columns")
    return _replace(row, problems=tuple(p.problems), bad_values=tuple(p.bad))


def _replace(row: SiliconRow, **changes: object) -> SiliconRow:
    return replace(row, **changes)  # type: ignore[arg-type]


def _check_columns(fieldnames: Iterable[str] | None, path: Path) -> None:
    found = [f.strip() for f in (fieldnames or []) if f is not None]
    if not found:
        raise InvalidInputError(f"silicon CSV {path} has no header row", "the file is empty")
    missing = [c for c in REQUIRED_COLUMNS if c not in found]
    if missing:
        raise InvalidInputError(
            f"silicon CSV {path} lacks required columns: {', '.join(missing)}",
            f"columns found: {', '.join(found)}",
        )


def load_rows(path: str | Path, ids: set[str] | None = None) -> list[SiliconRow]:
    """Parse a silicon CSV into :class:`SiliconRow` objects, in file order.

    ``ids``: keep only rows whose ``id`` is in the set (``None`` keeps every row).
    Per-row issues go to :attr:`SiliconRow.problems`; a duplicated id is kept and
    flagged. Raises :class:`DataFileError` when the file cannot be read and
    :class:`InvalidInputError` when required columns are missing.
    """
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise DataFileError(f"cannot read silicon CSV {path}", exc.strerror or str(exc)) from exc
    rows: list[SiliconRow] = []
    seen: dict[str, int] = {}
    with fh:
        reader = csv.DictReader(fh)
        try:
            fieldnames = reader.fieldnames
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataFileError(f"cannot parse silicon CSV {path}", str(exc)) from exc
        _check_columns(fieldnames, path)
        # Normalise header whitespace so " isl" still matches.
        reader.fieldnames = [f.strip() for f in fieldnames or []]
        try:
            for rec in reader:
                line = reader.line_num
                raw_id = (rec.get("id") or "").strip()
                if ids is not None and raw_id not in ids:
                    continue
                row = _parse_record(rec, line)
                extra = rec.get(None)  # type: ignore[call-overload]
                if extra:
                    row = _replace(row, problems=row.problems + (f"{len(extra)} extra field(s) beyond the header",))
                if row.id in seen:
                    row = _replace(
                        row,
                        problems=row.problems + (f"id: duplicate of the row on line {seen[row.id]}",),
                    )
                else:
                    seen[row.id] = line
                rows.append(row)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataFileError(f"cannot parse silicon CSV {path}", f"near line {reader.line_num}: {exc}") from exc
    return rows


def load_ids(path: str | Path) -> set[str]:
    """Read a row-id list: one id per line; blank lines and ``#`` comments are ignored.

    Raises :class:`DataFileError` naming the file when it cannot be read or is not UTF-8 text.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataFileError(f"cannot read id list {path}", exc.strerror or str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise DataFileError(
            f"cannot read id list {path}",
            f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "expected one row id per line",
        ) from exc
    ids: set[str] = set()
    for line in text.splitlines():
        item = line.split("#", 1)[0].strip()
        if item:
            ids.add(item)
    return ids
