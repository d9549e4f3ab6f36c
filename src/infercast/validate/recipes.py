"""Benchmark recipes as data: what the public scripts behind the silicon rows set that the rows do
not say, read from the YAML files in ``validate/recipe_files/`` (one file per recipe; the format
is in that directory's README.md) and translated into the inputs a user gives infercast:
:class:`~infercast.Estimator` keywords (KV-cache dtype, MTP draft tokens, MoE kernel, KV memory
fraction, expert parallelism) and :class:`~infercast.serving.backends.SchedulerParams` overrides.

A recipe says which rows it applies to (a match on the row's own fields: backend, benchmarked
version, system, model name, quantisation, source, lengths, concurrency, and on the layout being
served and the checkpoint), the engine settings in the engine's own names (an engine command line
or TensorRT-LLM LLM-API options, read by :mod:`infercast.serving.engine_args`, the reader behind
``--engine-args`` / ``--engine-cmd``), the benchmark client's settings (random range ratio), and
the values that are fits rather than published settings (each with the rows it was fitted on and
the client it describes). Nothing here knows a model, a file or a date: every such fact is in the
data files.

Two recipes that set one input to different values must differ in ``priority`` (the higher wins);
equal priorities that disagree raise :class:`~infercast.errors.DataFileError`. Evidence for each
recipe is in docs/modelling-log.md, under the section names the files cite.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from ..errors import DataFileError
from ..serving.backends import mean_length_ratio, sglang_hybrid_overlap
from .silicon import SiliconRow

#: where the shipped recipe files are (package data)
RECIPE_DIR = Path(__file__).with_name("recipe_files")

#: the keys of a recipe file
RECIPE_KEYS = {"name", "script", "about", "priority", "applies_to", "except", "engine", "client", "fits"}
#: the keys of an engine / fit block
BLOCK_KEYS = {"when", "cmd", "options", "computed", "client", "note"}
FIT_KEYS = BLOCK_KEYS | {"name", "value", "constant", "fitted_on", "benchmark_client"}
#: what a match may test: exact (a value or a list of values) ...
EXACT_KEYS = {"backend", "backend_version", "system", "gemm_quant", "mode", "model", "isl", "osl"}
#: ... a prefix of the model name (its last path part), a regular expression on the row's
#: ``silicon_data_source``, a number range, a checkpoint fact
PREFIX_KEYS = {"model_prefix"}
REGEX_KEYS = {"source"}
RANGE_KEYS = {"concurrency", "clients", "tp", "attention_dp", "gpus"}
FACT_KEYS = {"checkpoint_mtp", "checkpoint_moe"}
MATCH_KEYS = EXACT_KEYS | PREFIX_KEYS | REGEX_KEYS | RANGE_KEYS | FACT_KEYS
RANGE_OPS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def _quant(q: str | None) -> str | None:
    q = (q or "").strip().lower()
    return q or None


@dataclass(frozen=True)
class RowContext:
    """What a recipe match reads beyond the row: the layout being served (``tp`` per
    attention-DP rank, ``attention_dp``), the clients per rank when known (None: a search over
    layouts, where nothing sized by them applies), and the checkpoint's facts (None: unknown,
    which no ``checkpoint_*`` match accepts)."""

    tp: int | None = None
    attention_dp: int | None = None
    clients: int | None = None
    checkpoint_mtp: bool | None = None
    checkpoint_moe: bool | None = None


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _row_value(row: SiliconRow, ctx: RowContext, key: str):
    if key == "model":
        return (row.model or "").split("/")[-1]
    if key == "gemm_quant":
        return _quant(row.gemm_quant)
    if key == "concurrency":
        return row.concurrency
    if key == "gpus":
        return None if ctx.tp is None else ctx.tp * (ctx.attention_dp or 1)
    if key in ("tp", "attention_dp", "clients", "checkpoint_mtp", "checkpoint_moe"):
        return getattr(ctx, key)
    return getattr(row, key)


def matches(match: dict, row: SiliconRow, ctx: RowContext) -> bool:
    """Whether ``row`` (served as ``ctx`` says) meets every condition of ``match``."""
    for key, want in match.items():
        if key in PREFIX_KEYS:
            name = (row.model or "").split("/")[-1]
            if not any(name.startswith(p) for p in _as_list(want)):
                return False
        elif key in REGEX_KEYS:
            if not any(rx.match(row.source or "") for rx in want):
                return False
        elif key in RANGE_KEYS:
            got = _row_value(row, ctx, key)
            if got is None:
                return False
            if isinstance(want, dict):
                if not all(RANGE_OPS[op](got, bound) for op, bound in want.items()):
                    return False
            elif got not in _as_list(want):
                return False
        elif key in FACT_KEYS:
            got = _row_value(row, ctx, key)
            if got is None or bool(got) != bool(want):
                return False
        else:
            got = _row_value(row, ctx, key)
            if got not in [(_quant(w) if key == "gemm_quant" else w) for w in _as_list(want)]:
                return False
    return True


# --------------------------------------------------------------------------- formulas

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
_FUNCS = {"round_up": lambda x, m: -(-x // m) * m, "max": max, "min": min}
#: the names a formula may read (see :func:`evaluate`)
FORMULA_NAMES = ("isl", "osl", "concurrency", "clients")


class _Unknown(Exception):
    """A formula reads a quantity this prediction does not have (e.g. the clients per rank in a
    search over layouts)."""


def _check_formula(text: str, where: str) -> ast.AST:
    try:
        tree = ast.parse(str(text), mode="eval")
    except SyntaxError:
        raise DataFileError(f"{where}: {text!r} is not a formula", "integers, + - * //, round_up(x, m), max, min") from None
    for node in ast.walk(tree):
        ok = isinstance(node, (ast.Expression, ast.BinOp, ast.Load, ast.Call, ast.Name, ast.Constant, *_BINOPS))
        if not ok or (isinstance(node, ast.Name) and node.id not in FORMULA_NAMES + tuple(_FUNCS)):
            raise DataFileError(f"{where}: {text!r} uses {ast.dump(node)[:40]}",
                                f"formulas read {', '.join(FORMULA_NAMES)} with + - * //, round_up(x, m), max, min")
    return tree


def evaluate(tree: ast.AST, names: dict[str, int | None]) -> int:
    """The integer value of a checked formula (see :func:`_check_formula`)."""

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            v = names.get(n.id)
            if v is None:
                raise _Unknown(n.id)
            return v
        if isinstance(n, ast.BinOp):
            return _BINOPS[type(n.op)](ev(n.left), ev(n.right))
        return _FUNCS[n.func.id](*(ev(a) for a in n.args))

    v = ev(tree)
    return int(v) if float(v).is_integer() else v


# --------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class Block:
    """One group of settings of a recipe: engine settings (a command line or TensorRT-LLM
    options, with ``computed`` option values from formulas) and client settings, under an optional
    extra condition ``when``."""

    when: dict
    cmd: str | None
    options: dict | None
    computed: dict
    client: dict


@dataclass(frozen=True)
class Recipe:
    name: str
    script: str
    priority: int
    applies_to: dict
    exclude: tuple[dict, ...]
    blocks: tuple[Block, ...]
    fits: tuple[dict, ...]
    path: str


def _compile_match(m, where: str) -> dict:
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise DataFileError(f"{where}: a match is a mapping", f"got {type(m).__name__}")
    unknown = sorted(set(m) - MATCH_KEYS)
    if unknown:
        raise DataFileError(f"{where}: unknown match key(s) {', '.join(unknown)}", "known: " + ", ".join(sorted(MATCH_KEYS)))
    out = dict(m)
    for key in REGEX_KEYS & set(m):
        out[key] = [re.compile(p) for p in _as_list(m[key])]
    for key in RANGE_KEYS & set(m):
        if isinstance(m[key], dict) and set(m[key]) - set(RANGE_OPS):
            raise DataFileError(f"{where}: {key} range keys are {', '.join(RANGE_OPS)}", f"got {sorted(m[key])}")
    return out


def _block(b: dict, where: str, keys=BLOCK_KEYS) -> Block:
    if not isinstance(b, dict):
        raise DataFileError(f"{where}: a block is a mapping", f"got {type(b).__name__}")
    unknown = sorted(set(b) - keys)
    if unknown:
        raise DataFileError(f"{where}: unknown key(s) {', '.join(unknown)}", "known: " + ", ".join(sorted(keys)))
    computed = {k: _check_formula(v, f"{where} computed.{k}") for k, v in (b.get("computed") or {}).items()}
    if computed and b.get("cmd"):
        raise DataFileError(f"{where}: computed values fill TensorRT-LLM options", "give them beside options:, not cmd:")
    client = dict(b.get("client") or {})
    bad = sorted(set(client) - {"random_range_ratio", "clients_in_phase"})
    if bad:
        raise DataFileError(f"{where}: unknown client setting(s) {', '.join(bad)}", "known: random_range_ratio, clients_in_phase")
    return Block(_compile_match(b.get("when"), f"{where} when"), b.get("cmd"), b.get("options"), computed, client)


def load_recipe(path: Path) -> Recipe:
    """One recipe file, checked (unknown keys, formulas and match keys are errors)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DataFileError(f"cannot read recipe {path}", str(exc)) from None
    where = Path(path).name
    if not isinstance(data, dict):
        raise DataFileError(f"recipe {where}: expected a mapping")
    unknown = sorted(set(data) - RECIPE_KEYS)
    if unknown:
        raise DataFileError(f"recipe {where}: unknown key(s) {', '.join(unknown)}", "known: " + ", ".join(sorted(RECIPE_KEYS)))
    if not data.get("script"):
        raise DataFileError(f"recipe {where}: no script", "name the public script or configuration it comes from")
    blocks = [_block(b, f"{where} engine[{i}]") for i, b in enumerate(data.get("engine") or [])]
    if data.get("client"):
        blocks.append(_block({"client": data["client"]}, f"{where} client"))
    fits = []
    for i, f in enumerate(data.get("fits") or []):
        fw = f"{where} fits[{i}]"
        if not isinstance(f, dict) or not f.get("fitted_on") or not f.get("benchmark_client"):
            raise DataFileError(f"{fw}: a fit names the rows it was fitted on (fitted_on) and the client it describes "
                                "(benchmark_client)")
        blk = _block(f, fw, FIT_KEYS)
        if blk.cmd or blk.options or blk.computed or blk.client:
            blocks.append(blk)  # a fitted setting the recipe applies
        elif not f.get("constant"):
            raise DataFileError(f"{fw}: a fit either sets something (cmd, options, client) or names the constant "
                                "that holds it (constant)")
        fits.append(dict(f))
    return Recipe(str(data.get("name") or Path(path).stem), str(data["script"]), int(data.get("priority", 0)),
                  _compile_match(data.get("applies_to"), f"{where} applies_to"),
                  tuple(_compile_match(m, f"{where} except[{i}]") for i, m in enumerate(_as_list(data.get("except") or []))),
                  tuple(blocks), tuple(fits), str(path))


@dataclass
class RecipeSettings:
    """What the recipes that apply to one row set, as infercast inputs: Estimator keywords,
    SchedulerParams overrides, expert parallelism over the whole replica (vLLM's
    ``--enable-expert-parallel``), the client's random range ratio, and the recipes applied."""

    estimator: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)
    expert_parallel: bool = False
    random_range_ratio: float | None = None
    recipes: list[str] = field(default_factory=list)


class _Merge:
    """Values by input name, the highest priority winning; equal priorities must agree."""

    def __init__(self) -> None:
        self.got: dict[tuple[str, str], tuple[int, Any, str]] = {}

    def put(self, kind: str, key: str, value, priority: int, who: str) -> None:
        old = self.got.get((kind, key))
        if old is None or priority > old[0]:
            self.got[(kind, key)] = (priority, value, who)
        elif priority == old[0] and old[1] != value:
            raise DataFileError(f"recipes {old[2]} and {who} both set {key} ({old[1]!r} vs {value!r}) at priority {priority}",
                                "give one of them a higher priority, or narrow their applies_to")

    def section(self, kind: str) -> dict:
        return {k: v[1] for (t, k), v in self.got.items() if t == kind}


class RecipeBook:
    """The recipes of a directory of YAML files (default: the shipped ones), applied to rows by
    :meth:`resolve`. ``RecipeBook.empty()`` applies none: the defaults-only score."""

    def __init__(self, recipes: list[Recipe]):
        names = [r.name for r in recipes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DataFileError(f"recipe name(s) used twice: {', '.join(dup)}")
        self.recipes = sorted(recipes, key=lambda r: r.name)
        self._parsed: dict = {}

    @classmethod
    def load(cls, directory: str | Path | None = None) -> RecipeBook:
        d = Path(directory) if directory is not None else RECIPE_DIR
        files = sorted(d.glob("*.yaml"))
        if directory is not None and not files:
            raise DataFileError(f"no recipe files (*.yaml) in {d}")
        return cls([load_recipe(p) for p in files])

    @classmethod
    def empty(cls) -> RecipeBook:
        return cls([])

    def __bool__(self) -> bool:
        return bool(self.recipes)

    def _engine(self, block: Block, backend: str, values: dict):
        """:class:`~infercast.serving.engine_args.EngineSettings` of a block for ``backend``."""
        from ..serving.engine_args import parse_engine_cmd, parse_trtllm_options

        if block.cmd:
            key = ("cmd", block.cmd)
            if key not in self._parsed:
                self._parsed[key] = parse_engine_cmd(block.cmd)
            return self._parsed[key]
        options = dict(block.options or {})
        options.update(values)
        if not options:
            return None
        if backend != "trtllm":
            raise DataFileError(f"options: are TensorRT-LLM LLM-API options; a {backend} recipe gives cmd:")
        return parse_trtllm_options(options, "recipe options")

    def resolve(self, row: SiliconRow, ctx: RowContext) -> RecipeSettings:
        """The settings of every recipe that applies to ``row`` served as ``ctx`` says."""
        out = RecipeSettings()
        merge = _Merge()
        names = {"isl": row.isl, "osl": row.osl, "concurrency": row.concurrency, "clients": ctx.clients}
        radix_off = []
        for r in self.recipes:
            if not matches(r.applies_to, row, ctx) or any(matches(m, row, ctx) for m in r.exclude):
                continue
            used = False
            for b in r.blocks:
                if not matches(b.when, row, ctx):
                    continue
                try:
                    values = {k: evaluate(t, names) for k, t in b.computed.items()}
                except _Unknown:
                    continue  # sized by a quantity this prediction does not have
                used = True
                s = self._engine(b, row.backend, values)
                if s is not None:
                    if s.backend != row.backend:
                        raise DataFileError(f"recipe {r.name} gives {s.backend} settings but applies to a {row.backend} row",
                                            f"narrow its applies_to to backend {s.backend}")
                    for k, v in s.estimator_kw.items():
                        merge.put("est", k, v, r.priority, r.name)
                    for k, v in s.scheduler.items():
                        merge.put("sched", k, v, r.priority, r.name)
                    if "--enable-expert-parallel" in s.read:
                        merge.put("flag", "expert_parallel", True, r.priority, r.name)
                    if "--disable-radix-cache" in s.ignored:
                        radix_off.append(r.name)
                c = b.client
                if "random_range_ratio" in c:
                    ratio = float(c["random_range_ratio"])
                    merge.put("flag", "random_range_ratio", ratio, r.priority, r.name)
                    merge.put("sched", "kv_length_ratio", mean_length_ratio(ratio), r.priority, r.name)
                    merge.put("sched", "lockstep", False, r.priority, r.name)
                if c.get("clients_in_phase") is False:
                    merge.put("sched", "lockstep", False, r.priority, r.name)
            if used:
                out.recipes.append(r.name)
        out.estimator = merge.section("est")
        out.scheduler = merge.section("sched")
        flags = merge.section("flag")
        out.expert_parallel = bool(flags.get("expert_parallel", False))
        out.random_range_ratio = flags.get("random_range_ratio")
        if radix_off and row.backend == "sglang" and sglang_hybrid_overlap(row.backend_version):
            # SGLang builds from SGLANG_HYBRID_OVERLAP_FROM keep a hybrid linear-attention model's
            # overlap scheduler when the radix cache is off (a no-op for other models)
            out.scheduler.setdefault("overlap", True)
        return out

    def fits(self) -> list[tuple[str, dict]]:
        """(recipe name, fit) of every fitted value the recipes name."""
        return [(r.name, f) for r in self.recipes for f in r.fits]


@lru_cache(maxsize=1)
def shipped_recipes() -> RecipeBook:
    """The recipes shipped with infercast (``validate/recipe_files/*.yaml``), read once."""
    return RecipeBook.load()
