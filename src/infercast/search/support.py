"""What infercast can answer: model x system x backend x data version x mode (agg / disagg).

A combination is *supported* when infercast answers one representative configuration of it
(:class:`Probe`) with a result:

* the layout is the smallest that serves one request: the layouts of :func:`.space.layouts`
  (tensor parallelism within the NVLink domain, pipeline stages beyond it; for MoE models also
  expert-parallel and attention-DP layouts) of at most ``max_gpus`` GPUs, in order of GPU count,
  skipping those whose weights exceed a GPU's memory or whose KV cache cannot hold one request of
  ``isl + osl`` tokens. If a layout that fits cannot be built or served (no table, no data for a
  quant mode, a shape beyond the data), the next ones are tried, up to ``max_layouts`` of them;
* agg: one replica of that layout under a closed-loop benchmark of ``concurrency`` clients
  (:func:`infercast.api.serve_agg_replica`); disagg: one prefill and one decode worker of that
  layout under the same load (:func:`infercast.api.serve_disagg`);
* lengths ``isl`` = ``osl`` = 256 by default, the pack's own support matrix's lengths.

Otherwise the combination is unsupported and its reason is the first typed error infercast raised
(its class and message; on the smallest layout that fits), or "does not fit" when no layout of the
budget holds the model and one request. :func:`reason_group` strips a reason of the row's names
and numbers so that reasons group across rows.

:func:`compare` sets these answers against the pack's own support matrix
(:mod:`infercast.data.support_matrix`), the reference tool's claim of what it answers, using each
matrix row's GPU budget (its ``--total-gpus``).

Work is shared: a model's spec is built once, and one (model, system, backend, version, budget)
is probed once for both modes and every caller (:class:`Prober` memoises); :func:`probe_many`
visits many combinations grouped by (system, backend, version) so each table is read once, in
one process or spread over local processes or Ray tasks (``jobs``, ``ray``: :mod:`.executor`)
with the same answers.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from ..data.versions import version_key
from ..errors import InfercastError, InvalidInputError

MODES = ("agg", "disagg")
#: the pack's own matrix runs the reference with at most this many GPUs
DEFAULT_MAX_GPUS = 128


@dataclass(frozen=True)
class Probe:
    """The representative configuration a combination must answer (see the module docstring)."""

    isl: int = 256
    osl: int = 256
    concurrency: int = 8
    max_gpus: int = DEFAULT_MAX_GPUS
    max_layouts: int = 4  # layouts that fit tried before a data / modelling error is final


@dataclass
class SupportRow:
    """One combination's answer."""

    model: str
    architecture: str | None
    system: str
    backend: str
    version: str
    mode: str
    supported: bool
    reason: str | None = None  # why not: "<ErrorClass>: message", or "does not fit: ..."
    group: str | None = None  # the reason stripped of names and numbers (see reason_group)
    layout: str | None = None  # the layout that answered
    gpus: int | None = None  # GPUs of the answer (agg: one replica; disagg: both workers)
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def reason_group(reason: str, model: str = "", system: str = "", version: str = "") -> str:
    """``reason`` with the row's model id, system and data version replaced by ``<model>``,
    ``<system>``, ``<version>``, other standalone numbers by ``N``, and anything from the first
    ``" (available:"`` on dropped, so that one cause reads the same on every row it stops."""
    text = reason.split(" (available:")[0]
    for name, tag in sorted(((model, "<model>"), (system, "<system>"), (version, "<version>")),
                            key=lambda x: -len(x[0])):
        if name:
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", tag, text)
    return re.sub(r"(?<![\w.<])\d+(?:\.\d+)?(?![\w.])", "N", text)


def gpus_text(n: int) -> str:
    """``n`` with its unit: 1 GPU, 8 GPUs."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _reason(exc: InfercastError) -> str:
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Outcome:
    """Per mode: the answer, or the first failure met."""

    rows: dict[str, SupportRow] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class Prober:
    """Probes combinations with one :class:`Probe`, memoising per model and per combination.

    ``systems_path`` is the pack (as everywhere); ``probe`` the representative configuration."""

    def __init__(self, probe: Probe = Probe(), systems_path=None):
        self.probe = probe
        self.systems_path = systems_path
        self._specs: dict[str, object] = {}
        self._done: dict[tuple, dict[str, SupportRow]] = {}

    @property
    def probed(self) -> int:
        """How many (model, system, backend, version, budget) combinations were probed."""
        return len(self._done)

    # ---- model ---------------------------------------------------------------------------------
    def _spec(self, pack, model: str):
        """(spec, architecture) of ``model``, or the InfercastError building it raised (memoised)."""
        hit = self._specs.get(model)
        if hit is None:
            from ..data.model_configs import resolve_model
            from ..models.spec import build_spec

            try:
                mc = resolve_model(pack, model)
                cfg = (mc.config.get("text_config") or mc.config) if isinstance(mc.config, dict) else {}
                arch = ((mc.config.get("architectures") if isinstance(mc.config, dict) else None)
                        or cfg.get("architectures") or [None])[0]
                try:
                    hit = (build_spec(mc), arch)
                except InfercastError as exc:
                    hit = (exc, arch)
            except InfercastError as exc:
                hit = (exc, None)
            self._specs[model] = hit
        return hit

    # ---- one combination -----------------------------------------------------------------------
    def probe_combo(self, model: str, system: str, backend: str, version: str,
                    max_gpus: int | None = None) -> dict[str, SupportRow]:
        """{mode: row} for both modes of one combination; ``max_gpus`` overrides the probe's budget."""
        key = _key(self, model, system, backend, version, max_gpus)
        hit = self._done.get(key)
        if hit is None:
            hit = self._done[key] = self._probe(model, system, backend, version, key[-1])
        return hit

    def _probe(self, model, system, backend, version, budget) -> dict[str, SupportRow]:
        from ..data.database import PerfData

        names = (model, system, backend, version)

        def fail(arch, reason):
            group = reason_group(reason, model, system, version)
            return {m: SupportRow(model, arch, system, backend, version, m, False, reason, group) for m in MODES}

        try:
            data = PerfData.open(system, backend, version, self.systems_path)
        except InfercastError as exc:
            return fail(None, _reason(exc))
        spec, arch = self._spec(data.pack, model)
        if isinstance(spec, InfercastError):
            return fail(arch, _reason(spec))
        out = self._walk_layouts(spec, arch, data, names, budget)
        for m in MODES:
            if m not in out.rows:
                reason = out.errors.get(m) or "does not fit: no layout was tried"
                out.rows[m] = SupportRow(model, arch, system, backend, version, m, False, reason,
                                         reason_group(reason, model, system, version))
        return out.rows

    def _walk_layouts(self, spec, arch, data, names, budget) -> _Outcome:
        from ..api import Estimator, one_request_misfit, serve_agg_replica, serve_disagg
        from ..serving.memory import GB, weight_bytes_per_gpu
        from .space import layouts

        model, system, backend, version = names
        p = self.probe
        out = _Outcome()
        node = data.system.node
        try:
            lays, skipped = layouts(spec, budget, node.nvlink_gpus)
        except InfercastError as exc:
            out.errors = {m: _reason(exc) for m in MODES}
            return out
        if not lays:
            why = next(iter(skipped.values()), "none was generated")
            out.errors = {m: f"InvalidConfigError: no layout of at most {gpus_text(budget)} shards the model: {why}"
                          for m in MODES}
            return out
        # fewest GPUs first; at a count, wider stages before pipeline stages (stable: TP, then TP
        # with expert parallelism, then attention-DP, as :func:`layouts` yields them)
        lays = sorted(lays, key=lambda lay: (lay.gpus, lay.pp))
        cap = data.system.gpu.mem_capacity
        misfit = None
        tried = 0
        for lay in lays:
            try:
                w = weight_bytes_per_gpu(spec, lay.parallel)
            except (InfercastError, KeyError, ZeroDivisionError):
                w = 0.0  # let the estimator say what is wrong
            if w >= cap:
                misfit = (f"does not fit: the weights take {w / GB:.1f} GB per GPU on {lay.label} "
                          f"({gpus_text(lay.gpus)}), more than the GPU's {cap / GB:.0f} GB")
                continue
            try:
                est = Estimator(model, system, backend, version, lay.tp, lay.pp, attention_dp=lay.attention_dp,
                                moe_tp=lay.moe_tp, moe_ep=lay.moe_ep, systems_path=self.systems_path)
            except InfercastError as exc:
                for m in MODES:
                    out.errors.setdefault(m, _reason(exc))
                tried += 1
                if tried >= p.max_layouts:
                    break
                continue
            why = one_request_misfit(est, p.isl + p.osl)
            if why:
                misfit = f"does not fit: on {lay.label} ({gpus_text(lay.gpus)}) {why}"
                continue
            tried += 1
            for m in MODES:
                if m in out.rows:
                    continue
                try:
                    if m == "agg":
                        r, _ = serve_agg_replica(est, p.concurrency, p.isl, p.osl)
                        gpus = est.gpus
                    else:
                        r = serve_disagg(est, est, concurrency=p.concurrency, isl=p.isl, osl=p.osl,
                                         prefill_workers=1, decode_workers=1)
                        gpus = 2 * est.gpus
                except InfercastError as exc:
                    out.errors.setdefault(m, _reason(exc))
                    continue
                out.rows[m] = SupportRow(model, arch, system, backend, version, m, True, None, None, lay.label, gpus,
                                         float(r.ttft_ms), float(r.tpot_ms))
            if len(out.rows) == len(MODES) or tried >= p.max_layouts:
                break
        if misfit:
            for m in MODES:
                out.errors.setdefault(m, f"{misfit}; no layout of at most {gpus_text(budget)} holds the model and "
                                         "one request")
        return out


# ---- many combinations ---------------------------------------------------------------------------


#: one probe request: (model, system, backend, version, GPU budget or None for the probe's own)
Request = tuple


def _probe_group(probe: Probe, systems_path, requests: list) -> list:
    """Worker of :func:`probe_many`: [(request, {mode: row})] for one group of requests."""
    prober = Prober(probe, systems_path)
    return [(r, prober.probe_combo(*r)) for r in requests]


def probe_many(prober: Prober, requests: Iterable[Request], *, jobs: int | None = 1, ray: str | None = None,
               progress: Callable[[int, int, str], None] | None = None) -> None:
    """Probe every request not yet in ``prober``'s memo, visiting them grouped by (system, backend,
    version) so each table is read once (a version's older ones, which complete its partial
    tables, come just before it). ``jobs`` > 1 or ``ray`` spreads the (system, backend) groups
    over local processes or Ray tasks (:mod:`.executor`; each reads its own tables); the answers
    are the serial run's, since a probe depends on its request alone."""
    from functools import partial

    from .executor import executor

    ex = executor(jobs, ray)  # checks jobs; connects to Ray
    with ex:
        todo = sorted({_key(prober, *r) for r in requests} - set(prober._done),
                      key=lambda r: (r[1], r[2], version_key(r[3]), r[0], r[4]))
        total = len(todo)
        if ex.name == "serial" or total < 2:
            for n, r in enumerate(todo):
                if progress:
                    progress(n, total, f"{r[1]} {r[2]} {r[3]} {r[0]}")
                prober.probe_combo(*r)
        else:
            groups: dict[tuple, list] = defaultdict(list)
            for r in todo:
                groups[(r[1], r[2])].append(r)
            ordered = sorted(groups.values(), key=len, reverse=True)  # the longest first: they finish last
            done = 0
            if progress:
                progress(0, total, f"{len(groups)} system / backend groups {ex.describe()}")

            def finished(_i: int, got: list) -> None:
                nonlocal done
                for r, rows in got:
                    prober._done[r] = rows
                done += len(got)
                if progress:
                    progress(done, total, f"{got[0][0][1]} {got[0][0][2]}" if got else "")

            ex.map(partial(_probe_group, prober.probe, prober.systems_path), ordered, finished)
    if progress:
        progress(total, total, "done")


def _key(prober: Prober, model, system, backend, version, max_gpus=None) -> tuple:
    return (model, system, backend, version, prober.probe.max_gpus if max_gpus is None else max_gpus)


# ---- enumeration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Combo:
    model: str
    system: str
    backend: str
    version: str


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    return items or None


def _pick(flag: str, wanted: list[str] | None, available: Iterable[str], why: str) -> list[str]:
    avail = list(dict.fromkeys(available))
    if wanted is None:
        return avail
    bad = [w for w in wanted if w not in avail]
    if bad:
        raise InvalidInputError(f"--{flag} {','.join(bad)}: not {why}", available=avail)
    return [a for a in avail if a in wanted]


def combos(pack, models=None, systems=None, backends=None, versions=None) -> list[Combo]:
    """The combinations the filters select (each a comma-separated string or None for all), grouped
    by (system, backend, version). Models are the pack's model_configs; systems those with perf
    data; backends those with data on the system; versions the backend's slots (current,
    previous, next) unless ``versions`` names slot aliases, collected versions, or ``all``."""
    from ..data.model_configs import pack_model_ids
    from ..data.system import scan_systems
    from ..data.versions import SERVING_BACKENDS, SLOTS, backends_for, version_info

    model_ids = _pick("model", _split(models), pack_model_ids(pack), "a model id in the pack's model_configs")
    specs = {name: spec for name, spec, _ in scan_systems(pack) if spec is not None and backends_for(spec)}
    sys_names = _pick("system", _split(systems), specs, "a system with perf data in the pack")
    want_be = _pick("backend", _split(backends), SERVING_BACKENDS, "a serving backend")
    want_v = _split(versions)
    out: list[Combo] = []
    seen_versions: set[str] = set()
    for s in sys_names:
        for be in backends_for(specs[s]):
            if be not in want_be:
                continue
            info = version_info(pack, specs[s], be)
            seen_versions.update(info.collected)
            if want_v is None:
                vers = list(dict.fromkeys(info.slots().values()))
            elif "all" in want_v:
                vers = list(info.collected)
            else:
                slots = info.slots()
                vers = list(dict.fromkeys(slots[v] if v in SLOTS and v in slots else v for v in want_v
                                          if (v in SLOTS and v in slots) or v in info.collected))
            out.extend(Combo(m, s, be, v) for v in vers for m in model_ids)
    if want_v is not None and "all" not in want_v:
        bad = [v for v in want_v if v not in SLOTS and v not in seen_versions]
        if bad:
            raise InvalidInputError(f"--backend-version {','.join(bad)}: no selected system and backend has it",
                                    "give a slot (current, previous, next), a collected version, or all",
                                    sorted(seen_versions))
    if not out:
        raise InvalidInputError("the filters select no combination", "no selected system has the selected "
                                "backends at the selected versions")
    return out


def support_rows(prober: Prober, combos_: list[Combo], modes: Iterable[str] = MODES, *, jobs: int | None = 1,
                 ray: str | None = None, progress: Callable[[int, int, str], None] | None = None) -> list[SupportRow]:
    """A row per combination and mode, probing each combination once (:func:`probe_many`)."""
    modes = list(modes)
    probe_many(prober, [(c.model, c.system, c.backend, c.version, None) for c in combos_], jobs=jobs, ray=ray,
               progress=progress)
    rows: list[SupportRow] = []
    for c in combos_:
        got = prober.probe_combo(c.model, c.system, c.backend, c.version)
        rows.extend(got[m] for m in modes)
    return rows


# ---- agreement with the pack's matrix ---------------------------------------------------------------


@dataclass
class Agreement:
    """infercast's answers against the pack's matrix rows (``pairs``: (matrix row, our row))."""

    pairs: list = field(default_factory=list)

    @property
    def passed(self):
        return [(m, r) for m, r in self.pairs if m.passed]

    @property
    def others(self):
        return [(m, r) for m, r in self.pairs if not m.passed]

    def summary(self) -> dict:
        pas, oth = self.passed, self.others
        answered = sum(r.supported for _, r in pas)
        missed = Counter(r.group for _, r in pas if not r.supported)
        other_answered = Counter(m.status for m, r in oth if r.supported)
        return {
            "pass_rows": len(pas),
            "pass_answered": answered,
            "coverage": answered / len(pas) if pas else None,
            "pass_missed_by_reason": dict(missed.most_common()),
            "other_rows": dict(Counter(m.status for m, _ in oth)),
            "other_answered": dict(other_answered),
        }

    def coverage_by(self, attr: str) -> dict[str, tuple[int, int]]:
        """{value of ``attr`` (a matrix row field): (PASS rows answered, PASS rows)}."""
        acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for m, r in self.passed:
            k = getattr(m, attr)
            acc[k][0] += int(r.supported)
            acc[k][1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(acc.items())}


def compare(prober: Prober, matrix, *, statuses: Iterable[str] | None = None, jobs: int | None = 1,
            ray: str | None = None, progress: Callable[[int, int, str], None] | None = None) -> Agreement:
    """Probe every matrix row (or those whose status is in ``statuses``) with the row's own GPU
    budget (:func:`probe_many`); the answer's pairs are in the matrix's order."""
    rows = [m for m in matrix if statuses is None or m.status in set(statuses)]
    probe_many(prober, [(m.model, m.system, m.backend, m.version, m.total_gpus) for m in rows], jobs=jobs,
               ray=ray, progress=progress)
    answers: list = []
    for m in rows:
        got = prober.probe_combo(m.model, m.system, m.backend, m.version, m.total_gpus)
        if m.mode in MODES:
            answers.append(got[m.mode])
        else:
            reason = f"InvalidInputError: the matrix row's mode {m.mode!r} is neither agg nor disagg"
            answers.append(SupportRow(m.model, None, m.system, m.backend, m.version, m.mode, False, reason,
                                      reason_group(reason)))
    return Agreement(list(zip(rows, answers)))
