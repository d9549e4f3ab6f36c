"""The base of the serving models' engine wrappers (:mod:`.scaled`, :mod:`.prefix`): a view of a
compiled engine that changes some of its step times and must not let the others through unchanged.

Every other attribute is the wrapped engine's, except a timing method (a name ending in ``_ms`` or
``_scalar``) the subclass does not define: that is refused with AttributeError rather than
answered by the wrapped engine without the subclass's change, so callers that look a fast path up
with ``getattr(engine, name, None)`` fall back to the wrapper's :meth:`step_ms`.
"""

from __future__ import annotations

#: name endings of an engine's timing methods
TIMING_SUFFIXES = ("_ms", "_scalar")


class TimingWrapper:
    """``engine`` seen through a subclass that redefines the timing methods it changes."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name.endswith(TIMING_SUFFIXES):
            raise AttributeError(f"{type(self).__name__} does not adjust {name}; use step_ms")
        return getattr(self._engine, name)
