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

import json

#: lists of dicts longer than this are written one dict per line
RECORDS_INLINE = 20


def _key(k, flat: json.JSONEncoder) -> str:
    """A dict key as ``json`` writes it: a string as it is; a number, boolean or None as its JSON
    text, quoted."""
    if isinstance(k, str):
        return json.dumps(k)
    if k is None or isinstance(k, (int, float)):
        return json.dumps(flat.encode(k))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def json_text(obj, indent: int = 1, default=str) -> str:
    """``obj`` as JSON text: ``json.dumps(obj, indent=indent, default=default)``'s layout, except
    that a list of more than :data:`RECORDS_INLINE` dicts is written one dict per line (module
    docstring). ``json.loads`` of the text equals ``json.loads`` of ``json.dumps``'s."""
    flat = json.JSONEncoder(default=default, separators=(", ", ": "))

    def write(o, level: int) -> str:
        if isinstance(o, dict) and o:
            pad, end = " " * (indent * (level + 1)), " " * (indent * level)
            return "{\n" + ",\n".join(f"{pad}{_key(k, flat)}: {write(v, level + 1)}" for k, v in o.items()) + "\n" + end + "}"
        if isinstance(o, (list, tuple)) and o:
            pad, end = " " * (indent * (level + 1)), " " * (indent * level)
            if len(o) > RECORDS_INLINE and all(isinstance(x, dict) for x in o):
                return "[\n" + ",\n".join(pad + flat.encode(x) for x in o) + "\n" + end + "]"
            return "[\n" + ",\n".join(pad + write(x, level + 1) for x in o) + "\n" + end + "]"
        return flat.encode(o)

    return write(obj, 0)
