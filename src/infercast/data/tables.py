"""Perf tables: one parquet file -> a typed table of key columns and measured values.

Normalisation on load:

* descriptive columns ``framework``, ``version``, ``device`` are dropped (the directory is the
  authoritative version; the column is provenance only);
* every other non-measured column is a key (``op_name`` and ``kernel_source`` included);
  ``string`` and ``large_string`` both become numpy unicode arrays, integers int64;
* measured values are converted to milliseconds: ``latency`` is ms everywhere except
  ``moe_a2a_perf`` (µs); ``*_us`` columns are µs; ``avg_ms`` is ms. The result always has a
  ``latency`` column in ms when the table has one latency-like measure;
* rows with identical keys (repeated runs) are aggregated by the **median** of each measured
  column — robust to the occasional slow repeat, and equal to the value when all repeats agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import DataFileError, NotAvailableError
from .pack import damaged_file_fix

DESCRIPTIVE = ("framework", "version", "device")
MEASURED = {
    "latency", "power", "power_limit", "avg_ms", "transmit_us", "notify_us",
    "dispatch_transmit_us", "dispatch_notify_us", "combine_transmit_us", "combine_notify_us",
    "dispatch_avg_t_us", "combine_avg_t_us", "dispatch_bandwidth_gbps", "combine_bandwidth_gbps",
}
#: tables whose ``latency`` column is in microseconds
LATENCY_IN_US = {"moe_a2a"}

LOAD_STATS: dict[str, float] = {}


@dataclass
class Table:
    """A loaded perf table. ``keys`` and ``values`` map column name -> 1-D numpy array."""

    stem: str
    path: Path
    keys: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    raw_rows: int
    duplicate_keys: int = 0
    _index_cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0

    @property
    def latency(self) -> np.ndarray:
        return self.values["latency"]

    def has(self, col: str) -> bool:
        return col in self.keys

    def unique(self, col: str) -> list:
        """The column's distinct values, sorted (a new list; worked out once per column: the
        string columns of a large table take tens of milliseconds to sort)."""
        if col not in self.keys:
            return []
        key = ("unique", col)
        if key not in self._index_cache:
            self._index_cache[key] = sorted(np.unique(self.keys[col]).tolist())
        return list(self._index_cache[key])

    def mask(self, **eq) -> np.ndarray:
        m = np.ones(len(self), dtype=bool)
        for col, val in eq.items():
            if col not in self.keys:
                raise NotAvailableError(
                    f"table {self.stem} has no column {col!r}", str(self.path), self.keys
                )
            m &= self.keys[col] == val
        return m

    def select(self, mask: np.ndarray) -> Table:
        return Table(
            self.stem, self.path,
            {k: v[mask] for k, v in self.keys.items()},
            {k: v[mask] for k, v in self.values.items()},
            int(mask.sum()), 0,
        )

    def where(self, **eq) -> Table:
        return self.select(self.mask(**eq))


def _cause(exc: BaseException, limit: int = 160) -> str:
    """``Type: message`` of a reader's exception, on one line and at most ``limit`` characters."""
    text = " ".join(str(exc).split()).rstrip(".")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_lfs_pointer(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(40).startswith(b"version https://git-lfs")
    except OSError:
        return False


@dataclass
class _Strings:
    """A string column kept as pyarrow's dictionary (``words``) and each row's index into it
    until duplicate rows are merged, so only the rows that survive are spelt out."""

    words: np.ndarray
    idx: np.ndarray

    def ranks(self) -> np.ndarray:
        """Each row's rank among the column's sorted distinct values: what
        ``np.unique(column, return_inverse=True)`` gives, from the short dictionary."""
        _, rank_of_word = np.unique(self.words, return_inverse=True)
        return rank_of_word.astype(np.int64)[self.idx]

    def rows(self, which: np.ndarray | None = None) -> np.ndarray:
        return self.words[self.idx if which is None else self.idx[which]]


def _column_to_numpy(col, lazy: bool = False):
    """The column (a ``pyarrow.ChunkedArray``) as numpy; with ``lazy``, a string column as
    :class:`_Strings`."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_large_string(t) or pa.types.is_string(t):
        enc = col.cast(pa.string()).combine_chunks().dictionary_encode()
        words = np.asarray(enc.dictionary.to_pylist(), dtype=str)
        strings = _Strings(words, enc.indices.to_numpy(zero_copy_only=False))
        return strings if lazy else strings.rows()
    if pa.types.is_integer(t):
        return col.to_numpy().astype(np.int64)
    if pa.types.is_floating(t):
        return col.to_numpy().astype(np.float64)
    if pa.types.is_boolean(t):
        return col.to_numpy(zero_copy_only=False).astype(bool)
    return np.asarray(col.to_pylist(), dtype=object).astype(str)


def _spelt(keys: dict, which: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The key columns as numpy arrays (the rows ``which``, or all)."""
    out = {}
    for k, v in keys.items():
        if isinstance(v, _Strings):
            out[k] = v.rows(which)
        else:
            out[k] = v if which is None else v[which]
    return out


def _aggregate_duplicates(keys: dict, values: dict[str, np.ndarray]):
    """Median of the measured columns over rows with equal keys (string keys may come as
    :class:`_Strings`); the merged rows in the order of their sorted keys."""
    n = len(next(iter(values.values())))
    if n == 0 or not keys:
        return _spelt(keys), values, 0
    codes = []
    for arr in keys.values():
        if isinstance(arr, _Strings):
            codes.append(arr.ranks())
        elif arr.dtype.kind in "iub":
            codes.append(arr.astype(np.int64))
        else:
            _, inv = np.unique(arr, return_inverse=True)
            codes.append(inv.astype(np.int64))
    order = np.lexsort(codes[::-1])
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = False
    for c in codes:
        sc = c[order]
        new_group[1:] |= sc[1:] != sc[:-1]
    starts = np.flatnonzero(new_group)
    if len(starts) == n:
        return _spelt(keys), values, 0
    ends = np.append(starts[1:], n)
    out_keys = _spelt(keys, order[starts])  # the first row of each group, in sorted order
    out_vals = {}
    lengths = ends - starts
    gid = np.repeat(np.arange(len(starts)), lengths)
    lo = starts + (lengths - 1) // 2
    hi = starts + lengths // 2
    for k, v in values.items():
        sv = v[order]
        # sort values inside each group, then the median is the mean of the two middle ones
        within = np.lexsort((sv, gid))
        sv = sv[within]
        out_vals[k] = 0.5 * (sv[lo] + sv[hi])
    return out_keys, out_vals, int(np.count_nonzero(lengths > 1))


def read_table(path: Path, stem: str | None = None) -> Table:
    """Read and normalise one ``*_perf.parquet``. Raises :class:`DataFileError` on a bad file."""
    path = Path(path)
    stem = stem or path.name.removesuffix(".parquet").removesuffix("_perf")
    if not path.exists():
        raise DataFileError(f"perf table {path} does not exist", damaged_file_fix())
    if _is_lfs_pointer(path):
        raise DataFileError(
            f"perf table {path} is a Git LFS pointer, not data",
            f"fetch the real file (git lfs pull), or {damaged_file_fix()}",
        )
    # pyarrow only when a table is parsed (the cache of parsed tables, :func:`cached_table`, needs none)
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    try:
        # one file: ParquetFile reads it without pyarrow's datasets layer, whose first use costs
        # ~0.5 s of imports (pq.read_table goes through it)
        with pq.ParquetFile(path) as pf:
            at = pf.read()
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DataFileError(f"perf table {path} is unreadable ({_cause(exc)})", damaged_file_fix()) from exc
    keys: dict = {}  # string keys as _Strings until duplicates are merged
    values: dict[str, np.ndarray] = {}
    for name in at.column_names:
        if name in DESCRIPTIVE:
            continue
        arr = _column_to_numpy(at.column(name), lazy=name not in MEASURED)
        if name in MEASURED:
            arr = arr.astype(np.float64)
            if name.endswith("_us") or (name == "latency" and stem in LATENCY_IN_US):
                arr = arr / 1000.0
                name = name[:-3] + "_ms" if name.endswith("_us") else name
            values[name] = arr
        else:
            keys[name] = arr
    if "latency" not in values and "avg_ms" in values:
        values["latency"] = values.pop("avg_ms")
    raw = at.num_rows
    keys, values, ndup = _aggregate_duplicates(keys, values)
    LOAD_STATS[str(path)] = time.perf_counter() - t0
    return Table(stem, path, keys, values, raw, ndup)


#: bump when :func:`read_table`'s normalisation or the cache's layout changes: cached tables of
#: another format are not read (2: a directory of ``.npy`` files, memory-mapped; 3: with each key
#: column's distinct values)
CACHE_FORMAT = 4


def table_cache_dir() -> Path | None:
    """Where parsed tables are kept between processes: ``$INFERCAST_CACHE_DIR/tables``, else
    ``$XDG_CACHE_HOME/infercast/tables``, else ``~/.cache/infercast/tables``; None when
    ``$INFERCAST_CACHE_DIR`` is ``off`` (no cache)."""
    import os

    root = os.environ.get("INFERCAST_CACHE_DIR")
    if root is not None and root.strip().lower() in ("off", "0", "none", ""):
        return None
    if root:
        return Path(root) / "tables"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "infercast" / "tables"


def _cache_file(path: Path, stem: str) -> Path | None:
    """The cache entry of ``path`` as it is now (a directory): named by its resolved path, size and
    modification time (a changed or replaced file gets a new name, so a stale entry is never read)."""
    import hashlib

    root = table_cache_dir()
    if root is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    tag = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{stem}|{CACHE_FORMAT}"
    return root / f"{stem}-{hashlib.sha1(tag.encode()).hexdigest()[:20]}"


def _load_cached(entry: Path, path: Path, stem: str) -> Table | None:
    """The table kept in cache directory ``entry``: ``meta.json`` (row counts, column names, each
    key column's distinct values as :meth:`Table.unique` answers them) and one ``.npy`` file per
    column, memory-mapped copy-on-write (the pages are read as the columns are used, and nothing
    written to an array reaches the file); None for a partial or foreign entry."""
    import json

    try:
        meta = json.loads((entry / "meta.json").read_text())
        keys = {name: np.asarray(np.load(entry / f"k{i}.npy", mmap_mode="c", allow_pickle=False))
                for i, name in enumerate(meta["keys"])}
        values = {name: np.asarray(np.load(entry / f"v{i}.npy", mmap_mode="c", allow_pickle=False))
                  for i, name in enumerate(meta["values"])}
        table = Table(stem, path, keys, values, int(meta["raw_rows"]), int(meta["duplicate_keys"]))
        unique = meta["unique"]
        if set(unique) != set(keys) or not all(isinstance(v, list) for v in unique.values()):
            return None
        table._index_cache.update({("unique", name): vals for name, vals in unique.items()})
        return table
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store_cached(entry: Path, table: Table) -> None:
    """Write ``table`` to cache directory ``entry`` (built under a temporary name and renamed, so a
    reader never sees half of it; another process that got there first wins); a cache that cannot
    be written is skipped."""
    import json
    import shutil
    import tempfile

    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, suffix=".tmp"))
        for prefix, cols in (("k", table.keys), ("v", table.values)):
            for i, arr in enumerate(cols.values()):
                np.save(tmp / f"{prefix}{i}.npy", np.ascontiguousarray(arr), allow_pickle=False)
        st = table.path.stat()
        (tmp / "meta.json").write_text(json.dumps({"raw_rows": table.raw_rows, "duplicate_keys": table.duplicate_keys,
                                                   "keys": list(table.keys), "values": list(table.values),
                                                   "unique": {name: table.unique(name) for name in table.keys},
                                                   "format": CACHE_FORMAT, "source": str(table.path.resolve()),
                                                   "source_stat": [st.st_size, st.st_mtime_ns]}))
        tmp.rename(entry)
        tmp = None
    except (OSError, ValueError):  # ValueError: a column numpy cannot save without pickling
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    prune_table_cache(entry.parent)


#: how often (seconds) a process that writes a cache entry looks for stale ones (a marker file
#: in the cache directory keeps the time of the last look)
PRUNE_EVERY_S = 24 * 3600.0
#: a temporary entry directory older than this (seconds) was left by a writer that died
STALE_TMP_S = 3600.0
_PRUNED: set = set()  # the cache directories this process has looked at


def prune_due(root: Path, force: bool = False) -> bool:
    """Whether cache directory ``root`` is to be looked over for stale entries now: not yet by this
    process, and not for :data:`PRUNE_EVERY_S` by any (a marker file in it keeps the time of the
    last look, touched here), unless ``force``. False when the directory cannot be written."""
    if root in _PRUNED and not force:
        return False
    _PRUNED.add(root)
    marker = root / ".pruned"
    try:
        if not force and marker.exists() and time.time() - marker.stat().st_mtime < PRUNE_EVERY_S:
            return False
        root.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        return False
    return True


def prune_table_cache(root: Path, force: bool = False) -> int:
    """Remove the entries of cache directory ``root`` that no reader can use again: written in
    another format, or whose table file is gone or has changed (a reinstalled pack, a new virtual
    environment: their tables get entries of their own), and temporary directories a dead writer
    left. When :func:`prune_due` (at most once per process and once a day), when an entry is written: a cache that only gains entries would grow with every pack ever read. Answers
    how many entries went; a cache that cannot be read or changed is left as it is."""
    import json
    import shutil

    if not prune_due(root, force):
        return 0
    marker, now = root / ".pruned", time.time()
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        if entry == marker:
            continue
        if not entry.is_dir():  # a file: an entry of an older format (one .npz per table)
            try:
                entry.unlink()
                removed += 1
            except OSError:
                pass
            continue
        try:
            if entry.name.endswith(".tmp"):
                stale = now - entry.stat().st_mtime > STALE_TMP_S
            else:
                meta = json.loads((entry / "meta.json").read_text())
                src = Path(meta["source"])
                st = src.stat() if src.exists() else None
                stale = meta.get("format") != CACHE_FORMAT or st is None or [st.st_size, st.st_mtime_ns] != meta["source_stat"]
        except (OSError, ValueError, KeyError, TypeError):
            stale = not entry.name.endswith(".tmp")  # an entry without a readable source: of an older format
        if stale:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


#: the measured columns of every table this process has read (path -> column names): lets a
#: consumer of one measured column (the power of :mod:`infercast.engine.energy`) know, without
#: reading any file, whether a table it could use was read at all
COLUMNS_READ: dict[str, frozenset[str]] = {}


def column_was_read(name: str) -> bool:
    """Whether any table this process has read carries the measured column ``name``."""
    return any(name in cols for cols in COLUMNS_READ.values())


@lru_cache(maxsize=256)
def cached_table(path: Path, stem: str) -> Table:
    """Per-process cache: each file is read at most once; and between processes, its parsed
    arrays in the user's cache directory (:func:`table_cache_dir`), read instead of the parquet
    file while the file keeps its path, size and modification time."""
    path = Path(path)
    table = None
    file = _cache_file(path, stem)
    if file is not None and file.is_dir():
        t0 = time.perf_counter()
        table = _load_cached(file, path, stem)
        if table is not None:
            LOAD_STATS[str(path)] = time.perf_counter() - t0
    if table is None:
        table = read_table(path, stem)
        if file is not None:
            if file.exists():  # a damaged entry: replaced by this reading
                import shutil

                shutil.rmtree(file, ignore_errors=True)
            _store_cached(file, table)
    COLUMNS_READ[str(path)] = frozenset(table.values)
    return table
