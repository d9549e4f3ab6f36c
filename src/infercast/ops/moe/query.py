"""MoE query inputs: shape validation, the quant modes and their ``mxfp4`` alias, the expert
block's speed of light, the shared axes and column names (rules: :mod:`infercast.ops.moe.block`)."""

from __future__ import annotations

from functools import partial
import math

import numpy as np

from ...data.quant import COMPUTE_DTYPE, WEIGHT_BYTES
from ...errors import InvalidInputError
from ...interp import sol
from ..base import OpDB

#: the tokens axis of SOL / empirical grids (the collected num_tokens list of moe_perf)
TOKENS_AXIS = np.array(
    [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048,
     3072, 4096, 6144, 8192, 12288, 16384], dtype=float,
)


#: interpolation space of the num_tokens axis (see :mod:`infercast.ops.moe.block`)
TOKEN_SCALE = ("linear",)

SITE_COLS = ("hidden_size", "inter_size", "topk", "num_experts")
PAIR_COLS = ("moe_tp_size", "moe_ep_size")
MOE_QUANTS = ("bfloat16", "fp8", "fp8_block", "nvfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8", "int4_wo", "w4afp8")
MXFP4_ALIAS = "mxfp4"


DEFAULT_DISTRIBUTION = "balanced"


PHASE_ALIASES = {"context": "context", "prefill": "context", "generation": "generation", "decode": "generation"}


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
    """Table ``moe_dtype`` values to try for ``quant``, in order (the alias rule; see :mod:`infercast.ops.moe.block`)."""
    if quant == MXFP4_ALIAS:
        if has_fp4_hardware(system):
            return ("w4a8_mxfp4_mxfp8", "w4a16_mxfp4")
        return ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
    if quant not in WEIGHT_BYTES:
        raise InvalidInputError(f"unknown MoE quant mode {quant!r}", available=[*MOE_QUANTS, MXFP4_ALIAS])
    return (quant,)


def moe_sol_fn(db: OpDB, quant: str, hidden, inter, topk, experts, moe_tp, moe_ep, gated: bool = True):
    return partial(_moe_sol, db.system, COMPUTE_DTYPE[quant], WEIGHT_BYTES[quant], hidden, inter, topk, experts, moe_tp,
                   moe_ep, gated)


def _moe_sol(system, cdt, wb, hidden, inter, topk, experts, moe_tp, moe_ep, gated, tokens):
    """:func:`moe_sol_fn`'s function (a partial of it is picklable)."""
    return sol.moe(system, cdt, wb, tokens, hidden, inter, topk, experts, moe_tp, moe_ep, gated)[0]
