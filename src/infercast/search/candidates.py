"""A search's candidates, kept as rows until one is looked at: :class:`Candidates`.

A disaggregated search evaluates tens of thousands of deployments (about a million in a wide-EP
search of a large MoE model), and most of them are only ever read a column at a time: the Pareto
frontier and the recommendation need each candidate's throughputs, TTFT and whether it meets the
targets; only the frontier, the best and the top few are shown. So the candidates are stored as
*runs*: a run of one class holds its candidates either as objects (:meth:`Candidates.append`) or
as rows -- tuples of the class's field values in field order (:meth:`Candidates.add_row`), which
cost a fraction of an object to make, to send back from a worker process and to keep. A column
(:meth:`Candidates.column`) is read straight from the rows; an element is made into its object
the first time it is looked at (and that object is kept: a caller that changes it sees the change
when it looks again), and iterating makes every object, so a :class:`Candidates` behaves as the
list of objects it stands for.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from functools import lru_cache
from operator import attrgetter, itemgetter


@lru_cache(maxsize=None)
def field_names(cls) -> tuple[str, ...]:
    """The dataclass ``cls``'s field names in order (the order of a row)."""
    return tuple(f.name for f in fields(cls))


@lru_cache(maxsize=None)
def _row_getter(cls):
    names = field_names(cls)
    return attrgetter(*names) if len(names) > 1 else (lambda obj: (getattr(obj, names[0]),))


def as_row(obj) -> tuple:
    """The field values of dataclass instance ``obj`` as a row (:class:`Candidates`)."""
    return _row_getter(type(obj))(obj)


class _Run:
    """Candidates of one class, consecutive in the sequence: ``rows`` (None once every object is
    made) and ``objs`` (the objects made so far, by position in the run)."""

    __slots__ = ("cls", "rows", "objs")

    def __init__(self, cls, rows: list | None, objs: dict | list | None):
        self.cls, self.rows, self.objs = cls, rows, objs

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.objs)

    def get(self, j: int):
        if self.rows is None:
            return self.objs[j]
        obj = self.objs.get(j)
        if obj is None:
            obj = self.objs[j] = self.cls(*self.rows[j])
        return obj

    def materialise(self) -> list:
        """Every object of the run, made now where not made yet (the rows are then dropped)."""
        if self.rows is not None:
            made, cls = self.objs, self.cls
            self.objs = [made[j] if j in made else cls(*row) for j, row in enumerate(self.rows)]
            self.rows = None
        return self.objs

    def column(self, name: str) -> list:
        if self.rows is None:
            return list(map(attrgetter(name), self.objs))
        out = list(map(itemgetter(field_names(self.cls).index(name)), self.rows))
        for j, obj in self.objs.items():  # an object already made may have been changed since: read it
            out[j] = getattr(obj, name)
        return out


class Candidates(Sequence):
    """The candidates of a search, in the order they were added (module docstring)."""

    def __init__(self, items: Iterable = ()):
        self._runs: list[_Run] = []
        self._starts: list[int] = []  # the index of each run's first candidate
        self._n = 0
        self.extend(items)

    # ---- adding ----------------------------------------------------------------------------------
    def append(self, obj) -> None:
        """Add one candidate object."""
        last = self._runs[-1] if self._runs else None
        if last is not None and last.rows is None and last.cls is type(obj):
            last.objs.append(obj)
        else:
            self._new_run(_Run(type(obj), None, [obj]))
        self._n += 1

    def extend(self, items: Iterable) -> None:
        """Add candidate objects (those of another :class:`Candidates` as its rows)."""
        if isinstance(items, Candidates):
            for cls, rows in items.runs():
                self.add_rows(cls, rows)
            return
        for obj in items:
            self.append(obj)

    def add_row(self, cls, row: tuple) -> None:
        """Add one candidate of class ``cls`` as ``row``, its field values in field order."""
        last = self._runs[-1] if self._runs else None
        if last is not None and last.rows is not None and last.cls is cls:
            last.rows.append(row)
        else:
            self._new_run(_Run(cls, [row], {}))
        self._n += 1

    def add_rows(self, cls, rows: list) -> None:
        """Add candidates of class ``cls`` as ``rows`` (each its field values in field order)."""
        if not rows:
            return
        last = self._runs[-1] if self._runs else None
        if last is not None and last.rows is not None and last.cls is cls:
            last.rows.extend(rows)
        else:
            self._new_run(_Run(cls, list(rows), {}))
        self._n += len(rows)

    def _new_run(self, run: _Run) -> None:
        self._runs.append(run)
        self._starts.append(self._n)

    # ---- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("candidate index out of range")
        r = bisect_right(self._starts, i) - 1
        return self._runs[r].get(i - self._starts[r])

    def __iter__(self) -> Iterator:
        for run in self._runs:
            yield from run.materialise()

    def column(self, name: str) -> list:
        """Field ``name`` of every candidate, in order (read from the rows: no object made)."""
        out: list = []
        for run in self._runs:
            out.extend(run.column(name))
        return out

    def values_at(self, indices, names: tuple[str, ...]) -> list[list]:
        """Fields ``names`` of the candidates at ``indices``, a list per field (read from the rows:
        no object made)."""
        out: list[list] = [[] for _ in names]
        for i in indices:
            r = bisect_right(self._starts, i) - 1
            run, j = self._runs[r], i - self._starts[r]
            if run.rows is None or j in run.objs:  # an object made: read it (it may have been changed)
                obj = run.get(j)
                vals = [getattr(obj, name) for name in names]
            else:
                row, fn = run.rows[j], field_names(run.cls)
                vals = [row[fn.index(name)] for name in names]
            for column, v in zip(out, vals):
                column.append(v)
        return out

    def runs(self) -> list[tuple[type, list[tuple]]]:
        """The candidates as (class, rows) runs, in order (what a worker process sends back)."""
        out = []
        for run in self._runs:
            if run.rows is None:  # objects: their rows now
                out.append((run.cls, list(map(_row_getter(run.cls), run.objs))))
            elif run.objs:  # rows, some made into objects (perhaps changed since): those read again
                rows, getter = list(run.rows), _row_getter(run.cls)
                for j, obj in run.objs.items():
                    rows[j] = getter(obj)
                out.append((run.cls, rows))
            else:
                out.append((run.cls, run.rows))
        return out

    def __eq__(self, other) -> bool:
        if isinstance(other, (Candidates, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable, as a list

    def __repr__(self) -> str:
        return f"Candidates({len(self)} candidates in {len(self._runs)} runs)"


def column_reader(candidates) -> Callable[[str], list]:
    """``candidates.column`` for a :class:`Candidates`; for any other sequence of candidate
    objects, the same reader over them (a field of every candidate, in order)."""
    column = getattr(candidates, "column", None)
    return column if column is not None else Candidates(candidates).column
