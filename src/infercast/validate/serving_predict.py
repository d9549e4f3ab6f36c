"""Serving-model predictor for silicon rows: :func:`infercast.serving.sim.simulate`."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..serving.backends import scheduler_params
from ..serving.agg import serve_agg
from .predict import EstimatorCache
from .silicon import SiliconRow


def serving_predictor(cache: EstimatorCache, params=None):
    def predict(row: SiliconRow):
        if row.mode != "agg":
            raise UnsupportedModelError("disaggregated serving is not modelled yet")
        w = row.worker
        est = cache.get(row, w)
        conc = float(row.concurrency or w.batch_size)
        per_replica = max(1, round(conc / max(w.attention_dp, 1)))
        p = (params or {}).get(row.backend) or scheduler_params(row.backend)
        res = serve_agg(est.engine, per_replica, row.isl, row.osl, p, est.memory.kv_capacity_tokens, est.gpus)
        return res.ttft_ms, res.tpot_ms, f"data {est.version}; decode batch {res.decode_batch:.0f} ({res.bound})"

    return predict
