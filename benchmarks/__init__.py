"""Benchmarks for infercast: speed (``benchmarks.estimate``) and interpolation accuracy
(``benchmarks.interp_loo``). Run from the repository root, e.g.
``PYTHONPATH=src python -m benchmarks.estimate``; see ``benchmarks/README.md``."""
