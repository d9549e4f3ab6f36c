"""Mixture of experts: the routed-expert block and its expert-parallel dispatch, by concern.

Data flow, top to bottom:

* :mod:`.query` -- shape validation, quant modes (the ``mxfp4`` alias), the expert block's SOL;
* :mod:`.kernels` -- kernel families in the tables' ``kernel_source`` names, TensorRT-LLM's
  small-batch NVFP4 kernel preference;
* :mod:`.tables` -- the lattice: one moe table's rows grouped into per-site ``num_tokens`` curves;
* :mod:`.transfer` -- uncollected (moe_tp, moe_ep) pairs and shapes from collected ones;
* :mod:`.peers` -- another engine's (or version's) table on the same GPU;
* :mod:`.wide_ep` -- SGLang's DeepEP wide-EP expert tables;
* :mod:`.block` -- :func:`resolve_moe`, the expert block's curve (its docstring states the rules);
* :mod:`.a2a_tables` -- the measured all-to-all tables (``moe_a2a``, DeepEP's) as dispatch and
  combine curves, carried to the query's site and EP;
* :mod:`.dispatch` -- :func:`resolve_moe_dispatch`, the all-to-all dispatch + combine: which
  source answers.

Every public name (and the private helpers tests and benchmarks reach for) is re-exported here.
"""

from .query import (  # noqa: F401
    DEFAULT_DISTRIBUTION, MOE_QUANTS, MXFP4_ALIAS, PAIR_COLS, PHASE_ALIASES, SITE_COLS, TOKEN_SCALE, TOKENS_AXIS,
    _check_shape, _positive_int, has_fp4_hardware, moe_sol_fn, quant_candidates,
)
from .kernels import (  # noqa: F401
    KERNEL_FAMILY_NAMES, MOE_KERNELS, NONGATED_TAG, TRTLLM_LOW_LATENCY_KERNEL, TRTLLM_LOW_LATENCY_MAX_TOKENS,
    _expected_kernel, _prefer_low_latency, kernel_family, kernel_family_mask,
)
from .tables import (  # noqa: F401
    _get_lattice, _Lattice, _lattice, _pairs_str, _pick_distribution, _power_law_exponent, _site_grid, _site_index,
    _site_label, default_family,
)
from .transfer import (  # noqa: F401
    CONSISTENT_UTIL_FACTOR, FIXED_COST_FRACTION, _AtExpertRows, _fixed_plus_split, _pair_donor, _tp_trend,
    choose_donors, consistent_moe_donors, expert_rows, fixed_cost, transfer_sites,
)
from .peers import (  # noqa: F401
    PEER_MIN_SITES, PEER_RATIO_SPREAD, PeerCurve, _kernel_db, _log_ratios, _other_db, _peer_preferred, _peer_site,
    best_peer_curve, peer_curve, peer_grid, peer_lattices,
)
from .wide_ep import (  # noqa: F401
    WIDE_EP_BACKENDS, WIDE_EP_CONTEXT_TABLE, WIDE_EP_DONOR_QUANTS, WIDE_EP_TABLE, WIDE_EP_TABLES, _resolve_wide_ep,
    _resolve_wide_ep_pair, _wide_ep_between_pairs, _wide_ep_collected_eps, _wide_ep_quant_transfer,
    wide_ep_available,
)
from .block import _score, resolve_moe  # noqa: F401
from .a2a_tables import (  # noqa: F401
    A2A_DISPATCH_DTYPE, A2A_DTYPE_BYTES, DEEPEP_DEFAULT_SMS, DEEPEP_TABLES, A2AMeasurement, a2a_resolved, a2a_sol_fn,
    from_deepep, from_moe_a2a,
)
from .dispatch import A2A_BACKENDS, A2A_TOKENS_AXIS, DEEPEP_PEER_BACKEND, NCCL_ELEMENT_BYTES, resolve_moe_dispatch  # noqa: F401
