"""A replica's parallel layout in words, and counts with their nouns ("1 GPU", "8 GPUs").

infercast's layout degrees (:class:`infercast.models.plan.ParallelConfig`): ``tp`` is the tensor
parallel size of ONE attention-DP rank, so a replica runs attention on ``attention_dp x tp`` GPUs
and has ``pp`` pipeline stages of those, ``gpus = attention_dp x tp x pp``; the MoE experts are
split over the same ``attention_dp x tp`` GPUs of a stage as ``moe_ep x moe_tp``. (The engines'
own flags count differently: TensorRT-LLM's and SGLang's "tp 8 with attention DP" is 8 GPUs in
all, i.e. infercast's ``attention_dp 8, tp 1``.) These helpers spell that out so no output leaves
the GPU count implicit.
"""

from __future__ import annotations


def plural(n, noun: str) -> str:
    """``n`` and ``noun``, with an "s" unless ``n`` is exactly one: "1 GPU", "0 GPUs", "2.5 GPUs"."""
    shown = f"{n:g}" if isinstance(n, float) else str(n)
    return f"{shown} {noun}" + ("" if n == 1 else "s")


def layout_words(tp: int, pp: int = 1, attention_dp: int = 1, moe_tp: int | None = None, moe_ep: int | None = None,
                 moe: bool = False, cp: int = 1) -> str:
    """E.g. "64 GPUs: 8 attention-DP ranks x TP 8; experts EP 8 x TP 8" (``moe``: the model has
    experts, whose split is then stated; ``moe_tp`` defaults to the stage's GPUs over ``moe_ep``;
    ``cp`` context-parallel copies of the layout multiply the GPUs: "8 GPUs: TP 2, 4 context-parallel ranks")."""
    width = tp * attention_dp
    gpus = width * pp * cp
    attn = f"{attention_dp} attention-DP ranks x TP {tp}" if attention_dp > 1 else f"TP {tp}"
    if pp > 1:
        attn += f", {pp} pipeline stages"
    if cp > 1:
        attn += f", {cp} context-parallel ranks"
    text = f"{plural(gpus, 'GPU')}: {attn}"
    if moe:
        ep = moe_ep or 1
        etp = moe_tp or width // ep
        text += f"; experts EP {ep} x TP {etp}"
    return text


def parallel_words(par, moe: bool) -> str:
    """:func:`layout_words` of a :class:`~infercast.models.plan.ParallelConfig`."""
    return layout_words(par.tp, par.pp, par.attention_dp, par.etp, par.ep, moe, getattr(par, "cp", 1))
