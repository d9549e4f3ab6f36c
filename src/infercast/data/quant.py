"""Quantisation modes: storage bytes per weight, compute dtypes, KV-cache bytes."""

from __future__ import annotations

#: GEMM / MoE weight quant modes and their storage bytes per weight (scales included).
WEIGHT_BYTES = {
    "bfloat16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0 + 4.0 / (128 * 128),
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
    "w4a16_mxfp4": 0.5 + 1.0 / 32,
    "w4a8_mxfp4_mxfp8": 0.5 + 1.0 / 32,
    "int4_wo": 0.5 + 2.0 / 128,
    "int8_wo": 1.0 + 2.0 / 128,
    "w4afp8": 0.5 + 2.0 / 128,
    "sq": 1.0,
}
#: quant mode -> tensor-core compute dtype (for speed-of-light and hardware checks)
COMPUTE_DTYPE = {
    "bfloat16": "bfloat16",
    "fp8": "fp8",
    "fp8_block": "fp8",
    "nvfp4": "fp4",
    "mxfp4": "bfloat16",
    "w4a16_mxfp4": "bfloat16",
    "w4a8_mxfp4_mxfp8": "fp8",
    "int4_wo": "bfloat16",
    "int8_wo": "bfloat16",
    "w4afp8": "fp8",
    "sq": "int8",
}
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
GEMM_QUANTS = tuple(WEIGHT_BYTES)
KV_QUANTS = tuple(KV_BYTES)
