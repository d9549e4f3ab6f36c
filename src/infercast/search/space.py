"""The deployments a search considers: parallel layouts of one engine replica.

Serving backends shard by powers of two, so every degree is one. For a dense model a layout is
``tp`` (within one NVLink domain -- a node, or the rack of a GB200 / GB300 NVL72 system: tensor
parallelism over a slower network is not what the field deploys) times ``pp`` pipeline stages
(which may span nodes). For an MoE model a stage of width ``w`` runs attention as ``tp x
attention_dp = w`` and the experts as ``moe_tp x moe_ep = w`` over the same GPUs: every split of
both, mixed expert-TP x EP included (e.g. attention DP 8 with expert TP 2 x EP 4), with ``tp`` and
``moe_tp`` within the NVLink domain and attention-DP x EP free to span nodes (their collectives are
priced hierarchically, :mod:`infercast.ops.comm`); pipeline stages multiply the layouts without
attention DP. Each layout is checked against the model (:meth:`ParallelConfig.check`); one that does
not shard the model is left out with the reason, and one the data cannot price is refused later by
its estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InfercastError, InvalidInputError
from ..models.plan import ParallelConfig
from ..models.spec import ModelSpec


@dataclass(frozen=True)
class Layout:
    """One replica's parallelism (the degrees of :class:`~infercast.models.plan.ParallelConfig`)."""

    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int | None = None
    cp: int = 1  # context-parallel copies of the layout (infercast.models.context_parallel)

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp * self.pp * self.cp

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tp, self.pp, self.attention_dp, self.moe_tp, self.moe_ep, cp=self.cp)

    @property
    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.attention_dp > 1:
            parts.append(f"dp{self.attention_dp}")
        ep = self.moe_ep or 1
        # expert TP is named when it is mixed with EP; otherwise it follows from the width
        # (tp x dp over ep), as ParallelConfig defaults it
        if ep > 1 and self.moe_tp is not None and self.moe_tp > 1:
            parts.append(f"etp{self.moe_tp}")
        if ep > 1:
            parts.append(f"ep{ep}")
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        return "-".join(parts)


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def layouts(spec: ModelSpec, max_gpus: int, tp_gpus: int, max_pp: int | None = None,
            cps=(1,)) -> tuple[list[Layout], dict[str, str]]:
    """(the layouts of at most ``max_gpus`` GPUs that shard ``spec``, {label: why not} for the rest);
    a tensor-parallel group (attention TP, expert TP) spans at most ``tp_gpus`` (the NVLink domain,
    ``NodeSpec.nvlink_gpus``); ``max_pp``: the most pipeline stages (default: as many as fit).
    Ordered by stage width, then attention TP descending, then expert TP descending, then stages.
    ``cps``: the context-parallel degrees to take (default 1 only): each layout without attention
    DP is taken at each of them whose GPUs fit, its ``tp x cp`` within ``tp_gpus``."""
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise InvalidInputError(f"max_gpus must be a positive integer, got {max_gpus!r}")
    cand: list[Layout] = []
    for w in powers_of_two(max_gpus):
        stage = []
        if spec.moe is None:
            if w <= tp_gpus:
                stage.append(Layout(tp=w))
        else:
            for tp in reversed(powers_of_two(min(w, tp_gpus))):
                if tp == w:
                    stage.append(Layout(tp=w))  # experts tensor-parallel too
                for etp in reversed(powers_of_two(min(w, tp_gpus))):
                    if w // etp > 1:
                        stage.append(Layout(tp=tp, attention_dp=w // tp, moe_tp=etp, moe_ep=w // etp))
        for lay in stage:
            cand.append(lay)
            if lay.attention_dp == 1:  # pipeline stages of the layouts without attention DP
                pps = powers_of_two(max_gpus // w)[1:]
                cand.extend(Layout(lay.tp, pp, 1, lay.moe_tp, lay.moe_ep) for pp in pps if max_pp is None or pp <= max_pp)
    cps = sorted(set(cps))
    if cps != [1]:
        cand = [replace(lay, cp=cp) for lay in cand for cp in cps
                if cp == 1 or (lay.attention_dp == 1 and lay.gpus * cp <= max_gpus and lay.tp * cp <= tp_gpus)]
    ok, skipped = [], {}
    for lay in cand:
        try:
            lay.parallel.check(spec)
        except InfercastError as exc:
            skipped[lay.label] = str(exc)
            continue
        ok.append(lay)
    return ok, skipped
