"""Pack YAML documents (system specs, version lists) parsed once and kept between processes.

Every command reads a few of the pack's YAML files; parsing them needs PyYAML, whose import alone
takes longer than the rest of a warm command's data reading. :func:`read_pack_yaml` keeps each
parsed document in the parsed-table cache directory
(:func:`~infercast.data.tables.table_cache_dir`, off with ``INFERCAST_CACHE_DIR=off``), as an
entry named by the file's resolved path, size and modification time (a changed file gets a new
entry; the old one is pruned with the tables' stale entries, :func:`~infercast.data.tables.prune_table_cache`),
and answers from it while the file is unchanged: the same document, without importing PyYAML.
A document that does not parse is not stored (each read raises :class:`PackYamlError` again).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

from .pack import parse_pack_yaml
from .tables import CACHE_FORMAT, _cache_file, prune_table_cache


class PackYamlError(Exception):
    """A pack YAML file that does not parse; the message is PyYAML's."""


def read_pack_yaml(path: Path):
    """The document of pack YAML file ``path`` as :func:`~infercast.data.pack.parse_pack_yaml`
    parses it (module docstring). Raises OSError / UnicodeDecodeError as reading the file does, and
    :class:`PackYamlError` when it does not parse."""
    path = Path(path)
    entry = _cache_file(path, "yaml")  # named as a table's entry is, by the file as it is now
    if entry is not None:
        try:
            with open(entry / "doc.pickle", "rb") as f:
                return pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
            pass
    text = path.read_text(encoding="utf-8")
    import yaml

    try:
        doc = parse_pack_yaml(text)
    except yaml.YAMLError as exc:
        raise PackYamlError(str(exc)) from exc
    if entry is not None:
        _store(entry, path, doc)
    return doc


def _store(entry: Path, path: Path, doc) -> None:
    """Keep ``doc`` in ``entry`` (written under a temporary name and renamed, as a table entry is,
    with the same ``meta.json`` fields for pruning); a cache that cannot be written is skipped."""
    import tempfile  # (only to write: ~2.5 ms to import)

    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, suffix=".tmp"))
        with open(tmp / "doc.pickle", "wb") as f:
            pickle.dump(doc, f, protocol=pickle.HIGHEST_PROTOCOL)
        st = path.stat()
        (tmp / "meta.json").write_text(json.dumps({"format": CACHE_FORMAT, "source": str(path.resolve()),
                                                   "source_stat": [st.st_size, st.st_mtime_ns]}))
        tmp.rename(entry)
        tmp = None
    except (OSError, pickle.PicklingError):
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    prune_table_cache(entry.parent)
