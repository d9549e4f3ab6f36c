"""Model configs: HF ``config.json`` (+ ModelOpt ``hf_quant_config.json``) by HF id or local path.

The pack stores ``model_configs/<org>--<name>_config.json``. Ids a user will type that the pack
spells differently resolve through documented aliases, and the result says so:

* organisation renames (``zhipuai/`` -> ``zai-org/``);
* ``Llama-3.1-*`` -> ``Meta-Llama-3.1-*`` and dropping ``-Instruct`` (same architecture);
* ``nvidia/<name>-NVFP4`` / ``-FP8`` -> the base model's config with that quantisation applied
  (the quantised checkpoint has the base architecture).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataFileError, DataPackNotFoundError, UnknownModelError
from .pack import Pack

ORG_RENAMES = {"zhipuai": "zai-org"}
QUANT_SUFFIXES = {"-nvfp4": "nvfp4", "-fp8": "fp8"}


@dataclass(frozen=True)
class ModelConfig:
    """A raw HF config with where it came from."""

    model_id: str  # what the user asked for
    resolved_id: str  # the config actually read
    config: dict = field(repr=False)
    hf_quant: dict | None = field(default=None, repr=False)
    alias_note: str | None = None
    quant_from_alias: str | None = None  # quantisation implied by the alias (e.g. nvfp4)


def _parse_json(path: Path) -> dict:
    if path.is_dir():
        raise DataFileError(f"model config {path} is a directory, not a file", "expected a JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(
            f"model config {path} is not UTF-8 text", f"{exc.reason} at byte {exc.start}; expected a JSON file"
        ) from None
    except OSError as exc:
        raise DataFileError(f"cannot read model config {path}", exc.strerror or str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Some HF configs carry bare Infinity/NaN (not strict JSON); Python's json accepts them
        # by default, so reaching here means the file is genuinely broken.
        raise DataFileError(f"model config {path} is not valid JSON") from None


def _sanitize(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_sanitize(v) for v in obj]
    return obj


def pack_model_ids(pack: Pack) -> dict[str, Path]:
    """HF id -> config path for every config in the pack.

    Raises :class:`DataPackNotFoundError` when the pack has no ``model_configs/`` beside its
    ``systems/`` directory (e.g. ``--systems-path`` names a copy of ``systems/`` alone) or that
    directory holds no ``*_config.json``: the pack's model ids are then unknown, not "none".
    """
    where = pack.model_configs_expected
    fix = (f"a pack keeps model_configs/ beside systems/ ({pack.origin} gave {pack.systems_dir}); "
           "copy it there, or pass --model a local config.json path")
    if pack.model_configs_dir is None:
        raise DataPackNotFoundError(f"model configs not found: no directory {where}", fix)
    try:  # listed once per directory as it is (a file added or removed changes its mtime)
        key = (str(pack.model_configs_dir), pack.model_configs_dir.stat().st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _MODEL_IDS:
        return dict(_MODEL_IDS[key])
    out = {}
    for p in sorted(pack.model_configs_dir.glob("*_config.json")):
        if p.name.endswith("_hf_quant_config.json"):
            continue
        out[p.name.removesuffix("_config.json").replace("--", "/")] = p
    if not out:
        raise DataPackNotFoundError(f"model configs not found: {where} holds no *_config.json files", fix)
    if key is not None:
        _MODEL_IDS[key] = dict(out)
    return out


#: :func:`pack_model_ids`' answers by (directory, its modification time)
_MODEL_IDS: dict[tuple[str, int], dict[str, Path]] = {}


def _alias_candidates(model_id: str) -> list[tuple[str, str | None, str]]:
    """(candidate id, implied quant, note) in order of preference."""
    org, _, name = model_id.partition("/")
    cands: list[tuple[str, str | None, str]] = []
    orgs = [org] + ([ORG_RENAMES[org.lower()]] if org.lower() in ORG_RENAMES else [])
    quant = None
    base = name
    for suf, q in QUANT_SUFFIXES.items():
        if name.lower().endswith(suf):
            quant, base = q, name[: -len(suf)]
            break
    names = [name, base] if base != name else [name]
    extra = []
    for n in names:
        if re.match(r"(?i)llama-3\.\d", n):
            extra.append("Meta-" + n)
    names += extra
    names += [re.sub(r"(?i)-instruct$", "", n) for n in names if re.search(r"(?i)-instruct$", n)]
    for o in orgs:
        for n in names:
            cands.append((f"{o}/{n}", quant if n != name else None, ""))
    # quantised re-exports (nvidia/X-NVFP4) live under another org: match by name only
    for n in names:
        cands.append((f"*/{n}", quant if n != name else None, ""))
    return cands


def resolve_model(pack: Pack, model: str) -> ModelConfig:
    """Load a model config by HF id (pack), alias, or a local directory / config file."""
    p = Path(model).expanduser()
    if p.exists():
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.exists():
            raise UnknownModelError(f"{p} has no config.json")
        cfg = _sanitize(_parse_json(cfg_path))
        hq_path = cfg_path.parent / "hf_quant_config.json"
        hq = _sanitize(_parse_json(hq_path)) if hq_path.exists() else None
        return ModelConfig(model, str(cfg_path), cfg, hq)
    ids = pack_model_ids(pack)
    lower = {k.lower(): k for k in ids}
    for cand, quant, _ in _alias_candidates(model):
        if cand.startswith("*/"):
            hits = [k for k in ids if k.lower().split("/", 1)[1] == cand[2:].lower()]
            hit = min(hits) if hits else None
        else:
            hit = lower.get(cand.lower())
        if hit is None:
            continue
        path = ids[hit]
        cfg = _sanitize(_parse_json(path))
        hq_path = path.with_name(path.name.replace("_config.json", "_hf_quant_config.json"))
        hq = _sanitize(_parse_json(hq_path)) if hq_path.exists() else None
        note = None
        if hit != model:
            note = f"{model} resolved to the pack's {hit}"
            if quant:
                note += f" with {quant} weights (the quantised export keeps the base architecture)"
        return ModelConfig(model, hit, cfg, hq, note, quant)
    raise UnknownModelError(
        f"unknown model {model!r}",
        "not a local path and no config in the pack matches it or a known alias",
        ids,
    )
