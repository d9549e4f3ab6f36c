"""A calibration profile: the fitted scheduler values, the runs they came from, the concurrency
range they were fitted over and the residuals before and after, as YAML.

``--calibration FILE`` applies :meth:`CalibrationProfile.overrides` on top of the backend's
scheduler defaults (under any flag the user gives) and notes a concurrency outside
:attr:`CalibrationProfile.concurrency_range`: the values were fitted there, and a result outside
that range is an extrapolation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError

KIND = "infercast-calibration"
VERSION = 1


@dataclass
class CalibrationProfile:
    """``values``: SchedulerParams field -> fitted value; ``deployment``: what was measured
    (model, system, backend, backend_version, layout); ``runs``: per run its source,
    concurrency, lengths, measured and predicted (before / after) TTFT and TPOT."""

    values: dict
    defaults: dict
    deployment: dict
    concurrency_range: tuple[int, int]
    runs: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)

    def overrides(self) -> dict:
        """SchedulerParams field -> value to apply."""
        return {k: float(v) for k, v in self.values.items()}

    def note_for(self, concurrency) -> str | None:
        """A note when ``concurrency`` (clients) lies outside the calibrated range, else None."""
        lo, hi = self.concurrency_range
        if concurrency is None or lo <= concurrency <= hi:
            return None
        return (f"calibration: fitted at concurrency {lo}-{hi}; concurrency {concurrency} is outside it, so the "
                f"calibrated values are extrapolated there")

    def describe(self) -> str:
        vals = ", ".join(f"{k} {v:.4g}" for k, v in self.values.items())
        lo, hi = self.concurrency_range
        return f"calibration ({len(self.runs)} runs, concurrency {lo}-{hi}): {vals}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["concurrency_range"] = [int(x) for x in self.concurrency_range]
        return {"kind": KIND, "version": VERSION, **d}

    def write(self, path) -> None:
        import yaml

        try:
            Path(path).write_text(yaml.safe_dump(_plain(self.to_dict()), sort_keys=False))
        except OSError as exc:
            raise InvalidInputError(f"cannot write calibration profile {path}", exc.strerror or str(exc)) from exc


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return None if not np.isfinite(x) else round(float(x), 6)
    if isinstance(x, np.integer):
        return int(x)
    return x


def load_profile(path) -> CalibrationProfile:
    """Read a profile written by :meth:`CalibrationProfile.write` (``--calibration FILE``)."""
    import yaml

    from .fit import PARAMS

    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"--calibration {path}: no such file", "write one with `infercast calibrate --out FILE`")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"--calibration {path} is not YAML", str(exc).splitlines()[0]) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise InvalidInputError(f"--calibration {path} is not a calibration profile",
                                f"it has no 'kind: {KIND}' (write one with `infercast calibrate`)")
    values = doc.get("values") or {}
    unknown = sorted(set(values) - set(PARAMS))
    if unknown:
        raise InvalidInputError(f"--calibration {path} sets {', '.join(unknown)}", "not calibrated fields", PARAMS)
    for k, v in values.items():
        prm = PARAMS[k]
        if not isinstance(v, (int, float)) or not prm.lo <= v <= prm.hi:
            raise InvalidInputError(f"--calibration {path}: {k} is {v!r}", f"it must lie in [{prm.lo}, {prm.hi}]")
    rng = doc.get("concurrency_range") or [1, 1]
    return CalibrationProfile(values=values, defaults=doc.get("defaults") or {}, deployment=doc.get("deployment") or {},
                              concurrency_range=(int(rng[0]), int(rng[1])), runs=doc.get("runs") or [],
                              summary=doc.get("summary") or {}, evidence=doc.get("evidence") or {})


def check_applies(profile: CalibrationProfile, backend: str, model: str | None = None, system: str | None = None) -> list[str]:
    """Refuse a profile of another backend (its host times are that engine's); notes when the
    model or system differ from the calibrated one (applied anyway, as the user asked)."""
    dep = profile.deployment
    if dep.get("backend") and dep["backend"] != backend:
        raise InvalidInputError(f"the calibration profile was fitted on {dep['backend']}, not {backend}",
                                "its host-side times are that engine's; calibrate on this backend's runs")
    notes = [profile.describe()]
    for key, given in (("model", model), ("system", system)):
        if given and dep.get(key) and dep[key] != given:
            notes.append(f"calibration: fitted on {key} {dep[key]}, applied to {given}")
    return notes


def apply_to_static(res, profile: CalibrationProfile) -> list[str]:
    """A static estimate (:class:`~infercast.api.StaticResult`) with the profile's GPU-time
    scales applied: TTFT (one batch's prefill) x ``prefill_scale``, TPOT x ``decode_scale``, the
    request latency and throughputs recomputed from them. The host-side values have no place in
    a static estimate (it models no scheduler or front end): the notes say so."""
    ps = float(profile.values.get("prefill_scale", 1.0))
    ds = float(profile.values.get("decode_scale", 1.0))
    notes = []
    host = sorted(k for k in profile.values if k not in ("prefill_scale", "decode_scale"))
    if host:
        notes.append(f"calibration: {', '.join(host)} not used (the static estimate models no scheduler or front end; "
                     "`serve` applies them)")
    if (ps == 1.0 and ds == 1.0) or not res.fits or res.ttft_ms is None:
        return notes
    old_total = res.request_latency_ms
    res.ttft_ms *= ps
    res.tpot_ms *= ds
    res.request_latency_ms = res.ttft_ms + res.tpot_ms * (res.osl - 1)
    if res.tokens_per_s_per_gpu is not None and old_total:
        res.tokens_per_s_per_gpu *= old_total / res.request_latency_ms
    res.tokens_per_s_per_user = 1e3 / res.tpot_ms if res.tpot_ms > 0 else None
    notes.append(f"calibration: GPU-time scales applied (prefill x{ps:.3g}, decode x{ds:.3g})")
    return notes
