"""infercast: predict LLM serving performance on GPUs from measured per-operator tables."""

from .api import Estimator, StaticResult
from .errors import InfercastError

__version__ = "0.1.0"
__all__ = ["Estimator", "StaticResult", "InfercastError", "__version__"]
