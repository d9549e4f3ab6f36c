"""The measured all-to-all dispatch + combine: the pack's tables read into per-site curves over
tokens per rank, and the query's curve built from them.

Two kinds of table measure the expert-parallel exchange (DeepEP's kernels in both):

* ``moe_a2a`` (TensorRT-LLM and vLLM collectors): a ``comm_backend`` per phase
  (:data:`~infercast.ops.moe.dispatch.A2A_BACKENDS`), a ``comm_dtype``, the group's ``ep_size``
  and ``node_num``, ``sms``; latency per ``phase`` (dispatch / combine) in its own row.
* ``wideep_deepep_normal`` / ``wideep_deepep_ll`` (SGLang's collector; DeepEP's high-throughput
  "normal" kernels, used for prefill, and its low-latency kernels, used for decode): one row per
  point with the dispatch and the combine time as columns (normal: transmit + notify, ll: the
  average time), over ``node_num`` hosts. These tables carry no group size: a host's GPUs
  (``gpus_per_node`` of the system YAML; DeepEP's tests run one rank per GPU of each host), so
  ``node_num`` hosts are an EP group of ``node_num x gpus_per_node``. The normal kernels were
  measured at several SM budgets; DeepEP's default budget (:data:`DEEPEP_DEFAULT_SMS`, the
  ``Buffer.num_sms`` the engines keep) is read where measured. The tables do not record the
  dispatched dtype; the speed of light used to carry them to other shapes assumes bf16.

**Group size.** A table's rows at the query's EP answer it. Otherwise the nearest measured group
size on the same side of the NVLink domain (:attr:`~infercast.data.system.NodeSpec.nvlink_gpus`:
both within one domain, or both spanning domains) within
:data:`~infercast.ops.comm.GROUP_GATE` octaves (the largest below, else the smallest above)
is carried to it through the speed of light of the two all-to-alls
(:func:`infercast.interp.sol.collective`, which prices the bandwidth tier of each group), marked
transferred: a curve measured within one domain never answers a group that spans domains, nor
the reverse. On GB200 / GB300 the NVLink domain is the rack: an EP 8 group is one domain there,
answered from the 4-GPU rows.

**Sites** ``(hidden, topk, experts)``: the query's when measured, else the generic site choice
(:func:`infercast.interp.transfer.choose_sites`) through utilisation, dispatch and combine each on
its own, summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...data.versions import version_key
from ...errors import InfercastError
from ...interp import sol
from ...interp.grid import Grid
from ...interp.provenance import Prov
from ...interp.transfer import choose_sites, transfer_grid
from ..base import OpDB, Resolved, sites_and_curves
from ..comm import GROUP_GATE
from .peers import _other_db

#: MoE quant -> activation dtype the dispatch may send (first choice; bf16 is always the fallback)
A2A_DISPATCH_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "w4afp8": "fp8", "w4a8_mxfp4_mxfp8": "fp8", "nvfp4": "nvfp4"}
A2A_DTYPE_BYTES = {"bfloat16": 2.0, "default": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1.0 / 16, "fp4": 0.5 + 1.0 / 16}
#: SMs DeepEP's high-throughput kernels use unless told otherwise (DeepEP ``Buffer.num_sms``)
DEEPEP_DEFAULT_SMS = 20
#: phase -> the DeepEP table of SGLang's collector and its (dispatch, combine) value columns (ms)
DEEPEP_TABLES = {
    "context": ("wideep_deepep_normal", (("dispatch_transmit_ms", "dispatch_notify_ms"),
                                         ("combine_transmit_ms", "combine_notify_ms"))),
    "generation": ("wideep_deepep_ll", (("dispatch_avg_t_ms",), ("combine_avg_t_ms",))),
}
A2A_SITE_COLS = ("hidden_size", "topk", "num_experts")


def a2a_sol_fn(system, hidden: int, topk: int, ep: int, dispatch_bytes: float, combine_bytes: float = 2.0,
               part: str = "both"):
    """SOL of dispatch, combine or both (:func:`infercast.interp.sol.moe_a2a`) over tokens per rank."""

    def f(tokens):
        elems = np.asarray(tokens, dtype=float) * float(topk) * float(hidden)
        if part == "dispatch":
            return sol.collective(system, "alltoall", elems * dispatch_bytes, ep)[0]
        if part == "combine":
            return sol.collective(system, "alltoall", elems * combine_bytes, ep)[0]
        return sol.moe_a2a(system, tokens, hidden, topk, ep, dispatch_bytes, combine_bytes)[0]

    return f


@dataclass(frozen=True)
class A2AMeasurement:
    """Dispatch and combine curves measured over one group of ``ranks`` GPUs: for each phase,
    (sites (n, 3) hidden/topk/experts, {index: ((tokens axis,), ms)})."""

    source: str  # table stem
    version: str | None
    kernel: str
    ranks: int
    dtype_bytes: float
    dispatch: tuple
    combine: tuple
    notes: tuple[str, ...]


class _Values:
    """Key columns and one measured column as the latency (what :func:`sites_and_curves` reads)."""

    def __init__(self, keys: dict, latency: np.ndarray):
        self.keys, self.latency = keys, latency


def same_side(system, ranks: int, ep: int) -> bool:
    """Whether ``ranks`` and ``ep`` GPUs both fit one NVLink domain or both span domains."""
    return sol.spans_nodes(system, ranks) == sol.spans_nodes(system, ep)


def donor_ranks(system, measured, ep: int) -> int | None:
    """The measured group size to answer ``ep`` from: ``ep`` itself, else among the sizes on the
    same side of the NVLink domain the largest below, else the smallest above, within
    :data:`~infercast.ops.comm.GROUP_GATE` octaves; None when there is none."""
    sizes = sorted({int(r) for r in measured if same_side(system, int(r), ep)})
    if ep in sizes:
        return ep
    below = [r for r in sizes if r < ep]
    donor = below[-1] if below else (sizes[0] if sizes else None)
    if donor is None or abs(np.log2(ep / donor)) > GROUP_GATE:
        return None
    return donor


def from_moe_a2a(db: OpDB, table, comm_backend: str, hidden: int, topk: int, experts: int, ep: int,
                 quant: str) -> tuple[A2AMeasurement | None, str | None]:
    """The ``moe_a2a`` rows of ``comm_backend`` for ``ep``: (measurement, None), or (None, why)."""
    K = table.keys
    m = table.mask(comm_backend=comm_backend) if table.has("comm_backend") else np.zeros(len(table), bool)
    if not m.any():
        return None, f"moe_a2a has no {comm_backend} rows (has {', '.join(table.unique('comm_backend'))})"
    # which side of the NVLink domain a row's group is on follows from its ep_size (donor_ranks);
    # node_num counts hosts, several of which one NVLink domain joins on GB200 / GB300
    eps = sorted(np.unique(K["ep_size"][m]).astype(int).tolist())
    ranks = donor_ranks(db.system, eps, ep)
    if ranks is None:
        every = sorted(np.unique(K["ep_size"][table.mask(comm_backend=comm_backend)]).astype(int).tolist())
        return None, f"moe_a2a {comm_backend} has ep_size {every}, none within reach of {ep}"
    m &= K["ep_size"] == ranks
    # comm dtype: the quant's dispatch dtype first, then bf16 / vllm's "default"
    first = A2A_DISPATCH_DTYPE.get(quant, "bfloat16")
    cands = [c for c in dict.fromkeys((first, "bfloat16", "default")) if (m & (K["comm_dtype"] == c)).any()] if table.has("comm_dtype") else [None]
    if not cands:
        return None, f"moe_a2a {comm_backend} has comm_dtype {table.unique('comm_dtype')}"
    query = (float(hidden), float(topk), float(experts))
    best = None
    for c in cands:
        mc = m if c is None else m & (K["comm_dtype"] == c)
        if table.has("sms"):
            sms_vals, counts = np.unique(K["sms"][mc], return_counts=True)
            sms = sms_vals[np.lexsort((sms_vals, -counts))[0]]
            mc = mc & (K["sms"] == sms)
        per = [sites_and_curves(table, mc & (K["phase"] == ph), A2A_SITE_COLS, ("num_tokens",))
               for ph in ("dispatch", "combine")]
        common = {tuple(r) for r in per[0][0].tolist()} & {tuple(r) for r in per[1][0].tolist()}
        if not common:
            continue
        hit = query in common
        if best is None or (hit and not best[2]):
            best = (c, per, hit)
        if hit:
            break
    if best is None:
        return None, f"moe_a2a {comm_backend} ep={ranks} has no site with both dispatch and combine"
    c, per, _ = best
    return A2AMeasurement("moe_a2a", db.served_version("moe_a2a"), comm_backend, ranks,
                          A2A_DTYPE_BYTES.get(c, 2.0), per[0], per[1],
                          (f"{comm_backend} dispatch+combine, comm_dtype={c}",)), None


def deepep_tables(db: OpDB, stem: str) -> list[tuple[OpDB, object]]:
    """(db, table) of ``stem`` in this backend's data version and every other collected version,
    newest first, one per file: SGLang's multi-host DeepEP rows (``node_num`` 2, 4, 8 on h100 /
    h200) are in 0.5.6.post2, which the newer collections, single-host only, would shadow."""
    out, seen = [], set()
    versions = [db.data.version] + sorted((v for v in db.data.versions.collected if v != db.data.version),
                                          key=version_key, reverse=True)
    for v in versions:
        vdb = db if v == db.data.version else _other_db(db, version=v)
        if vdb is None:
            continue
        try:
            t = vdb.table_or_none(stem)
        except InfercastError:
            continue
        if t is not None and str(t.path) not in seen:
            seen.add(str(t.path))
            out.append((vdb, t))
    return out


def from_deepep(db: OpDB, phase: str, hidden: int, topk: int, experts: int, ep: int) -> tuple[A2AMeasurement | None, str | None]:
    """The DeepEP table of ``phase`` (:data:`DEEPEP_TABLES`) for ``ep``, from the newest collected
    version that measured a usable group size with a site within the gates: (measurement, None),
    or (None, why)."""
    stem, cols = DEEPEP_TABLES[phase]
    tables = deepep_tables(db, stem)
    if not tables:
        return None, f"no {stem} table for {db.backend} on {db.system.name}"
    per_host = db.system.node.gpus_per_node
    query = np.array([[hidden, topk, experts]], float)
    whys = []
    for vdb, t in tables:
        K = t.keys
        ranks_of = K["node_num"].astype(int) * per_host
        ranks = donor_ranks(db.system, np.unique(ranks_of), ep)
        if ranks is None:
            whys.append(f"{stem} {vdb.served_version(stem)} measured {sorted(set(ranks_of.tolist()))} GPUs")
            continue
        m = ranks_of == ranks
        note = ()
        if t.has("dispatch_sms"):
            sms = K["dispatch_sms"][m]
            pick = DEEPEP_DEFAULT_SMS if (sms == DEEPEP_DEFAULT_SMS).any() else np.unique(sms)[-1]
            m &= (K["dispatch_sms"] == pick) & (K["combine_sms"] == pick)
            note = (f"{int(pick)} SMs",)
        renamed = {"hidden_size": K["hidden_size"], "topk": K["num_topk"], "num_experts": K["num_experts"],
                   "num_tokens": K["num_token"]}
        per = []
        for parts in cols:
            lat = sum(t.values[c] for c in parts if c in t.values)
            per.append(sites_and_curves(_Values(renamed, lat), m, A2A_SITE_COLS, ("num_tokens",)))
        common = {tuple(r) for r in per[0][0].tolist()} & {tuple(r) for r in per[1][0].tolist()}
        if not common or choose_sites(query[0], np.asarray(sorted(common), float)) is None:
            whys.append(f"{stem} {vdb.served_version(stem)} has no site within the gates at {ranks} GPUs")
            continue
        hosts = ranks // per_host
        return A2AMeasurement(stem, vdb.served_version(stem), "deepep " + stem.rsplit("_", 1)[-1], ranks, 2.0,
                              per[0], per[1],
                              (f"DeepEP {stem.rsplit('_', 1)[-1]} dispatch+combine ({stem}, node_num={hosts}: "
                               f"{ranks} GPUs as {hosts} x {per_host}-GPU hosts, {', '.join(note) or 'its SMs'})",)), None
    return None, "; ".join(whys)


def a2a_resolved(db: OpDB, meas: A2AMeasurement, hidden: int, topk: int, experts: int, ep: int) -> tuple[Resolved | None, str | None]:
    """The query's dispatch + combine curve from ``meas`` (module docstring): site transfer at the
    measured group size, then the group-size transfer to ``ep``; (None, why) when no measured site
    is within the gates."""
    s_d, s_c = meas.dispatch[0], meas.combine[0]
    common = np.asarray(sorted({tuple(r) for r in s_d.tolist()} & {tuple(r) for r in s_c.tolist()}), float)
    if not len(common):
        return None, f"{meas.source} {meas.kernel} has no site with both dispatch and combine"
    query = (hidden, topk, experts)
    choice = choose_sites(query, common)
    if choice is None:
        return None, (f"{meas.source} {meas.kernel} sites {[tuple(int(x) for x in r) for r in common]} "
                      f"are beyond the gates of hidden={hidden} topk={topk} experts={experts}")
    system, r, b = db.system, meas.ranks, meas.dtype_bytes
    grids = {}
    for ph, (sites_ph, curves_ph) in (("dispatch", meas.dispatch), ("combine", meas.combine)):
        index = {tuple(row): j for j, row in enumerate(sites_ph.tolist())}

        def site_grid(i, ph=ph, curves_ph=curves_ph, index=index):
            h, k, _ = (int(x) for x in common[i])
            (axis,), vals = curves_ph[index[tuple(common[i].tolist())]]
            return Grid((axis,), vals, np.zeros(len(axis), np.int8), a2a_sol_fn(system, h, k, r, b, part=ph),
                        scales=("linear",))

        grids[ph] = transfer_grid(choice, site_grid, a2a_sol_fn(system, hidden, topk, r, b, part=ph))
    axis = np.unique(np.concatenate([grids["dispatch"].axes[0], grids["combine"].axes[0]]))
    vd, pd = grids["dispatch"](axis)
    vc, pc = grids["combine"](axis)
    values, prov = vd + vc, np.maximum(pd, pc)
    total_sol = a2a_sol_fn(system, hidden, topk, ep, b)
    labels = tuple(f"(hidden={int(common[i][0])}, topk={int(common[i][1])}, experts={int(common[i][2])}) w={w:.2f}"
                   for i, w in zip(choice.indices, choice.weights))
    notes = list(meas.notes)
    how = choice.how
    if r != ep:
        measured_sol = a2a_sol_fn(system, hidden, topk, r, b)
        values = values * total_sol(axis) / measured_sol(axis)
        prov = np.maximum(prov, int(Prov.TRANSFERRED)).astype(np.int8)
        how = "ep-transfer" if how == "exact" else f"{how}+ep-transfer"
        notes.append(f"EP{ep} not measured: the {r}-GPU curve carried to {ep} GPUs through the all-to-all speed of "
                     f"light ({'across' if sol.spans_nodes(system, ep) else 'within'} the NVLink domain)")
        labels = labels + (f"ep={r}",)
    g = Grid((axis,), values, prov, total_sol, labels if how != "exact" else (), scales=("linear",))
    return Resolved(g, meas.source, meas.version, meas.kernel, how, labels if how != "exact" else (), tuple(notes)), None
