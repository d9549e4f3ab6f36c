"""The schema of an experiments file (``infercast exp FILE.yaml``), validated with pydantic.

A file holds ``experiments``, a list of experiments, and optionally ``defaults``, keys every
experiment starts from (an experiment's own keys win; nested tables such as ``targets`` merge
key by key). An experiment names a model, one or more systems and backends, the request lengths,
and either a ``layout`` to serve at given concurrencies or a ``mode`` to search::

    defaults:
      isl: 4000
      osl: 500
      targets: {ttft_ms: 2000, tpot_ms: 30}
    experiments:
      - name: qwen32b-h200
        model: Qwen/Qwen3-32B-FP8
        system: h200_sxm
        backends: [trtllm, vllm]
        mode: both
        max_gpus: 16
      - name: qwen32b-tp2-fixed
        model: Qwen/Qwen3-32B-FP8
        system: h200_sxm
        backend: trtllm
        layout: {tp: 2}
        concurrency: [16, 64]
        scheduler: {max_num_tokens: 8192}

Every key is listed in :class:`Experiment`; an unknown key or a bad value is an error that names
the key's path and its line in the file (:mod:`infercast.exp.load`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Backend = Literal["trtllm", "vllm", "sglang"]


def _each_at_least_one(values: list[int] | None, what: str) -> list[int] | None:
    """``values`` unchanged when absent or every entry is >= 1; else a ValueError naming ``what``."""
    if values is not None and any(x < 1 for x in values):
        raise ValueError(f"every {what} must be >= 1")
    return values


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Targets(_Strict):
    """Latency targets on the mean TTFT and mean TPOT (ms); omitted: no target."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)


class Speculative(_Strict):
    """Speculative decoding (``speculative:``), in the CLI's and vLLM's names
    (:mod:`infercast.models.speculative`): ``method`` (mtp, eagle, eagle3, ngram, draft_model),
    ``num_speculative_tokens``, ``acceptance_rate`` or ``acceptance_per_position``, the draft
    network (``draft_model``, ``draft_tp``, ``draft_quant``) and the n-gram window
    (``prompt_lookup_min`` / ``prompt_lookup_max``). The experiment's ``nextn`` /
    ``mtp_acceptance`` are the same draft-token count and acceptance rate."""

    method: str | None = None
    num_speculative_tokens: int | None = Field(None, ge=0)
    acceptance_rate: float | None = Field(None, ge=0, le=1)
    acceptance_per_position: list[float] | None = None
    draft_model: str | None = None
    draft_tp: int | None = Field(None, ge=1)
    draft_quant: str | None = None
    prompt_lookup_min: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1)


class LayoutSpec(_Strict):
    """One replica's (or one worker's) parallel layout, as the ``estimate`` flags name it."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    attention_dp: int = Field(1, ge=1)
    moe_tp: int | None = Field(None, ge=1)
    moe_ep: int | None = Field(None, ge=1)
    cp: int = Field(1, ge=1)  # context-parallel ranks (the estimate flag --cp)


class DisaggSpec(_Strict):
    """A disaggregated deployment to serve: prefill and decode worker counts and layouts."""

    prefill_workers: int = Field(ge=1)
    decode_workers: int = Field(ge=1)
    prefill: LayoutSpec = LayoutSpec()
    decode: LayoutSpec = LayoutSpec()


class Quant(_Strict):
    """Quantisation overrides (default: the checkpoint's own)."""

    gemm: str | None = None
    moe: str | None = None
    kv_cache: str | None = None
    attention: str | None = None


class Scheduler(_Strict):
    """The engine's scheduler settings, overriding the backend's defaults
    (:class:`infercast.serving.backends.SchedulerParams`; the same names as ``serve``'s flags)."""

    max_num_tokens: int | None = Field(None, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    chunked_prefill: bool | None = None
    front_end_ms: float | None = Field(None, ge=0)
    front_end_per_stream_ms: float | None = Field(None, ge=0)
    front_end_per_prompt_token_ms: float | None = Field(None, ge=0)
    step_overhead_ms: float | None = Field(None, ge=0)
    requests_per_client: float | None = Field(None, ge=1)
    adp_balance_timeout_steps: int | None = Field(None, ge=0)
    batch_wait_iters: int | None = Field(None, ge=0)
    batch_wait_max_tokens_ratio: float | None = Field(None, ge=0, le=1)
    recv_interval: int | None = Field(None, ge=1)
    prefill_scheduling: Literal["mixed", "prefill-first"] | None = None
    min_prefill_chunk: int | None = Field(None, ge=1)
    seq_overhead_ms: float | None = Field(None, ge=0)
    overlap: bool | None = None
    overlap_residual_ms: float | None = Field(None, ge=0)
    cuda_graph_sizes: list[int] | None = None
    kv_reserve_full: bool | None = None
    kv_length_ratio: float | None = Field(None, gt=0, le=1)
    prefill_scale: float | None = Field(None, gt=0)
    decode_scale: float | None = Field(None, gt=0)

    @field_validator("cuda_graph_sizes")
    @classmethod
    def _graph_sizes(cls, v):
        return _each_at_least_one(v, "CUDA-graph batch size")

    def overrides(self) -> dict:
        """{SchedulerParams field: value} of the settings given."""
        rename = {"front_end_ms": "arrival_delay_ms", "chunked_prefill": "chunked", "cuda_graph_sizes": "graph_batch_sizes"}
        out = {}
        for key, value in self.model_dump(exclude_none=True).items():
            if key == "prefill_scheduling":
                mixed = value == "mixed"
                out.update(mixed=mixed, lockstep=not mixed)
            elif key == "cuda_graph_sizes":
                out["graph_batch_sizes"] = tuple(sorted(set(value)))
            else:
                out[rename.get(key, key)] = value
        return out


class Experiment(_Strict):
    """One experiment. ``system``/``systems`` and ``backend``/``backends``: one or several (every
    combination runs). With ``layout`` (or ``disagg``) the deployment is served at each
    ``concurrency``; without, ``mode`` searches (``agg``, ``disagg``, ``both``) within ``max_gpus``
    GPUs (per replica for agg, in all for disagg), or ``fixed`` every deployment of exactly
    ``gpus`` GPUs."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    system: str | None = None
    systems: list[str] | None = Field(None, min_length=1)
    backend: Backend | None = None
    backends: list[Backend] | None = Field(None, min_length=1)
    backend_version: str | None = None
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    #: cached prompt tokens every request starts with, before the ``isl`` new ones (serving.prefix)
    prefix: int = Field(0, ge=0)
    targets: Targets = Targets()
    mode: Literal["agg", "disagg", "both", "fixed"] = "agg"
    max_gpus: int | None = Field(None, ge=1)
    gpus: int | None = Field(None, ge=1)
    concurrency: list[int] | None = Field(None, min_length=1)
    layout: LayoutSpec | None = None
    disagg: DisaggSpec | None = None
    quant: Quant = Quant()
    nextn: int = Field(0, ge=0)
    mtp_acceptance: float | None = Field(None, ge=0, le=1)
    speculative: Speculative | None = None
    moe_kernel: str | None = None
    kv_memory_fraction: float | None = Field(None, gt=0, le=1)
    moe_comm: Literal["gather", "alltoall"] | None = None
    scheduler: Scheduler = Scheduler()
    #: context-parallel degrees a search takes (agg layouts; disagg: the prefill workers); None: 1
    cp_list: list[int] | None = Field(None, min_length=1)
    #: the context-parallel K/V exchange overlaps the attention (the --cp-overlap flag)
    cp_overlap: bool = False
    #: a disaggregated deployment's (``disagg``, or a ``disagg`` / ``both`` search) prefill and
    #: decode workers' own settings, over ``scheduler``
    prefill_scheduler: Scheduler = Scheduler()
    decode_scheduler: Scheduler = Scheduler()

    @field_validator("concurrency")
    @classmethod
    def _positive_concurrency(cls, v):
        return _each_at_least_one(v, "concurrency")

    @model_validator(mode="after")
    def _one_of_each(self):
        if (self.system is None) == (self.systems is None):
            raise ValueError("give exactly one of system (one name) or systems (a list)")
        if (self.backend is None) == (self.backends is None):
            raise ValueError("give exactly one of backend (one name) or backends (a list)")
        if self.layout is not None and self.disagg is not None:
            raise ValueError("give layout (aggregated) or disagg (prefill/decode workers), not both")
        if (self.layout is not None or self.disagg is not None) and self.concurrency is None:
            raise ValueError("a fixed layout is served at given clients: add concurrency: [..]")
        if self.mode == "fixed" and self.gpus is None and self.layout is None and self.disagg is None:
            raise ValueError("mode fixed needs gpus: the number of GPUs every deployment uses")
        if self.gpus is not None and self.mode != "fixed":
            raise ValueError("gpus fixes the GPU count: use mode: fixed (or max_gpus for a budget)")
        if self.cp_list is not None and (self.mode == "fixed" or self.layout is not None or self.disagg is not None):
            raise ValueError("cp_list is searched over: give it to a search (mode agg, disagg or both), and cp in a layout")
        if self.cp_list is not None and any(c < 1 or c & (c - 1) for c in self.cp_list):
            raise ValueError("every cp_list entry must be a power of two >= 1")
        if (self.prefill_scheduler.overrides() or self.decode_scheduler.overrides()) and not (
                self.disagg is not None or (self.layout is None and self.mode in ("disagg", "both"))):
            raise ValueError("prefill_scheduler / decode_scheduler set a disaggregated deployment's workers: give "
                             "disagg, or mode disagg or both (scheduler sets every worker)")
        for t in (self.targets.ttft_ms, self.targets.tpot_ms):
            if t is not None and not math.isfinite(t):
                raise ValueError("targets must be finite")
        return self

    @property
    def system_list(self) -> list[str]:
        return list(self.systems) if self.systems is not None else [self.system]

    @property
    def backend_list(self) -> list[str]:
        return list(self.backends) if self.backends is not None else [self.backend]

    def role_overrides(self) -> dict[str, dict]:
        """{"prefill": ..., "decode": ...}: each role's own SchedulerParams overrides."""
        return {"prefill": self.prefill_scheduler.overrides(), "decode": self.decode_scheduler.overrides()}

    def estimator_kw(self) -> dict:
        """The :class:`~infercast.Estimator` keywords this experiment sets."""
        q = self.quant
        return {"gemm_quant": q.gemm, "moe_quant": q.moe, "kv_cache_quant": q.kv_cache, "attention_quant": q.attention,
                "nextn": self.nextn, "mtp_acceptance": self.mtp_acceptance, "moe_kernel": self.moe_kernel,
                "kv_memory_fraction": self.kv_memory_fraction, "moe_comm": self.moe_comm,
                **({"cp_overlap": True} if self.cp_overlap else {}),
                "speculative": self.speculative.model_dump(exclude_none=True) if self.speculative else None}


class ExpFile(_Strict):
    """A whole experiments file."""

    defaults: dict = Field(default_factory=dict)
    experiments: list[dict] = Field(min_length=1)
