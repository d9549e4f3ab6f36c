"""Reading an experiments file: YAML with its line numbers, ``defaults`` merged into each
experiment, and every error named by the key's path and line (``experiments[1].targets.ttft_ms,
line 14: Input should be greater than 0``), as :class:`~infercast.errors.ConfigFileError`."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import ConfigFileError
from .schema import Experiment, ExpFile


def _walk(node, path: tuple):
    """The deepest YAML node along ``path`` (mapping keys and sequence indices) and how much of
    the path it reached."""
    reached = 0
    for part in path:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            if nxt is None:
                # point at the key itself for an unknown key, which pydantic names as the path's last part
                key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
                if key is not None:
                    return key, reached + 1
                break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
        else:
            break
        reached += 1
    return node, reached


def _line(root, path: tuple) -> int:
    node, _ = _walk(root, path)
    return node.start_mark.line + 1


def _duplicate_keys(node, path: str = "") -> list[str]:
    """``path: key (line N)`` for every key given twice in one mapping (YAML would keep the last
    silently)."""
    out = []
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for k, v in node.value:
            name = getattr(k, "value", None)
            if name in seen:
                out.append(f"{path + '.' if path else ''}{name} (lines {seen[name]} and {k.start_mark.line + 1})")
            seen[name] = k.start_mark.line + 1
            out += _duplicate_keys(v, f"{path + '.' if path else ''}{name}")
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out += _duplicate_keys(v, f"{path}[{i}]")
    return out


def _fmt_path(path: tuple) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s


def _merge(base: dict, own: dict) -> dict:
    """``own`` over ``base``; nested mappings merge key by key."""
    out = dict(base)
    for k, v in own.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_experiments(path) -> list[Experiment]:
    """The experiments of the YAML file at ``path``, validated; raises
    :class:`ConfigFileError` naming the file, the key's path and its line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigFileError(f"cannot read experiments file {p}", exc.strerror or str(exc)) from exc
    return parse_experiments(text, str(p))


def parse_experiments(text: str, name: str = "<experiments>") -> list[Experiment]:
    """:func:`load_experiments` on the file's text (``name`` appears in errors)."""
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigFileError(f"{name}{where}: not valid YAML", str(getattr(exc, "problem", exc))) from None
    if root is None or not isinstance(data, dict):
        raise ConfigFileError(f"{name}: an experiments file is a mapping with an experiments: list",
                                 "see docs/exp.md for the schema and examples/ for files")
    dups = _duplicate_keys(root)
    if dups:
        raise ConfigFileError(f"{name}: key given twice: {dups[0]}", "each key may appear once per mapping")
    try:
        whole = ExpFile.model_validate(data)
    except ValidationError as exc:
        raise _named(exc, root, name, ()) from None
    defaults = whole.defaults
    bad_default = next((k for k in defaults if k not in Experiment.model_fields), None)
    if bad_default is not None:
        raise ConfigFileError(f"{name}: defaults.{bad_default}, line {_line(root, ('defaults', bad_default))}: "
                                 "unknown key", "known keys: " + ", ".join(Experiment.model_fields))
    out, names = [], set()
    for i, raw in enumerate(whole.experiments):
        if not isinstance(raw, dict):
            raise ConfigFileError(f"{name}: experiments[{i}], line {_line(root, ('experiments', i))}: "
                                     "an experiment is a mapping of keys", f"got {type(raw).__name__}")
        try:
            exp = Experiment.model_validate(_merge(defaults, raw))
        except ValidationError as exc:
            raise _named(exc, root, name, ("experiments", i), defaults=defaults, own=raw) from None
        if exp.name in names:
            raise ConfigFileError(f"{name}: experiments[{i}].name, line {_line(root, ('experiments', i, 'name'))}: "
                                     f"two experiments are named {exp.name!r}", "names identify results and saved files")
        names.add(exp.name)
        out.append(exp)
    return out


def _model_at(model, loc: tuple):
    """The pydantic model class that validates the mapping at ``loc`` under ``model``."""
    import typing

    for part in loc:
        if isinstance(part, int):
            continue
        ann = model.model_fields[part].annotation
        for cand in (ann, *typing.get_args(ann)):
            if isinstance(cand, type) and hasattr(cand, "model_fields"):
                model = cand
                break
    return model


def _named(exc: ValidationError, root, name: str, prefix: tuple, defaults: dict | None = None,
           own: dict | None = None) -> ConfigFileError:
    """The first pydantic error as a one-line :class:`ConfigFileError` with the key's path and
    line (a key that came from ``defaults`` is located there)."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = prefix + loc
    if own is not None and loc and loc[0] not in own and defaults and loc[0] in defaults:
        path = ("defaults", *loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        known = ", ".join(_model_at(Experiment if prefix else ExpFile, loc[:-1]).model_fields)
        return ConfigFileError(f"{name}: {_fmt_path(path)}, line {_line(root, path)}: unknown key", f"known keys: {known}")
    shown = _fmt_path(path) if loc else _fmt_path(prefix) or "the file"
    value = err.get("input")
    got = "" if isinstance(value, dict) or err["type"] == "missing" else f" (got {value!r})"
    return ConfigFileError(f"{name}: {shown}, line {_line(root, path)}: {msg}{got}")
