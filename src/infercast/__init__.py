"""infercast: predict LLM serving performance on GPUs from measured per-operator tables."""

from .api import Estimator, StaticResult
from .engine.forward_pass import CorrectionOptions, ForwardPassModel, Iteration, RankLoad
from .engine.surface import Surface
from .errors import InfercastError
from .ops.queries import OpResult, PerfDB

__version__ = "0.1.0"
__all__ = ["Estimator", "StaticResult", "ForwardPassModel", "Iteration", "RankLoad", "CorrectionOptions", "Surface", "PerfDB", "OpResult", "InfercastError", "__version__"]
