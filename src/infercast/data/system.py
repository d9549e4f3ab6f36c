"""System specs (``systems/<system>.yaml``) as typed objects. Units: bytes, bytes/s, FLOP/s, s, W."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import DataFileError, UnknownSystemError
from .pack import Pack
from .yaml_cache import PackYamlError, read_pack_yaml

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

    @property
    def nvlink_gpus(self) -> int:
        """GPUs one NVLink domain joins: the rack on rack-scale systems (GB200 / GB300 NVL72,
        whose specs give ``num_gpus_per_rack``), else the node. Tensor parallelism and workers
        of a deployment stay within it."""
        return self.gpus_per_rack or self.gpus_per_node

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


def system_yaml_names(pack: Pack) -> list[str]:
    """Every ``<system>.yaml`` of the pack (control files excluded), loadable or not."""
    return sorted(
        p.stem for p in pack.systems_dir.glob("*.yaml") if p.stem not in CONTROL_FILES
    )


def scan_systems(pack: Pack) -> list[tuple[str, SystemSpec | None, str | None]]:
    """``(name, spec, None)`` for each system that loads, ``(name, None, reason)`` for each whose
    YAML is broken. Never raises for a broken system file (for listings)."""
    out: list[tuple[str, SystemSpec | None, str | None]] = []
    for name in system_yaml_names(pack):
        try:
            out.append((name, _load_system(pack.systems_dir, name), None))
        except DataFileError as exc:
            out.append((name, None, str(exc)))
    return out


_warned: set[tuple[str, str]] = set()


def list_systems(pack: Pack) -> list[str]:
    """Names of the pack's usable systems. A system whose YAML does not load is left out with a
    one-line warning (once per process) naming the file and what is wrong with it, so one broken
    file does not break a listing; :func:`load_system` of that name raises the DataFileError."""
    names = []
    for name, spec, problem in scan_systems(pack):
        if spec is not None:
            names.append(name)
        elif (str(pack.systems_dir), problem) not in _warned:
            _warned.add((str(pack.systems_dir), problem))
            import logging  # (only to warn: ~3 ms to import)

            logging.getLogger("infercast").warning("infercast: warning: skipped system %r: %s", name, problem)
    return names


# -- reading values -------------------------------------------------------------------------------
#: what a value must be: (test, words for the message)
_POSITIVE = (lambda x: x > 0, "a positive number")
_NON_NEGATIVE = (lambda x: x >= 0, "a number >= 0")


def _to_float(v) -> float | None:
    """``v`` as a finite float, or None. Numeric strings count: PyYAML reads ``141e9`` (no dot)
    as the string "141e9", which a user means as a number."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        try:
            v = float(v.strip().replace("_", ""))
        except ValueError:
            return None
    if not isinstance(v, (int, float)):
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def _bad(where: str, name: str, v, must: str) -> DataFileError:
    return DataFileError(f"system spec {where}: {name} must be {must}, got {v!r}")


def _num(d: dict, key: str, default=None, *, where: str, sect: str, rule=_POSITIVE):
    """``d[key]`` (or ``default``) as a float obeying ``rule``; None if absent and no default."""
    v = d.get(key)
    if v is None:
        v = default
    if v is None:
        return None
    x = _to_float(v)
    ok, must = rule
    if x is None or not ok(x):
        raise _bad(where, f"{sect}.{key}", v, must)
    return x


def _int(d: dict, key: str, default=None, *, where: str, sect: str, rule=_POSITIVE) -> int | None:
    """Like :func:`_num` for a count or a byte size: the value must be a whole number."""
    v = d.get(key)
    if v is None:
        v = default
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        x: float | int | None = v
    else:
        x = _to_float(v)
        if x is not None and not x.is_integer():
            x = None
    ok, must = rule
    if x is None or not ok(x):
        raise _bad(where, f"{sect}.{key}", v, must.replace("number", "whole number"))
    return int(x)


def _section(raw: dict, sect: str, where: str) -> dict:
    v = raw.get(sect)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DataFileError(f"system spec {where}: {sect} must be a mapping of keys to values, got {v!r}")
    return v


@lru_cache(maxsize=64)
def _load_system(systems_dir: Path, name: str) -> SystemSpec:
    path = systems_dir / f"{name}.yaml"
    try:
        raw = read_pack_yaml(path)
    except UnicodeDecodeError as exc:
        raise DataFileError(f"cannot read system spec {path}", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (OSError, PackYamlError) as exc:
        # PyYAML's messages span lines; the CLI prints one
        raise DataFileError(f"cannot read system spec {path}", " ".join(str(exc).split())) from exc
    where = str(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise DataFileError(f"system spec {where} is not a mapping of sections (gpu, node, misc)", f"got {type(raw).__name__}")
    gpu, node, misc = (_section(raw, s, where) for s in ("gpu", "node", "misc"))
    for sect, d, keys in (("gpu", gpu, ("mem_bw", "mem_capacity")), ("node", node, ("num_gpus_per_node", "intra_node_bw"))):
        for k in keys:
            if d.get(k) is None:
                raise DataFileError(f"{where}: missing {sect}.{k}")
    G = {"where": where, "sect": "gpu"}
    N = {"where": where, "sect": "node"}
    flops = {dt: _num(gpu, key, **G) for dt, key in FLOPS_KEYS.items() if gpu.get(key) is not None}
    g = GpuSpec(
        mem_bw=_num(gpu, "mem_bw", **G),
        mem_bw_efficiency=_num(gpu, "mem_bw_empirical_scaling_factor", 1.0, **G),
        mem_latency_s=_num(gpu, "mem_empirical_constant_latency", 0.0, **G, rule=_NON_NEGATIVE),
        mem_capacity=_int(gpu, "mem_capacity", **G),
        tc_flops=flops,
        power_w=_num(gpu, "power", 0.0, **G, rule=_NON_NEGATIVE),
        sm_version=_int(gpu, "sm_version", **G),
    )
    n = NodeSpec(
        gpus_per_node=_int(node, "num_gpus_per_node", **N),
        gpus_per_rack=_int(node, "num_gpus_per_rack", **N),
        intra_node_bw=_num(node, "intra_node_bw", **N),
        inter_node_bw=_num(node, "inter_node_bw", node.get("intra_node_bw"), **N),
        inter_rack_bw=_num(node, "inter_rack_bw", **N),
        pcie_bw=_num(node, "pcie_bw", **N),
        p2p_latency_s=_num(node, "p2p_latency", 1e-5, **N, rule=_NON_NEGATIVE),
        inter_rack_latency_s=_num(node, "inter_rack_latency", **N, rule=_NON_NEGATIVE),
    )
    nccl_raw = misc.get("nccl_mem")
    if nccl_raw is None:
        nccl_raw = {1: 0}
    if not isinstance(nccl_raw, dict) or not nccl_raw:
        raise DataFileError(f"system spec {where}: misc.nccl_mem must map GPU counts to bytes, got {nccl_raw!r}")
    nccl_mem = {}
    for k in nccl_raw:
        gpus = _int({"gpus": k}, "gpus", where=where, sect="misc.nccl_mem")  # the key: a GPU count
        nccl_mem[gpus] = _int(nccl_raw, k, where=where, sect="misc.nccl_mem", rule=_NON_NEGATIVE)
    return SystemSpec(
        name=name,
        data_dir=systems_dir / str(raw.get("data_dir", f"data/{name}")),
        gpu=g,
        node=n,
        nccl_mem=nccl_mem,
        other_mem=_int(misc, "other_mem", 0, where=where, sect="misc", rule=_NON_NEGATIVE),
        nccl_version=str(misc["nccl_version"]) if misc.get("nccl_version") is not None else None,
        oneccl_version=str(misc["oneccl_version"]) if misc.get("oneccl_version") is not None else None,
        raw=raw,
    )


def load_system(pack: Pack, name: str) -> SystemSpec:
    """The spec of one system. UnknownSystemError if it has no YAML, DataFileError if the YAML
    is unreadable or holds a value that cannot be right (non-numeric, zero or negative)."""
    names = system_yaml_names(pack)
    if name not in names:
        raise UnknownSystemError(f"unknown system {name!r}", f"no {name}.yaml in {pack.systems_dir}", names)
    return _load_system(pack.systems_dir, name)
