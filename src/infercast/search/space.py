"""The deployments a search considers: parallel layouts of one engine replica.

Serving backends shard by powers of two, so every degree is one. For a dense model a layout is
``tp`` (within one NVLink domain -- a node, or the rack of a GB200 / GB300 NVL72 system: tensor
parallelism over a slower network is not what the field deploys) times
``pp`` pipeline stages. For an MoE model, at each width ``w`` (the GPUs of one stage) three
layouts cover what the backends' recipes run: attention and experts both tensor-parallel
(``tp=w``), tensor-parallel attention with expert parallelism (``tp=w, moe_ep=w``), and data-parallel
attention with expert parallelism (``attention_dp=w, moe_ep=w``, "DEP"); pipeline stages multiply
the TP layouts only. Each layout is checked against the model (:meth:`ParallelConfig.check`);
one that does not shard the model is left out with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp * self.pp

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tp, self.pp, self.attention_dp, self.moe_tp, self.moe_ep)

    @property
    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.attention_dp > 1:
            parts.append(f"dp{self.attention_dp}")
        if self.moe_ep and self.moe_ep > 1:
            parts.append(f"ep{self.moe_ep}")
        return "-".join(parts)


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    out, p = [], 1
    while p <= limit:
        out.append(p)
        p *= 2
    return out


def layouts(spec: ModelSpec, max_gpus: int, tp_gpus: int) -> tuple[list[Layout], dict[str, str]]:
    """(the layouts of at most ``max_gpus`` GPUs that shard ``spec``, {label: why not} for the rest);
    a tensor-parallel group spans at most ``tp_gpus`` (the NVLink domain, ``NodeSpec.nvlink_gpus``)."""
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise InvalidInputError(f"max_gpus must be a positive integer, got {max_gpus!r}")
    cand: list[Layout] = []
    for w in powers_of_two(max_gpus):
        stage = []
        if w <= tp_gpus:
            stage.append(Layout(tp=w))
            if spec.moe is not None and w > 1:
                stage.append(Layout(tp=w, moe_tp=1, moe_ep=w))
        if spec.moe is not None and w > 1:
            stage.append(Layout(tp=1, attention_dp=w, moe_tp=1, moe_ep=w))
        for lay in stage:
            cand.append(lay)
            if lay.attention_dp == 1:  # pipeline stages of the TP layouts
                cand.extend(Layout(lay.tp, pp, 1, lay.moe_tp, lay.moe_ep) for pp in powers_of_two(max_gpus // w)[1:])
    ok, skipped = [], {}
    for lay in cand:
        try:
            lay.parallel.check(spec)
        except InfercastError as exc:
            skipped[lay.label] = str(exc)
            continue
        ok.append(lay)
    return ok, skipped
