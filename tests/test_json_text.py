"""The command line's JSON writer: json.dumps(indent=1)'s text, except that a long list of records
is written one record per line; the same data either way."""

from __future__ import annotations

import json

import pytest

from infercast.report.json_text import RECORDS_INLINE, json_text


@pytest.mark.parametrize("doc", [
    {"a": 1, "b": [1, 2, {"c": None}], "d": {}, "e": [], "f": "x\u00e9\n\"", "g": 1.5e-300, "h": float("nan"),
     "i": float("-inf"), 1: 2, 2.5: 3, None: 4, False: 5, "t": (1, 2)},
    [], {}, 3, "s", [[1, 2], [3]], {"few": [{"x": i} for i in range(RECORDS_INLINE)]},
])
def test_same_text_as_json_dumps_without_long_record_lists(doc):
    assert json_text(doc) == json.dumps(doc, indent=1, default=str)


def test_long_record_lists_one_per_line():
    class Odd:
        def __str__(self):
            return "odd"

    doc = {"candidates": [{"i": i, "v": i / 3, "n": {"p80": [i, i + 1]}, "o": Odd()} for i in range(RECORDS_INLINE + 1)],
           "top": [{"x": 1}], "mixed": [{"a": 1}] * RECORDS_INLINE + [2]}
    text = json_text(doc)
    assert json.loads(text) == json.loads(json.dumps(doc, indent=1, default=str))
    lines = text.splitlines()
    assert lines[1] == ' "candidates": [' and lines[2] == '  {"i": 0, "v": 0.0, "n": {"p80": [0, 1]}, "o": "odd"},'
    assert sum(line.startswith('  {"i": ') for line in lines) == RECORDS_INLINE + 1
    assert '  {\n   "a": 1\n  }' in text  # a list that is not all records stays indented
    with pytest.raises(TypeError, match="keys must be"):
        json_text({(1, 2): 3})


def test_records_are_written_as_they_are_made(monkeypatch):
    """A Records list is iterated once and written one record per line, each record made only
    when the one before it has been written (a long one; here the text goes to the stream as soon
    as it is made, ``FLUSH_CHARS`` 0: by default in pieces of about a megabyte, so that no more
    than that is held): the same text as the list it stands for (a short one written as
    json.dumps would)."""
    import io

    from infercast.report import json_text as jt
    from infercast.report.json_text import Records, write_json

    monkeypatch.setattr(jt, "FLUSH_CHARS", 0)

    made, written = [], io.StringIO()

    def make(n):
        for i in range(n):
            if n > RECORDS_INLINE:  # the record before this one is already in the output
                assert i == 0 or f'"i": {i - 1}' in written.getvalue()
            made.append(i)
            yield {"i": i, "v": [i, i / 7]}

    for n in (0, 3, RECORDS_INLINE + 5):
        made.clear()
        written.seek(0)
        written.truncate()
        doc = {"candidates": Records(n, lambda n=n: make(n)), "n": n}
        write_json(doc, written)
        plain = {"candidates": [{"i": i, "v": [i, i / 7]} for i in range(n)], "n": n}
        assert written.getvalue() == json_text(plain) and made == list(range(n))
