"""Typed errors. Every failure a user can cause or meet says what, why, and what exists.

The CLI maps any :class:`InfercastError` to a one-line message and exit code 2.
"""

from __future__ import annotations

from collections.abc import Iterable


def _avail(items: Iterable[object], limit: int = 12) -> str:
    items = sorted({str(i) for i in items})
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    if len(items) > limit:
        shown += f", ... ({len(items)} in all)"
    return shown


class InfercastError(Exception):
    """Base class of every error infercast raises on purpose."""

    def __init__(self, what: str, why: str = "", available: Iterable[object] | None = None):
        self.what = what
        self.why = why
        self.available = None if available is None else sorted({str(a) for a in available})
        msg = what
        if why:
            msg += f": {why}"
        if available is not None:
            msg += f" (available: {_avail(self.available)})"
        super().__init__(msg)


class UnknownModelError(InfercastError):
    """A model id or path that resolves to no config."""


class UnknownSystemError(InfercastError):
    """A system name with no YAML in the pack."""


class UnknownBackendError(InfercastError):
    """A backend with no data for the system."""


class UnknownVersionError(InfercastError):
    """A backend version with no data (or not a queryable slot)."""


class InvalidInputError(InfercastError, ValueError):
    """A shape, length, batch or flag value that is out of domain (<= 0, NaN, absurd)."""


class InvalidConfigError(InfercastError, ValueError):
    """A parallel / quantisation configuration that cannot run (e.g. TP not dividing heads)."""


class UnsupportedModelError(InfercastError):
    """A model family or feature that is not modelled yet."""


class NotAvailableError(InfercastError):
    """No measured data supports the query in the current database mode."""


class DataFileError(InfercastError):
    """A pack file that is missing, a Git LFS pointer, or unreadable."""


class DataPackNotFoundError(InfercastError):
    """No perf-data pack could be located."""


class ConfigFileError(InfercastError, ValueError):
    """A user's file (an experiments YAML) with a syntax error, an unknown key or a bad value; the
    message names the key's path and line."""


class WorkerError(InfercastError):
    """A worker process of a parallel run (``search --jobs``) died before answering (killed by the
    operating system, e.g. out of memory): the run has no result; the same run in one process
    (``--jobs 1``) needs no worker."""
