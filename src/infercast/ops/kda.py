"""Kimi Delta Attention (KDA: Kimi-Linear / Kimi-K3's linear-attention layers) as an
attention-like op: a context grid over ``(batch, isl)`` and a generation grid over
``(batch, step)`` whose value does not depend on ``step`` (fixed-size recurrent state).

What the op covers: the short causal conv over the q/k/v channels plus the gated delta-rule
scan (per-channel decay) of one layer on one GPU; the projections (q/k/v, the low-rank decay and
output gates, beta, o_proj), the gating and the output norm are the caller's. Head counts are
per GPU.

Source: ``kda_perf`` (family ``kda``), a table of the same columns as ``gdn_perf``
(``d_model``, ``num_k_heads``, ``head_k_dim``, ``num_v_heads``, ``head_v_dim``, ``d_conv``,
``phase``, ``kernel_source``, ``batch_size``, ``seq_len``) and the same split of one layer into
a conv kernel (``causal_conv1d*``) and a scan kernel run back to back, so it is read by
:func:`infercast.ops.gdn.resolve_gdn`'s machinery with ``stem="kda"``: per cell the conv row
plus the scan row (context: ``causal_conv1d_fn_qkv3`` + ``chunk_kda`` / ``flashkda_fwd``;
generation: ``causal_conv1d_update`` + the decode kernel; where a phase holds two decode kernels,
e.g. SGLang's ``fused_recurrent_kda_packed_decode`` and ``kda_fused_decode``, the one with the
most rows, which the collectors sweep as the engine default, see
:func:`infercast.ops.base.choose_kernel`). The ``verify`` rows (speculative verification) are not
read. Head counts that were not collected (12 / 24 / 48 / 96 heads of 128 are) are transferred
through utilisation against the Gated DeltaNet roofline (:func:`infercast.interp.sol.gdn`): the
same conv and state sizes, the per-channel decay's few extra element-wise FLOPs left out.

The recurrent state a request holds is fixed-size (:func:`kda_state_bytes`)."""

from __future__ import annotations

from .base import OpDB, Resolved
from .gdn import gdn_state_bytes, resolve_gdn

STEM = "kda"


def kda_state_bytes(num_heads: int, head_dim: int, conv_kernel: int, state_bytes: float = 4.0,
                    conv_bytes: float = 2.0) -> float:
    """KDA cache bytes one request holds per layer on one GPU (``num_heads`` per GPU, q/k/v heads
    of ``head_dim``): the recurrent state ``num_heads x head_dim x head_dim`` at ``state_bytes``
    plus the conv state of the q, k and v channels (``conv_kernel - 1`` inputs at ``conv_bytes``)
    — the Gated DeltaNet layout with as many key as value heads (:func:`gdn_state_bytes`)."""
    return gdn_state_bytes(num_heads, head_dim, head_dim, conv_kernel, num_heads, state_bytes, conv_bytes)


def resolve_kda(db: OpDB, phase: str, *, d_model: int, num_heads: int, head_dim: int, conv_kernel: int = 4,
                model_name: str | None = None) -> Resolved:
    """Compile one KDA layer's conv + scan on one GPU for ``phase`` (``num_heads`` per GPU, key
    and value heads alike) from ``kda_perf``; see the module docstring."""
    return resolve_gdn(db, phase, d_model=d_model, num_k_heads=num_heads, head_k_dim=head_dim, num_v_heads=num_heads,
                       head_v_dim=head_dim, conv_kernel=conv_kernel, model_name=model_name, stem=STEM)
