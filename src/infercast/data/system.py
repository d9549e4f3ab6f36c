"""System specs (``systems/<system>.yaml``) as typed objects. Units: bytes, bytes/s, FLOP/s, s, W."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from ..errors import DataFileError, UnknownSystemError
from .pack import Pack

#: YAML files in systems/ that are control files, not systems.
CONTROL_FILES = {"query_versions", "attention_lane_defaults", "perf_data_reuse_manifest"}

#: compute dtype -> FLOPS key in the YAML
FLOPS_KEYS = {
    "bfloat16": "bfloat16_tc_flops",
    "int8": "int8_tc_flops",
    "fp8": "fp8_tc_flops",
    "fp4": "fp4_tc_flops",
    "float32": "float32_tc_flops",
}


@dataclass(frozen=True)
class GpuSpec:
    mem_bw: float
    mem_bw_efficiency: float
    mem_latency_s: float
    mem_capacity: int
    tc_flops: dict[str, float]
    power_w: float
    sm_version: int | None

    @property
    def effective_mem_bw(self) -> float:
        return self.mem_bw * self.mem_bw_efficiency

    def flops(self, compute_dtype: str) -> float | None:
        return self.tc_flops.get(compute_dtype)


@dataclass(frozen=True)
class NodeSpec:
    gpus_per_node: int
    gpus_per_rack: int | None
    intra_node_bw: float
    inter_node_bw: float
    inter_rack_bw: float | None
    pcie_bw: float | None
    p2p_latency_s: float
    inter_rack_latency_s: float | None

    def bandwidth_for_group(self, group: int) -> tuple[float, str]:
        """Per-GPU one-direction bandwidth for a collective over ``group`` GPUs, and its tier."""
        if group <= self.gpus_per_node:
            return self.intra_node_bw, "intra-node"
        if self.gpus_per_rack and group <= self.gpus_per_rack:
            return self.inter_node_bw, "intra-rack"
        if self.gpus_per_rack:
            return (self.inter_rack_bw or self.inter_node_bw), "inter-rack"
        return self.inter_node_bw, "inter-node"


@dataclass(frozen=True)
class SystemSpec:
    name: str
    data_dir: Path
    gpu: GpuSpec
    node: NodeSpec
    nccl_mem: dict[int, int]
    other_mem: int
    nccl_version: str | None
    oneccl_version: str | None
    raw: dict = field(repr=False, compare=False)

    def nccl_mem_for(self, group: int) -> int:
        if group <= 1:
            return int(self.nccl_mem.get(1, 0))
        keys = sorted(k for k in self.nccl_mem if k >= group)
        k = keys[0] if keys else max(self.nccl_mem)
        return int(self.nccl_mem[k])


def list_systems(pack: Pack) -> list[str]:
    return sorted(
        p.stem for p in pack.systems_dir.glob("*.yaml") if p.stem not in CONTROL_FILES
    )


def _num(d: dict, key: str, default=None, *, where: str):
    v = d.get(key, default)
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError) as exc:
        raise DataFileError(f"{where}: {key} is not a number ({v!r})") from exc


@lru_cache(maxsize=64)
def _load_system(systems_dir: Path, name: str) -> SystemSpec:
    path = systems_dir / f"{name}.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DataFileError(f"cannot read system spec {path}", str(exc)) from exc
    gpu, node, misc = raw.get("gpu") or {}, raw.get("node") or {}, raw.get("misc") or {}
    where = str(path)
    for sect, keys in (("gpu", ("mem_bw", "mem_capacity")), ("node", ("num_gpus_per_node", "intra_node_bw"))):
        for k in keys:
            if (raw.get(sect) or {}).get(k) is None:
                raise DataFileError(f"{where}: missing {sect}.{k}")
    flops = {dt: float(gpu[key]) for dt, key in FLOPS_KEYS.items() if gpu.get(key) is not None}
    g = GpuSpec(
        mem_bw=_num(gpu, "mem_bw", where=where),
        mem_bw_efficiency=_num(gpu, "mem_bw_empirical_scaling_factor", 1.0, where=where),
        mem_latency_s=_num(gpu, "mem_empirical_constant_latency", 0.0, where=where),
        mem_capacity=int(gpu["mem_capacity"]),
        tc_flops=flops,
        power_w=_num(gpu, "power", 0.0, where=where),
        sm_version=int(gpu["sm_version"]) if gpu.get("sm_version") is not None else None,
    )
    n = NodeSpec(
        gpus_per_node=int(node["num_gpus_per_node"]),
        gpus_per_rack=int(node["num_gpus_per_rack"]) if node.get("num_gpus_per_rack") else None,
        intra_node_bw=_num(node, "intra_node_bw", where=where),
        inter_node_bw=_num(node, "inter_node_bw", node.get("intra_node_bw"), where=where),
        inter_rack_bw=_num(node, "inter_rack_bw", where=where),
        pcie_bw=_num(node, "pcie_bw", where=where),
        p2p_latency_s=_num(node, "p2p_latency", 1e-5, where=where),
        inter_rack_latency_s=_num(node, "inter_rack_latency", where=where),
    )
    return SystemSpec(
        name=name,
        data_dir=systems_dir / str(raw.get("data_dir", f"data/{name}")),
        gpu=g,
        node=n,
        nccl_mem={int(k): int(v) for k, v in (misc.get("nccl_mem") or {1: 0}).items()},
        other_mem=int(misc.get("other_mem", 0)),
        nccl_version=str(misc["nccl_version"]) if misc.get("nccl_version") is not None else None,
        oneccl_version=str(misc["oneccl_version"]) if misc.get("oneccl_version") is not None else None,
        raw=raw,
    )


def load_system(pack: Pack, name: str) -> SystemSpec:
    if name not in list_systems(pack):
        raise UnknownSystemError(
            f"unknown system {name!r}", f"no {name}.yaml in {pack.systems_dir}", list_systems(pack)
        )
    return _load_system(pack.systems_dir, name)
