"""Experiments from a file (``infercast exp FILE.yaml``): several searches or served deployments
per file, validated (:mod:`.schema`, :mod:`.load`) and run (:mod:`.run`)."""

from .load import load_experiments, parse_experiments
from .schema import Experiment

__all__ = ["Experiment", "load_experiments", "parse_experiments"]
