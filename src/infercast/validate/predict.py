"""Map a measured silicon row to an infercast configuration and predict it.

Mapping (facts from the fidelity README):

* model id as written in the CSV, resolved through the pack's aliases;
* what the benchmark recipes set that the row does not say (KV-cache dtype, MTP, MoE kernel, memory
  fraction, expert parallelism, scheduler sizes): the recipe files of :mod:`.recipes`, matched on the
  row's fields (:meth:`EstimatorCache.settings`); with ``RecipeBook.empty()`` none (defaults only);
* ``gemm_quant_mode`` from the row overrides the checkpoint's inferred GEMM quant (the row says
  what was benchmarked);
* data version: the pack's *current* slot for the backend. The CSV's ``backend_version`` values are
  the versions that were benchmarked (often Dynamo runtime tags); perf tables exist only for some.
  Using the current collected version is a modelling decision, reported in each row's note.
  The benchmarked version's own tables, where the pack collected that version, were tried and
  rejected (see docs/modelling-log.md, 'Benchmarked version's tables');
* agg: ``tp``/``pp`` per replica; the concurrency per replica comes from the benchmark
  concurrency (``_c<N>_``) divided over attention-DP ranks as the row says;
* a row whose TP (or attention-DP) column is the *product* of the TP and EP sizes its id names
  (``..._tp8_ep8_...`` with ``tp_size`` 64) ran on T GPUs, not T x E: see :func:`_product_layout`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from ..api import Estimator
from ..errors import InfercastError, InvalidInputError, UnsupportedModelError
from ..ops.base import DatabaseMode
from .recipes import RecipeBook, RecipeSettings, RowContext, _quant, shipped_recipes
from .silicon import SiliconRow

Predictor = Callable[[SiliconRow], tuple[float, float, str]]

#: Acceptance rate of the MTP draft token assumed for the rows that run MTP (a recipe sets the
#: draft tokens). The rows do not say; the API's default (0.8). See docs/modelling-log.md, 'MTP
#: acceptance'.
MTP_ACCEPTANCE = 0.8


#: estimators (or their errors) an :class:`EstimatorCache` keeps, least recently used dropped
#: first: more than one search over a GPU count asks for (a row whose TP column counts 72 GPUs
#: builds some 190 layouts)
ESTIMATORS_KEPT = 512


class EstimatorCache:
    """The estimators of the rows' configurations, built once and shared by every row (and every
    search layout) with the same configuration: model, system, backend, quantisation, KV cache,
    MTP, MoE kernel, KV memory fraction and parallel layout. At most :data:`ESTIMATORS_KEPT` are
    kept (LRU); :meth:`release` drops them and the perf data they share."""

    def __init__(self, systems_path=None, database_mode="SILICON", max_estimators: int = ESTIMATORS_KEPT,
                 recipes: RecipeBook | None = None):
        self.systems_path = systems_path
        #: the benchmark recipes applied to the rows (:mod:`.recipes`; default: the shipped ones;
        #: ``RecipeBook.empty()``: none, the defaults-only score)
        self.recipes = recipes if recipes is not None else shipped_recipes()
        # Parsed here, not per row: an unknown mode would otherwise fail every row one by one
        # (each reported as not predictable) instead of failing the run (InvalidInputError).
        self.database_mode = DatabaseMode.parse(database_mode)
        self._cache: dict = {}  # small per-model / per-system facts
        self._estimators: OrderedDict = OrderedDict()
        self.max_estimators = max(1, int(max_estimators))

    def release(self) -> None:
        """Drop every estimator and the process's shared perf tables and op curves
        (:func:`release_shared_data`); later rows build what they need again."""
        self._estimators.clear()
        release_shared_data()

    def checkpoint(self, row: SiliconRow) -> tuple[str, str | None, str | None]:
        """(model id, gemm quant override, moe quant override) for a row; see :func:`map_quant`."""
        key = ("ckpt", row.model, row.gemm_quant, row.moe_quant)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = map_quant(row, self.systems_path)
        return hit

    def settings(self, row: SiliconRow, tp: int | None, attention_dp: int | None,
                 clients: int | None = None) -> RecipeSettings:
        """The settings of the recipes (:attr:`recipes`) that apply to ``row`` served on the layout
        ``tp`` x ``attention_dp`` (``clients`` per rank when known)."""
        if not self.recipes:
            return RecipeSettings()
        model = self.checkpoint(row)[0]
        ctx = RowContext(tp, attention_dp, clients, self.ships_mtp(model), self.ships_moe(model))
        return self.recipes.resolve(row, ctx)

    def ships_mtp(self, model: str) -> bool:
        """Whether the checkpoint ``model`` ships MTP (next-n prediction) layers."""
        spec = self._spec(model)
        return spec is not None and spec.mtp_layers > 0

    def ships_moe(self, model: str) -> bool:
        """Whether the checkpoint ``model`` has routed experts."""
        spec = self._spec(model)
        return spec is not None and spec.moe is not None

    def _spec(self, model: str):
        """The model spec of checkpoint ``model``, or None when it does not resolve."""
        key = ("spec", model)
        if key not in self._cache:
            from ..data.model_configs import resolve_model
            from ..data.pack import find_pack
            from ..models.spec import build_spec

            try:
                self._cache[key] = build_spec(resolve_model(find_pack(self.systems_path), model))
            except InfercastError:
                self._cache[key] = None
        return self._cache[key]

    def _gpus_per_node(self, system: str) -> int | None:
        key = ("node", system)
        if key not in self._cache:
            from ..data.pack import find_pack
            from ..data.system import load_system

            try:
                self._cache[key] = load_system(find_pack(self.systems_path), system).node.gpus_per_node
            except InfercastError:
                self._cache[key] = None
        return self._cache[key]

    def get(self, row: SiliconRow, w) -> Estimator:
        """The estimator for a row's model/system/backend and one worker's parallelism ``w``."""
        w = self.layout(row, w)
        moe_tp, moe_ep = _moe_layout(w)
        if self.settings(row, w.tp, w.attention_dp).expert_parallel and self.ships_moe(self.checkpoint(row)[0]):
            moe_tp, moe_ep = 1, w.tp * w.attention_dp
        return self.for_layout(row, w.tp, w.pp, w.attention_dp, moe_tp, moe_ep)

    def layout(self, row: SiliconRow, w):
        """The worker layout ``w`` of ``row`` as served: the row's column rules applied
        (:func:`_product_layout`, :func:`_width_rule`)."""
        return _width_rule(_product_layout(row, w, self._gpus_per_node(row.system)))

    def for_layout(self, row: SiliconRow, tp: int = 1, pp: int = 1, attention_dp: int = 1, moe_tp: int | None = None,
                   moe_ep: int | None = None) -> Estimator:
        """The estimator for a row's model/system/backend on the parallel layout given as is
        (none of the row's column rules; e.g. a search's layout)."""
        model, gemm_q, moe_q = self.checkpoint(row)
        kw = self.settings(row, tp, attention_dp).estimator
        kv, nextn = kw.get("kv_cache_quant"), kw.get("nextn", 0)
        moe_kernel = kw.get("moe_kernel") if self.ships_moe(model) else None
        kv_fraction = kw.get("kv_memory_fraction")
        key = (model, row.system, row.backend, gemm_q, moe_q, kv, nextn, moe_kernel, kv_fraction, tp, pp, attention_dp, moe_tp,
               moe_ep)
        hit = self._estimators.get(key)
        if hit is not None:
            self._estimators.move_to_end(key)
        if isinstance(hit, InfercastError):
            raise hit
        if hit is None:
            try:
                hit = Estimator(
                    model, row.system, row.backend, None, tp, pp,
                    attention_dp=attention_dp, moe_tp=moe_tp, moe_ep=moe_ep,
                    gemm_quant=gemm_q, moe_quant=moe_q, kv_cache_quant=kv, nextn=nextn, mtp_acceptance=MTP_ACCEPTANCE,
                    moe_kernel=moe_kernel, kv_memory_fraction=kv_fraction, database_mode=self.database_mode,
                    systems_path=self.systems_path,
                )
            except InfercastError as exc:
                self._keep(key, exc)
                raise
            self._keep(key, hit)
            # the inputs it was built from, for the command line that reproduces a row
            hit.validate_inputs = {"model": model, "system": row.system, "backend": row.backend, "tp": tp, "pp": pp,
                                   "attention_dp": attention_dp, "moe_tp": moe_tp, "moe_ep": moe_ep, "gemm_quant": gemm_q,
                                   "moe_quant": moe_q, "kv_cache_quant": kv, "nextn": nextn, "moe_kernel": moe_kernel,
                                   "kv_memory_fraction": kv_fraction, "database_mode": self.database_mode.name}
        return hit

    def _keep(self, key, value) -> None:
        self._estimators[key] = value
        while len(self._estimators) > self.max_estimators:
            self._estimators.popitem(last=False)


def release_shared_data() -> None:
    """Forget the perf tables and op curves this process shares between estimators (the
    registry of :meth:`infercast.ops.base.OpDB.shared` and :func:`infercast.data.tables.cached_table`),
    so that their memory is freed once no estimator holds them, and run Python's cyclic collector:
    reference cycles among the released objects hold much of it until the collector happens to
    run (60 b200 vLLM rows: 360 MB resident after the release, 233 MB after the collection).
    Estimators built later read and build them again, with the same values."""
    import gc

    from ..data.tables import cached_table
    from ..ops.base import OpDB

    OpDB.release_shared()
    cached_table.cache_clear()
    gc.collect()


FOUR_BIT = ("nvfp4", "int4_wo", "mxfp4", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8")


def map_quant(row: SiliconRow, systems_path=None) -> tuple[str, str | None, str | None]:
    """Which checkpoint a row benchmarked, and which quant overrides to apply.

    * an ``nvfp4`` row of a model whose NVIDIA NVFP4 export is in the pack
      (``nvidia/<name>-NVFP4``) ran that export: use its config and its own quantisation;
    * a 4-bit label on a checkpoint whose experts are natively 4-bit (gpt-oss mxfp4, Kimi-K2.5
      int4) is that native checkpoint (the CSV labels gpt-oss "fp4"/nvfp4 even on Hopper, which
      has no FP4): no override;
    * a GEMM "fp8" / MoE "fp8_block" row of a model whose FP8 release is in the pack
      (``<org>/<name>-FP8``, e.g. zai-org/GLM-5-FP8) ran that release: use its config;
    * an "fp8" label on a block-scaled fp8 checkpoint (DeepSeek-V3/R1, Qwen3-235B-FP8,
      MiniMax-M2.5) is that checkpoint: the CSV's quant columns are coarse (``fp8`` for both);
    * otherwise the row's ``gemm_quant_mode`` / ``moe_quant_mode`` override the checkpoint.
    """
    from ..data.model_configs import pack_model_ids, resolve_model
    from ..data.pack import find_pack
    from ..models.spec import build_spec

    gq, mq = _quant(row.gemm_quant), _quant(row.moe_quant)
    pack = find_pack(systems_path)
    if gq == "nvfp4":
        name = row.model.split("/", 1)[-1]
        for base in (name, name.removesuffix("-Instruct")):
            export = f"nvidia/{base}-NVFP4"
            if export in pack_model_ids(pack):
                return export, None, None
        # no config of NVIDIA's export in the pack: its alias (the base's config with the
        # export's quantisation), where the alias knows which modules the export keeps in BF16
        # (models.spec.NVFP4_EXPORT_BF16_ATTENTION_ARCHS)
        try:
            alias = resolve_model(pack, row.model if name.upper().endswith("-NVFP4") else f"nvidia/{name}-NVFP4")
            if alias.quant_from_alias == "nvfp4" and build_spec(alias).quant.attn_gemm is not None:
                return alias.model_id, None, None
        except InfercastError:
            pass
    if gq == "fp8" and mq == "fp8_block":
        # block-scaled experts reveal the FP8 release; use it where the pack has its config
        try:
            export = resolve_model(pack, row.model + "-FP8")
            if export.resolved_id.lower().endswith("-fp8") and export.quant_from_alias is None:
                return export.resolved_id, None, None
        except InfercastError:
            pass
    try:
        spec = build_spec(resolve_model(pack, row.model))
    except InfercastError:
        return row.model, gq, mq
    native = spec.quant.moe if spec.moe is not None else None
    if native in FOUR_BIT and spec.quant.gemm == "bfloat16" and (gq in FOUR_BIT or mq in FOUR_BIT):
        return row.model, None, None
    if spec.quant.gemm == "fp8_block" and gq in ("fp8", "fp8_block") and mq in (None, "fp8", "fp8_block"):
        return row.model, None, None  # the coarse "fp8" label of a block-scaled fp8 checkpoint
    return row.model, gq, mq


_ID_LAYOUT = re.compile(r"_tp(\d+)(?:_0)?_ep(\d+|none)(?:_0)?(?:_|$)")


def _product_layout(row: SiliconRow, w, gpus_per_node: int | None):
    """Undo the TP x EP product some agg rows carry in their TP (or attention-DP) column.

    156 DeepSeek / Qwen3.5 rows give ``(tp, dp, moe_tp, moe_ep) = (64, 1, 8, 8)`` (or
    ``(16, 1, 4, 4)``, ``(1, 64, 8, 8)``) on 8-GPU nodes while their id says ``tp8_ep8``: the
    column holds T x E, the deployment ran T GPUs with EP E (64 GPUs per replica would be 8 nodes
    for a c4 benchmark, and TP 64 does not even divide Qwen3.5's 32 heads). Rule: when the id's
    ``tp<T>_ep<E>`` tokens multiply to the TP column (or to the attention-DP column with TP 1),
    the worker is T GPUs -- TP T (attention DP T) with MoE EP E. Rows without tokens whose
    columns have the same signature (width = moe_tp x moe_ep with moe_tp = moe_ep = E, wider
    than a node) get T = E. See docs/modelling-log.md, 'TP x EP product layouts'."""
    if row.mode != "agg":
        return w
    m = _ID_LAYOUT.search(row.id or "")
    square = _square_layout(w, m)
    if square is not None:
        return square
    if m:
        t, e = int(m.group(1)), (1 if m.group(2) == "none" else int(m.group(2)))
        if e <= 1 or t * e not in (w.tp, w.attention_dp) or (w.attention_dp == t * e and w.tp != 1):
            return w
    elif w.moe_ep > 1 and w.moe_tp == w.moe_ep and w.tp * w.attention_dp == w.moe_ep**2 and gpus_per_node and w.tp * w.attention_dp > gpus_per_node:
        t = e = w.moe_ep
    else:
        return w
    if t % e:
        return w
    if w.attention_dp > 1:
        return replace(w, tp=1, attention_dp=t, moe_tp=t // e, moe_ep=e)
    return replace(w, tp=t, attention_dp=1, moe_tp=t // e, moe_ep=e)


#: the narrowest tensor-parallel degree without expert parallelism that :func:`gpu_count` reads as a
#: GPU count for an MoE model (see there)
MOE_TP_WITHOUT_EP_MAX = 8


def gpu_count(row: SiliconRow, moe_model: bool = False) -> int | None:
    """The GPU count an agg row's TP column holds when it is no tensor-parallel degree, else None.

    30 development rows (DeepSeek-R1 on gb200, TensorRT-LLM nvfp4 and SGLang fp8, one source file) give
    ``tp`` 20, 24, 28, 36, 48, 52 or 72 with EP 1 and no attention DP: no backend shards by a
    degree that is not a power of two, and none of those divides the model's 128 heads. They are
    deployments of that many GPUs of a GB200 NVL72 rack whose split the row does not say; the
    fully specified gb200 disagg rows of the same model run TP4 / DEP4 prefill workers with DEP8-32
    decode workers (20 = 4 + 16, 36 = 4 + 32, 72 = 10 x 4 + 32). Such a row is predicted as the
    best deployment of exactly that many GPUs at its concurrency
    (:func:`infercast.search.search_fixed`; the serving predictor only), and says so.

    Two more rows of that family give ``tp`` 32 and 64 (``moe_model``: the checkpoint has routed
    experts): a power of two, but tensor parallelism wider than :data:`MOE_TP_WITHOUT_EP_MAX` for an
    MoE model without expert parallelism slices every expert of DeepSeek-R1 below 128 of its 2048
    columns, a layout nobody serves; read as one TP 32 replica such a row would queue for KV cache,
    and no all-reduce over 64 GPUs is in the tables. See docs/modelling-log.md, 'GPU-count rows'."""
    w = row.worker
    if row.mode != "agg" or w is None or w.tp < 2 or w.pp > 1 or w.attention_dp > 1:
        return None
    power_of_two = w.tp & (w.tp - 1) == 0
    if power_of_two and not (moe_model and w.tp > MOE_TP_WITHOUT_EP_MAX and w.moe_ep <= 1):
        return None
    return int(w.tp)


def _square_layout(w, id_match):
    """The second product signature: ``(tp, dp, moe_tp, moe_ep) = (T, T, 1, T*T)``.

    53 vLLM rows (MiniMax-M2.5, Kimi-K2.5) read as T*T GPUs (TP T x attention DP T, EP T*T) while
    their id, where it has tokens, says ``tp<T>_ep<T>``. The measurements side with T GPUs, TP T,
    EP T: MiniMax-M2.5 8192x1024 on "2 x 2" b200 queues for KV cache (13.5 s TTFT at c256, 70 s at
    c512), which only 2 GPUs explain (they hold 1.6M cached tokens, 256 x 9216 need 2.4M; 4 GPUs
    would hold them all). See docs/modelling-log.md, 'TP x EP product layouts'. Only taken when the
    id's tokens, if any, are ``tp<T>_ep<T>``."""
    t = w.tp
    if not (t > 1 and w.attention_dp == t and w.moe_tp == 1 and w.moe_ep == t * t):
        return None
    if id_match is not None and (id_match.group(2) == "none" or (int(id_match.group(1)), int(id_match.group(2))) != (t, t)):
        return None
    return replace(w, tp=t, attention_dp=1, moe_tp=1, moe_ep=t)


def _width_rule(w):
    """A row whose MoE layout spans more GPUs than tp x attention_dp ran attention data-parallel
    over the rest (e.g. vLLM tp1 with two DP ranks and TP-2 experts)."""
    width = w.tp * w.attention_dp
    moe_width = w.moe_tp * w.moe_ep
    if moe_width > width and moe_width % width == 0 and w.attention_dp == 1:
        return replace(w, attention_dp=moe_width // w.tp)
    return w


def _moe_layout(w) -> tuple[int | None, int | None]:
    """The row's (moe_tp, moe_ep), or None to derive them, when they do not span the replica.

    Rows leave MoE sizes empty for dense models and sometimes for MoE ones; the width rule
    (moe_tp x moe_ep == tp x attention_dp) then decides: keep moe_ep when it divides the width
    and derive moe_tp."""
    width = w.tp * w.attention_dp
    if w.moe_tp * w.moe_ep == width:
        return (None if w.moe_ep == 1 and w.moe_tp == width else w.moe_tp), (None if w.moe_ep == 1 else w.moe_ep)
    if w.moe_ep > 1 and width % w.moe_ep == 0:
        return None, w.moe_ep
    return None, None


def benchmark_concurrency(row: SiliconRow) -> int:
    """The row's benchmark concurrency (closed-loop clients), which every prediction needs.

    Raises :class:`InvalidInputError` when the row does not carry one (no ``_c<N>_`` in its id,
    no ``silicon_concurrency=N`` in ``silicon_data_source`` and no batch columns to derive it
    from, see :class:`SiliconRow`): :func:`~infercast.validate.report.run_validation` reports such
    a row as not predictable instead of predicting it at some assumed concurrency."""
    if row.concurrency is None or row.concurrency <= 0:
        raise InvalidInputError(
            "row has no benchmark concurrency",
            "no _c<N>_ token in its id, no silicon_concurrency=N in silicon_data_source and no "
            "batch columns to derive it from",
        )
    return int(row.concurrency)


def clients_per_rank(row: SiliconRow, est: Estimator) -> int:
    """Closed-loop clients one attention-DP rank serves. The row's ``batch_size`` is that number
    (the benchmark concurrency is batch_size x attention_dp in 3,577 of 3,607 agg rows; in the
    others the concurrency spans several replicas, e.g. c448 over 32 replicas of batch 14);
    without it (or when the attention-DP size was derived from the MoE width, see
    :func:`_width_rule`), the concurrency divided over the attention-DP ranks."""
    w = row.worker
    if w is not None and w.batch_size and w.attention_dp == est.plan.parallel.attention_dp:
        return max(1, int(w.batch_size))
    return max(1, round(float(benchmark_concurrency(row)) / max(est.plan.parallel.attention_dp, 1)))


def static_predictor(cache: EstimatorCache) -> Predictor:
    """The single-batch model: TTFT = one prefill of the whole batch, TPOT = mean decode step."""

    def predict(row: SiliconRow):
        if row.mode != "agg":
            raise UnsupportedModelError("disaggregated rows need the serving model", "run without --static")
        benchmark_concurrency(row)
        w = row.worker
        est = cache.get(row, w)
        batch = clients_per_rank(row, est)
        ttft = est.prefill_ms(batch, row.isl)
        tpot = est.decode_ms(batch, row.isl, row.osl)
        return ttft, tpot, f"data {est.version} (benchmarked {row.backend_version or '?'})"

    return predict
