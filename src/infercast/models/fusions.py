"""Which kernel fusions a serving backend applies to a model: the per-backend rules behind
:class:`~infercast.models.plan.Fusions`.

The perf tables measure unfused kernels one by one; an engine that fuses two of them runs a
different (cheaper) step. Each rule below names the engine behaviour it stands for and its
conditions; what each moved on the dev silicon rows (``python -m benchmarks.fidelity``) is in
docs/modelling-log.md, 'Kernel fusions'.

* **SGLang shared-experts fusion.** SGLang folds the DeepSeek-V3/R1 shared expert into the routed
  expert kernel as an extra expert that every token selects (on by default; its
  ``--disable-shared-experts-fusion`` flag turns it off). It applies to the DeepSeek-V3
  architecture with its 256 routed experts and one shared expert of the routed width, on NVIDIA
  GPUs, and not under expert parallelism (the engine turns it off for EP > 1 and for the DeepEP
  all-to-all path). The fused kernel is costed as the routed-expert table at ``(topk + 1) / topk``
  times the tokens (the extra token-expert pairs); the shared MLP's own GEMMs drop out (dropping
  them with no extra expert cost would price the shared expert's weights and FLOPs at zero). See
  docs/modelling-log.md, 'SGLang shared-experts fusion'.
* **TensorRT-LLM RoPE in the attention op.** TensorRT-LLM's attention op takes the fused QKV and
  applies the rotary embedding in its own pre-processing kernel (with the KV-cache write), which
  its attention tables time; vLLM and SGLang run a separate rotary kernel before attention.
  TensorRT-LLM also fuses the RMSNorm after each TP all-reduce into the all-reduce; that norm is
  still priced (at SOL). See docs/modelling-log.md, 'TensorRT-LLM RoPE in the attention op'.
* **SGLang all-reduce + RMSNorm fusion.** SGLang turns on FlashInfer's fused all-reduce (all-reduce,
  residual add and the next RMSNorm in one kernel) by default for DeepSeek-V3 and gpt-oss
  architectures under TP > 1 without attention DP or the all-to-all MoE path, on a single node
  (sgl-project/sglang#12724 names the two architectures and restricts it to single-node servers;
  #28786 lists the TP / DP-attention / a2a guards), on Hopper and Blackwell GPUs. The norms after
  the all-reduces drop out of the plan (the all-reduce keeps its measured time). See
  docs/modelling-log.md, 'SGLang all-reduce + RMSNorm fusion'.
* **Activation quantisation in the producer op** (``norm_quant``, ``act_quant``). Every collector
  times an fp8 per-tensor GEMM from bf16 activations, so its table includes the kernel that casts
  them to fp8 (TensorRT-LLM's ``Linear`` without an input scale quantises dynamically, vLLM's with a
  static scale, SGLang's per token); the pack times that cast separately (``quantize`` /
  ``scale_matrix_perf``: 2-3 us per call at decode sizes, 30-50 us at 8k tokens on B200). Serving
  engines write the GEMM's input already quantised:
  vLLM's ``fuse_norm_quant`` and ``fuse_act_quant`` compile passes (on from ``-O1``) for the
  RMSNorm before the QKV and gate/up projections and the SwiGLU before the down projection;
  TensorRT-LLM's Llama decoder layer for the first two only, in its all-reduce + RMSNorm kernel
  (``RESIDUAL_RMS_NORM_QUANT_FP8``), which it uses under TP > 1 without attention DP and not for
  models of hidden size 4096 or less ("accuracy issues"); its Qwen3 decoder layer runs plain
  RMSNorm modules. TensorRT-LLM's ``GatedMLP`` (every dense model) has its SwiGLU write the down
  projection's fp8 input since PR #6540 (Aug 2025; "Enable fp8 SwiGLU to minimize host
  overhead"). Those GEMMs drop the ``scale_matrix`` time (:func:`infercast.ops.gemm.resolve_gemm`);
  the O projection never does; the rules apply to the models and TP sizes the engines' code
  names, not to every model. The pack has no quantisation table for nvfp4 or fp8_block
  activations, so those GEMMs stay as measured. See docs/modelling-log.md, 'Activation
  quantisation in the producer op'.
"""

from __future__ import annotations

from .plan import Fusions, ParallelConfig
from .spec import ModelSpec

#: architectures SGLang's shared-experts fusion is written for
SHARED_EXPERT_FUSION_ARCHS = ("DeepseekV3ForCausalLM",)
#: routed experts of that architecture (the fused kernel's expert layout assumes it)
SHARED_EXPERT_FUSION_EXPERTS = 256
#: backends whose attention op applies RoPE itself (no separate rotary kernel)
ROPE_IN_ATTENTION_BACKENDS = ("trtllm",)
#: architectures SGLang turns its FlashInfer all-reduce + RMSNorm fusion on for by default
ALLREDUCE_NORM_FUSION_ARCHS = ("DeepseekV3ForCausalLM", "GptOssForCausalLM")
#: GPU generations (sm_version // 10) of that fusion's kernels: Hopper, Blackwell
ALLREDUCE_NORM_FUSION_SM = (9, 10)
#: architectures whose TensorRT-LLM decoder layer fuses the quantisation of the QKV and gate/up
#: inputs into its all-reduce + RMSNorm kernel
TRTLLM_NORM_QUANT_ARCHS = ("LlamaForCausalLM",)
#: TensorRT-LLM turns that fusion off for models no wider than this ("accuracy issues")
TRTLLM_NORM_QUANT_MIN_HIDDEN = 4096
#: backends whose SwiGLU writes the fp8 input of the down projection (vLLM's ``fuse_act_quant``;
#: TensorRT-LLM's ``GatedMLP``, every model, since NVIDIA/TensorRT-LLM PR #6540, Aug 2025)
ACT_QUANT_FUSION_BACKENDS = ("trtllm", "vllm")


def engine_fusions(backend: str, spec: ModelSpec, par: ParallelConfig, system=None) -> Fusions:
    """The fusions ``backend`` applies when serving ``spec`` under ``par`` (on ``system``, a
    :class:`~infercast.data.system.SystemSpec`, for the rules that depend on the GPU or node)."""
    m = spec.moe
    shared = (
        backend == "sglang"
        and m is not None
        and spec.architecture in SHARED_EXPERT_FUSION_ARCHS
        and m.experts == SHARED_EXPERT_FUSION_EXPERTS
        and m.shared_inter == m.inter  # one shared expert of the routed width
        and par.ep == 1
        and par.moe_comm != "alltoall"
    )
    ar_norm = (
        backend == "sglang"
        and spec.architecture in ALLREDUCE_NORM_FUSION_ARCHS
        and par.tp > 1
        and par.attention_dp == 1
        and par.moe_comm != "alltoall"
        and system is not None
        and system.gpu.sm_version is not None
        and system.gpu.sm_version // 10 in ALLREDUCE_NORM_FUSION_SM
        and par.tp * par.attention_dp <= system.node.gpus_per_node  # single node
    )
    # set only where a GEMM runs fp8 per-tensor: the one mode whose quantisation kernel the pack
    # measures (infercast.ops.gemm.FUSABLE_INPUT_QUANT), so the plan names no inert fusion
    q = spec.quant
    fp8 = "fp8" in (q.gemm, q.attention_gemm, q.shared_expert_gemm)
    trt_norm_quant = (
        fp8
        and backend == "trtllm"
        and spec.architecture in TRTLLM_NORM_QUANT_ARCHS
        and par.tp > 1
        and par.attention_dp == 1
        and spec.hidden > TRTLLM_NORM_QUANT_MIN_HIDDEN
    )
    return Fusions(shared_experts=shared, rope_in_attention=backend in ROPE_IN_ATTENTION_BACKENDS, allreduce_norm=ar_norm,
                   norm_quant=(fp8 and backend == "vllm") or trt_norm_quant,
                   act_quant=fp8 and backend in ACT_QUANT_FUSION_BACKENDS)
