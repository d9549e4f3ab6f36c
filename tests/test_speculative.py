"""Speculative decoding beyond MTP (EAGLE, EAGLE-3, n-gram, draft model) on the synthetic pack:
tokens per step from the acceptance inputs, the draft passes a decode step adds, the draft's
memory, the engine configurations that name them and the flags' errors.

tiny-llama: hidden 256, 8 heads, 2 KV heads, head_dim 32, FFN 512, 2 layers, vocab 1000.
"""

from __future__ import annotations

import json

import pytest

import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli
from infercast import Estimator
from infercast.errors import InvalidConfigError, InvalidInputError
from infercast.models.plan import Plan, SpecDecode
from infercast.models.speculative import spec_decode_of
from infercast.report.launch import DRAFT_PLACEHOLDER, Deployment, WorkerSpec, engine_command, launch_files
from infercast.serving.engine_args import parse_engine_cmd, parse_engine_file, parse_trtllm_options

B, KV = 8.0, 300.0
H, L = 256, 2


def _est(synth, speculative=None, backend="trtllm", **kw):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, backend, tp=1, systems_path=synth.systems_dir,
                     speculative=speculative, **kw)


@pytest.fixture(scope="module")
def base(synth):
    return _est(synth)


def _verify_ms(base, k: int) -> float:
    """The target's decode step verifying k + 1 tokens per sequence (no draft cost)."""
    e = base.engine
    return e.tokenwise_scalar(B * (k + 1), B) + e.generation_attention_scalar(B, KV)


# ---- acceptance -> tokens per step ---------------------------------------------------------------

def test_tokens_per_step_from_a_rate_and_from_positions():
    # rate a: position i accepted with a**i; 1 + 0.5 + 0.25 + 0.125
    assert SpecDecode(nextn=3, acceptance=0.5).tokens_per_step == 1.875
    # per-position probabilities are summed as given (vLLM's per-position acceptance rates)
    assert SpecDecode(nextn=3, acceptance_per_position=(0.9, 0.6, 0.3), method="ngram").tokens_per_step == pytest.approx(2.8)
    assert SpecDecode(nextn=2, acceptance=0.0, method="ngram").tokens_per_step == 1.0
    # a text list, and the --mtp-acceptance alias standing for the rate
    assert spec_decode_of(0, None, {"method": "eagle3", "num_speculative_tokens": 2,
                                    "acceptance_per_position": "0.7,0.4"}).position_acceptance == (0.7, 0.4)
    assert spec_decode_of(2, 0.6, {"method": "ngram"}).position_acceptance == pytest.approx((0.6, 0.36))
    assert spec_decode_of(2).method == "mtp" and spec_decode_of(2).acceptance == 0.8


@pytest.mark.parametrize(("kw", "needle"), [
    ({"method": "medusa", "num_speculative_tokens": 2}, "unknown --speculative-method"),
    ({"method": "ngram"}, "needs --num-speculative-tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_per_position": [0.5]}, "1 values for 2"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_per_position": [0.5, 0.7]}, "must not grow"),
    ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_per_position": [1.5, 0.7]}, "in [0, 1]"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs --draft-model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}, "runs no draft network"),
    ({"method": "eagle", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "n-gram matcher"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3}, "exceeds"),
    ({"method": "ngram", "num_speculative_tokens": 9}, "0..8"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "unknown speculative decoding setting typo"),
])
def test_bad_settings_are_refused(kw, needle):
    with pytest.raises(InvalidInputError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        spec_decode_of(0, None, kw).check()


def test_nextn_and_num_speculative_tokens_must_agree():
    with pytest.raises(InvalidInputError, match="conflicts"):
        spec_decode_of(2, None, {"num_speculative_tokens": 3})
    with pytest.raises(InvalidInputError, match="conflicts"):
        spec_decode_of(2, 0.5, {"acceptance_rate": 0.6})


# ---- n-gram: verification only ------------------------------------------------------------------

def test_ngram_step_is_the_verification_alone(synth, base):
    e = _est(synth, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.0})
    assert not [c for c in e.engine.ops if c.op.phase == "decode"]
    assert e.engine.decode_scalar(B, KV) == _verify_ms(base, 3)
    assert e.memory.weights == base.memory.weights and e.memory.kv_per_token == base.memory.kv_per_token


def test_acceptance_zero_scales_throughput_by_the_step_cost_ratio(synth, base):
    """With nothing accepted a step yields one token: TPOT is the speculative step's mean, and
    throughput falls by the ratio of the step costs."""
    e = _est(synth, {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.0})
    b, isl, osl = 4, 256, 33
    r, r0 = e.static(b, isl, osl, breakdown=False), base.static(b, isl, osl, breakdown=False)
    assert r.ttft_ms == r0.ttft_ms
    assert r.tpot_ms == pytest.approx(e.decode_ms(b, isl, osl), rel=1e-12)
    assert r0.tpot_ms == pytest.approx(base.decode_ms(b, isl, osl), rel=1e-12)
    assert r.tpot_ms > r0.tpot_ms


def test_per_position_acceptance_sets_the_steps(synth):
    per = (0.9, 0.6, 0.3)
    e = _est(synth, {"method": "ngram", "num_speculative_tokens": 3, "acceptance_per_position": list(per)})
    assert e.engine.tokens_per_step == pytest.approx(2.8)
    b, isl, osl = 2, 128, 57
    steps = (osl - 1) / 2.8
    want = e.decode_ms(b, isl, int(round(steps)) + 1) * steps / (osl - 1)
    assert e.static(b, isl, osl, breakdown=False).tpot_ms == pytest.approx(want, rel=1e-12)


# ---- EAGLE heads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_draft_ops(synth, method):
    e = _est(synth, {"method": method, "num_speculative_tokens": 3})
    ops = {o.name: o for o in e.plan.ops if o.phase == "decode"}
    assert all(n.startswith("draft_") for n in ops)
    assert ops["draft_qkv_gemm"].count == 3 and ops["draft_attention"].count == 3
    assert ops["draft_qkv_gemm"].params["n"] == (8 + 2 * 2) * 32
    assert ops["draft_qkv_gemm"].params["k"] == (2 * H if method == "eagle3" else H)
    assert ops["draft_gate_up_gemm"].params["n"] == 2 * 512 and ops["draft_lm_head"].params["n"] == 1000
    fc = ops["draft_fc"]
    assert (fc.params["n"], fc.params["k"], fc.count) == ((H, 3 * H, 1) if method == "eagle3" else (H, 2 * H, 3))


def test_eagle_step_adds_k_passes_of_one_target_layer(synth, base):
    """The target-shaped EAGLE-1 head is one target layer plus the ends: each of its k passes
    costs every base op once (an op over L layers: a 1/L share) at one token per sequence, plus
    the fc fusion."""
    k = 2
    e = _est(synth, {"method": "eagle", "num_speculative_tokens": k})
    comps = base.engine.components(dec_batch=B, dec_kv=KV)
    one_pass = sum(float(v) / next(c.op.count for c in base.engine.ops if c.name == n) for n, (v, _) in comps.items())
    fc = next(c for c in e.engine.ops if c.name == "draft_fc")
    fc_ms = fc.resolved[0].grid.scalar(B, refuse=True)[0] * fc.op.count
    assert e.engine.decode_scalar(B, KV) == pytest.approx(_verify_ms(base, k) + k * one_pass + fc_ms, rel=1e-12)
    # drafts run in decode steps only: prefill is the target's
    assert e.prefill_ms(2, 256) == base.prefill_ms(2, 256)


def test_eagle_head_memory(synth, base):
    """Head weights: one layer (QKV, O, norms, gated MLP) in bf16, the fc, and for EAGLE-3 the
    wider QKV input and its own LM head; KV: one layer's K and V."""
    layer = (H * 384 + 256 * H + 2 * H) * 2.0 + 3 * H * 512 * 2.0
    kv_layer = 2 * 2 * 32 * 2.0
    e1 = _est(synth, {"method": "eagle", "num_speculative_tokens": 2})
    assert e1.memory.weights - base.memory.weights == pytest.approx(layer + 2 * H * H * 2.0)
    assert e1.memory.kv_per_token - base.memory.kv_per_token == kv_layer
    e3 = _est(synth, {"method": "eagle3", "num_speculative_tokens": 2})
    assert e3.memory.weights - base.memory.weights == pytest.approx(layer + 3 * H * H * 2.0 + H * 384 * 2.0 + 1000 * H * 2.0)


def test_eagle_head_from_its_config(synth, tmp_path, base):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "num_attention_heads": 4,
           "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 1024, "num_hidden_layers": 1,
           "vocab_size": 1000, "draft_vocab_size": 400}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    e = _est(synth, {"method": "eagle3", "num_speculative_tokens": 2, "draft_model": str(path)})
    ops = {o.name: o for o in e.plan.ops if o.phase == "decode"}
    assert ops["draft_qkv_gemm"].params["n"] == (4 + 2) * 32 and ops["draft_lm_head"].params["n"] == 400
    assert ops["draft_gate_up_gemm"].params["n"] == 2048
    assert e.memory.kv_per_token - base.memory.kv_per_token == 2 * 1 * 32 * 2.0
    path.write_text(json.dumps({**cfg, "hidden_size": 512}))
    with pytest.raises(InvalidInputError, match="hidden_size 512"):
        _est(synth, {"method": "eagle3", "num_speculative_tokens": 2, "draft_model": str(path)})


# ---- draft model ---------------------------------------------------------------------------------

def test_draft_model_step_adds_k_decode_steps_of_the_draft(synth, base):
    """The target as its own draft model: a step is the verification plus k of its own decode
    steps; weights and KV per token double."""
    k = 3
    e = _est(synth, {"method": "draft_model", "num_speculative_tokens": k, "draft_model": sp.MODEL_ID})
    want = _verify_ms(base, k) + k * base.engine.decode_scalar(B, KV)
    assert e.engine.decode_scalar(B, KV) == pytest.approx(want, rel=1e-12)
    assert e.memory.weights == pytest.approx(2 * base.memory.weights)
    assert e.memory.kv_per_token == 2 * base.memory.kv_per_token
    # its own quant: the fp8 checkpoint as the draft
    f = _est(synth, {"method": "draft_model", "num_speculative_tokens": k, "draft_model": sp.MODEL_ID_FP8})
    assert {o.params.get("quant") for o in f.plan.ops if o.name == "draft_o_gemm"} == {"fp8_block"}
    assert f.memory.weights < e.memory.weights


def test_draft_tp_and_bad_draft_tp(synth):
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=synth.systems_dir,
                  speculative={"method": "draft_model", "num_speculative_tokens": 2, "draft_model": sp.MODEL_ID, "draft_tp": 1})
    assert e.plan.draft_parallel.tp == 1
    assert not [o for o in e.plan.ops if o.name.startswith("draft_") and o.kind == "allreduce"]
    with pytest.raises(InvalidConfigError):
        _est(synth, {"method": "eagle", "num_speculative_tokens": 2, "draft_tp": 3})


def test_plan_json_round_trip_keeps_the_draft(synth):
    e = _est(synth, {"method": "draft_model", "num_speculative_tokens": 2, "draft_model": sp.MODEL_ID,
                     "acceptance_per_position": [0.8, 0.5]})
    plan = Plan.from_json(e.plan.to_json())
    assert plan == e.plan
    back = Estimator.from_plan(plan, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    assert back.memory == e.memory and back.engine.decode_scalar(B, KV) == e.engine.decode_scalar(B, KV)


def test_notes_say_what_is_costed(synth):
    r = _est(synth, {"method": "ngram", "num_speculative_tokens": 2}).static(2, 128, 16, breakdown=False)
    assert any("no GPU draft cost" in n and "2.44 tokens per step" in n for n in r.notes)
    r = _est(synth, {"method": "eagle3", "num_speculative_tokens": 2}).static(2, 128, 16, breakdown=False)
    assert any("EAGLE-3 head" in n and "prompt pass is not costed" in n for n in r.notes)


# ---- engine configurations -----------------------------------------------------------------------

def test_vllm_speculative_config():
    s = parse_engine_cmd("vllm serve org/t --speculative-config '{\"method\": \"eagle3\", \"model\": \"org/head\", "
                         "\"num_speculative_tokens\": 3, \"draft_tensor_parallel_size\": 1}'")
    assert s.estimator_kw == {"nextn": 3, "speculative": {"method": "eagle3", "draft_model": "org/head", "draft_tp": 1}}
    s = parse_engine_cmd("vllm serve org/t --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                         "\"prompt_lookup_max\": 5, \"prompt_lookup_min\": 2}'")
    assert s.estimator_kw == {"nextn": 4, "speculative": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}}
    # a model without a method is a draft model; unmodelled keys are listed
    s = parse_engine_cmd("vllm serve org/t --speculative-config '{\"model\": \"org/small\", \"num_speculative_tokens\": 2, "
                         "\"disable_by_batch_size\": 8}'")
    assert s.estimator_kw["speculative"] == {"method": "draft_model", "draft_model": "org/small"}
    assert any("disable_by_batch_size" in n for n in s.notes)
    assert parse_engine_cmd("vllm serve m --speculative-config '{\"method\": \"qwen3_next_mtp\", \"num_speculative_tokens\": 2}'"
                            ).estimator_kw == {"nextn": 2}


def test_sglang_speculative_algorithms():
    base = "python -m sglang.launch_server --model-path org/t "
    s = parse_engine_cmd(base + "--speculative-algorithm EAGLE3 --speculative-draft-model-path org/head "
                         "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    assert s.estimator_kw == {"nextn": 3, "speculative": {"method": "eagle3", "draft_model": "org/head"}} and s.ignored == []
    s = parse_engine_cmd(base + "--speculative-algorithm STANDALONE --speculative-draft-model-path org/small "
                         "--speculative-num-steps 4")
    assert s.estimator_kw == {"nextn": 4, "speculative": {"method": "draft_model", "draft_model": "org/small"}}
    s = parse_engine_cmd(base + "--speculative-algorithm NGRAM --speculative-num-draft-tokens 6 "
                         "--speculative-ngram-min-match-window-size 1 --speculative-ngram-max-match-window-size 4")
    assert s.estimator_kw == {"nextn": 5, "speculative": {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4}}
    # EAGLE without a draft path runs the checkpoint's MTP layers; a tree is noted
    s = parse_engine_cmd(base + "--speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 4")
    assert s.estimator_kw == {"nextn": 2} and any("tree drafting" in n for n in s.notes)
    with pytest.raises(InvalidInputError, match="needs --speculative-draft-model-path"):
        parse_engine_cmd(base + "--speculative-algorithm STANDALONE")


def test_trtllm_speculative_config():
    s = parse_trtllm_options({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3,
                                                     "speculative_model_dir": "org/head"}})
    assert s.estimator_kw == {"nextn": 3, "speculative": {"method": "eagle3", "draft_model": "org/head"}}
    s = parse_trtllm_options({"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4,
                                                     "max_matching_ngram_size": 3, "is_keep_all": True}})
    assert s.estimator_kw == {"nextn": 4, "speculative": {"method": "ngram", "prompt_lookup_max": 3}}
    assert any("is_keep_all" in n for n in s.notes)
    s = parse_trtllm_options({"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 2,
                                                     "speculative_model": "org/small"}})
    assert s.estimator_kw["speculative"] == {"method": "draft_model", "draft_model": "org/small"}


WORKERS = [
    WorkerSpec(role="agg", workers=1, tp=2, nextn=3, spec_method="eagle3", draft_model="org/head"),
    WorkerSpec(role="agg", workers=1, tp=2, nextn=4, spec_method="ngram", prompt_lookup_min=2, prompt_lookup_max=5),
    WorkerSpec(role="agg", workers=1, tp=2, nextn=2, spec_method="draft_model", draft_model="org/small"),
    WorkerSpec(role="agg", workers=1, tp=2, nextn=2, spec_method="eagle"),
]


def _want(w: WorkerSpec, backend: str) -> dict:
    sp_ = {"method": w.spec_method}
    if w.spec_method != "ngram":
        sp_["draft_model"] = w.draft_model or DRAFT_PLACEHOLDER
    if w.prompt_lookup_min and backend != "trtllm":  # TensorRT-LLM's matcher has no shortest n-gram
        sp_["prompt_lookup_min"] = w.prompt_lookup_min
    if w.prompt_lookup_max:
        sp_["prompt_lookup_max"] = w.prompt_lookup_max
    return {"nextn": w.nextn, "speculative": sp_}


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("w", WORKERS, ids=["eagle3", "ngram", "draft-model", "eagle-placeholder"])
def test_launch_files_round_trip(backend, w):
    s = parse_engine_cmd(engine_command(Deployment("org/t", backend, "1.0", (w,), 100, 10, 4), w))
    got = {k: v for k, v in s.estimator_kw.items() if k in ("nextn", "speculative")}
    assert got == _want(w, backend) and s.ignored == []


@pytest.mark.parametrize("w", WORKERS, ids=["eagle3", "ngram", "draft-model", "eagle-placeholder"])
def test_launch_files_round_trip_trtllm(tmp_path, w):
    files = launch_files(Deployment("org/t", "trtllm", "1.0", (w,), 100, 10, 4))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    s = parse_engine_file(tmp_path / "extra_llm_api_options_agg.yaml")
    assert {k: v for k, v in s.estimator_kw.items() if k in ("nextn", "speculative")} == _want(w, "trtllm")


def test_worker_spec_of_an_estimate(synth):
    from infercast.report.launch import worker_spec
    from infercast.serving.backends import scheduler_params

    e = _est(synth, {"method": "draft_model", "num_speculative_tokens": 2, "draft_model": sp.MODEL_ID_FP8})
    w = worker_spec(e, scheduler_params("trtllm", e.data.system, e.spec))
    assert (w.nextn, w.spec_method, w.draft_model, w.draft_tp) == (2, "draft_model", sp.MODEL_ID_FP8, None)


# ---- command line --------------------------------------------------------------------------------

def _cli(synth, *extra):
    return ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--batch", "2",
            "--isl", "128", "--osl", "16", "--systems-path", str(synth.systems_dir), "--json", *extra]


def test_cli_flags_and_aliases(synth, capsys):
    rc, out, err = run_cli(capsys, _cli(synth, "--speculative-method", "eagle3", "--num-speculative-tokens", "2",
                                        "--acceptance-rate", "0.5"))
    assert rc == 0, err
    new = json.loads(out)
    rc, out, err = run_cli(capsys, _cli(synth, "--speculative-method", "eagle3", "--nextn", "2", "--mtp-acceptance", "0.5"))
    assert rc == 0, err
    assert json.loads(out)["tpot_ms"] == new["tpot_ms"]
    est = _est(synth, {"method": "eagle3", "num_speculative_tokens": 2, "acceptance_rate": 0.5})
    assert new["tpot_ms"] == pytest.approx(est.static(2, 128, 16, breakdown=False).tpot_ms, rel=1e-12)


@pytest.mark.parametrize(("extra", "needles"), [
    (["--speculative-method", "medusa", "--nextn", "2"], ["unknown --speculative-method 'medusa'", "eagle3"]),
    (["--speculative-method", "draft_model", "--nextn", "2"], ["needs --draft-model"]),
    (["--speculative-method", "ngram", "--nextn", "2", "--acceptance-per-position", "0.5"], ["1 values for 2"]),
    (["--speculative-method", "ngram", "--nextn", "2", "--acceptance-per-position", "a,b"], ["comma-separated"]),
    (["--speculative-method", "draft_model", "--nextn", "2", "--draft-model", "org/none"], ["org/none"]),
    (["--engine-cmd", "vllm serve m --speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 2}'",
      "--speculative-method", "ngram"], ["--speculative-method ngram conflicts"]),
])
def test_cli_errors_are_one_line(synth, capsys, extra, needles):
    backend = "vllm" if "--engine-cmd" in extra else "trtllm"
    argv = _cli(synth, *extra)
    argv[argv.index("trtllm")] = backend
    assert_one_line_error(*run_cli(capsys, argv), *needles)


# ---- experiments file ----------------------------------------------------------------------------

EXP = f"""\
experiments:
  - name: spec
    model: {sp.MODEL_ID}
    system: {sp.SYSTEM}
    backend: trtllm
    isl: 128
    osl: 16
    layout: {{tp: 1}}
    concurrency: [2]
    speculative: {{method: eagle3, num_speculative_tokens: 2, acceptance_per_position: [0.7, 0.4]}}
"""


def test_exp_speculative_key(synth):
    from infercast.api import serve_agg_replica
    from infercast.errors import ConfigFileError
    from infercast.exp import parse_experiments
    from infercast.exp.run import run_experiment
    from infercast.serving.backends import scheduler_params

    (exp,) = parse_experiments(EXP)
    assert exp.estimator_kw()["speculative"] == {"method": "eagle3", "num_speculative_tokens": 2,
                                                 "acceptance_per_position": [0.7, 0.4]}
    (out,) = run_experiment(exp, systems_path=synth.systems_dir)
    est = _est(synth, {"method": "eagle3", "num_speculative_tokens": 2, "acceptance_per_position": [0.7, 0.4]})
    r, _ = serve_agg_replica(est, 2, 128, 16, scheduler_params("trtllm", est.data.system, est.spec))
    assert out.error is None and out.rows[0]["tpot_ms"] == r.tpot_ms
    with pytest.raises(ConfigFileError, match="speculative.draft"):
        parse_experiments(EXP.replace("method: eagle3,", "method: eagle3, draft: x,"), "x.yaml")
