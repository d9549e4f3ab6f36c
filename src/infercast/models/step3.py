"""Step-3.7-Flash (``Step3p7FlashForCausalLM``, StepFun): GQA decoder layers that alternate
sliding-window and full attention, MoE with a shared expert after a few dense layers, and MTP
layers. The reader builds a :class:`~infercast.models.spec.ModelSpec` of family ``moe`` whose
``attention_groups`` (:mod:`infercast.models.groups`) count the two attention kinds, so the
common op plan and memory model serve it.

What the config gives, and how it is read (field names of the checkpoint's ``config.json``):

* ``layer_types``: each layer ``sliding_attention`` (a window of ``sliding_window`` tokens) or
  ``full_attention``. Both kinds use ``num_attention_heads`` query heads and
  ``num_key_value_heads`` (StepFun's ``num_attention_groups``) KV heads of ``head_dim``, unless an
  ``attention_other_setting`` block gives the sliding layers their own ``num_attention_heads`` /
  ``num_attention_groups`` / ``head_dim`` (the Step-3.5-Flash checkpoints' layout: 96 query heads
  on the sliding layers, 64 on the full ones; NVIDIA Megatron-Bridge's ``Step35Config`` and the
  published Step-3.5-Flash ``config.json`` name these fields). The pack's Step-3.7-Flash configs
  carry no such block: every layer then has 64 query and 8 KV heads of 128.
* FFN: the first ``first_k_dense_replace`` layers run a SwiGLU MLP of ``intermediate_size``
  (Step-3.5's ``moe_layers_enum`` starts at layer 3, the same split); the others route to
  ``num_experts`` experts of ``moe_intermediate_size`` (top ``num_experts_per_tok``, sigmoid
  scores), beside ``n_shared_experts`` shared experts of ``share_expert_dim`` each.
* ``num_nextn_predict_layers``: MTP layers (3); their draft pass is costed as one decoder layer
  with full attention and the MoE block (:func:`infercast.models.plan._with_mtp`).
* Per-head q/k RMSNorm when ``use_qk_norm`` says so. A head-wise attention output gate
  (``use_head_wise_attn_gate``, Step-3.5) is not modelled and is refused when a config sets it;
  the pack's configs do not.

Sliding-window attention at a window the tables did not collect (512 at head size 128, on all but
b300 SGLang) is carried over from the same shape's full-attention curves
(:mod:`infercast.ops.window`).
"""

from __future__ import annotations

from ..data.model_configs import ModelConfig
from ..errors import InvalidInputError, UnsupportedModelError
from .families import _check_groups, _common, _pattern
from .groups import AttentionGroup
from .spec import ModelSpec, MoESpec, _int_field, infer_quant, vision_params

ARCHITECTURES = ("Step3p7FlashForCausalLM",)


def _bad(where: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"model config {where} is malformed", why)


def step3p7(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    """Step-3.7-Flash's spec (see the module docstring)."""
    where = mc.resolved_id
    c = _common(text, cfg, where)
    layers, heads, hidden = c["num_layers"], c["num_heads"], c["hidden"]
    if text.get("use_head_wise_attn_gate"):
        raise UnsupportedModelError(f"{where}: the head-wise attention output gate is not modelled",
                                    "use_head_wise_attn_gate is set in the config")
    lt = _pattern(text, "layer_types", layers, {"sliding_attention", "full_attention"}, where)
    kv = _int_field(text, "num_key_value_heads", "num_attention_groups", where=where, default=heads,
                    default_note="num_attention_heads")
    hd = _int_field(text, "head_dim", where=where, default=hidden // heads, default_note="hidden_size // num_attention_heads")
    other = text.get("attention_other_setting") or {}
    if not isinstance(other, dict):
        raise _bad(where, f"attention_other_setting must be an object, got {type(other).__name__}")
    n_local = lt.count("sliding_attention")
    groups = []
    if layers - n_local:
        groups.append(AttentionGroup(layers - n_local, "gqa", heads, kv, hd, hd, 0))
    if n_local:
        window = _int_field(text, "sliding_window", where=where)
        o_where = f"{where} attention_other_setting"
        s_heads = _int_field(other, "num_attention_heads", where=o_where, default=heads, default_note="num_attention_heads")
        s_kv = _int_field(other, "num_attention_groups", "num_key_value_heads", where=o_where, default=kv,
                          default_note="num_key_value_heads")
        s_hd = _int_field(other, "head_dim", where=o_where, default=hd, default_note="head_dim")
        groups.append(AttentionGroup(n_local, "gqa", s_heads, s_kv, s_hd, s_hd, window))
    _check_groups(groups, where)
    inter = _int_field(text, "intermediate_size", where=where)
    experts = _int_field(text, "num_experts", "moe_num_experts", "n_routed_experts", where=where)
    topk = _int_field(text, "num_experts_per_tok", "moe_top_k", where=where)
    if topk > experts:
        raise _bad(where, f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
    einter = _int_field(text, "moe_intermediate_size", where=where)
    n_shared = _int_field(text, "n_shared_experts", where=where, default=1, minimum=0)
    shared_each = _int_field(text, "share_expert_dim", "share_expert_dims", where=where, default=einter,
                             default_note="moe_intermediate_size") if n_shared else 0
    dense = _int_field(text, "first_k_dense_replace", where=where, default=0, minimum=0)
    if dense > layers:
        raise _bad(where, f"first_k_dense_replace={dense} exceeds the {layers} layers")
    moe = MoESpec(experts, topk, einter, n_shared * shared_each, dense, inter if dense else 0)
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=family,
        num_kv_heads=max(g.kv_heads for g in groups), head_dim=max(g.head_dim for g in groups),
        intermediate=inter, sliding_window=None, quant=infer_quant(mc, text, layers), alias_note=mc.alias_note,
        moe=moe, mtp_layers=_int_field(text, "num_nextn_predict_layers", where=where, default=0, minimum=0),
        qk_norm="per_head" if text.get("use_qk_norm") else "", attention_groups=tuple(groups),
        vision_params=vision_params(cfg, hidden, where), **c,
    )
