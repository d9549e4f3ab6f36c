"""Compiled ops kept between processes: what :class:`~infercast.engine.compiled.CompiledEngine`
resolves an op to, answered from disk by the next process that asks for the same op.

Resolving an op (reading its table, building the lattice of measured sites, transferring to the
query's shape) is most of the time an estimator takes to build: ~0.1 s for a dense model's first
layout, before any serving model runs. A command that builds estimators (``estimate``, ``serve``,
``search``, ...) keeps each op it resolved, per perf database (pack, system, backend, data version,
database mode, kind of data), in one SQLite file under the user's cache directory, next to the
parsed tables (``<cache>/compiled``, :func:`~infercast.data.tables.table_cache_dir`;
``INFERCAST_CACHE_DIR=off`` turns both off). Keys are the op's resolution key
(:meth:`~infercast.engine.compiled.CompiledEngine._compile_shared`: its kind, phase, parameters,
and how tokens reach MoE experts); values the pickled answer.

An answer stays valid while nothing it was built from changes. Each file carries the fingerprint it
was written under and is emptied when it differs:

* infercast's own code (every module's path, size and modification time), its version, numpy's
  and Python's;
* the pack: the modification time of every directory under ``systems/`` (a table file added,
  removed or renamed anywhere changes its directory's: another system's or version's table can
  serve this one's), and the size and modification time of every YAML file there (system specs,
  ``query_versions.yaml``, each version's ``reuse.yaml``); the walk that finds them is kept beside
  the stores and checked entry by entry, a new walk made when any entry changed
  (:func:`pack_fingerprint`);
* every table file the kept answers were built from (size and modification time, checked when
  the file is opened).

A compile has effects beside its answer, which a kept answer replays: which file served each
table (:attr:`~infercast.data.database.PerfData.served`, the provenance an estimate reports) and
each table's measured columns (:data:`~infercast.data.tables.COLUMNS_READ`, what the energy model
checks before it resolves its ops). They are recorded while the op resolves
(:func:`~infercast.data.database.recording_reads`).

An answer that cannot be pickled (a speed-of-light function that is a closure, in the op families
not converted) is not stored: that op resolves in every process, as without this cache. A file is
checked when a process first opens it, and its new answers are written when the process exits, in
one transaction (a forked worker neither reads nor writes its parent's file); a damaged file is
made anew, and one that cannot be written is left alone: the cache only ever saves time, every
answer is the one the op resolves to. Once a day a process removes the files whose pack is gone
(:func:`prune`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pickle
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

#: bumped when what a file holds changes shape (older files are then emptied)
CACHE_FORMAT = 1

#: the open stores of this process, by perf database
_STORES: dict[tuple, _Store | None] = {}


def compile_cache_dir() -> Path | None:
    """``<cache>/compiled`` beside the parsed tables' directory; None when caching is off."""
    from ..data.tables import table_cache_dir

    tables = table_cache_dir()
    return None if tables is None else tables.parent / "compiled"


def _files(root: str, suffix: str) -> list:
    """(path, size, mtime) of every file under ``root`` whose name ends in ``suffix``, sorted."""
    out = []
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        if e.name != "__pycache__":
                            stack.append(e.path)
                    elif e.name.endswith(suffix):
                        st = e.stat()
                        out.append((e.path, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((d, -1, -1))
    return sorted(out)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """infercast's modules, its version, numpy's and Python's (see the module docstring)."""
    import numpy as np

    from .. import __version__

    root = str(Path(__file__).resolve().parent.parent)
    tag = json.dumps([CACHE_FORMAT, __version__, np.__version__, list(sys.version_info[:3]), _files(root, ".py")])
    return hashlib.sha1(tag.encode()).hexdigest()


@lru_cache(maxsize=8)
def pack_fingerprint(systems_dir: str) -> str:
    """The pack's ``systems/`` tree: every directory's modification time and every YAML file's
    size and modification time, wherever it is (see the module docstring). The walk's entries are
    kept (:func:`_walk_record`): while every one of them stats as recorded, the tree is the one
    the walk saw (a file or directory added, removed or renamed anywhere changes its directory's
    time), and its fingerprint is the recorded one without listing the ~900 directories again."""
    record = _walk_record(systems_dir)
    kept = _read_walk(record) if record is not None else None
    if kept is not None:
        return kept
    out = _walk_pack(systems_dir)
    fingerprint = hashlib.sha1(json.dumps(out).encode()).hexdigest()
    if record is not None and out and out[0][1] != -1:
        _write_walk(record, out, fingerprint)
    return fingerprint


def _walk_pack(systems_dir: str) -> list:
    """(path, size, modification time) of ``systems_dir``, every directory under it (size 0) and
    every YAML file there, sorted; one ``("?", -1, -1)`` entry when it cannot be walked."""
    out: list = []
    stack = [systems_dir]
    try:
        out.append((systems_dir, 0, os.stat(systems_dir).st_mtime_ns))
        while stack:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        out.append((e.path, 0, e.stat(follow_symlinks=False).st_mtime_ns))
                    elif e.name.endswith(".yaml"):
                        st = e.stat()
                        out.append((e.path, st.st_size, st.st_mtime_ns))
    except OSError:
        out.append(("?", -1, -1))
    return sorted(out)


def _walk_record(systems_dir: str) -> Path | None:
    """Where the walk of ``systems_dir`` is kept (None: caching is off)."""
    root = compile_cache_dir()
    if root is None:
        return None
    return root / f"pack-walk-{hashlib.sha1(systems_dir.encode()).hexdigest()[:20]}.json"


def _read_walk(record: Path) -> str | None:
    """The fingerprint kept in ``record`` if every entry of its walk stats as recorded, else None."""
    try:
        kept = json.loads(record.read_text())
        for path, size, mtime in kept["entries"]:
            st = os.stat(path)
            if st.st_mtime_ns != mtime or (size and st.st_size != size):
                return None
        return kept["fingerprint"] if kept.get("format") == CACHE_FORMAT else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_walk(record: Path, entries: list, fingerprint: str) -> None:
    """Keep a walk (written under a temporary name and renamed; one that cannot be written is skipped)."""
    tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "fingerprint": fingerprint, "entries": entries}))
        tmp.replace(record)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def _file_stat(path: str) -> list:
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [-1, -1]


class _Store:
    """One perf database's kept compiles (an SQLite file), and the new ones to write at exit."""

    def __init__(self, path: Path, fingerprint: str, systems_dir: str = ""):
        import sqlite3

        self.path = path
        self.pid = os.getpid()  # a connection is not used across a fork (SQLite's rule)
        self.pending: dict[str, bytes] = {}
        self.files: dict[str, list] = {}  # table files the new answers were built from
        path.parent.mkdir(parents=True, exist_ok=True)
        self.con = sqlite3.connect(str(path), timeout=10.0, isolation_level=None)
        con = self.con
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        con.execute("CREATE TABLE IF NOT EXISTS ops (key TEXT PRIMARY KEY, value BLOB)")
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        files = json.loads(meta.get("files", "{}"))
        if meta.get("fingerprint") != fingerprint or any(_file_stat(p) != s for p, s in files.items()):
            con.execute("BEGIN IMMEDIATE")
            con.execute("DELETE FROM ops")
            con.execute("INSERT OR REPLACE INTO meta VALUES ('fingerprint', ?)", (fingerprint,))
            con.execute("INSERT OR REPLACE INTO meta VALUES ('files', '{}')")
            con.execute("INSERT OR REPLACE INTO meta VALUES ('systems_dir', ?)", (systems_dir,))
            con.execute("COMMIT")

    def get(self, key: str):
        row = self.con.execute("SELECT value FROM ops WHERE key = ?", (key,)).fetchone()
        return None if row is None else pickle.loads(row[0])

    def put(self, key: str, value, reads: list) -> None:
        try:
            self.pending[key] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError):
            return  # not picklable: resolved again by every process
        for path in {r[5] for r in reads} - self.files.keys():  # each table file stat'ed once
            self.files[path] = _file_stat(path)

    def save(self) -> None:
        if not self.pending:
            return
        con = self.con
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT value FROM meta WHERE key = 'files'").fetchone()
        files = {**json.loads(row[0] if row else "{}"), **self.files}
        con.executemany("INSERT OR REPLACE INTO ops VALUES (?, ?)", list(self.pending.items()))
        con.execute("INSERT OR REPLACE INTO meta VALUES ('files', ?)", (json.dumps(files),))
        con.execute("COMMIT")
        self.pending.clear()
        self.files.clear()


def _store(db) -> _Store | None:
    """The open store of ``db``'s perf database (opened on first use; None: no cache)."""
    data = db.data
    ident = (str(data.pack.systems_dir), data.system.name, str(data.system.data_dir), data.backend, data.version,
             str(db.mode), type(data).__name__)
    if ident in _STORES:
        store = _STORES[ident]
        # a forked worker (search --jobs) compiles without the store its parent opened
        return store if store is None or store.pid == os.getpid() else None
    store = None
    root = compile_cache_dir()
    if root is not None:
        import sqlite3

        name = hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:20]
        fingerprint = f"{code_fingerprint()}:{pack_fingerprint(str(data.pack.systems_dir))}"
        path = root / f"{data.system.name}-{data.backend}-{name}.sqlite"
        prune(root)
        for attempt in (1, 2):
            try:
                store = _Store(path, fingerprint, str(data.pack.systems_dir))
                break
            except sqlite3.DatabaseError as exc:  # not a database (a damaged file): made anew, once
                if attempt == 2 or isinstance(exc, sqlite3.OperationalError):  # (locked: left alone)
                    break
                try:
                    path.unlink()
                except OSError:
                    break
            except (sqlite3.Error, OSError, ValueError):
                break
    if not _STORES:
        atexit.register(save_all)
    _STORES[ident] = store
    return store


def prune(root: Path, force: bool = False) -> int:
    """Remove the stores of ``root`` whose pack is gone (a removed virtual environment, a moved
    pack) or that cannot be read, and the kept walks of such packs, when :func:`~infercast.data.tables.prune_due` (at most once per
    process and once a day, unless ``force``), as :func:`~infercast.data.tables.prune_table_cache`
    does for parsed tables. Answers how many went."""
    import sqlite3

    from ..data.tables import prune_due

    if not prune_due(root, force):
        return 0
    try:
        files = sorted(root.glob("*.sqlite"))
    except OSError:
        return 0
    removed = 0
    for f in files:
        try:
            con = sqlite3.connect(f"file:{f}?mode=ro", uri=True, timeout=1.0)
            try:
                row = con.execute("SELECT value FROM meta WHERE key = 'systems_dir'").fetchone()
            finally:
                con.close()
            gone = row is None or not Path(row[0]).is_dir()
        except sqlite3.OperationalError as exc:  # locked (in use): left alone; no meta table: unusable
            gone = "no such table" in str(exc)
        except sqlite3.DatabaseError:
            gone = True
        removed += gone and _unlinked(f)
    for f in sorted(root.glob("pack-walk-*")):  # kept walks (pack_fingerprint) of packs that are gone
        try:
            gone = f.name.endswith(".tmp") or not Path(json.loads(f.read_text())["entries"][0][0]).is_dir()
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            gone = True
        removed += gone and _unlinked(f)
    return removed


def _unlinked(f: Path) -> int:
    """1 when file ``f`` was removed, 0 when it could not be."""
    try:
        f.unlink()
        return 1
    except OSError:
        return 0


def key_text(key: tuple) -> str | None:
    """A resolution key as the text it is kept under; None when its text would not name it
    (an object shown by its address)."""
    text = repr(key)
    return None if " at 0x" in text else text


def compiled(db, key: tuple, build):
    """``build()`` (a compiled op with ``op`` None or not) for resolution ``key`` of ``db``: from
    the store when a process kept it (its side effects replayed), else built (and kept at exit).
    The answer's ``op`` is None when it comes from the store (the caller puts its own back)."""
    from ..data.database import recording_reads

    text = key_text(key)
    store = _store(db) if text is not None else None
    if store is None:
        return build()
    import sqlite3

    try:
        hit = store.get(text)
    except (sqlite3.Error, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        hit = None
    if hit is not None:
        value, reads = hit
        _replay(db, reads)
        return value
    with recording_reads() as reads:
        value = build()
    store.put(text, (replace(value, op=None), reads), reads)
    return value


def _replay(db, reads: list) -> None:
    """A kept compile's side effects (module docstring)."""
    from ..data.tables import COLUMNS_READ

    data = db.data
    here = (data.system.name, data.backend, data.version)
    for system, backend, version, stem, loc, path, cols in reads:
        if (system, backend, version) == here:
            data.served[stem] = loc
        COLUMNS_READ.setdefault(path, cols)


def save_all() -> None:
    """Write every store's new answers (at exit; also callable before)."""
    import sqlite3

    for store in _STORES.values():
        if store is None or store.pid != os.getpid():
            continue
        try:
            store.save()
        except (sqlite3.Error, OSError):
            store.pending.clear()


def close_all() -> None:
    """Write and forget every open store (tests, and a process that changes its cache directory)."""
    save_all()
    for store in _STORES.values():
        if store is not None and store.pid == os.getpid():
            store.con.close()
    _STORES.clear()
