"""Mixture of experts: the routed-expert grouped GEMM block, resolved from the tables read by the
other modules of this package (the all-to-all is :mod:`infercast.ops.moe.dispatch`).

**Expert block** (:func:`resolve_moe`, table ``moe_perf``). One row = gate/up GEMM + activation +
down GEMM over the local experts of one rank of a ``moe_tp x moe_ep`` group, for ``num_tokens``
tokens entering the block on that rank before dispatch (the caller passes tokens x attention-DP
when the ranks gather). Sites are the model tuple ``(hidden, inter, topk, experts)`` at a fixed
``(moe_tp, moe_ep)``; the curve axis is ``num_tokens``. Rules, each backed by the pack:

* **quant** = the table's ``moe_dtype`` (bfloat16, fp8, fp8_block, nvfp4, w4a16_mxfp4,
  w4a8_mxfp4_mxfp8, int4_wo, w4afp8). ``"mxfp4"`` is an alias: on a GPU with FP4 tensor cores
  (an ``fp4`` FLOPS entry in the system YAML; sm >= 100 in this pack) it means
  ``w4a8_mxfp4_mxfp8`` (TensorRT-LLM / SGLang run MXFP4 experts with MXFP8 activations there),
  otherwise ``w4a16_mxfp4`` (Hopper, Ada, Xe: weight-only MXFP4, bf16 math). The other form is the
  fallback when the preferred one lacks the query's site: rtx_pro_6000_server has only
  ``w4a8_mxfp4_mxfp8`` under trtllm but only ``w4a16_mxfp4`` under vllm/sglang, and b200 vllm has
  ``w4a8_mxfp4_mxfp8`` only for (4096, 2048, 6, 256)/(7168, 3072, 6, 384), not gpt-oss
  (2880, 2880, 4, 128), which it has as ``w4a16_mxfp4``. The choice is recorded in the notes.
  When the preferred form lacks the query's exact site and pair in this backend's table but
  another backend's table on the same system has it there, and the two tables agree within
  ``data.database.PEER_AGREEMENT`` (median over shared token counts) on the fallback form at that
  same site and pair, the engines run the same kernels and the peer's rows of the preferred form
  serve (:func:`_peer_preferred`, noted). b200: vLLM's and SGLang's gpt-oss ``w4a16_mxfp4`` rows
  agree (both FlashInfer TRT-LLM MoE), SGLang's ``w4a8_mxfp4_mxfp8`` rows serve vLLM, whose
  gpt-oss recipe for Blackwell enables MXFP8 activations (``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8``).
  An explicit quant mode is never swapped. See docs/modelling-log.md, 'MoE preferred quant form
  from a peer table'.
* **kernel**: TensorRT-LLM splits non-gated (relu^2, Nemotron) experts into kernels named
  ``*nongated*`` (``moe_torch_flow_nongated``); ``gated=True`` excludes them, ``gated=False``
  keeps only them. Where the quant mode has no such kernel (every vLLM / SGLang table: their
  Nemotron shapes are collected with the engine's one MoE kernel) the flag does not filter. If the
  requested class is empty the other class's rows are used and utilisation is carried across
  through the gated/non-gated speed of light (noted). Among the remaining kernels,
  :func:`~infercast.ops.base.merge_kernels` (default = most rows, others fill shapes it lacks).
* **distribution**: the requested routing skew; if absent, ``balanced``; if that is absent too
  (a100 trtllm/vllm, b60 collect only power-law routing), the least skewed power law. Noted.
* **(moe_tp, moe_ep)**: a pair not collected for the site whose moe_tp is one octave beyond two
  collected at the same moe_ep (vLLM's tables stop at moe_tp 4 with EP 1, where TP 8 serves)
  continues the last collected octave of moe_tp: latency is split as ``a + b / moe_tp`` through the
  two collected curves at each token count (:func:`_tp_trend`, :func:`_fixed_plus_split`); otherwise it is
  transferred through utilisation from a collected pair of the *same width* (moe_tp x moe_ep: the
  same GPUs and the same expert FLOPs per GPU under balanced routing; the roofline carries the
  difference in weight traffic), preferring the closest moe_tp; with neither SILICON raises
  :class:`~infercast.errors.NotAvailableError` listing the collected pairs (HYBRID answers
  empirically). The share of latency that does not shrink as the experts are split grows with
  moe_tp, which a constant utilisation trend misses and the ``a + b / moe_tp`` split carries; the
  split was chosen over the same-width donor and the utilisation trend by leave-one-out (see
  docs/modelling-log.md, 'MoE uncollected moe_tp').
* **off-site shapes** come from another engine's measurement of the shape where the engines run
  the same kernels at a steady ratio (rule 5 below); otherwise they transfer through utilisation
  (:mod:`infercast.interp.transfer`) among the sites collected at the same ``(moe_tp, moe_ep)``,
  with :func:`infercast.interp.sol.moe` as the speed of light, by MoE-specific rules
  (:func:`choose_donors`, :func:`transfer_sites`):

  1. **donors from the default kernel**: donors are chosen (log2 ``(hidden, inter, topk,
     experts)``, the generic gates) among the sites whose curves come from the default kernel
     (the kernel an uncollected shape is assumed to run), and among all sites only when none of
     those is within the gates. b200 SGLang's bf16/fp8_block tables mix FlashInfer-TRT-LLM sites
     with Triton ones (slower at the same shape), a mix no shape distance can see;
  2. **fixed cost in the roofline**: a MoE call pays a shape-independent cost (routing, token
     permutation, the block's several kernel launches: the 15-40 us floors of the tables) that a
     per-shape roofline does not scale with. Utilisation is carried as
     ``u = (SOL + c) / latency`` and answered as ``(SOL(query) + c) / u``, with ``c`` =
     :data:`FIXED_COST_FRACTION` (0.5) x the lowest latency measured at the pair (that floor is
     the fixed cost plus the smallest site's weight traffic; 0.5 chosen by leave-one-out); the grid
     keeps the plain SOL for holding beyond the tokens range;
  3. **equal expert rows**: a donor's utilisation is read at the same rows per expert (the grouped
     GEMMs' ``m`` = ``num_tokens x topk / experts``), not the same ``num_tokens``: a donor with
     twice the query's ``topk/experts`` is read at half the tokens.

  Rules 1-3 were chosen by leave-one-out over every collected site (see docs/modelling-log.md,
  'MoE off-site transfer rules'); what remains is mostly per-site offsets that no neighbour shows
  and, on b200 SGLang, Triton sites predicted from FlashInfer donors.

  4. **consistent donors** (:func:`consistent_moe_donors`): donors whose utilisation, read as rules
     2 and 3 blend it, differs by more than :data:`CONSISTENT_UTIL_FACTOR` (1.5x; median of the
     log ratio over the tokens axis) are not blended together; the heaviest pairwise-agreeing
     subset is kept and renormalised (:func:`infercast.interp.transfer.consistent_subset`, as
     generation attention uses it). A donor 1.5x off its neighbours is a site offset or another
     kernel, which averaging only spreads. See docs/modelling-log.md, 'MoE consistent donors'
     (with the variants tried and rejected: per-donor fixed cost, a dense-GEMM efficiency
     correction, donors from every pair).

  5. **another engine's measurement** (:func:`peer_curve`, :func:`best_peer_curve`; tried before
     rules 1-4): when the shape is not in this engine's table at any pair but another serving
     backend's current table on the same GPU measured it at the query's (moe_tp, moe_ep), in the
     same quant mode, routing and activation class, with the kernel family this table's default
     kernel belongs to (:func:`kernel_family`: the engines ship the same FlashInfer
     TensorRT-LLM-gen or CUTLASS kernels), the answer is the peer's curve x this engine's
     latency ratio to it, median per token count over the shapes both measured at that pair
     with that family. Only when that ratio is steady: at least :data:`PEER_MIN_SITES` shared
     shapes, and the median absolute deviation of their log ratios (median over token counts) at
     most :data:`PEER_RATIO_SPREAD`; the steadiest peer wins. Why: engines that ship the same
     TensorRT-LLM-gen kernels measure the same shapes at a steady ratio, while each engine tunes its
     own Triton configurations and CUTLASS differs from TensorRT-LLM-gen altogether: the family
     gate turns the latter away, the spread gate the Triton pairs whose ratio wanders. For a
     collected shape at an uncollected pair the ``a + b / moe_tp`` split through the engine's own
     curves answers first. See docs/modelling-log.md, 'MoE shapes from another engine's
     measurement'.

  **What b200 still misses.** The b200 SGLang bf16 and fp8_block tables mix kernels per shape:
  7 of 17 bf16 shapes and 6 of 17 fp8_block shapes are Triton (``sglang_fused_moe_triton``) at
  every pair, the rest FlashInfer-TRT-LLM. The kernel is not a function of the shape:
  (4096, 2048, 8, 256) runs Triton beside FlashInfer (3072, 1024, 8, 256) and (6144, 2048, 8, 256),
  and (5120, 8192, 1, 16 | 128) runs Triton in bf16 but FlashInfer in fp8_block. An uncollected
  shape faces the same question and gets the default kernel's answer; no shape rule in the pack
  tells which kernel SGLang would pick. See docs/modelling-log.md, 'MoE transfer on b200 SGLang'.
* beyond the collected ``num_tokens`` range (1...16384 in most files) the grid holds the boundary
  utilisation (SOL ratio).

**TensorRT-LLM NVFP4 at small batch.** TensorRT-LLM's b200 ``moe_perf`` rows for DeepSeek's shape
(7168, 2048, 8, 256) at nvfp4, TP 8, come from two kernels: CUTLASS (61 / 85 / 120 / 154 us at
1 / 4 / 8 / 16 tokens) and a low-latency kernel (20 / 32 / 43 / 60 us), the latter as fast as
SGLang's and vLLM's TensorRT-LLM-gen tables (19-23 / 31-33 / 45-48 / 63-64 us). Up to
:data:`TRTLLM_LOW_LATENCY_MAX_TOKENS` tokens per rank the low-latency rows are used (:func:`_prefer_low_latency`). fp8_block shows the same gap
(DeepGEMM 98-220 us vs 35-103 us in SGLang's table) but has no second TensorRT-LLM kernel in the
pack, so its collected table stays. See docs/modelling-log.md, 'TensorRT-LLM MoE at small batch'.

The ``num_tokens`` axis interpolates **linearly** (:data:`TOKEN_SCALE`), chosen by leave-one-out over
the balanced ``moe_perf`` curves (see docs/modelling-log.md, 'MoE tokens axis').
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import InvalidInputError, NotAvailableError
from ...interp.grid import Grid
from ...interp.provenance import Prov
from ...interp.transfer import SiteChoice, transfer_grid
from ..base import DatabaseMode, OpDB, Resolved, sol_resolved
from ..empirical import empirical_resolved
from .kernels import MOE_KERNELS
from .peers import _kernel_db, _peer_preferred, _peer_site
from .query import (DEFAULT_DISTRIBUTION, MXFP4_ALIAS, PHASE_ALIASES, TOKEN_SCALE, TOKENS_AXIS, _check_shape,
                    has_fp4_hardware, moe_sol_fn, quant_candidates)
from .tables import _get_lattice, _Lattice, _pairs_str, _site_grid, _site_label
from .transfer import _pair_donor, _tp_trend, choose_donors, consistent_moe_donors, fixed_cost, transfer_sites
from .wide_ep import WIDE_EP_TABLE, WIDE_EP_TABLES, _resolve_wide_ep

def _score(lat: _Lattice | None, query: tuple, tp: int, ep: int) -> int:
    if lat is None or len(lat.sites) == 0:
        return 0
    site_hit = np.all(lat.sites[:, :4] == np.asarray(query, float), axis=1)
    pair_hit = (lat.sites[:, 4] == tp) & (lat.sites[:, 5] == ep)
    if (site_hit & pair_hit).any():
        return 3
    if site_hit.any():
        return 2
    return 1


def resolve_moe(
    db: OpDB,
    *,
    quant: str,
    hidden: int,
    inter: int,
    topk: int,
    experts: int,
    moe_tp: int,
    moe_ep: int,
    distribution: str = DEFAULT_DISTRIBUTION,
    gated: bool = True,
    wide_ep: bool = False,
    kernel: str | None = None,
    phase: str = "generation",
) -> Resolved:
    """Compile the routed-expert block's ``num_tokens`` curve (ms per MoE layer on one rank).
    ``wide_ep``: attention data parallelism with EP on a backend that serves it through DeepEP
    (see ``WIDE_EP_TABLE``), in ``phase`` (``context`` or ``generation``; ``prefill`` / ``decode``
    are aliases), whose DeepEP mode has its own table (:data:`WIDE_EP_TABLES`); the standard
    tables do not depend on the phase. ``kernel``: the kernel family the engine runs (:data:`MOE_KERNELS`),
    from this backend's table or, when it did not measure that family, another backend's on the
    same system (noted); None: the table's own kernels (module docstring)."""
    hidden, inter, topk, experts, moe_tp, moe_ep = _check_shape(hidden, inter, topk, experts, moe_tp, moe_ep)
    gated = bool(gated)
    candidates = quant_candidates(db.system, quant)
    query = (hidden, inter, topk, experts)
    notes: list[str] = []
    if kernel is not None and kernel not in MOE_KERNELS:
        raise InvalidInputError(f"unknown MoE kernel family {kernel!r}", "known: " + ", ".join(MOE_KERNELS))
    ph = PHASE_ALIASES.get(str(phase).lower())
    if ph is None:
        raise InvalidInputError(f"unknown phase {phase!r}", available=sorted(PHASE_ALIASES))
    if wide_ep and db.mode is not DatabaseMode.SOL and not any(db.data.has_table(t) for t in WIDE_EP_TABLES.values()):
        # the all-to-all path on an engine whose wide-EP expert kernels the pack does not measure
        notes.append(f"no wide-EP expert tables for {db.backend} {db.data.version} on {db.system.name} "
                     f"({', '.join(WIDE_EP_TABLES.values())}); standard MoE kernels")
        wide_ep = False
    if wide_ep and db.mode is not DatabaseMode.SOL:
        table = WIDE_EP_TABLES[ph]
        try:
            r = _resolve_wide_ep(db, quant, (*query, moe_tp, moe_ep), gated, distribution, table)
        except NotAvailableError:
            if table == WIDE_EP_TABLE:
                raise
            r = None  # no context table for this backend and version: the generation one below
        if r is None and table != WIDE_EP_TABLE:
            r = _resolve_wide_ep(db, quant, (*query, moe_tp, moe_ep), gated, distribution, WIDE_EP_TABLE)
            if r is not None:
                why = f"no {table} rows for this shape and EP{moe_ep}: the {ph} phase reads {WIDE_EP_TABLE}"
                return replace(r, notes=(*r.notes, why))
        if r is not None:
            return r
        notes.append(f"no wide-EP ({WIDE_EP_TABLE}) data for this shape and EP{moe_ep}; standard MoE kernels")
    elif kernel is not None and db.mode is not DatabaseMode.SOL:
        kdb = _kernel_db(db, candidates, kernel, gated, distribution)
        if kdb is None:
            if db.mode is DatabaseMode.SILICON:
                have = sorted({k for k in MOE_KERNELS if _kernel_db(db, candidates, k, gated, distribution) is not None})
                raise NotAvailableError(f"no {candidates[0]} MoE rows of the {kernel} kernels on {db.system.name}",
                                        "no serving backend's moe table measured them; kernel families measured "
                                        f"in {candidates[0]} here", have)
            notes.append(f"no {candidates[0]} {kernel} MoE rows on {db.system.name}; the table's own kernels")
            kernel = None
        elif kdb is not db:
            notes.append(f"{kernel} MoE kernels from {kdb.backend} {kdb.data.version}'s moe table "
                         f"({db.backend} {db.data.version}'s has none in {candidates[0]})")
            db = kdb

    q = candidates[0]
    lat = None
    if db.mode is not DatabaseMode.SOL:
        lats = [(c, _get_lattice(db, c, gated, distribution, kernel=kernel)) for c in candidates]
        scored = [(_score(lt, query, moe_tp, moe_ep), -i, c, lt) for i, (c, lt) in enumerate(lats)]
        best = max(scored, key=lambda s: (s[0], s[1]))
        if best[0] > 0:
            q, lat = best[2], best[3]
        peer = None
        if q != candidates[0] and lat is not None and kernel is None:
            peer = _peer_preferred(db, candidates[0], q, lat, query, moe_tp, moe_ep, gated, distribution)
        if quant == MXFP4_ALIAS:
            lacks = "" if q == candidates[0] else "; preferred " + candidates[0] + " lacks this site"
            notes.append(
                f"mxfp4 -> {candidates[0] if peer else q} "
                f"({'FP4 tensor cores' if has_fp4_hardware(db.system) else 'no FP4 tensor cores'}{lacks})"
            )
        if peer is not None:
            db, q, lat, note = peer
            notes.append(note)
    elif quant == MXFP4_ALIAS:
        notes.append(f"mxfp4 -> {q}")

    sol_q = moe_sol_fn(db, q, hidden, inter, topk, experts, moe_tp, moe_ep, gated)
    sol_q(1.0)  # raises early if the GPU has no tensor cores for the compute dtype
    axes = (TOKENS_AXIS,)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved(axes, sol_q, TOKEN_SCALE, tuple(notes))

    def empirical(donor_idx=None, why: str | None = None) -> Resolved:
        donors = None
        if lat is not None and donor_idx is not None and len(donor_idx):
            donors = [_site_grid(db, lat, int(i), gated) for i in donor_idx]
        r = empirical_resolved("moe", sol_q, axes, donors, TOKEN_SCALE)
        extra = (why,) if why else ()
        return replace(r, notes=tuple(notes) + (lat.notes if lat else ()) + extra + r.notes)

    if lat is None:
        table = db.table_or_none("moe")
        if table is None:
            return empirical(why="no moe table")
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(
                f"no {quant} MoE data for {db.backend} on {db.system.name}",
                "the moe table was not collected in this quant mode"
                + (f" (tried {', '.join(candidates)})" if len(candidates) > 1 else ""),
                table.unique("moe_dtype"),
            )
        return empirical(why=f"no {quant} rows in the moe table")
    notes.extend(lat.notes)
    sites = lat.sites
    pair_hit = (sites[:, 4] == moe_tp) & (sites[:, 5] == moe_ep)
    site_hit = np.all(sites[:, :4] == np.asarray(query, float), axis=1)
    same_pair = np.flatnonzero(pair_hit)
    shape = f"MoE {q} hidden={hidden} inter={inter} topk={topk} experts={experts}"

    if site_hit.any() and not (site_hit & pair_hit).any() and db.mode is not DatabaseMode.EMPIRICAL:
        trend = _tp_trend(db, lat, sites, site_hit, moe_tp, moe_ep, gated, sol_q)
        if trend is not None:
            g, labels = trend
            why = (f"moe_tp={moe_tp} moe_ep={moe_ep} not collected: latency split into a fixed and a "
                   f"1/moe_tp part through {labels[1]} and {labels[0]}, carried on to moe_tp={moe_tp}")
            return Resolved(g, "moe", db.served_version("moe"), lat.kernel, "pair-trend", labels, (*notes, why))
        donor = _pair_donor(sites, site_hit, moe_tp, moe_ep)
        if donor is not None:
            dtp, dep = int(sites[donor, 4]), int(sites[donor, 5])
            base = _site_grid(db, lat, int(donor), gated)
            ax = base.axes[0]
            vals = base.values * sol_q(ax) / base.sol(ax)
            label = f"moe_tp={dtp} moe_ep={dep}"
            g = Grid((ax,), vals, np.maximum(base.prov, int(Prov.TRANSFERRED)).astype(np.int8), sol_q, (label,), scales=TOKEN_SCALE)
            return Resolved(
                g, "moe", db.served_version("moe"), lat.kernel, "pair-transfer", (label,),
                tuple(notes) + (f"moe_tp={moe_tp} moe_ep={moe_ep} from the collected {label} at the same width through utilisation",),
            )
    if site_hit.any() and not (site_hit & pair_hit).any():
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(
                f"{shape} was not collected at moe_tp={moe_tp} moe_ep={moe_ep}",
                f"{db.backend} on {db.system.name}; (moe_tp, moe_ep) is never transferred — "
                "use a collected pair, or --database-mode HYBRID for an empirical estimate",
                _pairs_str(sites[site_hit]),
            )
        return empirical(same_pair if len(same_pair) else np.arange(len(sites)), f"moe_tp={moe_tp} moe_ep={moe_ep} not collected for this shape")
    if not len(same_pair):
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(
                f"{shape}: no site was collected at moe_tp={moe_tp} moe_ep={moe_ep}",
                f"{db.backend} on {db.system.name}; use a collected pair, or --database-mode HYBRID",
                _pairs_str(sites),
            )
        return empirical(np.arange(len(sites)), f"moe_tp={moe_tp} moe_ep={moe_ep} not collected")

    cross = lat.site_gated is not None and lat.site_gated != gated
    if db.mode is not DatabaseMode.EMPIRICAL and not cross and not site_hit.any():
        peer = _peer_site(db, lat, query, moe_tp, moe_ep, gated, distribution, kernel, sol_q)
        if peer is not None:
            return replace(peer, notes=(*notes, *peer.notes))
    choice = None if db.mode is DatabaseMode.EMPIRICAL else choose_donors(query, sites[same_pair, :4], lat.primary[same_pair])
    if choice is None:
        if db.mode is DatabaseMode.SILICON:
            raise NotAvailableError(
                f"{shape} (moe_tp={moe_tp}, moe_ep={moe_ep}) is outside the collected sites' gates",
                f"{db.backend} on {db.system.name}; use --database-mode HYBRID for an empirical estimate",
                [f"{int(h)}/{int(n)}/{int(k)}/{int(e)}" for h, n, k, e in sites[same_pair, :4]],
            )
        return empirical(same_pair, None if db.mode is DatabaseMode.EMPIRICAL else "shape outside the collected sites' gates")
    choice = SiteChoice(tuple(int(same_pair[i]) for i in choice.indices), choice.weights, choice.how, choice.clamp_distance)
    if cross and choice.how == "exact":
        choice = replace(choice, how="activation-transfer")
    site_grid = lambda i: _site_grid(db, lat, i, gated)
    cost = 0.0
    if choice.how not in ("exact", "activation-transfer"):
        cost = fixed_cost(lat.curves[int(i)][1] for i in same_pair)
        choice = consistent_moe_donors(choice, query, sites[:, :4], site_grid, cost)
    labels = tuple(f"{_site_label(sites[i])} w={w:.2f}" for i, w in zip(choice.indices, choice.weights))
    if choice.how in ("exact", "activation-transfer"):
        g = transfer_grid(choice, site_grid, sol_q, labels)
    else:
        g = transfer_sites(choice, query, sites[:, :4], site_grid, sol_q, cost, labels)
        notes.append(f"utilisation over SOL + {cost * 1e3:.1f} us fixed cost, donors read at equal expert rows "
                     f"(num_tokens x topk / experts)")
        if not lat.primary[list(choice.indices)].all():
            notes.append(f"no {lat.kernel.split('+')[0]} site within the gates: donors from the other kernels")
    return Resolved(
        g, "moe", db.served_version("moe"), lat.kernel, choice.how,
        labels if choice.how != "exact" else (), tuple(notes),
    )
