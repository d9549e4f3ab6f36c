"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): the per-layer pre / post kernels.

DeepSeek-V4 carries ``hc_mult`` copies of the residual stream instead of one. Before each
sublayer (attention, FFN) the **pre** kernel computes, from the streams, the mixing weights
(a small projection of the flattened streams, the residual mixing matrix made doubly stochastic
by ``hc_sinkhorn_iters`` Sinkhorn-Knopp iterations) and folds the streams into the sublayer's
input; after it the **post** kernel spreads the sublayer's output back over the streams and mixes
them. Source for the layout: the checkpoints' ``hc_mult`` / ``hc_sinkhorn_iters`` / ``hc_eps``
and the pack's ``mhc_module`` tables (kernels ``*_mhc_pre`` / ``*_mhc_post`` of TensorRT-LLM,
SGLang's and vLLM's TileLang kernels).

Source: ``mhc_module_perf`` (family ``mhc``), keyed by ``op_name`` (``pre`` / ``post``),
``num_tokens``, ``num_sites``, ``hc_mult``, ``hidden_size``, ``sinkhorn_iters``. A row times one
layer's kernel at its ``num_sites`` sites (2: before / after attention and FFN), so the op runs
once per layer. The curve is ``num_tokens`` (log-log); several kernels (TensorRT-LLM's pre kernel
splits by size) are merged by shape, the fastest at each token count (the engine dispatches by
size). Rows are matched exactly on ``hc_mult`` and ``sinkhorn_iters``; another ``hidden_size`` is
carried from the nearest collected one at equal utilisation against :func:`mhc_sol`
(provenance ``transferred``). Without a matching table (the system / backend / version collected
none, or another ``hc_mult`` / iteration count) the op is the roofline :func:`mhc_sol` in every
database mode, provenance ``sol`` with a note: the kernels are memory-bound elementwise work,
and this keeps a DeepSeek-V4 estimate possible where only the attention and MoE tables exist. How
far the roofline is from the measured kernels (hidden 4096, 16k-131k tokens; b200 SGLang, h200
vLLM / TensorRT-LLM): pre 0.50-0.60 of the measured time, post 1.09-1.12 (the post kernels move
the streams at about the system's effective bandwidth; the byte counts are this module's
estimate of the kernels' traffic).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ..interp import sol
from ..interp.grid import Grid
from ..interp.provenance import Prov
from .base import DatabaseMode, OpDB, Resolved, sol_resolved

STEM = "mhc_module"
OPS = ("pre", "post")
TOKENS = 2.0 ** np.arange(0, 20)


def mhc_sol(system, which: str, tokens, *, hidden: int, hc_mult: int, sinkhorn_iters: int, sites: int = 2):
    """Roofline (ms) of one layer's mHC ``which`` kernel over ``tokens`` tokens at ``sites`` sites.
    ``pre``: read the ``hc_mult`` streams (bf16), write the folded input; the mixing projection
    ``hc_mult x hidden -> hc_mult x (2 + hc_mult)`` coefficients and the Sinkhorn iterations over an
    ``hc_mult x hc_mult`` matrix. ``post``: read the sublayer output and the streams, write the
    streams."""
    t = np.asarray(tokens, dtype=float)
    n, h = float(hc_mult), float(hidden)
    if which == "pre":
        nbytes = (n + 1.0) * h * 2.0
        flops = 2.0 * n * h * n * (2.0 + n) + 4.0 * sinkhorn_iters * n * n
    else:
        nbytes = (2.0 * n + 1.0) * h * 2.0
        flops = 3.0 * n * h + 2.0 * n * n * h
    ms = np.maximum(sites * t * flops / sol._flops(system, "bfloat16"),
                    sites * t * nbytes / system.gpu.effective_mem_bw) * 1e3
    return ms + system.gpu.mem_latency_s * 1e3


def _curve(db: OpDB, which: str, hc_mult: int, iters: int):
    """(hidden sizes, {hidden: (tokens, latency)}, kernels, sites) of the matching rows, or None."""
    if not db.data.has_table(STEM):
        return None
    t = db.data.table(STEM)
    mask = np.ones(len(t), bool)
    for col, v in (("op_name", which), ("hc_mult", hc_mult), ("sinkhorn_iters", iters)):
        if t.has(col):
            mask &= t.keys[col].astype(str) == str(v)
    if not mask.any():
        return None
    hid = t.keys["hidden_size"][mask].astype(float)
    tok = t.keys["num_tokens"][mask].astype(float)
    lat = t.latency[mask]
    sites = int(np.max(t.keys["num_sites"][mask])) if t.has("num_sites") else 2
    kernels = sorted(set(t.keys["kernel_source"][mask].tolist())) if t.has("kernel_source") else []
    out = {}
    for hv in np.unique(hid):
        sel = hid == hv
        xs = np.unique(tok[sel])
        # fastest kernel per token count (numpy: minimum over rows sharing a token count)
        idx = np.searchsorted(xs, tok[sel])
        best = np.full(len(xs), np.inf)
        np.minimum.at(best, idx, lat[sel])
        out[float(hv)] = (xs, best)
    return np.array(sorted(out)), out, kernels, sites


def resolve_mhc(db: OpDB, which: str, *, hidden: int, hc_mult: int, sinkhorn_iters: int) -> Resolved:
    """Compile one layer's mHC ``which`` (``"pre"`` / ``"post"``) kernel: a grid over tokens."""
    if which not in OPS:
        raise InvalidInputError(f"unknown mHC op {which!r}", available=OPS)
    for name, v in (("hidden", hidden), ("hc_mult", hc_mult), ("sinkhorn_iters", sinkhorn_iters)):
        if isinstance(v, bool) or int(v) != v or v < (0 if name == "sinkhorn_iters" else 1):
            raise InvalidInputError(f"mHC {name} must be a positive integer", f"got {v!r}")
    hidden, hc_mult, iters = int(hidden), int(hc_mult), int(sinkhorn_iters)
    found = db.memo(("mhc-curve", which, hc_mult, iters), lambda: _curve(db, which, hc_mult, iters))
    sites = found[3] if found else 2

    def sol_at(h: float):
        return lambda tokens: mhc_sol(db.system, which, tokens, hidden=int(h), hc_mult=hc_mult,
                                      sinkhorn_iters=iters, sites=sites)

    query_sol = sol_at(hidden)
    if db.mode is DatabaseMode.SOL:
        return sol_resolved((TOKENS,), query_sol, ("log",))
    if found is None:
        why = (f"no {STEM}_perf table" if not db.data.has_table(STEM)
               else f"{STEM}_perf holds no {which} rows at hc_mult={hc_mult}, sinkhorn_iters={iters}")
        r = sol_resolved((TOKENS,), query_sol, ("log",),
                         notes=(f"mHC {which} from its roofline: {why} ({db.backend} {db.data.version} on {db.system.name})",))
        return r
    hiddens, curves, kernels, _ = found
    near = float(hiddens[np.argmin(np.abs(np.log2(hiddens / hidden)))])
    xs, vals = curves[near]
    prov = np.full(len(xs), int(Prov.EXACT), np.int8)
    notes = []
    how = "exact"
    if near != hidden:
        site = sol_at(near)
        vals = vals * query_sol(xs) / site(xs)
        prov[:] = int(Prov.TRANSFERRED)
        how = "transferred"
        notes.append(f"rows at hidden_size {int(near)} carried to {hidden} at equal utilisation against the roofline")
    if len(kernels) > 1:
        notes.append(f"fastest of the kernels per token count: {', '.join(kernels)}")
    g = Grid((xs,), vals, prov, query_sol, scales=("log",))
    return Resolved(g, STEM, db.served_version(STEM), "+".join(kernels) or None, how, (), tuple(notes))
