"""SGLang's wide expert parallelism (DeepEP): the expert block from the ``wideep_*_moe`` tables,
at collected EPs, between two collected EPs, and in a quant mode the tables lack."""

from __future__ import annotations

import numpy as np

from ...errors import InfercastError
from ...interp.grid import Grid
from ...interp.provenance import Prov
from ..base import DatabaseMode, OpDB, Resolved
from .query import MOE_QUANTS, TOKEN_SCALE, moe_sol_fn, quant_candidates
from .tables import _get_lattice, _site_grid, _site_label
from .transfer import _fixed_plus_split

#: Wide expert parallelism. SGLang serves attention data parallelism with EP through DeepEP and
#: DeepGEMM's grouped kernels (``--moe-a2a-backend deepep``), whose expert block the pack measures
#: separately (``wideep_generation_moe_perf``, DeepSeek-V3 shape, EP 2-256, 1-128 tokens per rank).
#: At small per-rank batches it matches the standard table (EP32, 32 tokens: 81 us in both on
#: b200); as tokens grow the standard FlashInfer/Triton rows climb far faster (EP32, 4096 tokens:
#: 878 us vs 157 us; the expert FLOPs are ~20 us of fp8 peak per GPU; see docs/modelling-log.md,
#: 'SGLang wide EP'). A layout with attention DP > 1 and EP > 1 on these
#: backends whose exact site and (moe_tp, moe_ep) pair the wide-EP table holds -- or an EP between
#: two it collected at that site (:func:`_wide_ep_between_pairs`) -- is a wide-EP
#: deployment (``Estimator`` sets ``ParallelConfig.moe_comm = "alltoall"``): its experts read the
#: wide-EP table (past its last token count the edge rule applies) and its tokens travel by
#: all-to-all dispatch/combine (``moe_dispatch``) instead of all-gather + reduce-scatter. Other
#: layouts (EP8 and small attention-DP groups, other shapes) keep the standard path.
#:
#: The wide-EP table is collected in fp8_block only, while SGLang runs NVFP4 DeepSeek checkpoints
#: wide-EP on Blackwell too (DeepEP dispatch, FP4 grouped experts). Such a query is served from the
#: fp8_block site **through the speed-of-light ratio** at each token count, SOL_nvfp4 / SOL_fp8_block
#: (0.57-0.61 at the DeepSeek-V3 site on b200/gb200/gb300: 0.56x the weight bytes, half the math,
#: the same fixed latency), the utilisation-transfer rule applied across quant modes of one expert
#: block (:data:`WIDE_EP_DONOR_QUANTS`). The standard tables back it where both modes were
#: collected: SGLang's nvfp4 / fp8_block latency ratio at that site, EP 8/16/32, 1-256 tokens is
#: 0.48-0.58 on b200, gb200 and gb300 alike (beyond 512 tokens the standard fp8_block kernel falls
#: to 0.26, a kernel the DeepEP path does not run). See docs/modelling-log.md, 'SGLang wide EP'.
WIDE_EP_TABLE = "wideep_generation_moe"
#: The context (prefill) phase runs DeepEP's high-throughput mode, whose expert block the pack
#: measures in its own table (``wideep_context_moe_perf``: the same shape and pairs, 32 to 524,288
#: tokens over the EP group). The two differ by 2-3x where both are measured: gb300 EP4 at 512
#: tokens 0.46 ms (generation) against 0.81 ms (context); past the generation table's last count
#: (512 tokens at EP4) its held utilisation put a 4,096-token prefill block at ~0.5 ms where the
#: context table measures 1.35 ms. A compiled engine reads the context table for steps that carry
#: prompt tokens and the generation table for decode-only steps (SGLang runs DeepEP's ``auto``
#: mode: normal kernels for extend batches, low-latency ones for decode batches); a pair or site
#: the context table lacks falls back to the generation table, with a note.
WIDE_EP_CONTEXT_TABLE = "wideep_context_moe"
WIDE_EP_TABLES = {"context": WIDE_EP_CONTEXT_TABLE, "generation": WIDE_EP_TABLE}
WIDE_EP_BACKENDS = ("sglang",)
#: quant modes of the wide-EP table that serve another mode's query through the SOL ratio
WIDE_EP_DONOR_QUANTS = ("fp8_block",)


def wide_ep_available(db: OpDB, *, quant: str, hidden: int, inter: int, topk: int, experts: int, moe_tp: int,
                      moe_ep: int, gated: bool, distribution: str) -> bool:
    """Whether the wide-EP table holds this expert block at this (moe_tp, moe_ep): the deployments
    that run the DeepEP path (its expert kernel and its all-to-all dispatch)."""
    if db.mode is DatabaseMode.SOL or db.backend not in WIDE_EP_BACKENDS:
        return False
    try:
        return _resolve_wide_ep(db, quant, (hidden, inter, topk, experts, moe_tp, moe_ep), bool(gated), distribution) is not None
    except InfercastError:
        return False


def _resolve_wide_ep(db: OpDB, quant: str, query: tuple, gated: bool, distribution: str,
                     table: str = WIDE_EP_TABLE) -> Resolved | None:
    r = _resolve_wide_ep_pair(db, quant, query, gated, distribution, table)
    return r if r is not None else _wide_ep_between_pairs(db, quant, query, gated, distribution, table)


def _wide_ep_collected_eps(db: OpDB, gated: bool, distribution: str, table: str, site: tuple, moe_tp: int) -> list[int]:
    eps: set[int] = set()
    for q in MOE_QUANTS:
        lat = _get_lattice(db, q, gated, distribution, table)
        if lat is None:
            continue
        hit = np.all(lat.sites[:, :4] == np.asarray(site, float), axis=1) & (lat.sites[:, 4] == moe_tp)
        eps.update(int(e) for e in lat.sites[hit, 5])
    return sorted(eps)


def _wide_ep_between_pairs(db: OpDB, quant: str, query: tuple, gated: bool, distribution: str,
                           table: str) -> Resolved | None:
    """An EP the wide-EP table skipped between two it collected at the same site and moe_tp:
    latency split into a part fixed in EP and a part that shrinks as ``1 / EP``, through the two
    (:func:`_fixed_plus_split`), at each token count both curves cover, marked transferred; None
    without a collected EP on both sides. Chosen over interpolating utilisation in log2(EP) by
    leave-one-out over the SGLang wide-EP tables. The b200 / b300 / gb200 / gb300 tables hold EP
    2, 4, 16, 32, ... but not EP8 (the Hopper ones do), where SGLang's DP8 x EP8 prefill and decode
    workers run DeepEP. See docs/modelling-log.md, 'SGLang wide EP between collected EPs'."""
    site, tp, ep = tuple(query[:4]), int(query[4]), int(query[5])
    eps = _wide_ep_collected_eps(db, gated, distribution, table, site, tp)
    lo = max((e for e in eps if e < ep), default=None)
    hi = min((e for e in eps if e > ep), default=None)
    if lo is None or hi is None:
        return None
    rl = _resolve_wide_ep_pair(db, quant, (*site, tp, lo), gated, distribution, table)
    rh = _resolve_wide_ep_pair(db, quant, (*site, tp, hi), gated, distribution, table)
    if rl is None or rh is None:
        return None
    sol_q = moe_sol_fn(db, quant, *site, tp, ep, gated)
    g = _fixed_plus_split(rl.grid, float(lo), rh.grid, float(hi), float(ep), sol_q)
    if g is None:
        return None
    note = (f"wide-EP expert block (DeepEP, {table}) for attention DP x EP{ep}: EP{ep} not collected at this site; "
            f"latency split into a fixed and a 1/EP part through EP{lo} and EP{hi}")
    return Resolved(g, table, db.served_version(table), rl.kernel, "ep-transfer", (f"EP{lo}", f"EP{hi}"),
                    rl.notes + (note,))


def _resolve_wide_ep_pair(db: OpDB, quant: str, query: tuple, gated: bool, distribution: str,
                          table: str = WIDE_EP_TABLE) -> Resolved | None:
    for c in quant_candidates(db.system, quant):
        lat = _get_lattice(db, c, gated, distribution, table)
        if lat is None:
            continue
        hit = np.flatnonzero(np.all(lat.sites == np.asarray(query, float), axis=1))
        if len(hit):
            g = _site_grid(db, lat, int(hit[0]), gated)
            note = f"wide-EP expert block (DeepEP, {table}) for attention DP x EP{int(query[5])}"
            return Resolved(g, table, db.served_version(table), lat.kernel, "exact", (), lat.notes + (note,))
    return _wide_ep_quant_transfer(db, quant, query, gated, distribution, table)


def _wide_ep_quant_transfer(db: OpDB, quant: str, query: tuple, gated: bool, distribution: str,
                            table: str = WIDE_EP_TABLE) -> Resolved | None:
    """The wide-EP expert block in a quant mode the table lacks, from a donor mode's curve at the
    same site and pair scaled by the speed-of-light ratio at each token count (see
    :data:`WIDE_EP_DONOR_QUANTS`); None when no donor has the site or the GPU lacks the tensor
    cores for the query's mode."""
    for c in quant_candidates(db.system, quant):
        if c in WIDE_EP_DONOR_QUANTS:
            continue
        sol_c = moe_sol_fn(db, c, *query, gated)
        try:
            sol_c(1.0)
        except InfercastError:
            continue  # no tensor cores for this mode here: the standard path reports it
        for d in WIDE_EP_DONOR_QUANTS:
            lat = _get_lattice(db, d, gated, distribution, table)
            if lat is None:
                continue
            hit = np.flatnonzero(np.all(lat.sites == np.asarray(query, float), axis=1))
            if not len(hit):
                continue
            donor = _site_grid(db, lat, int(hit[0]), gated)
            (axis,) = donor.axes
            ratio = np.asarray(sol_c(axis), float) / np.asarray(moe_sol_fn(db, d, *query, gated)(axis), float)
            g = Grid((axis,), donor.values * ratio, np.full(len(axis), Prov.TRANSFERRED, np.int8), sol_c,
                     scales=TOKEN_SCALE)
            note = (f"wide-EP expert block (DeepEP, {table}) for attention DP x EP{int(query[5])}: "
                    f"no {c} rows; the {d} curve at this site x SOL({c}) / SOL({d}) "
                    f"({ratio.min():.2f}-{ratio.max():.2f})")
            return Resolved(g, table, db.served_version(table), lat.kernel, "quant-transfer",
                            (f"{d} {_site_label(lat.sites[int(hit[0])])}",), lat.notes + (note,))
    return None
