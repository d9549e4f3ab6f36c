"""The search's candidate store: rows and objects in one sequence that behaves as the list of
objects it stands for (order, indexing, slices, iteration, changes to an object kept), with
columns read without making objects."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from infercast.search.candidates import Candidates, as_row, field_names


@dataclass
class A:
    name: str
    x: float
    ok: bool = True


@dataclass
class B(A):
    extra: int = 0


def _mixed() -> tuple[Candidates, list]:
    """A store of objects and rows of two classes, and the list of objects it stands for."""
    want = [A("a0", 1.0), A("a1", 2.0, False), B("b0", 3.0, True, 7), B("b1", 4.0, False, 8), A("a2", 5.0), B("b2", 6.0)]
    c = Candidates()
    c.append(want[0])
    c.append(want[1])
    c.add_row(B, as_row(want[2]))
    c.add_rows(B, [as_row(want[3])])
    c.add_row(A, ("a2", 5.0, True))
    c.add_rows(B, [])  # nothing
    c.append(want[5])
    return c, want


def test_store_is_the_list_it_stands_for():
    c, want = _mixed()
    assert len(c) == 6 and bool(c) and list(c) == want and c == want
    assert [c[i] for i in range(6)] == want and c[-1] == want[-1] and c[-6] == want[0]
    assert c[1:4] == want[1:4] and c[::-2] == want[::-2]
    assert [type(x) for x in c] == [A, A, B, B, A, B]
    with pytest.raises(IndexError):
        c[6]
    with pytest.raises(IndexError):
        c[-7]
    assert Candidates() == [] and not Candidates() and len(Candidates(want)) == 6


def test_columns_come_from_rows_and_from_changed_objects():
    c, want = _mixed()
    assert c.column("x") == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert c.column("ok") == [True, False, True, False, True, True]
    assert field_names(B) == ("name", "x", "ok", "extra")
    # an object looked at is kept: a change to it is seen by a second look, a column and iteration
    c[3].x = 40.0
    assert c[3].x == 40.0 and c[3] is c[3]
    assert c.column("x")[3] == 40.0
    assert [o.x for o in c][3] == 40.0
    # after iterating (every object made), the same objects again
    first = list(c)
    assert all(a is b for a, b in zip(first, c))


def test_runs_round_trip_and_pickle():
    c, want = _mixed()
    c[2].extra = 70  # changed before the runs are taken: the rows say so
    runs = c.runs()
    assert [cls for cls, _ in runs] == [A, B, A, B]
    back = Candidates()
    for cls, rows in runs:
        back.add_rows(cls, rows)
    want[2].extra = 70
    assert back == want
    other = Candidates()
    other.extend(c)
    assert other == want
    again = pickle.loads(pickle.dumps(c))
    assert again == want and [o.extra for o in again[2:4]] == [70, 8]
