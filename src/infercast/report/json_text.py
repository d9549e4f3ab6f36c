"""JSON text for the command line's ``--json``: indented, except long lists of records.

``json.dumps(..., indent=1)`` is readable but goes through the standard library's pure-Python
encoder, which takes minutes on a search's ``--all`` output (a million candidates of ~30 fields
with their prediction intervals). :func:`json_text` writes the same document with the same
indentation, except that a list of more than :data:`RECORDS_INLINE` objects is written one
object per line, each on one line through the C encoder (``{"layout": "tp2", "tp": 2, ...}``):
the same data (``json.loads`` gives the same value), one candidate per line for ``grep``, and
about as fast as compact JSON.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

#: lists of dicts longer than this are written one dict per line
RECORDS_INLINE = 20
#: :func:`write_json` hands its text to the stream in pieces of about this many characters
FLUSH_CHARS = 1 << 20


def _key(k, flat: json.JSONEncoder) -> str:
    """A dict key as ``json`` writes it: a string as it is; a number, boolean or None as its JSON
    text, quoted."""
    if isinstance(k, str):
        return json.dumps(k)
    if k is None or isinstance(k, (int, float)):
        return json.dumps(flat.encode(k))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


class Records(Sequence):
    """A list of ``n`` dicts made one at a time as it is iterated (``make()`` gives a fresh
    iterator of them): :func:`write_json` writes each and lets it go, so a million search
    candidates are never all held as dicts at once."""

    def __init__(self, n: int, make: Callable[[], Iterator[dict]]):
        self._n, self._make = int(n), make

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[dict]:
        return self._make()

    def __getitem__(self, i):
        return list(self)[i]


def write_json(obj, out: TextIO, indent: int = 1, default=str) -> None:
    """Write ``obj`` to ``out`` as :func:`json_text` gives it, piece by piece (a :class:`Records`
    list one record at a time)."""
    flat = json.JSONEncoder(default=default, separators=(", ", ": "))
    pieces: list[str] = []  # written to ``out`` a megabyte at a time (one call per piece costs more)
    size = [0]

    def write(text: str) -> None:
        pieces.append(text)
        size[0] += len(text)
        if size[0] >= FLUSH_CHARS:
            out.write("".join(pieces))
            pieces.clear()
            size[0] = 0

    def emit(o, level: int) -> None:
        pad, end = " " * (indent * (level + 1)), " " * (indent * level)
        if isinstance(o, dict) and o:
            write("{\n")
            for j, (k, v) in enumerate(o.items()):
                write(f"{',' if j else ''}{'' if not j else chr(10)}{pad}{_key(k, flat)}: ")
                emit(v, level + 1)
            write("\n" + end + "}")
            return
        if isinstance(o, Records) and len(o) <= RECORDS_INLINE:
            o = list(o)
        if isinstance(o, (list, tuple, Records)) and len(o):
            write("[\n")
            if isinstance(o, Records) or (len(o) > RECORDS_INLINE and all(isinstance(x, dict) for x in o)):
                for j, x in enumerate(o):
                    write((",\n" if j else "") + pad + flat.encode(x))
            else:
                for j, x in enumerate(o):
                    write((",\n" if j else "") + pad)
                    emit(x, level + 1)
            write("\n" + end + "]")
            return
        write(flat.encode(list(o) if isinstance(o, Records) else o))

    emit(obj, 0)
    out.write("".join(pieces))


def json_text(obj, indent: int = 1, default=str) -> str:
    """``obj`` as JSON text: ``json.dumps(obj, indent=indent, default=default)``'s layout, except
    that a list of more than :data:`RECORDS_INLINE` dicts (or a :class:`Records`) is written one
    dict per line (module docstring). ``json.loads`` of the text equals ``json.loads`` of
    ``json.dumps``'s."""
    buf = io.StringIO()
    write_json(obj, buf, indent, default)
    return buf.getvalue()
