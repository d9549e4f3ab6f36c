"""Serving-model predictor for silicon rows: :mod:`infercast.serving.agg` for aggregated rows,
:mod:`infercast.serving.disagg` for disaggregated rows that carry worker counts."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..serving.agg import serve_agg
from ..serving.backends import scheduler_params
from ..serving.disagg import kv_transfer_ms, solve_disagg
from .predict import EstimatorCache, clients_per_rank
from .silicon import SiliconRow


def serving_predictor(cache: EstimatorCache, params=None):
    def p_for(backend, system=None, spec=None):
        return (params or {}).get(backend) or scheduler_params(backend, system, spec)

    def predict(row: SiliconRow):
        if row.mode == "disagg":
            return _disagg(row)
        w = row.worker
        est = cache.get(row, w)
        per_rank = clients_per_rank(row, est)
        res = serve_agg(est.engine, per_rank, row.isl, row.osl, p_for(row.backend, est.data.system, est.spec), est.memory.capacity_for(per_rank), est.gpus_per_rank)
        return res.ttft_ms, res.tpot_ms, f"data {est.version}; decode batch {res.decode_batch:.0f} ({res.bound})"

    def _disagg(row: SiliconRow):
        if not (row.prefill_workers and row.decode_workers and row.prefill and row.decode):
            raise UnsupportedModelError("disaggregated row without prefill/decode worker counts", "the configuration is not fully specified")
        pe = cache.get(row, row.prefill)
        de = cache.get(row, row.decode)
        node = pe.data.system.node
        transfer = kv_transfer_ms(pe.memory.kv_per_token, row.isl, pe.gpus, node.inter_node_bw, node.p2p_latency_s)
        gpus = row.prefill_workers * pe.gpus + row.decode_workers * de.gpus
        conc = float(row.concurrency)
        res = solve_disagg(
            pe.engine, de.engine, conc, row.isl, row.osl, row.prefill_workers, row.decode_workers,
            de.plan.parallel.attention_dp, row.prefill.batch_size or 1, p_for(row.backend, pe.data.system, pe.spec), p_for(row.backend, de.data.system, de.spec), transfer, gpus,
            prefill_dp=pe.plan.parallel.attention_dp,
        )
        return res.ttft_ms, res.tpot_ms, f"data {pe.version}; decode batch {res.decode_batch:.0f}; prefill util {res.prefill_utilisation:.2f}"

    return predict
