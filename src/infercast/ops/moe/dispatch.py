"""**Dispatch + combine** (:func:`resolve_moe_dispatch`): the expert-parallel all-to-all of one MoE
layer, DeepEP's high-throughput kernels for the context phase and its low-latency kernels for
generation, as a curve over tokens per rank. Sources, in order (each read by
:mod:`infercast.ops.moe.a2a_tables`, which also carries a measured group size to the query's EP):

1. this backend's ``moe_a2a`` table (TensorRT-LLM, vLLM: :data:`A2A_BACKENDS`);
2. this backend's DeepEP tables (``wideep_deepep_normal`` / ``wideep_deepep_ll``, SGLang), in its
   data version or any other collected version (the multi-host rows are in an older one);
3. for a group that spans NVLink domains only: SGLang's DeepEP tables on the same system, for
   another backend whose all-to-all is DeepEP too (every one of :data:`A2A_BACKENDS`): the pack's
   only measurement of the kernels across hosts, noted as such;
4. two NCCL all-to-alls (dispatch + combine) of ``message = tokens * topk * hidden`` 16-bit
   elements each -- the per-rank send buffer when every token's hidden vector goes to each of its
   ``topk`` experts' ranks (NCCL's ``alltoall`` ``message_size`` is the per-rank buffer in
   elements, of which ``(ep-1)/ep`` leaves the rank) -- from :func:`infercast.ops.comm.resolve_collective`,
   which prices a group spanning domains hierarchically (intra-node stage from the NCCL table,
   inter-node stage analytic from the system YAML), with its provenance.

Each answer's notes say which source answered and why the earlier ones did not.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...data.quant import WEIGHT_BYTES
from ...errors import InvalidInputError, NotAvailableError
from ...interp import sol
from ...interp.grid import Grid
from ..base import DatabaseMode, OpDB, Resolved, sol_resolved
from ..comm import resolve_collective
from .a2a_tables import a2a_resolved, a2a_sol_fn, from_deepep, from_moe_a2a
from .peers import _other_db
from .query import MOE_QUANTS, MXFP4_ALIAS, PHASE_ALIASES, _check_shape

#: tokens axis of SOL / empirical all-to-all grids (the collected moe_a2a num_tokens span)
A2A_TOKENS_AXIS = 2.0 ** np.arange(0, 17)


#: serving backend -> phase -> moe_a2a comm_backend (DeepEP high-throughput / low-latency)
A2A_BACKENDS = {
    "trtllm": {"context": "trtllm_deepep_ht", "generation": "trtllm_deepep_ll"},
    "vllm": {"context": "deepep_ht", "generation": "deepep_ll"},
    "sglang": {"context": "deepep_ht", "generation": "deepep_ll"},
}


#: NCCL fallback: 16-bit elements (as ops.comm)
NCCL_ELEMENT_BYTES = 2.0
#: the backend whose collector measured DeepEP across hosts (source 3 of the module docstring)
DEEPEP_PEER_BACKEND = "sglang"


def resolve_moe_dispatch(
    db: OpDB,
    *,
    phase: str,
    hidden: int,
    topk: int,
    experts: int,
    ep: int,
    quant: str,
) -> Resolved | None:
    """All-to-all dispatch + combine per MoE layer (ms) as a curve over tokens per rank.

    ``None`` when ``ep == 1`` (no expert parallelism, nothing to exchange). ``phase`` is
    ``context`` (DeepEP high-throughput) or ``generation`` (low-latency); ``prefill`` / ``decode``
    are accepted as aliases. Like :mod:`infercast.ops.comm`'s collectives, the answer comes from
    measurements (the sources of the module docstring, in order) in every database mode but SOL;
    SILICON raises only when none covers ``ep`` (HYBRID/EMPIRICAL then get the NCCL op's
    empirical estimate).
    """
    hidden, _, topk, experts, _, ep = _check_shape(hidden, 1, topk, experts, 1, ep)
    ph = PHASE_ALIASES.get(str(phase).lower())
    if ph is None:
        raise InvalidInputError(f"unknown phase {phase!r}", available=sorted(PHASE_ALIASES))
    if quant != MXFP4_ALIAS and quant not in WEIGHT_BYTES:
        raise InvalidInputError(f"unknown MoE quant mode {quant!r}", available=[*MOE_QUANTS, MXFP4_ALIAS])
    if ep == 1:
        return None
    backends = A2A_BACKENDS.get(db.backend, A2A_BACKENDS["vllm"])
    comm_backend = backends[ph]
    nccl_sol = a2a_sol_fn(db.system, hidden, topk, ep, NCCL_ELEMENT_BYTES)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved((A2A_TOKENS_AXIS,), nccl_sol, ("linear",),
                            ("dispatch+combine as two all-to-alls of tokens*topk*hidden bf16 elements",))
    res, why = _measured(db, ph, comm_backend, hidden, topk, experts, ep, quant)
    if res is not None:
        return res
    # fallback: two NCCL all-to-alls of tokens*topk*hidden 16-bit elements (dispatch + combine)
    try:
        rc = resolve_collective(db, "alltoall", ep)
    except NotAvailableError as exc:
        raise NotAvailableError(
            f"no measured MoE all-to-all over ep={ep} on {db.system.name} ({db.backend}, {ph})",
            f"{why}; NCCL fallback: {exc.what}" + (f": {exc.why}" if exc.why else ""),
            exc.available,
        ) from None
    kh = float(topk * hidden)
    src = rc.grid
    axis = src.axes[0] / kh
    g = Grid((axis,), 2.0 * src.values, src.prov, nccl_sol, scales=("linear",))
    notes = (
        f"{why}; fallback: NCCL alltoall x2 (dispatch + combine), message = tokens*topk*hidden = tokens*{int(kh)} bf16 elements",
    ) + tuple(rc.notes)
    return Resolved(g, rc.source, rc.version, "NCCL alltoall", rc.how, rc.donors, notes)


def _measured(db: OpDB, ph: str, comm_backend: str, hidden: int, topk: int, experts: int, ep: int,
              quant: str) -> tuple[Resolved | None, str]:
    """Sources 1-3 of the module docstring: (resolved, "") from the first that answers, else
    (None, why none did)."""
    whys = []
    try:
        table = db.table_or_none("moe_a2a")
        if table is None:
            whys.append("no moe_a2a table")
    except NotAvailableError as exc:
        table = None
        whys.append(exc.what)
    if table is not None:
        meas, why = from_moe_a2a(db, table, comm_backend, hidden, topk, experts, ep, quant)
        res, why = a2a_resolved(db, meas, hidden, topk, experts, ep) if meas is not None else (None, why)
        if res is not None:
            return res, ""
        whys.append(why)
    meas, why = from_deepep(db, ph, hidden, topk, experts, ep)
    res, why = a2a_resolved(db, meas, hidden, topk, experts, ep) if meas is not None else (None, why)
    if res is not None:
        return res, ""
    whys.append(why)
    if sol.spans_nodes(db.system, ep) and db.backend != DEEPEP_PEER_BACKEND:
        pdb = _other_db(db, backend=DEEPEP_PEER_BACKEND)
        if pdb is not None:
            meas, why = from_deepep(pdb, ph, hidden, topk, experts, ep)
            res, why = a2a_resolved(pdb, meas, hidden, topk, experts, ep) if meas is not None else (None, why)
            if res is not None:
                note = (f"{db.backend} has no measurement of its DeepEP all-to-all across hosts ({'; '.join(whys)}): "
                        f"{DEEPEP_PEER_BACKEND}'s collector's measurement of the DeepEP kernels serves")
                return replace(res, notes=(*res.notes, note)), ""
            whys.append(f"{DEEPEP_PEER_BACKEND}: {why}")
    return None, "; ".join(w for w in whys if w)
