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

    def get(self, row: SiliconRow, w) -> Estimator:
        """The estimator for a row's model/system/backend and one worker's parallelism ``w``."""
        kv = _kv_quant(row)
        moe_q = _quant(row.moe_quant)
        key = (row.model, row.system, row.backend, row.gemm_quant, moe_q, kv, w.tp, w.pp, w.attention_dp, w.moe_tp, w.moe_ep)
        hit = self._cache.get(key)
        if isinstance(hit, InfercastError):
            raise hit
        if hit is None:
            try:
                moe_tp, moe_ep = _moe_layout(w)
                hit = Estimator(
                    row.model, row.system, row.backend, None, w.tp, w.pp,
                    attention_dp=w.attention_dp, moe_tp=moe_tp, moe_ep=moe_ep,
                    gemm_quant=_gemm_quant(row), moe_quant=moe_q, kv_cache_quant=kv,
                    database_mode=self.database_mode, systems_path=self.systems_path,
                )
            except InfercastError as exc:
                self._cache[key] = exc
                raise
            self._cache[key] = hit
        return hit


def _moe_layout(w) -> tuple[int | None, int | None]:
    """The row's (moe_tp, moe_ep), or None to derive them, when they do not span the replica.

    Rows leave MoE sizes empty for dense models and sometimes for MoE ones; the width rule
    (moe_tp x moe_ep == tp x attention_dp) then decides: keep moe_ep when it divides the width
    and derive moe_tp."""
    width = w.tp * w.attention_dp
    if w.moe_tp * w.moe_ep == width:
        return (None if w.moe_ep == 1 and w.moe_tp == width else w.moe_tp), (None if w.moe_ep == 1 else w.moe_ep)
    if w.moe_ep > 1 and width % w.moe_ep == 0:
        return None, w.moe_ep
    return None, None


def _quant(q: str | None) -> str | None:
    q = (q or "").strip().lower()
    return q or None


def _gemm_quant(row: SiliconRow) -> str | None:
    return _quant(row.gemm_quant)


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
        est = cache.get(row, w)
        conc = row.concurrency or w.batch_size
        batch = max(1, round(conc / max(w.attention_dp, 1)))
        ttft = est.prefill_ms(batch, row.isl)
        tpot = est.decode_ms(batch, row.isl, row.osl)
        return ttft, tpot, f"data {est.version} (benchmarked {row.backend_version or '?'})"

    return predict
