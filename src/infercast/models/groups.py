"""Heterogeneous decoder layers as groups of identical layers, and their op plan.

Some checkpoints give their layers different shapes: Gemma-4 and MiMo-V2-Flash alternate
sliding-window and full-attention layers whose KV heads and head sizes differ; DeciLM
(Llama-Nemotron NAS) drops attention from some layers and gives each layer its own FFN width. A
spec carries such layers as :class:`AttentionGroup` / :class:`FFNGroup` entries, each a count of
layers of one shape (where in the stack they sit does not change the cost). Layers not covered
by any attention group have no attention block (and no norm or all-reduce for it); likewise for
FFN groups.

The plan emits each group's ops once with the group's layer count (op names carry the group's
label), so a forward pass sums the ops per layer kind.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_KINDS = ("gqa", "linear")
FFN_KINDS = ("gated", "linear")


@dataclass(frozen=True)
class AttentionGroup:
    """``count`` layers of one attention shape. ``kind`` ``"gqa"``: grouped-query attention of
    ``heads`` query heads and ``kv_heads`` KV heads, q/k heads of ``head_dim`` and v heads of
    ``v_head_dim``, over the last ``window`` tokens (0 = the whole context); ``k_eq_v``: the layer
    has no V projection, V is K's projection output (Gemma-4's full-attention layers; the cache
    still holds both). ``kind`` ``"linear"``: the block is replaced by one ``hidden x hidden``
    linear layer (DeciLM's ``replace_with_linear``)."""

    count: int
    kind: str = "gqa"
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    window: int = 0
    k_eq_v: bool = False

    @property
    def label(self) -> str:
        if self.kind == "linear":
            return "attn_linear"
        w = f"window{self.window}" if self.window else "full"
        return f"{w}_kv{self.kv_heads}_d{self.head_dim}"


@dataclass(frozen=True)
class FFNGroup:
    """``count`` layers whose FFN is a gated MLP (gate + up, activation, down) of width ``inter``
    (``kind`` ``"gated"``), or one ``hidden x hidden`` linear layer (``"linear"``, DeciLM's
    ``replace_with_linear``; ``inter`` 0)."""

    count: int
    inter: int = 0
    kind: str = "gated"

    @property
    def label(self) -> str:
        return "ffn_linear" if self.kind == "linear" else f"ffn{self.inter}"
