"""Speculative decoding beyond MTP: the draft passes of EAGLE / EAGLE-3 heads and of a separate
draft model, and n-gram (prompt lookup) speculation, added to a target model's op plan.

What a decode step costs with ``k`` draft tokens (:class:`~infercast.models.plan.SpecDecode`):

* **Verification** (every method, as for MTP): the target model runs once on ``1 + k`` tokens per
  decoding sequence; token-wise ops see ``batch x (k + 1)`` tokens, attention reads each
  sequence's KV once (:attr:`infercast.engine.compiled.CompiledEngine.decode_width`).
* **Drafting**, ``k`` sequential passes on one token per decoding sequence, in decode steps only
  (draft ops have ``phase="decode"``; their names start with ``draft_``):

  - ``eagle`` (EAGLE-1): a one-decoder-layer head at the target's hidden size; each pass fuses the
    token embedding with the previous feature (``fc``: ``2 x hidden -> hidden``), runs the layer
    and the target's LM head (EAGLE-1 shares it, at the target's vocabulary).
  - ``eagle3`` (EAGLE-3): the same one-layer head, whose QKV projection reads ``2 x hidden``
    (embedding and feature concatenated); ``fc`` fuses three of the target's hidden states
    (``3 x hidden -> hidden``) once per step; each pass ends in the head's own LM head over its
    draft vocabulary (``draft_vocab_size``).
  - ``draft_model``: ``k`` decode passes of the draft model's whole plan, built from its own
    config at its own quant and TP size (the target's TP unless ``draft_tp`` says otherwise),
    costed by the same tables.
  - ``ngram``: no GPU draft cost. The prompt lookup runs on the CPU (vLLM's numba matcher,
    SGLang's n-gram cache, TensorRT-LLM's NGram drafter), overlapped with the GPU step; only the
    verification of ``1 + k`` tokens is costed.

The EAGLE head's shape comes from its config when one is given (``--draft-model``:
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``num_hidden_layers``, ``draft_vocab_size``; a speculators-format config's
``transformer_layer_config`` is read the same way); without one, from the target (its hidden size,
heads, KV heads, head size and dense FFN width, the target's vocabulary), which needs a target
with uniform grouped-query attention and a dense FFN width (not MLA, DeepSeek-V4's compressed
attention, sparse / linear / hybrid layers or per-layer windows). The head's GEMMs are bf16 (the released heads are) unless
``draft_quant`` says otherwise; its KV cache follows the target's KV dtype.

Not modelled (approximations, stated in the estimate's notes): the draft network's pass over the
prompt at prefill (as for MTP, drafts are costed in decode steps only); the first EAGLE pass
re-reading the verified positions (costed at one token per sequence like the others); tree
drafting (SGLang's ``--speculative-eagle-topk`` > 1 is costed as a chain, said in the engine
configuration's notes).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import InvalidConfigError, InvalidInputError
from .plan import Fusions, ParallelConfig, Plan, PlanOp, SpecDecode, build_plan, dense_plan
from .spec import QuantSpec, ModelSpec

#: methods whose draft is an EAGLE head
EAGLE_METHODS = ("eagle", "eagle3")


def _cfg_int(cfg: dict, key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise InvalidInputError(f"EAGLE head config {where} lacks {key}", "an EAGLE head config names its layer's shape")
    try:
        x = int(v)
    except (TypeError, ValueError):
        raise InvalidInputError(f"EAGLE head config {where}: {key} must be an integer, got {v!r}") from None
    if x < 1:
        raise InvalidInputError(f"EAGLE head config {where}: {key} must be >= 1, got {x}")
    return x


def eagle_head_spec(target: ModelSpec, method: str, cfg: dict | None = None, where: str = "",
                    quant: str | None = None) -> ModelSpec:
    """The EAGLE head of ``target`` as a dense :class:`ModelSpec` (its decoder layer(s), LM head at
    its vocabulary), from the head's config ``cfg`` or, without one, from the target's shape (see
    the module docstring). ``quant``: the head's GEMM quant mode (default bf16)."""
    if cfg is None:
        uniform = (target.mla is None and target.attention_groups is None and target.mamba is None and target.gdn is None
                   and not target.msa_layers and not target.layer_windows and target.dsv4 is None
                   and target.kimi is None and not target.sparse_attention and target.intermediate > 0)
        if not uniform:
            raise InvalidInputError(
                f"--speculative-method {method}: {target.resolved_id} has no uniform grouped-query attention to size "
                "an EAGLE head from", "give the head's config with --draft-model (a config.json path or pack id)")
        inter = target.moe.dense_inter if target.moe is not None and target.moe.dense_inter else target.intermediate
        layers, hidden, heads, kvh, hd, vocab = 1, target.hidden, target.num_heads, target.num_kv_heads, target.head_dim, target.vocab
        name = f"{target.resolved_id} {method} head (shape of the target)"
    else:
        c = dict(cfg.get("transformer_layer_config") or {})
        c.update({k: v for k, v in cfg.items() if k != "transformer_layer_config"})
        hidden = _cfg_int(c, "hidden_size", where)
        if hidden != target.hidden:
            raise InvalidInputError(f"EAGLE head config {where} has hidden_size {hidden}, the target {target.hidden}",
                                    "an EAGLE head runs at its target's hidden size: give the head trained for this target")
        heads = _cfg_int(c, "num_attention_heads", where)
        kvh = _cfg_int(c, "num_key_value_heads", where, heads)
        hd = _cfg_int(c, "head_dim", where, hidden // heads)
        inter = _cfg_int(c, "intermediate_size", where)
        layers = _cfg_int(c, "num_hidden_layers", where, 1)
        vocab = _cfg_int(c, "draft_vocab_size", where, c.get("vocab_size", target.vocab)) if method == "eagle3" else target.vocab
        name = where or f"{method} head"
        if heads % kvh:
            raise InvalidInputError(f"EAGLE head config {where}: num_attention_heads {heads} is not a multiple of "
                                    f"num_key_value_heads {kvh}")
    q = QuantSpec(gemm="bfloat16", kv_cache=target.quant.kv_cache, attention=target.quant.attention,
                  source=f"{method} head: bf16 weights, the target's KV dtype")
    if quant is not None:
        q = q.with_overrides(gemm=quant)
    return ModelSpec(
        model_id=name, resolved_id=name, architecture="Eagle3Head" if method == "eagle3" else "EagleHead",
        family="dense", num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=kvh, head_dim=hd,
        intermediate=inter, vocab=vocab, tie_embeddings=False, sliding_window=None, max_position=None, quant=q,
    )


def draft_parallel(sd: SpecDecode, par: ParallelConfig) -> ParallelConfig:
    """The draft network's layout: ``sd.draft_tp`` (default the target's TP per attention-DP rank),
    one pipeline stage (the draft runs beside the target's last stage), experts split over its TP."""
    return ParallelConfig(tp=sd.draft_tp or par.tp)


def _draft_ops(ops, k: int) -> tuple[PlanOp, ...]:
    """``ops`` as ``k`` sequential draft passes in decode steps (pipeline sends dropped)."""
    return tuple(replace(o, name=f"draft_{o.name}", count=o.count * k, phase="decode") for o in ops if o.kind != "p2p")


def eagle_ops(head: ModelSpec, dpar: ParallelConfig, method: str, k: int, fusions: Fusions | None = None) -> tuple[PlanOp, ...]:
    """The ops of ``k`` EAGLE / EAGLE-3 draft passes of ``head`` (see the module docstring), with
    the serving engine's kernel fusions ``fusions`` (the target's: the head runs in its engine)."""
    h = head.hidden
    body = dense_plan(head, dpar, fusions).ops
    if method == "eagle3":
        body = tuple(replace(o, params={**o.params, "k": 2 * h}) if o.name == "qkv_gemm" else o for o in body)
    ops = _draft_ops(body, k)
    fc_in, fc_count = (3 * h, 1) if method == "eagle3" else (2 * h, k)
    fc = PlanOp("draft_fc", "gemm", fc_count, phase="decode", params={"n": h, "k": fc_in, "quant": head.quant.gemm})
    return (fc,) + ops


def with_speculation(plan: Plan, sd: SpecDecode, draft: ModelSpec | None = None,
                     draft_fusions: Fusions | None = None) -> Plan:
    """``plan`` (a target built without drafts) with the draft passes of ``sd``'s method:
    ``draft`` is the draft model's spec (``draft_model``) or the EAGLE head's
    (:func:`eagle_head_spec`); MTP plans come from :func:`~infercast.models.plan.build_plan`
    already (returned as they are). ``draft_fusions``: the serving engine's fusions for the
    draft model."""
    sd.check()
    if sd.method == "mtp":
        if sd.draft_tp is not None and not sd.nextn:
            raise InvalidInputError(f"--draft-tp {sd.draft_tp} is given without speculative decoding",
                                    "add --speculative-method and --num-speculative-tokens, or drop --draft-tp")
        if sd.draft_tp is not None and sd.draft_tp != plan.parallel.tp:
            raise InvalidInputError(f"--draft-tp {sd.draft_tp}: the MTP layers run at the target's TP {plan.parallel.tp}",
                                    "drop --draft-tp (or set it to the target's --tp) with MTP")
        return plan
    plan = replace(plan, spec_decode=sd)
    if sd.method == "ngram":
        return plan
    if draft is None:
        raise InvalidInputError(f"--speculative-method {sd.method} needs its draft network's spec")
    dpar = draft_parallel(sd, plan.parallel)
    par = plan.parallel
    if dpar.tp > par.tp * par.attention_dp * par.cp:
        raise InvalidConfigError(f"--draft-tp {dpar.tp} exceeds the GPUs the draft can run on: {par.tp * par.attention_dp * par.cp} "
                                 f"(tp {par.tp} x attention-dp {par.attention_dp} x cp {par.cp} of the target's last "
                                 "pipeline stage)", "set --draft-tp to at most that")
    if sd.method in EAGLE_METHODS:
        _check_tp(draft, dpar, "EAGLE head")
        ops = eagle_ops(draft, dpar, sd.method, sd.nextn, plan.fusions)
    else:
        try:
            dplan = build_plan(draft, dpar, None, draft_fusions)
        except (InvalidConfigError, InvalidInputError) as exc:
            raise type(exc)(f"draft model {draft.resolved_id} at TP {dpar.tp}: {exc.what}", exc.why, exc.available) from None
        ops = _draft_ops(dplan.ops, sd.nextn)
    return replace(plan, ops=plan.ops + ops, draft=draft, draft_parallel=dpar)


def _check_tp(head: ModelSpec, dpar: ParallelConfig, what: str) -> None:
    if head.num_heads % dpar.tp or head.intermediate % dpar.tp:
        raise InvalidConfigError(f"draft TP {dpar.tp} does not divide the {what}'s {head.num_heads} heads / "
                                 f"FFN width {head.intermediate}", "set --draft-tp to a divisor")


def speculation_notes(plan: Plan) -> list[str]:
    """One line saying what the speculative decoding of ``plan`` costs and yields (empty without)."""
    sd = plan.spec_decode
    if sd.nextn == 0:
        return []
    acc = ", ".join(f"{p:.3g}" for p in sd.position_acceptance)
    head = (f"speculative decoding {sd.method}, {sd.nextn} draft tokens: the target verifies {sd.nextn + 1} tokens per "
            f"sequence per step; position acceptance {acc} -> {sd.tokens_per_step:.3g} tokens per step")
    if sd.method == "ngram":
        return [head + "; the n-gram lookup runs on the CPU: no GPU draft cost"]
    if sd.method == "mtp":
        return [head + f"; drafts: {sd.nextn} passes of the MTP layer"]
    d, dp = plan.draft, plan.draft_parallel
    what = "EAGLE-3 head" if sd.method == "eagle3" else "EAGLE head" if sd.method == "eagle" else "draft model"
    return [head + f"; drafts: {sd.nextn} sequential passes of the {what} {d.resolved_id} at TP {dp.tp} "
            f"({d.quant.gemm}), one token per sequence, decode steps only (the draft's prompt pass is not costed)"]


#: keys of the ``speculative`` mapping :func:`spec_decode_of` reads (the CLI's flags, the YAML keys)
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "acceptance_rate", "acceptance_per_position", "draft_model",
                    "draft_tp", "draft_quant", "prompt_lookup_min", "prompt_lookup_max")
#: other names of the methods (SGLang's and TensorRT-LLM's, lower-cased) -> infercast's (vLLM's)
METHOD_ALIASES = {"draft": "draft_model", "standalone": "draft_model", "drafttarget": "draft_model",
                  "nextn": "mtp", "deepseek_mtp": "mtp"}
DEFAULT_ACCEPTANCE = 0.8


def spec_decode_of(nextn: int = 0, acceptance: float | None = None, speculative: dict | None = None) -> SpecDecode:
    """The :class:`SpecDecode` of the Estimator's inputs: ``nextn`` / ``acceptance`` (the MTP
    flags ``--nextn`` / ``--mtp-acceptance``, which are the draft-token count and the acceptance
    rate of every method) and ``speculative``, a mapping of :data:`SPECULATIVE_KEYS` (None values
    are unset). A value given both ways must agree. Without a method, draft tokens mean MTP."""
    sp = {k: v for k, v in (speculative or {}).items() if v is not None}
    unknown = sorted(set(sp) - set(SPECULATIVE_KEYS))
    if unknown:
        raise InvalidInputError(f"unknown speculative decoding setting {', '.join(unknown)}", available=list(SPECULATIVE_KEYS))
    k = sp.get("num_speculative_tokens")
    if k is not None and nextn and int(k) != int(nextn):
        raise InvalidInputError(f"--nextn {nextn} conflicts with --num-speculative-tokens {k}", "they are one setting: give one")
    k = nextn if k is None else k
    rate = sp.get("acceptance_rate")
    if rate is not None and acceptance is not None and float(rate) != float(acceptance):
        raise InvalidInputError(f"--mtp-acceptance {acceptance} conflicts with --acceptance-rate {rate}",
                                "they are one setting: give one")
    rate = DEFAULT_ACCEPTANCE if rate is None and acceptance is None else (acceptance if rate is None else rate)
    method = str(sp.get("method", "mtp")).lower()
    method = METHOD_ALIASES.get(method, method)
    per = sp.get("acceptance_per_position") or ()
    if isinstance(per, str):
        per = _floats("--acceptance-per-position", per)
    try:
        k, rate, per = _int_of("--num-speculative-tokens", k), float(rate), tuple(float(p) for p in per)
    except (TypeError, ValueError):
        raise InvalidInputError(f"--acceptance-rate takes a number, got {rate!r}") from None
    tp = sp.get("draft_tp")
    lo, hi = sp.get("prompt_lookup_min"), sp.get("prompt_lookup_max")
    return SpecDecode(nextn=k, acceptance=rate, method=method, acceptance_per_position=per,
                      draft=None if sp.get("draft_model") is None else str(sp["draft_model"]),
                      draft_tp=None if tp is None else _int_of("--draft-tp", tp), draft_quant=sp.get("draft_quant"),
                      prompt_lookup_min=None if lo is None else _int_of("--prompt-lookup-min", lo),
                      prompt_lookup_max=None if hi is None else _int_of("--prompt-lookup-max", hi))


def _int_of(flag: str, v) -> int:
    if isinstance(v, bool):
        raise InvalidInputError(f"{flag} takes an integer, got {v!r}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{flag} takes an integer, got {v!r}") from None
    if x != int(x):
        raise InvalidInputError(f"{flag} takes an integer, got {v!r}")
    return int(x)


def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.replace(" ", ",").split(",") if x.strip())
    except ValueError:
        raise InvalidInputError(f"{flag} takes comma-separated probabilities, got {text!r}") from None
