"""Map a measured silicon row to an infercast configuration and predict it.

Mapping (facts from the fidelity README):

* model id as written in the CSV, resolved through the pack's aliases;
* fp8 KV cache for TensorRT-LLM rows with quantised weights (see :func:`_kv_quant`);
* ``gemm_quant_mode`` from the row overrides the checkpoint's inferred GEMM quant (the row says
  what was benchmarked);
* data version: the pack's *current* slot for the backend. The CSV's ``backend_version`` values are
  the versions that were benchmarked (often Dynamo runtime tags); perf tables exist only for some.
  Using the current collected version is a modelling decision, reported in each row's note;
* agg: ``tp``/``pp`` per replica; the concurrency per replica comes from the benchmark
  concurrency (``_c<N>_``) divided over attention-DP ranks as the row says.
"""

from __future__ import annotations

from collections.abc import Callable

from ..api import Estimator
from ..errors import InfercastError, UnsupportedModelError
from .silicon import SiliconRow

Predictor = Callable[[SiliconRow], tuple[float, float, str]]


class EstimatorCache:
    def __init__(self, systems_path=None, database_mode="SILICON"):
        self.systems_path = systems_path
        self.database_mode = database_mode
        self._cache: dict = {}

    def get(self, row: SiliconRow, tp: int, pp: int) -> Estimator:
        kv = _kv_quant(row)
        key = (row.model, row.system, row.backend, row.gemm_quant, kv, tp, pp)
        hit = self._cache.get(key)
        if isinstance(hit, InfercastError):
            raise hit
        if hit is None:
            try:
                hit = Estimator(
                    row.model, row.system, row.backend, None, tp, pp,
                    gemm_quant=_gemm_quant(row), kv_cache_quant=kv, database_mode=self.database_mode, systems_path=self.systems_path,
                )
            except InfercastError as exc:
                self._cache[key] = exc
                raise
            self._cache[key] = hit
        return hit


def _gemm_quant(row: SiliconRow) -> str | None:
    q = (row.gemm_quant or "").strip().lower()
    return q or None


def _kv_quant(row: SiliconRow) -> str | None:
    """No row says whether the KV cache was fp8. TensorRT-LLM serves NVIDIA's quantised (fp8 /
    nvfp4) checkpoints with their fp8 KV cache by default; vLLM and SGLang keep the model dtype
    (``kv_cache_dtype=auto``) unless the checkpoint says otherwise."""
    if row.backend == "trtllm" and _gemm_quant(row) in ("fp8", "nvfp4", "fp8_block"):
        return "fp8"
    return None


def static_predictor(cache: EstimatorCache) -> Predictor:
    """The single-batch model: TTFT = one prefill of the whole batch, TPOT = mean decode step."""

    def predict(row: SiliconRow):
        if row.mode != "agg":
            raise UnsupportedModelError("disaggregated rows need the serving model", "run without --static")
        w = row.worker
        est = cache.get(row, w.tp, w.pp)
        conc = row.concurrency or w.batch_size
        batch = max(1, round(conc / max(w.attention_dp, 1)))
        ttft = est.prefill_ms(batch, row.isl)
        tpot = est.decode_ms(batch, row.isl, row.osl)
        return ttft, tpot, f"data {est.version} (benchmarked {row.backend_version or '?'})"

    return predict
