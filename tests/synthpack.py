"""Synthetic perf-data pack for infercast unit tests.

``make_pack(root)`` writes a tiny pack with the same on-disk layout, YAML keys
and Parquet schemas as the AIC data pack (aiconfigurator-core 0.12.0), but
every latency comes from a closed-form formula defined here, so tests can
compute the exact expected value with the exported functions.

Layout written under ``root``::

    systems/query_versions.yaml        trtllm current 1.0 / previous 0.9 (next derives to 1.1)
                                       vllm current 2.0 / previous null
    systems/synth_gpu.yaml             gpu / node / misc sections (see SYSTEM_* below)
    systems/data/synth_gpu/<family>/<backend>/<version>/<stem>.parquet
    model_configs/synth--tiny-llama_config.json
    model_configs/synth--tiny-llama-fp8_config.json

Formulas (all latencies in milliseconds; vectorised over numpy arrays):

    gemm_ms(dtype, m, n, k) = GEMM_A_MS
                              + 2*m*n*k / GEMM_FLOPS[dtype] * 1e3
                              + (m*k + k*n + m*n) * 2 / GEMM_BW * 1e3
        GEMM_A_MS = 0.005, GEMM_FLOPS = {bfloat16: 5e13, fp8_block: 1e14}, GEMM_BW = 5e11
    ctx_ms(batch, isl, num_heads, head_dim, kv_dtype)
        = (0.01 + batch*num_heads*head_dim*isl*isl*2e-9) * (0.9 if kv fp8 else 1)
    gen_ms(batch, step, num_kv_heads, head_dim, kv_dtype)
        = 0.005 + batch*num_kv_heads*head_dim*(step+1)*2*kv_bytes / 1e12 * 1e3
        kv_bytes = 2 for bfloat16, 1 for fp8
    ar_ms(message_size, num_gpus) = 0.003 + message_size*2*2*(g-1)/g / 2e11 * 1e3
    nccl_ms(op, message_size, num_gpus)
        = 0.01 + message_size*2*factor*(g-1)/g / 1.5e11 * 1e3
        factor = 2 for all_reduce, 1 for all_gather / reduce_scatter / alltoall

Each table stores ``formula * VERSION_FACTOR[(stem, backend, version)]``
(multiplying the whole formula, constant term included):
gemm trtllm 0.9 x1.5, gemm vllm 2.0 x1.2, context attention trtllm 0.9 x2,
generation attention vllm 1.5 x1.1, everything else x1.

Deliberate quirks (each exported as a module constant):

* RELABELLED: the ``version`` column of gemm_perf trtllm 1.0 reads
  "1.0.0-relabel"; the directory name ("1.0") is authoritative.
* LARGE_STRING_TABLE: nccl_perf stores its string columns as Arrow
  ``large_string`` (all other tables use ``string``).
* Duplicates: gemm trtllm 1.0 holds GEMM_DUP_KEY three times with latency
  formula * GEMM_DUP_FACTORS (0.9, 1.0, 1.3): the median is the formula, the
  mean is not. nccl_perf holds every row twice with identical latency.
* Ragged grid: gemm trtllm 1.0 has no bfloat16 row at GEMM_DROPPED
  (m=4096, n=2048, k=2048) for any kernel; attention grids are truncated at
  batch*isl > CTX_MAX_TOKENS and batch*step > GEN_MAX_BATCH_STEP.
* Second kernel: gemm trtllm 1.0 also has kernel_source "alt_kernel" for
  bfloat16 at GEMM_ALT_FACTOR (1.1) x latency; the default kernel is
  "torch_flow".
* Column order: the vllm generation table puts ``window_size`` after ``step``
  (as in the real pack); readers must select columns by name.
* Reuse: trtllm 1.1 (the derived "next") holds only reuse.yaml, borrowing
  gemm_perf from 1.0; it has no collection_meta.yaml.
* Missing table / backfill: vllm 2.0 has gemm but no attention table;
  vllm 1.5 has generation_attention_perf (backfill source); no vllm version
  has context_attention_perf.
* Options: ``lfs_pointer_table=<stem>`` replaces that table (trtllm 1.0, or
  nccl_perf) by a Git LFS pointer text; ``corrupt_table=<stem>`` replaces it
  by garbage bytes.

Everything is deterministic and takes well under a second to write.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "Pack",
    "make_pack",
    "gemm_ms",
    "ctx_ms",
    "gen_ms",
    "ar_ms",
    "nccl_ms",
    "VERSION_FACTOR",
]

# --------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------
SYSTEM = "synth_gpu"
DEVICE = "Synth GPU"
MODEL_ID = "synth/tiny-llama"
MODEL_ID_FP8 = "synth/tiny-llama-fp8"

# --------------------------------------------------------------------------
# System YAML values
# --------------------------------------------------------------------------
SYSTEM_GPU: Mapping[str, Any] = MappingProxyType(
    {
        "mem_bw": 1_000_000_000_000,
        "mem_bw_empirical_scaling_factor": 0.5,
        "mem_empirical_constant_latency": 1e-6,
        "mem_capacity": 17_179_869_184,
        "bfloat16_tc_flops": 100_000_000_000_000,
        "int8_tc_flops": 200_000_000_000_000,
        "fp8_tc_flops": 200_000_000_000_000,
        "power": 500,
        "sm_version": 90,
    }
)
SYSTEM_NODE: Mapping[str, Any] = MappingProxyType(
    {
        "num_gpus_per_node": 8,
        "inter_node_bw": 50_000_000_000,
        "intra_node_bw": 200_000_000_000,
        "pcie_bw": 64_000_000_000,
        "p2p_latency": 1e-5,
    }
)
SYSTEM_NCCL_MEM: Mapping[int, int] = MappingProxyType(
    {1: 0, 2: 100_000_000, 4: 100_000_000, 8: 100_000_000}
)
SYSTEM_OTHER_MEM = 1_000_000_000
NCCL_VERSION = "2.0"

# --------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------
TRTLLM_CURRENT = "1.0"
TRTLLM_PREVIOUS = "0.9"
TRTLLM_NEXT = "1.1"  # reuse-only directory
VLLM_CURRENT = "2.0"
VLLM_BACKFILL = "1.5"

# --------------------------------------------------------------------------
# Formula constants
# --------------------------------------------------------------------------
GEMM_A_MS = 0.005
GEMM_FLOPS: Mapping[str, float] = MappingProxyType({"bfloat16": 5e13, "fp8_block": 1e14})
GEMM_BW = 5e11
GEMM_ELEM_BYTES = 2

CTX_A_MS = 0.01
CTX_COEF = 2e-9
CTX_FP8_FACTOR = 0.9

GEN_A_MS = 0.005
GEN_BW = 1e12
GEN_KV_BYTES: Mapping[str, int] = MappingProxyType({"bfloat16": 2, "fp8": 1})

AR_A_MS = 0.003
AR_BW = 2e11
AR_ELEM_BYTES = 2

NCCL_A_MS = 0.01
NCCL_BW = 1.5e11
NCCL_ELEM_BYTES = 2
NCCL_OP_FACTOR: Mapping[str, int] = MappingProxyType(
    {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "alltoall": 1}
)

# --------------------------------------------------------------------------
# Grids
# --------------------------------------------------------------------------
GEMM_DTYPES = ("bfloat16", "fp8_block")
GEMM_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
GEMM_NK = (64, 128, 256, 512, 1024, 2048)
GEMM_DEFAULT_KERNEL = "torch_flow"
GEMM_ALT_KERNEL = "alt_kernel"
GEMM_ALT_FACTOR = 1.1
GEMM_DUP_KEY = ("bfloat16", 64, 256, 256)  # (gemm_dtype, m, n, k) in trtllm 1.0, torch_flow
GEMM_DUP_FACTORS = (0.9, 1.0, 1.3)
GEMM_DROPPED = ("bfloat16", 4096, 2048, 2048)  # absent from trtllm 1.0 (every kernel)
VLLM_GEMM_KERNELS: Mapping[str, str] = MappingProxyType(
    {"bfloat16": "torch.nn.functional.linear", "fp8_block": "CutlassFp8BlockScaledMMKernel"}
)

# (num_heads, num_key_value_heads, head_dim)
ATTN_SITES = ((8, 2, 32), (4, 1, 32), (2, 1, 32), (1, 1, 32), (16, 4, 32))
ATTN_KV_DTYPES = ("bfloat16", "fp8")
CTX_BATCH = (1, 2, 4, 8, 16)
CTX_ISL = (16, 32, 64, 128, 256, 512, 1024, 2048)
CTX_MAX_TOKENS = 8192  # rows with batch*isl > this are absent
GEN_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GEN_STEP = tuple(2**k - 1 for k in range(1, 13))  # 1, 3, ..., 4095
GEN_MAX_BATCH_STEP = 262144  # rows with batch*step > this are absent
VLLM_ATTN_KERNEL = "vllm_flash_attn_fa3"

AR_NUM_GPUS = (2, 4, 8)
AR_MESSAGE_SIZES = tuple(2**p for p in range(7, 25))  # elements
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
NCCL_NUM_GPUS = (2, 4, 8)
NCCL_MESSAGE_SIZES = tuple(2**p for p in range(8, 27))  # elements
NCCL_COPIES = 2  # every nccl row is written this many times

# --------------------------------------------------------------------------
# Quirk markers
# --------------------------------------------------------------------------
RELABELLED = ("gemm_perf", "trtllm", TRTLLM_CURRENT)
RELABELLED_VERSION = "1.0.0-relabel"
LARGE_STRING_TABLE = ("nccl_perf", "nccl", NCCL_VERSION)

# (stem, backend, dir version) -> multiplier applied to the whole formula.
# ("gemm_perf", "trtllm", "1.1") is served via reuse.yaml from 1.0.
VERSION_FACTOR: Mapping[tuple[str, str, str], float] = MappingProxyType(
    {
        ("gemm_perf", "trtllm", TRTLLM_CURRENT): 1.0,
        ("gemm_perf", "trtllm", TRTLLM_NEXT): 1.0,
        ("gemm_perf", "trtllm", TRTLLM_PREVIOUS): 1.5,
        ("gemm_perf", "vllm", VLLM_CURRENT): 1.2,
        ("context_attention_perf", "trtllm", TRTLLM_CURRENT): 1.0,
        ("context_attention_perf", "trtllm", TRTLLM_PREVIOUS): 2.0,
        ("generation_attention_perf", "trtllm", TRTLLM_CURRENT): 1.0,
        ("generation_attention_perf", "vllm", VLLM_BACKFILL): 1.1,
        ("custom_allreduce_perf", "trtllm", TRTLLM_CURRENT): 1.0,
        ("nccl_perf", "nccl", NCCL_VERSION): 1.0,
    }
)

LFS_POINTER_HEADER = "version https://git-lfs.github.com/spec/v1"


# --------------------------------------------------------------------------
# Formula functions
# --------------------------------------------------------------------------
def _out(x: np.ndarray) -> Any:
    """Return a Python float for 0-d results, the array otherwise."""
    return float(x) if np.ndim(x) == 0 else x


def _lookup(values: Any, table: Mapping[str, float], what: str) -> np.ndarray:
    arr = np.asarray(values)
    out = np.zeros(arr.shape, dtype=np.float64)
    seen = np.zeros(arr.shape, dtype=bool)
    for key, val in table.items():
        mask = arr == key
        out[mask] = val
        seen |= mask
    if not np.all(seen):
        bad = sorted({str(v) for v in np.atleast_1d(arr)[~np.atleast_1d(seen)]})
        raise ValueError(f"unknown {what}: {bad}")
    return out


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def gemm_ms(dtype: Any, m: Any, n: Any, k: Any) -> Any:
    """GEMM latency in ms (version factor 1)."""
    m, n, k = _f(m), _f(n), _f(k)
    flops = _lookup(dtype, GEMM_FLOPS, "gemm dtype")
    compute = 2.0 * m * n * k / flops * 1e3
    memory = (m * k + k * n + m * n) * GEMM_ELEM_BYTES / GEMM_BW * 1e3
    return _out(GEMM_A_MS + compute + memory)


def ctx_ms(batch: Any, isl: Any, num_heads: Any, head_dim: Any, kv_dtype: Any = "bfloat16") -> Any:
    """Context-attention latency in ms (version factor 1)."""
    b, s, h, d = _f(batch), _f(isl), _f(num_heads), _f(head_dim)
    kv = _lookup(kv_dtype, {"bfloat16": 1.0, "fp8": CTX_FP8_FACTOR}, "kv_cache_dtype")
    return _out((CTX_A_MS + b * h * d * s * s * CTX_COEF) * kv)


def gen_ms(
    batch: Any, step: Any, num_key_value_heads: Any, head_dim: Any, kv_dtype: Any = "bfloat16"
) -> Any:
    """Generation-attention latency in ms (version factor 1); ``step`` = cached tokens."""
    b, t, hkv, d = _f(batch), _f(step), _f(num_key_value_heads), _f(head_dim)
    kv_bytes = _lookup(kv_dtype, GEN_KV_BYTES, "kv_cache_dtype")
    return _out(GEN_A_MS + b * hkv * d * (t + 1.0) * 2.0 * kv_bytes / GEN_BW * 1e3)


def ar_ms(message_size: Any, num_gpus: Any) -> Any:
    """Custom all-reduce latency in ms; ``message_size`` is an element count."""
    x, g = _f(message_size), _f(num_gpus)
    return _out(AR_A_MS + x * AR_ELEM_BYTES * 2.0 * (g - 1.0) / g / AR_BW * 1e3)


def nccl_ms(op: Any, message_size: Any, num_gpus: Any) -> Any:
    """NCCL collective latency in ms; ``message_size`` is an element count."""
    x, g = _f(message_size), _f(num_gpus)
    factor = _lookup(op, NCCL_OP_FACTOR, "nccl op")
    return _out(NCCL_A_MS + x * NCCL_ELEM_BYTES * factor * (g - 1.0) / g / NCCL_BW * 1e3)


# --------------------------------------------------------------------------
# Pack handle
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Pack:
    root: Path
    systems_dir: Path
    model_configs_dir: Path
    system: str = SYSTEM
    # relative path (from systems_dir, posix) -> number of rows written
    tables: Mapping[str, int] = field(default_factory=dict)

    gemm_ms = staticmethod(gemm_ms)
    ctx_ms = staticmethod(ctx_ms)
    gen_ms = staticmethod(gen_ms)
    ar_ms = staticmethod(ar_ms)
    nccl_ms = staticmethod(nccl_ms)
    version_factor: ClassVar[Mapping[tuple[str, str, str], float]] = VERSION_FACTOR

    @property
    def data_dir(self) -> Path:
        return self.systems_dir / "data" / self.system

    def table_path(self, family: str, backend: str, version: str, stem: str) -> Path:
        return self.data_dir / family / backend / version / f"{stem}.parquet"


# --------------------------------------------------------------------------
# Table builders: each returns (schema, columns dict)
# --------------------------------------------------------------------------
def _schema(fields: list[tuple[str, pa.DataType]], large: bool) -> pa.Schema:
    s = pa.large_string() if large else pa.string()
    return pa.schema([(name, s if t == "str" else t) for name, t in fields])


_DESC = [("framework", "str"), ("version", "str"), ("device", "str"), ("op_name", "str"), ("kernel_source", "str")]


def _desc(n: int, framework: str, version: str, op_name: str, kernels: list[str]) -> dict[str, list]:
    return {
        "framework": [framework] * n,
        "version": [version] * n,
        "device": [DEVICE] * n,
        "op_name": [op_name] * n,
        "kernel_source": kernels,
    }


def _gemm_table(backend: str, version: str, quirks: bool) -> tuple[pa.Schema, dict]:
    factor = VERSION_FACTOR[("gemm_perf", backend, version)]
    rows: list[tuple[str, str, int, int, int, float]] = []  # kernel, dtype, m, n, k, multiplier
    for dtype in GEMM_DTYPES:
        kernels = [GEMM_DEFAULT_KERNEL] if backend == "trtllm" else [VLLM_GEMM_KERNELS[dtype]]
        if quirks and dtype == "bfloat16":
            kernels.append(GEMM_ALT_KERNEL)
        for kern in kernels:
            mult = GEMM_ALT_FACTOR if kern == GEMM_ALT_KERNEL else 1.0
            for m, n, k in itertools.product(GEMM_M, GEMM_NK, GEMM_NK):
                key = (dtype, m, n, k)
                if quirks and key == GEMM_DROPPED:
                    continue
                if quirks and key == GEMM_DUP_KEY and kern == GEMM_DEFAULT_KERNEL:
                    for f in GEMM_DUP_FACTORS:
                        rows.append((kern, dtype, m, n, k, f))
                    continue
                rows.append((kern, dtype, m, n, k, mult))
    kern_c, dt_c, m_c, n_c, k_c, mult_c = (list(c) for c in zip(*rows))
    lat = np.asarray(gemm_ms(np.asarray(dt_c), m_c, n_c, k_c)) * np.asarray(mult_c) * factor
    framework = "TRTLLM" if backend == "trtllm" else "VLLM"
    label = RELABELLED_VERSION if (("gemm_perf", backend, version) == RELABELLED) else version
    cols = _desc(len(rows), framework, label, "gemm", kern_c)
    cols.update({"gemm_dtype": dt_c, "m": m_c, "n": n_c, "k": k_c, "latency": lat})
    schema = _schema(
        _DESC + [("gemm_dtype", "str"), ("m", pa.int64()), ("n", pa.int64()), ("k", pa.int64()), ("latency", pa.float64())],
        large=False,
    )
    return schema, cols


def _attn_table(stem: str, backend: str, version: str) -> tuple[pa.Schema, dict]:
    factor = VERSION_FACTOR[(stem, backend, version)]
    generation = stem == "generation_attention_perf"
    keys: list[tuple[int, int, int, int, int, int, str]] = []  # batch, isl, step, h, hkv, d, kv
    for (h, hkv, d), kv in itertools.product(ATTN_SITES, ATTN_KV_DTYPES):
        if generation:
            for b, t in itertools.product(GEN_BATCH, GEN_STEP):
                if b * t <= GEN_MAX_BATCH_STEP:
                    keys.append((b, 1, t, h, hkv, d, kv))
        else:
            for b, s in itertools.product(CTX_BATCH, CTX_ISL):
                if b * s <= CTX_MAX_TOKENS:
                    keys.append((b, s, 0, h, hkv, d, kv))
    b_c, s_c, t_c, h_c, hkv_c, d_c, kv_c = (list(c) for c in zip(*keys))
    kv_arr = np.asarray(kv_c)
    if generation:
        lat = np.asarray(gen_ms(b_c, t_c, hkv_c, d_c, kv_arr)) * factor
    else:
        lat = np.asarray(ctx_ms(b_c, s_c, h_c, d_c, kv_arr)) * factor
    n = len(keys)
    framework = "TRTLLM" if backend == "trtllm" else "VLLM"
    kernel = "torch_flow" if backend == "trtllm" else VLLM_ATTN_KERNEL
    op_name = "generation_attention" if generation else "context_attention"
    cols = _desc(n, framework, version, op_name, [kernel] * n)
    cols.update(
        {
            "batch_size": b_c,
            "isl": s_c,
            "num_heads": h_c,
            "num_key_value_heads": hkv_c,
            "head_dim": d_c,
            "window_size": [0] * n,
            "beam_width": [1] * n,
            "attn_dtype": ["bfloat16"] * n,
            "kv_cache_dtype": kv_c,
            "step": t_c,
            "latency": lat,
        }
    )
    i64 = pa.int64()
    axes = [("batch_size", i64), ("isl", i64), ("num_heads", i64), ("num_key_value_heads", i64), ("head_dim", i64)]
    if backend == "vllm":  # real vllm tables put window_size last
        tail = [("beam_width", i64), ("attn_dtype", "str"), ("kv_cache_dtype", "str"), ("step", i64), ("window_size", i64)]
    else:
        tail = [("window_size", i64), ("beam_width", i64), ("attn_dtype", "str"), ("kv_cache_dtype", "str"), ("step", i64)]
    schema = _schema(_DESC + axes + tail + [("latency", pa.float64())], large=False)
    return schema, cols


def _allreduce_table() -> tuple[pa.Schema, dict]:
    keys = list(itertools.product(AR_NUM_GPUS, AR_MESSAGE_SIZES))
    g_c, x_c = (list(c) for c in zip(*keys))
    lat = np.asarray(ar_ms(x_c, g_c)) * VERSION_FACTOR[("custom_allreduce_perf", "trtllm", TRTLLM_CURRENT)]
    n = len(keys)
    cols = _desc(n, "TRTLLM", TRTLLM_CURRENT, "all_reduce", ["TRTLLM"] * n)
    cols.update(
        {
            "allreduce_dtype": ["bfloat16"] * n,
            "num_gpus": g_c,
            "message_size": x_c,
            "latency": lat,
            "implementation": ["trtllm"] * n,
        }
    )
    schema = _schema(
        _DESC
        + [
            ("allreduce_dtype", "str"),
            ("num_gpus", pa.int64()),
            ("message_size", pa.int64()),
            ("latency", pa.float64()),
            ("implementation", "str"),
        ],
        large=False,
    )
    return schema, cols


def _nccl_table() -> tuple[pa.Schema, dict]:
    keys = [
        key
        for key in itertools.product(NCCL_OPS, NCCL_NUM_GPUS, NCCL_MESSAGE_SIZES)
        for _ in range(NCCL_COPIES)
    ]
    op_c, g_c, x_c = (list(c) for c in zip(*keys))
    lat = np.asarray(nccl_ms(np.asarray(op_c), x_c, g_c)) * VERSION_FACTOR[LARGE_STRING_TABLE]
    n = len(keys)
    cols = _desc(n, "TRTLLM", NCCL_VERSION, "", ["NCCL"] * n)
    cols["op_name"] = op_c
    cols.update({"nccl_dtype": ["half"] * n, "num_gpus": g_c, "message_size": x_c, "latency": lat})
    schema = _schema(
        _DESC + [("nccl_dtype", "str"), ("num_gpus", pa.int64()), ("message_size", pa.int64()), ("latency", pa.float64())],
        large=True,
    )
    return schema, cols


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------
# (family, backend, version, stem, builder)
_TABLES: tuple[tuple[str, str, str, str, Any], ...] = (
    ("gemm", "trtllm", TRTLLM_CURRENT, "gemm_perf", lambda: _gemm_table("trtllm", TRTLLM_CURRENT, quirks=True)),
    ("gemm", "trtllm", TRTLLM_PREVIOUS, "gemm_perf", lambda: _gemm_table("trtllm", TRTLLM_PREVIOUS, quirks=False)),
    ("gemm", "vllm", VLLM_CURRENT, "gemm_perf", lambda: _gemm_table("vllm", VLLM_CURRENT, quirks=False)),
    (
        "attention", "trtllm", TRTLLM_CURRENT, "context_attention_perf",
        lambda: _attn_table("context_attention_perf", "trtllm", TRTLLM_CURRENT),
    ),
    (
        "attention", "trtllm", TRTLLM_CURRENT, "generation_attention_perf",
        lambda: _attn_table("generation_attention_perf", "trtllm", TRTLLM_CURRENT),
    ),
    (
        "attention", "trtllm", TRTLLM_PREVIOUS, "context_attention_perf",
        lambda: _attn_table("context_attention_perf", "trtllm", TRTLLM_PREVIOUS),
    ),
    (
        "attention", "vllm", VLLM_BACKFILL, "generation_attention_perf",
        lambda: _attn_table("generation_attention_perf", "vllm", VLLM_BACKFILL),
    ),
    ("comm", "trtllm", TRTLLM_CURRENT, "custom_allreduce_perf", _allreduce_table),
    ("comm", "nccl", NCCL_VERSION, "nccl_perf", _nccl_table),
)

# Stems that lfs_pointer_table / corrupt_table may name -> (family, backend, version)
_DAMAGEABLE: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        stem: (family, backend, version)
        for family, backend, version, stem, _ in _TABLES
        if backend == "trtllm" and version == TRTLLM_CURRENT
    }
    | {"nccl_perf": ("comm", "nccl", NCCL_VERSION)}
)


def _write_parquet(path: Path, schema: pa.Schema, cols: dict) -> int:
    arrays = [pa.array(cols[f.name], type=f.type) for f in schema]
    table = pa.Table.from_arrays(arrays, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return table.num_rows


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _system_yaml() -> str:
    g, nd = SYSTEM_GPU, SYSTEM_NODE
    lines = [
        "# Synthetic system for infercast unit tests (not real hardware).",
        f"data_dir: data/{SYSTEM} # relative to systems_dir",
        "gpu:",
        f"  mem_bw: {g['mem_bw']} # 1 TB/s",
        f"  mem_bw_empirical_scaling_factor: {g['mem_bw_empirical_scaling_factor']}",
        "  mem_empirical_constant_latency: 0.000001 # 1us",
        f"  mem_capacity: {g['mem_capacity']} # 16GiB",
        f"  bfloat16_tc_flops: {g['bfloat16_tc_flops']}",
        f"  int8_tc_flops: {g['int8_tc_flops']}",
        f"  fp8_tc_flops: {g['fp8_tc_flops']}",
        f"  power: {g['power']}  # Watt",
        f"  sm_version: {g['sm_version']}",
        "",
        "node:",
        f"  num_gpus_per_node: {nd['num_gpus_per_node']}",
        f"  inter_node_bw: {nd['inter_node_bw']}  # Byte/s per GPU, single direction",
        f"  intra_node_bw: {nd['intra_node_bw']}  # Byte/s per GPU, single direction",
        f"  pcie_bw: {nd['pcie_bw']}",
        "  p2p_latency: 0.00001  # 10us",
        "",
        "misc:",
        "  nccl_mem:",
        *(f"    {k}: {v}" for k, v in SYSTEM_NCCL_MEM.items()),
        f"  other_mem: {SYSTEM_OTHER_MEM}",
        f"  nccl_version: '{NCCL_VERSION}'",
        "",
    ]
    return "\n".join(lines)


def _query_versions_yaml() -> str:
    return (
        "# Synthetic queryable-version slots; next (trtllm) derives to 1.1.\n"
        "schema_version: 1\n"
        "defaults:\n"
        f'  trtllm: {{current: "{TRTLLM_CURRENT}", previous: "{TRTLLM_PREVIOUS}"}}\n'
        f'  vllm: {{current: "{VLLM_CURRENT}", previous: null}}\n'
        "overrides: {}\n"
    )


def _collection_meta_yaml(backend: str, version: str, stems: list[str]) -> str:
    lines = [
        "schema_version: 1",
        "provenance: collected",
        "runtime:",
        f"  framework: {backend}",
        f'  version: "{version}"',
        "tables:",
        *(f"  {stem}:\n    status: complete" for stem in stems),
        "",
    ]
    return "\n".join(lines)


def _reuse_yaml() -> str:
    return (
        "schema_version: 1\n"
        "reuse:\n"
        f'- {{table: gemm_perf, from_version: "{TRTLLM_CURRENT}", reason: test, approved_by: test}}\n'
    )


def _model_config(fp8: bool) -> dict:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 512,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 8,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": 1000,
    }
    if fp8:
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
    return cfg


def _lfs_pointer(real: bytes) -> str:
    return f"{LFS_POINTER_HEADER}\noid sha256:{hashlib.sha256(real).hexdigest()}\nsize {len(real)}\n"


_GARBAGE = bytes(range(256))[::-1] * 4  # 1 KiB, no parquet magic


def make_pack(
    root: Path,
    *,
    lfs_pointer_table: str | None = None,
    corrupt_table: str | None = None,
) -> Pack:
    """Write the synthetic pack under ``root`` and return a :class:`Pack` handle.

    ``lfs_pointer_table`` / ``corrupt_table`` name a table stem (one of the
    trtllm 1.0 tables: gemm_perf, context_attention_perf,
    generation_attention_perf, custom_allreduce_perf; or nccl_perf) whose
    parquet is replaced by a Git LFS pointer text / by garbage bytes.
    """
    for opt, val in (("lfs_pointer_table", lfs_pointer_table), ("corrupt_table", corrupt_table)):
        if val is not None and val not in _DAMAGEABLE:
            raise ValueError(f"{opt}={val!r}: expected one of {sorted(_DAMAGEABLE)}")
    if lfs_pointer_table is not None and lfs_pointer_table == corrupt_table:
        raise ValueError("lfs_pointer_table and corrupt_table name the same table")

    root = Path(root)
    systems = root / "systems"
    models = root / "model_configs"
    data = systems / "data" / SYSTEM

    _write_text(systems / "query_versions.yaml", _query_versions_yaml())
    _write_text(systems / f"{SYSTEM}.yaml", _system_yaml())

    written: dict[str, int] = {}
    per_dir: dict[tuple[str, str, str], list[str]] = {}
    for family, backend, version, stem, build in _TABLES:
        path = data / family / backend / version / f"{stem}.parquet"
        schema, cols = build()
        written[path.relative_to(systems).as_posix()] = _write_parquet(path, schema, cols)
        per_dir.setdefault((family, backend, version), []).append(stem)

    for (family, backend, version), stems in per_dir.items():
        _write_text(data / family / backend / version / "collection_meta.yaml", _collection_meta_yaml(backend, version, stems))
    _write_text(data / "gemm" / "trtllm" / TRTLLM_NEXT / "reuse.yaml", _reuse_yaml())

    for stem, damage in ((lfs_pointer_table, "lfs"), (corrupt_table, "corrupt")):
        if stem is None:
            continue
        family, backend, version = _DAMAGEABLE[stem]
        path = data / family / backend / version / f"{stem}.parquet"
        if damage == "lfs":
            path.write_text(_lfs_pointer(path.read_bytes()), encoding="utf-8")
        else:
            path.write_bytes(_GARBAGE)
        written.pop(path.relative_to(systems).as_posix(), None)

    models.mkdir(parents=True, exist_ok=True)
    for name, fp8 in (("synth--tiny-llama", False), ("synth--tiny-llama-fp8", True)):
        _write_text(models / f"{name}_config.json", json.dumps(_model_config(fp8), indent=2) + "\n")

    return Pack(
        root=root,
        systems_dir=systems,
        model_configs_dir=models,
        tables=MappingProxyType(written),
    )


# --------------------------------------------------------------------------
# Support matrix (written on request, into a pack of the test's own)
# --------------------------------------------------------------------------
#: a model whose architecture infercast does not model
FOREIGN_MODEL_ID = "synth/foreign-family"
FOREIGN_ARCH = "SynthForeignForCausalLM"
#: tiny-llama with DEEP_LAYERS layers: ~22 GB of bf16 weights, more than one synth GPU's 16 GiB
#: and less than half of two GPUs' (so TP 2 holds it and one 512-token request)
DEEP_MODEL_ID = "synth/deep-llama"
DEEP_LAYERS = 20_000
MATRIX_COLUMNS = ("HuggingFaceID", "Architecture", "System", "Backend", "Version", "Mode", "Status", "ErrMsg",
                  "Command", "Source")


def add_support_models(pack: Pack) -> None:
    """Write FOREIGN_MODEL_ID and DEEP_MODEL_ID configs into ``pack``'s model_configs/."""
    foreign = _model_config(False)
    foreign["architectures"] = [FOREIGN_ARCH]
    deep = _model_config(False)
    deep["num_hidden_layers"] = DEEP_LAYERS
    for mid, cfg in ((FOREIGN_MODEL_ID, foreign), (DEEP_MODEL_ID, deep)):
        _write_text(pack.model_configs_dir / f"{mid.replace('/', '--')}_config.json", json.dumps(cfg, indent=2) + "\n")


def write_support_matrix(pack: Pack, rows: list[dict]) -> Path:
    """Write ``systems/support_matrix/<SYSTEM>.csv`` (+ index.json) in the pack's format.

    Each row: model, arch, backend, version, mode, status, and optionally ``gpus`` (the command's
    --total-gpus, default 8) and ``error`` (the exception line, stored as the last line of a
    traceback whose newlines are the two characters backslash-n, as in the real pack)."""
    import csv

    d = pack.systems_dir / "support_matrix"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{SYSTEM}.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(MATRIX_COLUMNS)
        for r in rows:
            err = r.get("error")
            errmsg = f'Traceback (most recent call last):\\n  File "x.py", line 1, in f\\n{err}\\n' if err else ""
            cmd = (f"aiconfigurator cli default --model-path {r['model']} --total-gpus {r.get('gpus', 8)} "
                   f"--system {SYSTEM} --backend {r['backend']} --backend-version {r['version']} --isl 256 --osl 256")
            w.writerow([r["model"], r["arch"], SYSTEM, r["backend"], r["version"], r["mode"], r["status"], errmsg, cmd,
                        "silicon"])
    _write_text(d / "index.json", json.dumps({"files": [path.name]}) + "\n")
    return path
