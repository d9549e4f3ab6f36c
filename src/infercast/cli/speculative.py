"""The speculative decoding flags of every command that builds an Estimator (``estimate``,
``serve``, ``serve-disagg``, ``search``, ``recommend``, ...), named after vLLM's
``speculative_config`` keys: ``--speculative-method``, ``--num-speculative-tokens`` (alias
``--nextn``), ``--acceptance-rate`` (alias ``--mtp-acceptance``), ``--acceptance-per-position``,
``--draft-model``, ``--draft-tp``, ``--draft-quant``, ``--prompt-lookup-min`` /
``--prompt-lookup-max``. :func:`speculative_kw` turns them into the Estimator's ``speculative``
mapping (:func:`infercast.models.speculative.spec_decode_of`)."""

from __future__ import annotations

from ..models.plan import SPEC_METHODS

#: argparse dest -> key of the Estimator's ``speculative`` mapping
DESTS = {"speculative_method": "method", "acceptance_per_position": "acceptance_per_position",
         "draft_model": "draft_model", "draft_tp": "draft_tp", "draft_quant": "draft_quant",
         "prompt_lookup_min": "prompt_lookup_min", "prompt_lookup_max": "prompt_lookup_max"}


def add_speculative_args(p) -> None:
    """Add the speculative decoding flags to a command's parser."""
    p.add_argument("--speculative-method", default=None, metavar="METHOD",
                   help=f"speculative decoding method: {', '.join(SPEC_METHODS)} (default: mtp when draft tokens are "
                        "given); vLLM's speculative_config method names")
    p.add_argument("--num-speculative-tokens", "--nextn", dest="nextn", type=int, default=0,
                   help="draft tokens per step, k (0: no speculation); the target verifies k+1 tokens per sequence")
    p.add_argument("--acceptance-rate", "--mtp-acceptance", dest="mtp_acceptance", type=float, default=None,
                   help="probability a draft token is accepted given the one before it was: position i is accepted "
                        "with rate**i (default 0.8)")
    p.add_argument("--acceptance-per-position", default=None, metavar="P1,P2,...",
                   help="per draft position, the probability it is accepted (vLLM's per-position acceptance rate); "
                        "replaces --acceptance-rate. Tokens per step = 1 + sum of them")
    p.add_argument("--draft-model", default=None,
                   help="draft network: the draft model (draft_model: a pack id or config path) or the EAGLE head's "
                        "config (eagle / eagle3; default: a head of the target's shape)")
    p.add_argument("--draft-tp", type=int, default=None, help="TP size of the draft network (default: the target's --tp)")
    p.add_argument("--draft-quant", default=None,
                   help="GEMM quant mode of the draft network (default: the draft model's own; bf16 for EAGLE heads)")
    p.add_argument("--prompt-lookup-min", type=int, default=None, help="n-gram speculation: shortest n-gram matched")
    p.add_argument("--prompt-lookup-max", type=int, default=None, help="n-gram speculation: longest n-gram matched")


def speculative_kw(a) -> dict | None:
    """The Estimator's ``speculative`` mapping from parsed flags ``a`` (None when none is set)."""
    kw = {key: getattr(a, dest, None) for dest, key in DESTS.items() if getattr(a, dest, None) is not None}
    return kw or None
