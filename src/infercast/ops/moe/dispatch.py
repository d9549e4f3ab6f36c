"""**Dispatch + combine** (:func:`resolve_moe_dispatch`, table ``moe_a2a_perf``, latency converted
to ms by the reader): DeepEP high-throughput kernels for the context phase, low-latency kernels
for generation (:data:`A2A_BACKENDS`); sites ``(hidden, topk, experts)`` at the collected
``ep_size``; dispatch and combine are resolved separately (each transferred through
:func:`infercast.interp.sol.collective`) and summed. Without a table, the ep size or a site
within the gates, the cost falls back to two NCCL all-to-alls (dispatch + combine) with
``message = tokens * topk * hidden`` 16-bit elements each — the per-rank send buffer when every
token's hidden vector goes to each of its ``topk`` experts' ranks (NCCL's ``alltoall``
``message_size`` is the per-rank buffer in elements, of which ``(ep-1)/ep`` leaves the rank).
"""

from __future__ import annotations

import numpy as np

from ...data.quant import WEIGHT_BYTES
from ...errors import InvalidInputError, NotAvailableError
from ...interp import sol
from ...interp.grid import Grid
from ...interp.transfer import choose_sites, transfer_grid
from ..base import DatabaseMode, OpDB, Resolved, sites_and_curves, sol_resolved
from ..comm import resolve_collective
from .query import MOE_QUANTS, MXFP4_ALIAS, PHASE_ALIASES, _check_shape

#: tokens axis of SOL / empirical all-to-all grids (the collected moe_a2a num_tokens span)
A2A_TOKENS_AXIS = 2.0 ** np.arange(0, 17)


#: serving backend -> phase -> moe_a2a comm_backend (DeepEP high-throughput / low-latency)
A2A_BACKENDS = {
    "trtllm": {"context": "trtllm_deepep_ht", "generation": "trtllm_deepep_ll"},
    "vllm": {"context": "deepep_ht", "generation": "deepep_ll"},
    "sglang": {"context": "deepep_ht", "generation": "deepep_ll"},
}


#: MoE quant -> activation dtype the dispatch may send (first choice; bf16 is always the fallback)
A2A_DISPATCH_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "w4afp8": "fp8", "w4a8_mxfp4_mxfp8": "fp8", "nvfp4": "nvfp4"}
A2A_DTYPE_BYTES = {"bfloat16": 2.0, "default": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1.0 / 16, "fp4": 0.5 + 1.0 / 16}
#: NCCL fallback: 16-bit elements (as ops.comm)
NCCL_ELEMENT_BYTES = 2.0


def _a2a_sol_fn(db: OpDB, hidden: int, topk: int, ep: int, dispatch_bytes: float, combine_bytes: float = 2.0, part: str = "both"):
    """SOL of dispatch, combine or both (:func:`infercast.interp.sol.moe_a2a`) over tokens per rank."""
    system = db.system

    def f(tokens):
        elems = np.asarray(tokens, dtype=float) * float(topk) * float(hidden)
        if part == "dispatch":
            return sol.collective(system, "alltoall", elems * dispatch_bytes, ep)[0]
        if part == "combine":
            return sol.collective(system, "alltoall", elems * combine_bytes, ep)[0]
        return sol.moe_a2a(system, tokens, hidden, topk, ep, dispatch_bytes, combine_bytes)[0]

    return f


def _a2a_from_table(db: OpDB, table, comm_backend: str, phase: str, hidden: int, topk: int, experts: int, ep: int, quant: str):
    """(Resolved | None, reason) from moe_a2a; None + reason when it cannot answer."""
    K = table.keys
    m = table.mask(comm_backend=comm_backend) if table.has("comm_backend") else np.zeros(len(table), bool)
    if not m.any():
        return None, f"moe_a2a has no {comm_backend} rows (has {', '.join(table.unique('comm_backend'))})"
    eps = sorted(np.unique(K["ep_size"][m]).tolist())
    m &= K["ep_size"] == ep
    if not m.any():
        return None, f"moe_a2a {comm_backend} has ep_size {eps}, not {ep}"
    if table.has("node_num"):
        nodes = max(1, -(-ep // max(1, db.system.node.gpus_per_node)))
        if (m & (K["node_num"] == nodes)).any():
            m &= K["node_num"] == nodes
        else:
            return None, f"moe_a2a {comm_backend} ep={ep} has node_num {sorted(np.unique(K['node_num'][m]).tolist())}, not {nodes}"
    # comm dtype: the quant's dispatch dtype first, then bf16 / vllm's "default"
    first = A2A_DISPATCH_DTYPE.get(quant, "bfloat16")
    cands = [c for c in dict.fromkeys((first, "bfloat16", "default")) if (m & (K["comm_dtype"] == c)).any()] if table.has("comm_dtype") else [None]
    if not cands:
        return None, f"moe_a2a {comm_backend} has comm_dtype {table.unique('comm_dtype')}"
    query = (hidden, topk, experts)
    best = None
    for c in cands:
        mc = m if c is None else m & (K["comm_dtype"] == c)
        if table.has("sms"):
            sms_vals, counts = np.unique(K["sms"][mc], return_counts=True)
            sms = sms_vals[np.lexsort((sms_vals, -counts))[0]]
            mc = mc & (K["sms"] == sms)
        per_phase = {}
        for ph in ("dispatch", "combine"):
            mp = mc & (K["phase"] == ph)
            per_phase[ph] = sites_and_curves(table, mp, ("hidden_size", "topk", "num_experts"), ("num_tokens",))
        s_d, s_c = per_phase["dispatch"][0], per_phase["combine"][0]
        common = [tuple(r) for r in s_d.tolist() if tuple(r) in {tuple(x) for x in s_c.tolist()}]
        if not common:
            continue
        hit = tuple(float(x) for x in query) in common
        if best is None or (hit and not best[2]):
            best = (c, per_phase, hit, np.asarray(common, float))
        if hit:
            break
    if best is None:
        return None, f"moe_a2a {comm_backend} ep={ep} has no site with both dispatch and combine"
    cdt, per_phase, _, common = best
    choice = choose_sites(query, common)
    if choice is None:
        return None, (f"moe_a2a {comm_backend} sites {[tuple(int(x) for x in r) for r in common]} "
                      f"are beyond the gates of hidden={hidden} topk={topk} experts={experts}")
    dbytes = A2A_DTYPE_BYTES.get(cdt, 2.0)
    grids = {}
    for ph in ("dispatch", "combine"):
        sites_ph, curves_ph = per_phase[ph]
        index = {tuple(r): j for j, r in enumerate(sites_ph.tolist())}

        def site_grid(i, ph=ph, sites_ph=sites_ph, curves_ph=curves_ph, index=index):
            h, k, e = (int(x) for x in common[i])
            (axis,), vals = curves_ph[index[tuple(common[i].tolist())]]
            return Grid((axis,), vals, np.zeros(len(axis), np.int8), _a2a_sol_fn(db, h, k, ep, dbytes, part=ph), scales=("linear",))

        grids[ph] = transfer_grid(choice, site_grid, _a2a_sol_fn(db, hidden, topk, ep, dbytes, part=ph))
    axis = np.unique(np.concatenate([grids["dispatch"].axes[0], grids["combine"].axes[0]]))
    vd, pd = grids["dispatch"](axis)
    vc, pc = grids["combine"](axis)
    total_sol = _a2a_sol_fn(db, hidden, topk, ep, dbytes)
    labels = tuple(f"(hidden={int(common[i][0])}, topk={int(common[i][1])}, experts={int(common[i][2])}) w={w:.2f}"
                   for i, w in zip(choice.indices, choice.weights))
    g = Grid((axis,), vd + vc, np.maximum(pd, pc), total_sol, labels if choice.how != "exact" else (), scales=("linear",))
    notes = (f"{comm_backend} dispatch+combine, comm_dtype={cdt}",)
    return Resolved(g, "moe_a2a", db.served_version("moe_a2a"), comm_backend, choice.how,
                    labels if choice.how != "exact" else (), notes), None


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
    measurements (moe_a2a, else NCCL) in every database mode but SOL; SILICON raises only when
    neither table covers ``ep`` (HYBRID/EMPIRICAL then get the NCCL op's empirical estimate).
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
    nccl_sol = _a2a_sol_fn(db, hidden, topk, ep, NCCL_ELEMENT_BYTES)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved((A2A_TOKENS_AXIS,), nccl_sol, ("linear",),
                            ("dispatch+combine as two all-to-alls of tokens*topk*hidden bf16 elements",))
    try:
        table = db.table_or_none("moe_a2a")
        why = None if table is not None else "no moe_a2a table"
    except NotAvailableError as exc:
        table, why = None, exc.what
    if table is not None:
        res, why = _a2a_from_table(db, table, comm_backend, ph, hidden, topk, experts, ep, quant)
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
