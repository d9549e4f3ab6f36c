"""Collectives and point-to-point transfers.

All-reduce (the TP reduction after attention and FFN) comes from the backend's
``custom_allreduce`` table for its group size, else from the system's NCCL table; other collectives
from NCCL. A group size neither table measured is transferred through utilisation from the
nearest measured one (:data:`GROUP_GATE`): from the backend's own all-reduce kernel where that
kernel spans the group (:data:`RACK_ALLREDUCE_BACKENDS`), else from NCCL. ``message_size`` in both tables is an element count (16-bit elements here), the curve
axis. P2P (pipeline stage boundaries) has no table in the pack: the engine evaluates it analytically
from the link bandwidth and the system's P2P latency.

**Groups that span nodes** (more GPUs than one NVLink domain, ``NodeSpec.nvlink_gpus``: the node,
or the rack on GB200 / GB300 NVL72) never borrow an intra-node curve (:func:`_cross_node`). In
order: the tables' rows measured over exactly that group; a curve measured over more GPUs than
one domain (a multi-node NCCL measurement) transferred through utilisation within
:data:`GROUP_GATE`; else the hierarchical schedule of :func:`infercast.interp.sol.hierarchical_collective`:
its intra-node stages (reduce-scatter / all-gather / all-to-all over the domain's GPUs) from the
NCCL table measured at that size, its inter-node stage analytic from the system YAML's
``inter_node_bw`` (``inter_rack_bw`` between racks) and ``p2p_latency``
(:func:`infercast.interp.sol.inter_node_stage`; provenance ``analytic``). The pack (0.12.0) has
no NCCL or custom all-reduce rows over more GPUs than one node (num_gpus 2, 4, 8; GB200 / GB300 2,
4; GB300's 8 and 16 are within its rack), so the hierarchical schedule is what answers there. A
group that does not split into whole domains (12 GPUs on 8-GPU nodes) is refused in SILICON
mode (:class:`~infercast.errors.NotAvailableError`).
"""

from __future__ import annotations

from functools import partial
import numpy as np

from ..errors import InvalidConfigError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from .base import DatabaseMode, OpDB, Resolved, choose_kernel, sol_resolved
from .empirical import empirical_resolved

MSG_AXIS = 2.0 ** np.arange(7, 30)
ELEMENT_BYTES = 2.0


def _sol_fn(db: OpDB, op: str, group: int):
    """``f(elements)``: the collective's speed-of-light ms (a partial: picklable)."""
    return partial(_collective_sol, db.system, op, group)


def _collective_sol(system, op: str, group: int, elements):
    return sol.collective(system, op, np.asarray(elements) * ELEMENT_BYTES, group)[0]


def _group_transfer(db: OpDB, table, mask, op: str, donor: int, sol_q) -> Grid:
    """The ``mask`` rows' curve (measured over ``donor`` GPUs) carried to the query's group size
    through utilisation: each point scaled by the two groups' speed-of-light ratio."""
    base = _curve(table, mask, _sol_fn(db, op, donor))
    ax = base.axes[0]
    return Grid((ax,), base.values * sol_q(ax) / base.sol(ax), np.full(len(ax), int(Prov.TRANSFERRED), np.int8), sol_q,
                (f"num_gpus={donor}",))


def _curve(table, mask, sol_q):
    ms = table.keys["message_size"][mask].astype(float)
    lat = table.latency[mask]
    order = np.argsort(ms)
    return Grid((ms[order],), lat[order], np.zeros(len(ms), np.int8), sol_q)


def resolve_collective(db: OpDB, op: str, group: int) -> Resolved:
    """``op`` in all_reduce / all_gather / reduce_scatter / alltoall over ``group`` GPUs."""
    sol_q = _sol_fn(db, op, group)
    if group <= 1:
        raise InvalidConfigError(f"a {op} needs at least 2 GPUs, got {group}")
    if db.mode is DatabaseMode.SOL:
        return sol_resolved((MSG_AXIS,), sol_q)
    tried = []
    if op == "all_reduce":
        t = db.table_or_none("custom_allreduce")
        if t is not None:
            rows = _allreduce_rows(db, t, group)
            if rows is not None:
                m, kernel = rows
                return Resolved(_curve(t, m, sol_q), "custom_allreduce", db.served_version("custom_allreduce"), kernel)
            tried.append(f"custom_allreduce has num_gpus {t.unique('num_gpus')}")
            r = _rack_transfer(db, t, group, sol_q)
            if r is not None:
                return r
    try:
        nt = db.data.comm_library_table() if db.mode is not DatabaseMode.SOL else None
    except NotAvailableError:
        if db.mode is DatabaseMode.SILICON:
            raise
        nt = None
    if nt is not None:
        m = nt.mask(op_name=op, num_gpus=group)
        if nt.has("nccl_dtype"):
            m &= nt.keys["nccl_dtype"] == "half"
        if m.any():
            loc = db.data.served.get("nccl") or db.data.served.get("oneccl")
            return Resolved(_curve(nt, m, sol_q), "nccl", loc.served_by if loc else None, "NCCL")
        tried.append(f"nccl {op} has num_gpus {nt.unique('num_gpus')}")
    if sol.spans_nodes(db.system, group):
        return _cross_node(db, op, group, nt, tried)
    if nt is not None:
        donor = _group_donor(nt, op, group)
        if donor is not None:
            m = nt.mask(op_name=op, num_gpus=donor)
            if nt.has("nccl_dtype"):
                m &= nt.keys["nccl_dtype"] == "half"
            g = _group_transfer(db, nt, m, op, donor, sol_q)
            loc = db.data.served.get("nccl") or db.data.served.get("oneccl")
            _, tier = db.system.node.bandwidth_for_group(group)
            return Resolved(g, "nccl", loc.served_by if loc else None, "NCCL", "group-transfer", (f"num_gpus={donor}",),
                            (f"{op} over {group} GPUs ({tier}) from the measured {donor}-GPU curve through utilisation",))
    if db.mode is DatabaseMode.SILICON:
        raise NotAvailableError(
            f"no measured {op} over {group} GPUs on {db.system.name}",
            "; ".join(tried) or "no comm tables",
        )
    return empirical_resolved("comm", sol_q, (MSG_AXIS,), None)


#: how far (log2 of the group-size ratio) a collective may be transferred from a measured group
#: size; the roofline carries the bandwidth tier (NVLink / rack / network) of the target group
GROUP_GATE = 3.0

#: Backends whose own all-reduce kernel also serves a TP group spanning several nodes of one
#: NVLink rack (TensorRT-LLM's multi-node-NVLink all-reduce on GB200 / GB300 NVL72): such a group,
#: when the backend's ``custom_allreduce`` table stops at the node (GB200: 2 and 4 GPUs), is
#: transferred from that table's largest group rather than from NCCL. The pack's GB300 table,
#: which measured 8 and 16 GPUs, shows the kernel's latency holding across trays (4.4-6.5 us at
#: 8k-128k elements for 4, 8 and 16 GPUs; NCCL on GB200: 11-18 us). See docs/modelling-log.md,
#: 'Rack-wide all-reduce from the backend's kernel'.
RACK_ALLREDUCE_BACKENDS = ("trtllm",)


def _rack_transfer(db: OpDB, table, group: int, sol_q) -> Resolved | None:
    """The backend's all-reduce over ``group`` GPUs of one NVLink rack, transferred through
    utilisation from its largest measured group below (:data:`RACK_ALLREDUCE_BACKENDS`); None
    where that does not apply (another backend, a group beyond the rack, nothing measured)."""
    node = db.system.node
    if db.backend not in RACK_ALLREDUCE_BACKENDS or not node.gpus_per_rack or group > node.gpus_per_rack:
        return None
    sizes = table.keys["num_gpus"][_bf16_rows(table)]
    donor = _donor_size(sizes, group, below_only=True)
    if donor is None:
        return None
    m, kernel = _allreduce_rows(db, table, donor)
    g = _group_transfer(db, table, m, "all_reduce", donor, sol_q)
    return Resolved(g, "custom_allreduce", db.served_version("custom_allreduce"), kernel, "group-transfer",
                    (f"num_gpus={donor}",),
                    ((f"all_reduce over {group} GPUs of one NVLink rack from the backend's measured {donor}-GPU curve "
                      "through utilisation"),))


def _bf16_rows(table) -> np.ndarray:
    """Mask of a ``custom_allreduce`` table's bf16 rows (every row where it has no dtype key)."""
    m = np.ones(len(table.latency), bool)
    if table.has("allreduce_dtype"):
        m &= table.keys["allreduce_dtype"] == "bfloat16"
    return m


def _allreduce_rows(db: OpDB, table, group: int) -> tuple[np.ndarray, str] | None:
    """(mask, kernel) of the backend's preferred all-reduce kernel over ``group`` GPUs in its
    ``custom_allreduce`` table (bf16 rows), or None where it measured no such group."""
    m = _bf16_rows(table) & (table.keys["num_gpus"] == group)
    if not m.any():
        return None
    kernel = choose_kernel(table, db.backend, m)
    return m & (table.keys["kernel_source"] == kernel), kernel


def _donor_size(sizes, group: int, below_only: bool = False) -> int | None:
    """The measured group size to transfer from: the largest below ``group``, else (unless
    ``below_only``) the smallest above, within ``GROUP_GATE``."""
    sizes = sorted({int(x) for x in sizes})
    below = [g for g in sizes if g < group]
    if not below and (below_only or not sizes):
        return None
    donor = below[-1] if below else sizes[0]
    return donor if abs(np.log2(group / donor)) <= GROUP_GATE else None


def _group_donor(table, op: str, group: int) -> int | None:
    """:func:`_donor_size` over the group sizes ``table`` measured for ``op``."""
    m = table.mask(op_name=op)
    return _donor_size(table.keys["num_gpus"][m], group) if m.any() else None


def _nccl_rows(nt, op: str, group: int) -> np.ndarray:
    m = nt.mask(op_name=op, num_gpus=group)
    if nt.has("nccl_dtype"):
        m &= nt.keys["nccl_dtype"] == "half"
    return m


def _cross_node(db: OpDB, op: str, group: int, nt, tried: list[str]) -> Resolved:
    """``op`` over a ``group`` that spans NVLink domains and that no table measured at exactly
    that size (module docstring): a multi-node NCCL curve within :data:`GROUP_GATE`, else the
    hierarchical schedule; SILICON raises :class:`NotAvailableError` naming what is missing when
    neither applies, HYBRID / EMPIRICAL answer empirically from the hierarchical speed of light."""
    system = db.system
    domain = system.node.nvlink_gpus
    sol_q = _sol_fn(db, op, group)
    loc = db.data.served.get("nccl") or db.data.served.get("oneccl")
    version = loc.served_by if loc else None
    if nt is not None:  # a multi-node measurement: only a curve that itself spans domains is a donor
        m = nt.mask(op_name=op)
        sizes = [g for g in nt.keys["num_gpus"][m] if int(g) > domain] if m.any() else []
        donor = _donor_size(sizes, group) if sizes else None
        if donor is not None:
            g = _group_transfer(db, nt, _nccl_rows(nt, op, donor), op, donor, sol_q)
            return Resolved(g, "nccl", version, "NCCL", "group-transfer", (f"num_gpus={donor}",),
                            (f"{op} over {group} GPUs across nodes from the measured {donor}-GPU multi-node curve "
                             "through utilisation",))
    split = sol.node_split(system, group)
    measured = ", ".join(tried) or "no comm tables"
    if split is None:
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(
                f"no measured {op} over {group} GPUs on {system.name}, and {group} GPUs do not split into whole nodes "
                f"of {domain} GPUs for the hierarchical (intra-node + inter-node) model", measured)
        return empirical_resolved("comm", sol_q, (MSG_AXIS,), None)
    d, nodes = split
    stage_ops = {"all_reduce": ("reduce_scatter", "all_gather"), "all_gather": ("all_gather",),
                 "reduce_scatter": ("reduce_scatter",), "alltoall": ("alltoall",)}[op]
    # the intra-node stages' message: the whole message, or (all-to-all) the 1/N that stays in the node
    shrink = float(nodes) if op == "alltoall" else 1.0
    stages = []
    if d > 1:
        for sop in stage_ops:
            try:
                stages.append((sop, resolve_collective(db, sop, d)))
            except NotAvailableError as exc:
                raise NotAvailableError(
                    f"no {op} over {group} GPUs on {system.name}: the hierarchical model ({nodes} nodes x {d} GPUs) "
                    f"needs a measured intra-node {sop} over {d} GPUs", f"{exc.what}" + (f": {exc.why}" if exc.why else ""),
                    exc.available) from None
    if stages:
        axis = np.unique(np.concatenate([r.grid.axes[0] * shrink for _, r in stages]))
    else:
        axis = MSG_AXIS
    inter = sol.inter_node_stage(system, op, axis * ELEMENT_BYTES, group)[0]
    intra = [r.grid(axis / shrink)[0] for _, r in stages]
    if op == "alltoall":
        values = np.maximum(inter, intra[0]) if intra else inter
    else:
        values = inter + sum(intra) if intra else inter
    prov = np.full(len(axis), int(Prov.ANALYTIC), np.int8)
    g = Grid((axis,), values, prov, sol_q, (f"num_gpus={d}",))
    bw, lat, tier = sol.inter_node_link(system)
    key = "inter_rack_bw" if tier == "inter-rack" and system.node.inter_rack_bw else "inter_node_bw"
    parts = " + ".join(f"{sop} over {d} GPUs ({r.source}, {r.how})" for sop, r in stages) or "no intra-node stage"
    inter_what = f"the {nodes - 1}/{nodes} of the buffer bound for other nodes" if op == "alltoall" else f"ring {op} of 1/{d} of the message"
    note = (f"{op} over {group} GPUs spans {nodes} nodes of {d}: hierarchical, intra-node {parts}"
            f"{' in parallel with' if op == 'alltoall' else ' +'} inter-node {inter_what} at {bw / 1e9:g} GB/s per GPU "
            f"({key}) and {lat * 1e6:g} us (analytic, {tier}); no table measured {op} over more than {domain} GPUs")
    src = stages[0][1] if stages else None
    return Resolved(g, src.source if src else "analytic", src.version if src else version,
                    (src.kernel or "NCCL") + " + network (analytic)" if src else "network (analytic)",
                    "hierarchical", (f"num_gpus={d}",), (note,))
