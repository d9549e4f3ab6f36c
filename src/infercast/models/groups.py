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


def layer_group_notes(spec, window_kv_limit: int) -> list[str]:
    """What the cost of ``spec``'s layer groups approximates, for a result's notes: sliding-window
    layers with a window under ``window_kv_limit`` hold their window of each request as
    per-request memory (an upper bound for shorter requests; not in the disaggregated KV
    transfer), and attention whose v heads are narrower than its q/k heads runs at the q/k size."""
    notes = []
    small = [g for g in spec.attention_groups or () if g.kind == "gqa" and 0 < g.window < window_kv_limit]
    if small:
        n = sum(g.count for g in small)
        windows = "/".join(str(w) for w in sorted({g.window for g in small}))
        notes.append(f"{n} of {spec.num_layers} layers attend over a {windows}-token window: their KV counts as "
                     "the full window per request (an upper bound for shorter requests) and is not part of "
                     "the disaggregated KV transfer")
    narrow = [g for g in spec.attention_groups or () if g.kind == "gqa" and g.v_head_dim < g.head_dim]
    for g in narrow:
        notes.append(f"attention of the {g.label} layers costed at head size {g.head_dim} for q, k and v "
                     f"(its v heads are {g.v_head_dim} wide; the tables hold one head size)")
    if getattr(spec, "dsv4", None) is not None:
        from .deepseek_v4 import plan_notes

        notes.extend(plan_notes(spec))
    return notes
