"""Mixture of experts: the routed-expert grouped GEMM block and its expert-parallel all-to-all.

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

**Dispatch + combine** (:func:`resolve_moe_dispatch`, table ``moe_a2a_perf``, latency converted
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

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from ..data.database import PEER_AGREEMENT
from ..data.quant import COMPUTE_DTYPE, WEIGHT_BYTES
from ..data.versions import SERVING_BACKENDS, version_key
from ..errors import InfercastError, InvalidInputError, NotAvailableError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from ..interp.transfer import SiteChoice, choose_sites, consistent_subset, transfer_grid
from .base import DatabaseMode, OpDB, Resolved, merge_kernels, sites_and_curves, sol_resolved
from .comm import resolve_collective
from .empirical import empirical_resolved

#: the tokens axis of SOL / empirical grids (the collected num_tokens list of moe_perf)
TOKENS_AXIS = np.array(
    [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048,
     3072, 4096, 6144, 8192, 12288, 16384], dtype=float,
)
#: tokens axis of SOL / empirical all-to-all grids (the collected moe_a2a num_tokens span)
A2A_TOKENS_AXIS = 2.0 ** np.arange(0, 17)
#: interpolation space of the num_tokens axis (see the module docstring)
TOKEN_SCALE = ("linear",)

SITE_COLS = ("hidden_size", "inter_size", "topk", "num_experts")
PAIR_COLS = ("moe_tp_size", "moe_ep_size")
MOE_QUANTS = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8", "int4_wo", "w4afp8")
MXFP4_ALIAS = "mxfp4"
NONGATED_TAG = "nongated"
#: TensorRT-LLM's small-batch NVFP4 expert kernel (see :func:`_prefer_low_latency`)
TRTLLM_LOW_LATENCY_KERNEL = "moe_torch_flow_min_latency"
#: tokens per rank (after attention-DP gathering) up to which TensorRT-LLM's NVFP4 experts are
#: costed by the low-latency kernel's rows: the decode steps' token counts (see
#: :func:`_prefer_low_latency`, "Above 128 tokens")
TRTLLM_LOW_LATENCY_MAX_TOKENS = 512
DEFAULT_DISTRIBUTION = "balanced"

#: serving backend -> phase -> moe_a2a comm_backend (DeepEP high-throughput / low-latency)
A2A_BACKENDS = {
    "trtllm": {"context": "trtllm_deepep_ht", "generation": "trtllm_deepep_ll"},
    "vllm": {"context": "deepep_ht", "generation": "deepep_ll"},
    "sglang": {"context": "deepep_ht", "generation": "deepep_ll"},
}
PHASE_ALIASES = {"context": "context", "prefill": "context", "generation": "generation", "decode": "generation"}
#: MoE quant -> activation dtype the dispatch may send (first choice; bf16 is always the fallback)
A2A_DISPATCH_DTYPE = {"fp8": "fp8", "fp8_block": "fp8", "w4afp8": "fp8", "w4a8_mxfp4_mxfp8": "fp8", "nvfp4": "nvfp4"}
A2A_DTYPE_BYTES = {"bfloat16": 2.0, "default": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1.0 / 16, "fp4": 0.5 + 1.0 / 16}
#: NCCL fallback: 16-bit elements (as ops.comm)
NCCL_ELEMENT_BYTES = 2.0


# ----------------------------------------------------------------------------------------------
# validation and quant aliases
# ----------------------------------------------------------------------------------------------


def _positive_int(name: str, v) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a positive integer", f"got {v!r}") from None
    if not math.isfinite(f) or f <= 0 or f != int(f):
        raise InvalidInputError(f"{name} must be a positive integer", f"got {v!r}")
    return int(f)


def _check_shape(hidden, inter, topk, experts, moe_tp=1, moe_ep=1):
    hidden, inter, topk, experts = (_positive_int(n, v) for n, v in
                                    (("hidden", hidden), ("inter", inter), ("topk", topk), ("experts", experts)))
    moe_tp, moe_ep = _positive_int("moe_tp", moe_tp), _positive_int("moe_ep", moe_ep)
    if topk > experts:
        raise InvalidInputError(f"topk={topk} exceeds the number of experts ({experts})")
    if moe_ep > experts:
        raise InvalidInputError(f"moe_ep={moe_ep} exceeds the number of experts ({experts})", "every EP rank needs an expert")
    return hidden, inter, topk, experts, moe_tp, moe_ep


def has_fp4_hardware(system) -> bool:
    """FP4 tensor cores: the system YAML lists ``fp4_tc_flops`` (exactly the sm >= 100 systems
    of this pack: b200/b300/gb200/gb300 sm100/103, rtx_pro_6000_server sm120)."""
    return system.gpu.flops("fp4") is not None


def quant_candidates(system, quant: str) -> tuple[str, ...]:
    """Table ``moe_dtype`` values to try for ``quant``, in order (the alias rule; see module doc)."""
    if quant == MXFP4_ALIAS:
        if has_fp4_hardware(system):
            return ("w4a8_mxfp4_mxfp8", "w4a16_mxfp4")
        return ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
    if quant not in WEIGHT_BYTES:
        raise InvalidInputError(f"unknown MoE quant mode {quant!r}", available=[*MOE_QUANTS, MXFP4_ALIAS])
    return (quant,)


def moe_sol_fn(db: OpDB, quant: str, hidden, inter, topk, experts, moe_tp, moe_ep, gated: bool = True):
    cdt = COMPUTE_DTYPE[quant]
    wb = WEIGHT_BYTES[quant]
    system = db.system

    def f(tokens):
        return sol.moe(system, cdt, wb, tokens, hidden, inter, topk, experts, moe_tp, moe_ep, gated)[0]

    return f


def _power_law_exponent(dist: str) -> float:
    m = re.search(r"([0-9]+(?:\.[0-9]+)?)", dist)
    return float(m.group(1)) if m else math.inf


def _pick_distribution(available: list[str], requested: str) -> tuple[str, tuple[str, ...]]:
    if requested in available:
        return requested, ()
    if DEFAULT_DISTRIBUTION in available:
        return DEFAULT_DISTRIBUTION, (f"distribution {requested!r} not collected; using {DEFAULT_DISTRIBUTION!r}",)
    best = sorted(available, key=lambda d: (_power_law_exponent(d), d))[0]
    asked = repr(requested) if requested == DEFAULT_DISTRIBUTION else f"{requested!r} and {DEFAULT_DISTRIBUTION!r}"
    return best, (f"distribution {asked} not collected; using the least skewed {best!r}",)


# ----------------------------------------------------------------------------------------------
# the expert-block lattice
# ----------------------------------------------------------------------------------------------


@dataclass
class _Lattice:
    table: object
    quant: str
    kernel: str
    distribution: str
    site_gated: bool | None  # gating of the collected rows; None = the kernels do not say
    sites: np.ndarray  # (n, 6): hidden, inter, topk, experts, moe_tp, moe_ep
    curves: dict
    notes: tuple[str, ...]
    primary: np.ndarray  # (n,) bool: most of the site's points come from the default kernel
    site_kernel: np.ndarray  # (n,) object: the kernel most of the site's points come from


def _lattice(db: OpDB, quant: str, gated: bool, distribution: str, table_name: str = "moe",
             kernel: str | None = None) -> _Lattice | None:
    """Rows of one quant mode, kernel class and routing distribution, grouped by site and pair.
    None when the table (HYBRID/EMPIRICAL) or the quant mode is missing. ``kernel``: only the rows
    of that kernel family (:func:`kernel_family_mask`); None when the table has none."""
    table = db.table_or_none(table_name)
    if table is None:
        return None
    base = table.mask(moe_dtype=quant)
    if kernel is not None:
        base &= kernel_family_mask(table, kernel)
    if not base.any():
        return None
    notes: list[str] = []
    dists = sorted(np.unique(table.keys["distribution"][base]).tolist()) if table.has("distribution") else []
    dist = distribution
    if table.has("distribution"):
        dist, dnotes = _pick_distribution(dists, distribution)
        notes.extend(dnotes)
        base &= table.keys["distribution"] == dist
    kernels = np.unique(table.keys["kernel_source"][base]).tolist() if table.has("kernel_source") else []
    nongated = [k for k in kernels if NONGATED_TAG in k]
    site_gated: bool | None = None  # None: kernel names do not tell gated from non-gated
    if nongated:
        gated_k = [k for k in kernels if NONGATED_TAG not in k]
        want, site_gated = (gated_k, True) if gated else (nongated, False)
        if not want:  # only the other activation type was collected: carry utilisation across
            want, site_gated = (nongated, False) if gated else (gated_k, True)
            notes.append(
                f"no {'gated' if gated else 'non-gated'} {quant} MoE kernel collected; utilisation "
                f"carried over from the {'non-gated' if gated else 'gated'} kernels"
            )
        base &= np.isin(table.keys["kernel_source"], want)
    low_latency = False
    if table.has("kernel_source"):
        candidates = base
        base, order = merge_kernels(table, base, SITE_COLS + PAIR_COLS + ("num_tokens",), db.backend)
        if db.backend == "trtllm" and kernel is None:
            chosen = base
            base = _prefer_low_latency(table, base, candidates)
            low_latency = bool((base != chosen).any())
        kernel = "+".join(order)
    else:
        order, kernel = [], None
    sites, curves = sites_and_curves(table, base, SITE_COLS + PAIR_COLS, ("num_tokens",))
    primary = np.ones(len(sites), bool)
    site_kernel = np.full(len(sites), order[0] if order else None, dtype=object)
    if len(order) > 1:  # a site is primary when most of its points come from the expected kernel
        rows = np.flatnonzero(base)
        site_of = np.unique(np.stack([table.keys[c][rows].astype(float) for c in SITE_COLS + PAIR_COLS], axis=1),
                            axis=0, return_inverse=True)[1].reshape(-1)
        expected = (table.keys["kernel_source"][rows] == _expected_kernel(table, rows, order[0], low_latency))
        primary = np.bincount(site_of, expected.astype(float), len(sites)) * 2 > np.bincount(site_of, minlength=len(sites))
        ks = table.keys["kernel_source"][rows]
        counts = np.stack([np.bincount(site_of, (ks == k).astype(float), len(sites)) for k in order], axis=1)
        site_kernel = np.asarray(order, dtype=object)[np.argmax(counts, axis=1)]  # ties: the earlier kernel
    return _Lattice(table, quant, kernel, dist, site_gated, sites, curves, tuple(notes), primary, site_kernel)


def _prefer_low_latency(table, chosen: np.ndarray, candidates: np.ndarray,
                        max_tokens: float = TRTLLM_LOW_LATENCY_MAX_TOKENS) -> np.ndarray:
    """TensorRT-LLM NVFP4 experts: among the ``candidates`` rows, those of the
    low-latency kernel (:data:`TRTLLM_LOW_LATENCY_KERNEL`) at up to ``max_tokens``
    (:data:`TRTLLM_LOW_LATENCY_MAX_TOKENS`) tokens replace the ``chosen`` rows (one per point, after
    :func:`~infercast.ops.base.merge_kernels`) of the same points; every larger point, and every
    point the low-latency kernel lacks, stays with the kernel chosen (CUTLASS, the default: it has
    the most rows), which also keeps its place as the sites' default kernel for transfer.

    Why: TensorRT-LLM's own DeepSeek-R1 NVFP4 recipes for B200 (``examples/configs/database``)
    select the ``TRTLLM`` MoE backend (TensorRT-LLM-gen kernels) for the tensor-parallel, small-batch
    configurations and CUTLASS for the attention-DP, large-batch ones; the pack has no rows of that
    backend, but its low-latency rows match its speed: DeepSeek's expert shape (7168, 2048, 8, 256)
    at TP 8 takes 20 / 32 / 43 / 60 us at 1 / 4 / 8 / 16 tokens there, as in SGLang's and vLLM's
    tables of the same TensorRT-LLM-gen kernels (19-23 / 31-33 / 45-48 / 63-64 us), against
    61 / 85 / 120 / 154 us for CUTLASS. The low-latency rows exist for b200 and gb200 only; elsewhere
    nothing changes.

    Above 128 tokens. The recipes' attention-DP points do run CUTLASS, but they measure the
    low-latency rows' speed, not the pack's CUTLASS rows': at DeepSeek's shape, EP 8, 256 tokens
    per rank the CUTLASS rows take 282 us, the low-latency rows 153 us (vLLM's and SGLang's
    TensorRT-LLM-gen rows 178-184 us). The threshold, 512 tokens, covers the decode steps of
    attention-DP deployments (up to 64 sequences x DP 8, or x 2 with MTP), while prefill chunks
    (thousands of tokens, where the recipes' CUTLASS rows stand) keep CUTLASS; costing them with
    the low-latency rows would cut a static 16 x 2048-token DeepSeek prefill on b200 TP 8 by a
    third on no evidence. The cost: TensorRT-LLM's b200 nvfp4 curves switch kernel at 512 tokens,
    which transfer carries to uncollected shapes less well. See docs/modelling-log.md,
    'TensorRT-LLM MoE at small batch'."""
    ks = table.keys["kernel_source"]
    rows = np.flatnonzero(candidates)
    small = table.keys["num_tokens"][rows].astype(float) <= max_tokens
    low = small & (ks[rows] == TRTLLM_LOW_LATENCY_KERNEL)
    if not low.any():
        return chosen
    point = np.stack([table.keys[c][rows].astype(float) for c in SITE_COLS + PAIR_COLS + ("num_tokens",)], axis=1)
    _, inv = np.unique(point, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    covered = np.zeros(int(inv.max()) + 1, bool)
    covered[inv[low]] = True
    out = chosen.copy()
    out[rows[covered[inv]]] = False  # every row of a point the low-latency kernel measured ...
    out[rows[low]] = True  # ... gives way to its row
    return out


def _expected_kernel(table, rows: np.ndarray, default: str, low_latency: bool) -> np.ndarray:
    """The kernel each of ``rows`` would come from at a shape the engine runs as the lattice
    assumes: ``default`` (the kernel with the most rows); with :func:`_prefer_low_latency` in
    force, its low-latency kernel up to :data:`TRTLLM_LOW_LATENCY_MAX_TOKENS` tokens. This decides
    which sites are transfer donors first (:func:`choose_donors`).

    Why not the row-count default alone: TensorRT-LLM's b200 nvfp4 table has the low-latency rows
    for 445 of its 518 (shape, TP, EP) sites; the other 73 are the two shapes with more than 256
    experts ((7168, 2048, 8, 384) and (4096, 1024, 10, 512)), CUTLASS only. Counted by CUTLASS
    rows, those 73 were the only "default" sites, so every uncollected shape was transferred from
    them: 1.5-2x slower at <= 512 tokens than the 445 sites whose kernel mix it is served with. See
    docs/modelling-log.md, 'TensorRT-LLM MoE at small batch'."""
    expected = np.full(len(rows), default, dtype=object)
    if low_latency:
        small = table.keys["num_tokens"][rows].astype(float) <= TRTLLM_LOW_LATENCY_MAX_TOKENS
        expected[small] = TRTLLM_LOW_LATENCY_KERNEL
    return expected


def _get_lattice(db: OpDB, quant: str, gated: bool, distribution: str, table_name: str = "moe",
                 kernel: str | None = None) -> _Lattice | None:
    return db.memo(("moe-lattice", table_name, quant, bool(gated), distribution, kernel),
                   lambda: _lattice(db, quant, gated, distribution, table_name, kernel))


#: MoE kernel families an engine can be told to run (TensorRT-LLM's ``moe_config.backend``:
#: ``TRTLLM`` = the TensorRT-LLM-gen kernels, ``CUTLASS``, ``DEEPGEMM``; vLLM's and SGLang's
#: Triton ``fused_moe``), each matched against the ``kernel_source`` names of the moe tables
#: (case-insensitive substrings, :data:`KERNEL_FAMILY_NAMES`): "trtllm" finds SGLang's
#: ``sglang_flashinfer_trtllm_moe`` and vLLM's ``..._flashinfer_trtllm_...`` rows (the same
#: TensorRT-LLM-gen kernels through FlashInfer), "cutlass" TensorRT-LLM's
#: ``moe_torch_flow_cutlass`` and FlashInfer's CUTLASS rows, "deepgemm" ``deepgemm``, "triton"
#: SGLang's ``sglang_fused_moe_triton`` and vLLM's ``vllm_fused_moe`` (vLLM's ``fused_moe`` layer
#: is its Triton kernel: what it runs with FlashInfer and DeepGEMM experts switched off, e.g.
#: ``VLLM_USE_FLASHINFER_MOE_FP8=0 VLLM_MOE_USE_DEEP_GEMM=0``).
KERNEL_FAMILY_NAMES = {
    "trtllm": ("trtllm",),
    "cutlass": ("cutlass",),
    "deepgemm": ("deepgemm",),
    "triton": ("triton", "vllm_fused_moe"),
}
MOE_KERNELS = tuple(KERNEL_FAMILY_NAMES)


def kernel_family_mask(table, kernel: str) -> np.ndarray:
    """Rows of ``table`` whose ``kernel_source`` names the kernel family ``kernel``."""
    if not table.has("kernel_source"):
        return np.zeros(len(table.latency), bool)
    names = np.char.lower(table.keys["kernel_source"].astype(str))
    hit = np.zeros(len(names), bool)
    for part in KERNEL_FAMILY_NAMES.get(kernel.lower(), (kernel.lower(),)):
        hit |= np.char.find(names, part) >= 0
    return hit


def kernel_family(kernel_source: str | None) -> str | None:
    """The kernel family (:data:`KERNEL_FAMILY_NAMES`) a table's ``kernel_source`` name belongs to,
    e.g. ``sglang_flashinfer_trtllm_moe`` -> ``"trtllm"``; None for a name of no known family."""
    name = str(kernel_source or "").lower()
    for family, parts in KERNEL_FAMILY_NAMES.items():
        if any(p in name for p in parts):
            return family
    return None


def _kernel_db(db: OpDB, candidates: tuple[str, ...], kernel: str, gated: bool, distribution: str) -> OpDB | None:
    """The database whose moe table measured ``kernel``'s family in the preferred quant mode, in
    this order: this backend's data version; this backend's other collected versions, newest
    first (a kernel an engine stopped defaulting to drops out of the newer collections: vLLM's
    b200 tables measured the Triton ``fused_moe`` in 0.19.0 and 0.22.0, FlashInfer's kernels in
    0.24.0); another serving backend's current data on the same system (in
    :data:`~infercast.data.versions.SERVING_BACKENDS` order) -- the kernels are the same library's,
    whichever engine called them. None when no table has them."""

    def measured(kdb: OpDB | None) -> bool:
        if kdb is None:
            return False
        try:
            return _get_lattice(kdb, candidates[0], gated, distribution, kernel=kernel) is not None
        except InfercastError:
            return False

    if measured(db):
        return db
    for version in sorted((v for v in db.data.versions.collected if v != db.data.version), key=version_key, reverse=True):
        kdb = _other_db(db, version=version)
        if measured(kdb):
            return kdb
    for backend in (b for b in SERVING_BACKENDS if b != db.backend):
        kdb = _other_db(db, backend=backend)
        if measured(kdb):
            return kdb
    return None


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


def _site_grid(db: OpDB, lat: _Lattice, i: int, query_gated: bool) -> Grid:
    gated = query_gated if lat.site_gated is None else lat.site_gated

    def build():
        h, n, k, e, tp, ep = (int(x) for x in lat.sites[i])
        s = moe_sol_fn(db, lat.quant, h, n, k, e, tp, ep, gated)
        (axis,), vals = lat.curves[i]
        return Grid((axis,), vals, np.zeros(len(axis), np.int8), s, scales=TOKEN_SCALE)

    # keyed by the table too: two tables of one kernel family (the wide-EP context and generation
    # tables are both "deepepmoe") number their sites alike
    return db.memo(("moe-site", getattr(lat.table, "stem", None), lat.quant, lat.distribution, lat.kernel, gated, i), build)


def _site_label(row) -> str:
    h, n, k, e, tp, ep = (int(x) for x in row)
    return f"(hidden={h}, inter={n}, topk={k}, experts={e}, tp={tp}, ep={ep})"


def _pairs_str(sites: np.ndarray) -> list[str]:
    return [f"tp{int(tp)}xep{int(ep)}" for tp, ep in sorted({(int(a), int(b)) for a, b in sites[:, 4:6]})]


def _site_index(lat: _Lattice, query: tuple, tp: int, ep: int) -> int | None:
    hit = np.flatnonzero(np.all(lat.sites[:, :4] == np.asarray(query, float), axis=1)
                         & (lat.sites[:, 4] == tp) & (lat.sites[:, 5] == ep))
    return int(hit[0]) if len(hit) else None


def _other_db(db: OpDB, *, backend: str | None = None, version: str | None = None) -> OpDB | None:
    """The same system's data of another serving ``backend`` at its current version, or of this
    backend at another collected ``version``; shared with every estimator that reads it
    (:meth:`OpDB.shared`); None when the pack has no such data."""

    def build():
        try:
            data = db.data.for_backend(backend) if backend is not None else replace(db.data, version=version, served={})
            return OpDB.shared(data, db.mode)
        except InfercastError:
            return None

    return db.memo(("moe-other-db", backend, version), build)


def _peer_preferred(db: OpDB, preferred: str, fallback: str, lat: _Lattice, query: tuple, tp: int, ep: int,
                    gated: bool, distribution: str):
    """(peer db, preferred quant, its lattice, note) when this backend's table lacks the preferred
    quant mode at the query's exact site and pair but another backend's table on the same system
    has it there, and the two tables agree (within ``PEER_AGREEMENT``, median over shared token
    counts) on the fallback quant at that same site and pair: the engines run the same kernels, so
    the peer's measurement of the preferred mode stands in for the missing one (module doc)."""
    mine = _site_index(lat, query, tp, ep)
    if mine is None:
        return None
    (m_ax,), m_vals = lat.curves[mine]
    for backend in SERVING_BACKENDS:
        if backend == db.backend:
            continue
        pdb = _other_db(db, backend=backend)
        if pdb is None:
            continue
        try:
            plat, pfall = _get_lattice(pdb, preferred, gated, distribution), _get_lattice(pdb, fallback, gated, distribution)
        except InfercastError:
            continue
        if plat is None or pfall is None or _site_index(plat, query, tp, ep) is None:
            continue
        j = _site_index(pfall, query, tp, ep)
        if j is None:
            continue
        (p_ax,), p_vals = pfall.curves[j]
        shared, mi, pi = np.intersect1d(m_ax, p_ax, return_indices=True)
        ok = ~np.isnan(m_vals[mi]) & ~np.isnan(p_vals[pi])
        if ok.sum() < 3:
            continue
        r = float(np.median(m_vals[mi][ok] / p_vals[pi][ok]))
        if 1.0 / PEER_AGREEMENT <= r <= PEER_AGREEMENT:
            note = (f"{preferred} from {backend} {pdb.data.version}'s moe table: {db.backend}'s has no {preferred} "
                    f"at this site, and the two agree on {fallback} here ({db.backend}/{backend} = {r:.2f} over "
                    f"{int(ok.sum())} token counts)")
            return pdb, preferred, plat, note
    return None


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


def _tp_trend(db: OpDB, lat: _Lattice, sites: np.ndarray, site_hit: np.ndarray, moe_tp: int, moe_ep: int,
              gated: bool, sol_q) -> tuple[Grid, tuple[str, str]] | None:
    """The site's curve at an uncollected ``moe_tp`` one octave beyond the two largest collected
    below it at the same ``moe_ep`` (``moe_tp = 2 t1 = 4 t2``, the case the leave-one-out
    measures), by the fixed-plus-parallel split of the two (:func:`_fixed_plus_split`: at
    ``2 t1``, ``1.5 l(t1) - 0.5 l(t2)``); None otherwise
    (module docstring)."""
    same = np.flatnonzero(site_hit & (sites[:, 5] == moe_ep) & (sites[:, 4] < moe_tp))
    if len(same) < 2:
        return None
    order = same[np.argsort(sites[same, 4])]
    i1, i2 = int(order[-1]), int(order[-2])
    t1, t2 = float(sites[i1, 4]), float(sites[i2, 4])
    if moe_tp != 2 * t1 or t1 != 2 * t2:
        return None
    labels = (f"moe_tp={int(t1)} moe_ep={moe_ep}", f"moe_tp={int(t2)} moe_ep={moe_ep}")
    g = _fixed_plus_split(_site_grid(db, lat, i1, gated), t1, _site_grid(db, lat, i2, gated), t2, moe_tp, sol_q, labels)
    return None if g is None else (g, labels)


def _fixed_plus_split(ga: Grid, xa: float, gb: Grid, xb: float, x: float, sol_q, labels: tuple = ()) -> Grid | None:
    """The curve at a split ``x`` (moe_tp or EP) from curves measured at ``xa`` (``ga``) and ``xb``
    (``gb``): at every token count both measured, latency is ``a + b / x`` -- a part that does not
    shrink as the experts are split (routing, permutation, launches, the dispatch's fixed cost)
    and a part that does -- fitted through the two; never below perfect scaling of the curve
    measured at the larger split below ``x`` (its latency times ``SOL(query) / SOL(that curve)``).
    Answered at those token counts, marked transferred; None where the curves share fewer than two
    token counts."""
    ta, tb = ga.axes[0], gb.axes[0]
    axis = np.unique(np.concatenate([ta, tb]))
    axis = axis[(axis >= max(ta[0], tb[0])) & (axis <= min(ta[-1], tb[-1]))]
    if len(axis) < 2:
        return None
    la, lb = ga(axis)[0], gb(axis)[0]
    per_split = (la - lb) / (1.0 / xa - 1.0 / xb)  # b in a + b / x
    v = la - per_split / xa + per_split / x
    curves = ((xa, ga), (xb, gb))
    below = [c for c in curves if c[0] <= x] or [min(curves, key=lambda c: c[0])]
    near = max(below, key=lambda c: c[0])[1]
    v = np.maximum(v, near(axis)[0] * sol_q(axis) / near.sol(axis))
    return Grid((axis,), v, np.full(len(axis), Prov.TRANSFERRED, np.int8), sol_q, labels, scales=TOKEN_SCALE)


def _pair_donor(sites: np.ndarray, site_hit: np.ndarray, moe_tp: int, moe_ep: int) -> int | None:
    """Index of the collected (moe_tp, moe_ep) at this site with the same width, closest moe_tp."""
    idx = np.flatnonzero(site_hit & (sites[:, 4] * sites[:, 5] == moe_tp * moe_ep))
    if not len(idx):
        return None
    dist = np.abs(np.log2(sites[idx, 4]) - np.log2(moe_tp))
    order = np.lexsort((sites[idx, 4], dist))
    return int(idx[order[0]])


# ----------------------------------------------------------------------------------------------
# off-site transfer (the rule and its leave-one-out numbers are in the module docstring)
# ----------------------------------------------------------------------------------------------

#: fixed per-call cost (routing, permutation, the block's kernel launches) added to the speed of
#: light when utilisation is carried between sites, as a fraction of the lowest latency measured
#: at the (moe_tp, moe_ep) pair (that floor = the fixed cost + the smallest site's weight traffic)
FIXED_COST_FRACTION = 0.5


def expert_rows(site) -> float:
    """Rows each expert receives per token entering the block under balanced routing:
    ``topk / experts`` (the grouped GEMMs' per-expert ``m`` is ``num_tokens`` times this)."""
    return float(site[2]) / float(site[3])


def fixed_cost(curve_values) -> float:
    """The pair's fixed per-call cost (ms): :data:`FIXED_COST_FRACTION` x its lowest measured latency."""
    lows = [float(np.nanmin(v)) for v in curve_values if np.isfinite(v).any()]
    return FIXED_COST_FRACTION * min(lows) if lows else 0.0


def choose_donors(query, sites: np.ndarray, primary: np.ndarray) -> SiteChoice | None:
    """Donor sites for ``query`` among ``sites`` ((n, 4) hidden, inter, topk, experts at one pair):
    an exact hit if collected; else :func:`~infercast.interp.transfer.choose_sites` among the
    sites whose curves come from the default kernel (``primary``: the kernel an uncollected
    shape is assumed to run); else among all of them. Indices refer to ``sites``."""
    sites = np.asarray(sites, dtype=float)
    primary = np.asarray(primary, dtype=bool)
    hit = np.flatnonzero(np.all(sites == np.asarray(query, dtype=float), axis=1))
    if len(hit):
        return SiteChoice((int(hit[0]),), (1.0,), "exact", 0.0)
    if primary.any() and not primary.all():
        idx = np.flatnonzero(primary)
        c = choose_sites(query, sites[idx])
        if c is not None:
            return replace(c, indices=tuple(int(idx[i]) for i in c.indices))
    return choose_sites(query, sites)


#: donors whose utilisation (over SOL + the fixed cost, at equal expert rows) differs by more than
#: this factor are not blended together; the heaviest consistent subset is kept (rule 4)
CONSISTENT_UTIL_FACTOR = 1.5


def consistent_moe_donors(choice: SiteChoice, query, sites: np.ndarray, site_grid, cost: float) -> SiteChoice:
    """Rule 4 (module docstring): :func:`~infercast.interp.transfer.consistent_subset` over the
    donors as :func:`transfer_sites` blends them (read at the query's expert rows, utilisation over
    SOL + ``cost``), with :data:`CONSISTENT_UTIL_FACTOR`. Indices refer to ``sites``."""
    if choice.how == "exact" or len(choice.indices) < 2:
        return choice
    rows_q = expert_rows(query)
    grids = [_AtExpertRows(site_grid(i), rows_q / expert_rows(sites[i]), cost) for i in choice.indices]
    return consistent_subset(choice, grids, CONSISTENT_UTIL_FACTOR)


class _AtExpertRows:
    """A donor site's grid read at the query's expert rows (``tokens x rows_q / rows_d``) over the
    speed of light plus the fixed cost: what :func:`~infercast.interp.transfer.transfer_grid`
    blends (it uses ``axes``, ``scales``, ``__call__`` and ``sol``)."""

    def __init__(self, grid: Grid, ratio: float, cost: float):
        self.grid, self.ratio, self.cost = grid, ratio, cost
        self.axes, self.scales = grid.axes, grid.scales

    def __call__(self, tokens):
        return self.grid(np.asarray(tokens, dtype=float) * self.ratio)

    def sol(self, tokens):
        return self.grid.sol(np.asarray(tokens, dtype=float) * self.ratio) + self.cost


def transfer_sites(choice: SiteChoice, query, sites: np.ndarray, site_grid, sol_q, cost: float, labels=()) -> Grid:
    """The query site's grid from ``choice``'s donors (indices into ``sites``; ``site_grid(i)``
    gives donor ``i``'s grid): utilisation ``(SOL + cost) / latency`` of each donor at the same
    expert rows, blended with the choice's weights, answers ``(SOL(query) + cost) / u``. The
    grid's own SOL (holding beyond the tokens range) stays ``sol_q``."""
    if choice.how == "exact":
        return site_grid(choice.indices[0])
    rows_q = expert_rows(query)
    g = transfer_grid(
        choice,
        lambda i: _AtExpertRows(site_grid(i), rows_q / expert_rows(sites[i]), cost),
        lambda t: sol_q(t) + cost,
        labels,
    )
    return Grid(g.axes, g.values, g.prov, sol_q, g.sites, scales=g.scales)


#: peer-engine transfer (:func:`peer_curve`, module docstring rule 5): at least this many sites at
#: the query's pair that both engines measured with the query's kernel family, ...
PEER_MIN_SITES = 3
#: ... whose latency ratio (log, per token count) varies across those sites by at most this median
#: absolute deviation (0.05: about 5%): the two engines run the same kernels there at a steady ratio
PEER_RATIO_SPREAD = 0.05


@dataclass(frozen=True)
class PeerCurve:
    """The query site's curve from another engine's table: ``values`` (ms, on ``axis``) = the peer's
    measured curve x this engine's latency ratio to it, per token count; ``ratio`` is the median
    over every point of the ``shared`` sites, ``spread`` the gate's statistic (:func:`peer_curve`)."""

    index: int  # the query site's index in the peer's lattice
    axis: np.ndarray
    values: np.ndarray
    shared: int
    spread: float
    ratio: float


def _log_ratios(own_curve, peer_curve) -> dict[float, float]:
    (oax,), ov = own_curve
    (pax,), pv = peer_curve
    common, oi, pi = np.intersect1d(oax, pax, return_indices=True)
    r = np.log(ov[oi] / pv[pi])
    return {float(t): float(x) for t, x in zip(common, r) if np.isfinite(x)}


def peer_curve(query, moe_tp: int, moe_ep: int, family: str | None, own_sites: np.ndarray, own_curves,
               own_kernels, peer_sites: np.ndarray, peer_curves, peer_kernels) -> PeerCurve | None:
    """The query shape's curve at ``(moe_tp, moe_ep)`` from a peer engine's lattice on the same GPU
    (``peer_*``: sites (n, 6) hidden, inter, topk, experts, moe_tp, moe_ep; curves by index;
    kernel names), when the peer measured that exact site with the kernel ``family`` the query is
    assumed to run, and the two engines' latencies stand in a steady ratio at that pair: over the
    sites both measured there with that family (at least :data:`PEER_MIN_SITES`), the median
    absolute deviation of the per-site log ratios, median over token counts, is at most
    :data:`PEER_RATIO_SPREAD`. The answer is the peer's curve x the median ratio at each token
    count (the median over every shared point where fewer than :data:`PEER_MIN_SITES` sites measured
    that count). None otherwise. ``own_*`` are this engine's lattice in the same layout."""
    if family is None:
        return None
    q = np.asarray(query, dtype=float)
    pair = lambda sites: (sites[:, 4] == moe_tp) & (sites[:, 5] == moe_ep)
    p_at = pair(peer_sites)
    hit = np.flatnonzero(p_at & np.all(peer_sites[:, :4] == q, axis=1))
    if not len(hit) or kernel_family(peer_kernels[int(hit[0])]) != family:
        return None
    j = int(hit[0])
    peer_index = {tuple(row): i for i, row in enumerate(peer_sites[:, :4].tolist()) if p_at[i]}
    by_token: dict[float, list[float]] = {}
    shared = 0
    for i in np.flatnonzero(pair(own_sites)):
        k = peer_index.get(tuple(own_sites[i, :4].tolist()))
        if k is None or k == j or kernel_family(own_kernels[i]) != family or kernel_family(peer_kernels[k]) != family:
            continue
        r = _log_ratios(own_curves[int(i)], peer_curves[int(k)])
        if not r:
            continue
        shared += 1
        for t, x in r.items():
            by_token.setdefault(t, []).append(x)
    if shared < PEER_MIN_SITES:
        return None
    steady = {t: np.asarray(v) for t, v in by_token.items() if len(v) >= PEER_MIN_SITES}
    if not steady:
        return None
    spread = float(np.median([np.median(np.abs(v - np.median(v))) for v in steady.values()]))
    if spread > PEER_RATIO_SPREAD:
        return None
    overall = float(np.median(np.concatenate(list(by_token.values()))))
    (axis,), vals = peer_curves[j]
    ratio = np.array([float(np.median(steady[float(t)])) if float(t) in steady else overall for t in axis])
    return PeerCurve(j, axis, vals * np.exp(ratio), shared, spread, float(np.exp(overall)))


def best_peer_curve(query, moe_tp: int, moe_ep: int, family: str | None, own_sites: np.ndarray, own_curves,
                    own_kernels, peers) -> tuple[int, PeerCurve] | None:
    """:func:`peer_curve` against each of ``peers`` (lattices: ``sites``, ``curves``,
    ``site_kernel``); the steadiest ratio wins, ties to the earlier peer. (index into ``peers``,
    curve), or None when no peer serves."""
    best = None
    for n, plat in enumerate(peers):
        pc = peer_curve(query, moe_tp, moe_ep, family, own_sites, own_curves, own_kernels,
                        plat.sites, plat.curves, plat.site_kernel)
        if pc is not None and (best is None or pc.spread < best[1].spread):
            best = (n, pc)
    return best


def peer_grid(pc: PeerCurve, sol_q, label: str = "") -> Grid:
    """:class:`PeerCurve` as a transferred grid holding beyond its tokens range through ``sol_q``."""
    return Grid((pc.axis,), pc.values, np.full(len(pc.axis), int(Prov.TRANSFERRED), np.int8), sol_q,
                (label,) if label else (), scales=TOKEN_SCALE)


def default_family(lat: _Lattice) -> str | None:
    """The kernel family an uncollected shape of ``lat`` is assumed to run (its default kernel's)."""
    return kernel_family(lat.kernel.split("+")[0]) if lat.kernel else None


def peer_lattices(db: OpDB, lat: _Lattice, gated: bool, distribution: str, kernel: str | None = None) -> list:
    """(peer db, lattice) of every other serving backend's current moe table on this system with
    ``lat``'s quant mode, routing distribution and activation class, in
    :data:`~infercast.data.versions.SERVING_BACKENDS` order."""
    peers = []
    for backend in SERVING_BACKENDS:
        pdb = None if backend == db.backend else _other_db(db, backend=backend)
        if pdb is None:
            continue
        try:
            plat = _get_lattice(pdb, lat.quant, gated, distribution, kernel=kernel)
        except InfercastError:
            continue
        if plat is not None and plat.distribution == lat.distribution and plat.site_gated == lat.site_gated:
            peers.append((pdb, plat))
    return peers


def _peer_site(db: OpDB, lat: _Lattice, query: tuple, moe_tp: int, moe_ep: int, gated: bool, distribution: str,
               kernel: str | None, sol_q) -> Resolved | None:
    """:func:`best_peer_curve` over :func:`peer_lattices`, as a resolved curve; None when no peer serves."""
    family = default_family(lat)
    peers = peer_lattices(db, lat, gated, distribution, kernel)
    best = best_peer_curve(query, moe_tp, moe_ep, family, lat.sites, lat.curves, lat.site_kernel,
                           [plat for _, plat in peers])
    if best is None:
        return None
    pdb, plat = peers[best[0]]
    pc = best[1]
    label = f"{pdb.backend} {pdb.data.version} {_site_label(plat.sites[pc.index])}"
    why = (f"shape not collected in {db.backend} {db.data.version}'s moe table: {pdb.backend} "
           f"{pdb.data.version}'s curve of it ({plat.site_kernel[pc.index]}) x {db.backend}/{pdb.backend} latency "
           f"ratio {pc.ratio:.2f} (median over {pc.shared} shapes both measured with {family} kernels at "
           f"moe_tp={moe_tp} moe_ep={moe_ep}; spread {pc.spread:.3f})")
    return Resolved(peer_grid(pc, sol_q, label), "moe", db.served_version("moe"), lat.kernel, "peer-transfer",
                    (label,), (why,))


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
    same system (noted); None: the table's own kernels (module doc)."""
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


# ----------------------------------------------------------------------------------------------
# expert-parallel all-to-all (dispatch + combine)
# ----------------------------------------------------------------------------------------------


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
