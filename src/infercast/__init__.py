"""infercast: predict LLM serving performance on GPUs from measured per-operator tables.

The public names below are imported on first use (PEP 562): ``import infercast`` alone loads
nothing else (no numpy), so that the ``infercast`` command can set up its process (the BLAS
threads, :mod:`infercast.cli`) before numpy loads."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Estimator", "StaticResult", "ForwardPassModel", "Iteration", "RankLoad", "CorrectionOptions", "Surface", "PerfDB",
           "OpResult", "InfercastError", "__version__"]

#: where each public name is defined
_PUBLIC = {
    "Estimator": ".api", "StaticResult": ".api",
    "CorrectionOptions": ".engine.forward_pass", "ForwardPassModel": ".engine.forward_pass",
    "Iteration": ".engine.forward_pass", "RankLoad": ".engine.forward_pass",
    "Surface": ".engine.surface", "InfercastError": ".errors", "OpResult": ".ops.queries", "PerfDB": ".ops.queries",
}


def __getattr__(name: str):
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'infercast' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
