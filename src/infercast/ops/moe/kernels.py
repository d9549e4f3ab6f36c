"""MoE kernel families: which ``kernel_source`` rows a family names, which family a kernel
belongs to, and TensorRT-LLM's small-batch NVFP4 kernel preference (see
:mod:`infercast.ops.moe.block`, 'TensorRT-LLM NVFP4 at small batch')."""

from __future__ import annotations

import numpy as np

from .query import PAIR_COLS, SITE_COLS

NONGATED_TAG = "nongated"
#: TensorRT-LLM's small-batch NVFP4 expert kernel (see :func:`_prefer_low_latency`)
TRTLLM_LOW_LATENCY_KERNEL = "moe_torch_flow_min_latency"
#: tokens per rank (after attention-DP gathering) up to which TensorRT-LLM's NVFP4 experts are
#: costed by the low-latency kernel's rows: the decode steps' token counts (see
#: :func:`_prefer_low_latency`, "Above 128 tokens")
TRTLLM_LOW_LATENCY_MAX_TOKENS = 512


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
