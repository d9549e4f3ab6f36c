"""The features merged side by side -- context parallelism, speculative decoding, energy,
prediction intervals, per-role scheduler / engine flags, the new model families -- run together
through the command line, as a user meets them (real pack).

Every run either answers (exit 0: finite, positive TTFT / TPOT, ordered prediction intervals,
energy absent or positive with a coverage in (0, 1]) or refuses in one line (exit 2); a flag that
is accepted must move the answer where it has to. The second half pins the combinations that
broke: each test names what happened before the fix.
"""

from __future__ import annotations

import json
import math
import shlex

import pytest
from cli_helpers import assert_one_line_error, run_cli

pytestmark = pytest.mark.real_pack

DENSE, MOE = "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B"
DSV4, KIMI, STEP, NEMO = ("deepseek-ai/DeepSeek-V4-Flash", "moonshotai/Kimi-K3", "stepfun-ai/Step-3.7-Flash",
                          "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
#: (model, system, backend, layout flags) where each family has data
TARGETS = [(DENSE, "h200_sxm", "trtllm", []), (MOE, "b200_sxm", "sglang", []),
           (DSV4, "b200_sxm", "vllm", ["--tp", "4", "--moe-ep", "4"]), (KIMI, "b200_sxm", "vllm", ["--tp", "16"]),
           (STEP, "h200_sxm", "vllm", ["--tp", "8"]), (NEMO, "h200_sxm", "trtllm", [])]
EAGLE3 = ["--speculative-method", "eagle3", "--num-speculative-tokens", "3"]
NGRAM = ["--speculative-method", "ngram", "--num-speculative-tokens", "3", "--acceptance-per-position", "0.7,0.5,0.3"]
DRAFT = ["--speculative-method", "draft_model", "--num-speculative-tokens", "3", "--draft-model", "Qwen/Qwen3-0.6B",
         "--draft-tp", "1"]
FEATURES = {"plain": [], "cp2": ["--cp", "2"], "cp2-overlap": ["--cp", "2", "--cp-overlap"], "eagle3": EAGLE3,
            "ngram": NGRAM, "draft": DRAFT, "cp2+eagle3": ["--cp", "2", *EAGLE3]}


def _sane(d: dict, where: str = "") -> None:
    """One answer: finite positive latencies, ordered intervals, energy absent or positive."""
    if d.get("fits") is False:
        assert d.get("reason"), where
        return
    for k in ("ttft_ms", "tpot_ms"):
        assert isinstance(d[k], float) and math.isfinite(d[k]) and d[k] > 0, (where, k, d[k])
    for k, iv in (d.get("intervals") or {}).items():
        (lo80, hi80), (lo95, hi95) = iv["p80"], iv["p95"]
        assert 0 < lo95 <= lo80 < hi80 <= hi95 and math.isfinite(hi95), (where, k, iv)
    e = d.get("energy")
    if isinstance(e, dict) and e.get("available"):
        assert 0 < e["coverage"] <= 1 and 0 < e["measured_j_per_token"] <= e["upper_bound_j_per_token"], (where, e)


def _answer_or_refusal(capsys, argv) -> dict | None:
    rc, out, err = run_cli(capsys, argv)
    if rc == 2:
        assert_one_line_error(rc, out, err)
        return None
    assert rc == 0, (argv, err)
    d = json.loads(out)
    if "ttft_ms" in d or "fits" in d:
        _sane(d, " ".join(argv))
    for key in ("best", "frontier", "top"):
        for c in ([d[key]] if isinstance(d.get(key), dict) else d.get(key) or []):
            _sane(c, key)
    return d


@pytest.mark.parametrize("model, system, backend, layout", TARGETS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_feature_on_every_family(capsys, model, system, backend, layout):
    """estimate / serve / serve-disagg x {cp, cp overlap, EAGLE-3, n-gram, draft model, cp +
    EAGLE-3}: an answer or a one-line refusal; cp and speculation move what they must."""
    base = ["--model", model, "--system", system, "--backend", backend, "--isl", "2048", "--osl", "128", "--json"]
    got = {}
    for name, flags in FEATURES.items():
        est = _answer_or_refusal(capsys, ["estimate", *base, *layout, "--batch", "4", *flags])
        srv = _answer_or_refusal(capsys, ["serve", *base, *layout, "--concurrency", "8", *flags])
        role = [f.replace("--cp", "--prefill-cp") if f == "--cp" else f for f in flags]
        _answer_or_refusal(capsys, ["serve-disagg", *base, "--concurrency", "8", "--prefill-workers", "1",
                                    "--decode-workers", "1", *role])
        got[name] = (est, srv)
    plain = got["plain"][0]
    for name in ("cp2", "eagle3", "ngram", "draft"):
        est = got[name][0]
        if plain is None or est is None or not est["fits"]:
            continue
        if name.startswith("cp"):  # prompts split over two ranks: the prefill is shorter
            assert est["gpus"] == 2 * plain["gpus"] and est["ttft_ms"] < plain["ttft_ms"], name
        else:  # several tokens per step: a lower TPOT
            assert est["tpot_ms"] < plain["tpot_ms"], name


@pytest.mark.parametrize("flags", [[], ["--cp-list", "1,2"], EAGLE3, ["--cp", "2", *EAGLE3]], ids=str)
def test_search_and_recommend_combinations(capsys, flags):
    base = ["--model", DENSE, "--system", "h200_sxm", "--backend", "trtllm", "--isl", "4096", "--osl", "128",
            "--max-gpus", "8", "--json"]
    for mode in ("agg", "disagg"):
        d = _answer_or_refusal(capsys, ["search", *base, "--mode", mode, "--concurrency", "8", "--top", "2", *flags,
                                        *(["--prefill-scheduler", "max_num_tokens=4096"] if mode == "disagg" else [])])
        assert d is not None and d["best"] is not None
        if "--cp" in flags:
            assert "cp2" in d["best"]["layout"]
    if "--cp-list" not in flags and "--cp" not in flags:
        assert _answer_or_refusal(capsys, ["recommend", *base, "--clients", "8", *flags]) is not None


# ---- the combinations that broke ------------------------------------------------------------
def test_eagle_head_of_deepseek_v4_refused(capsys):
    """Before: an EAGLE head sized from DeepSeek-V4 (no dense FFN, one latent KV head) asked for a
    GEMM with n=0 -- "GEMM bfloat16 n=0 k=4096 is outside the collected lattice", a wrong reason."""
    rc, out, err = run_cli(capsys, ["estimate", "--model", DSV4, "--system", "b200_sxm", "--backend", "vllm", "--tp", "4",
                                    "--moe-ep", "4", "--isl", "1024", "--osl", "128", "--batch", "4", *EAGLE3])
    assert_one_line_error(rc, out, err, "no uniform grouped-query attention", "--draft-model")


def test_eagle_head_shape_needs_a_plain_target():
    from infercast.data.model_configs import resolve_model
    from infercast.data.pack import find_pack
    from infercast.errors import InvalidInputError
    from infercast.models.spec import build_spec
    from infercast.models.speculative import eagle_head_spec

    pack = find_pack()
    for model in (DSV4, "sgl-project/DeepSeek-V4-Pro-FP8", KIMI):
        with pytest.raises(InvalidInputError, match="EAGLE head"):
            eagle_head_spec(build_spec(resolve_model(pack, model)), "eagle3")
    head = eagle_head_spec(build_spec(resolve_model(pack, DENSE)), "eagle3")
    assert (head.num_heads, head.num_kv_heads, head.head_dim, head.intermediate) == (64, 8, 128, 25600)


def test_simulate_refuses_layout_flags_of_the_other_mode(capsys):
    """Before: ``simulate --prefill-workers 1 --decode-workers 1 --cp 2`` (and ``--replicas 1
    --prefill-cp 2``) ran and ignored the flag: the same answer as without it."""
    base = ["simulate", "--model", DENSE, "--system", "h200_sxm", "--backend", "trtllm", "--concurrency", "4",
            "--num-requests", "8", "--isl", "1024", "--osl", "8", "--json"]
    rc, out, err = run_cli(capsys, [*base, "--prefill-workers", "1", "--decode-workers", "1", "--cp", "2"])
    assert_one_line_error(rc, out, err, "--cp", "--prefill-cp / --decode-cp")
    rc, out, err = run_cli(capsys, [*base, "--prefill-cp", "2"])
    assert_one_line_error(rc, out, err, "--prefill-cp", "--replicas")
    rc, out, err = run_cli(capsys, [*base, "--prefill-workers", "1", "--decode-workers", "1", "--prefill-cp", "2"])
    assert rc == 0, err
    assert json.loads(out)["gpus"] == 3


@pytest.mark.parametrize("flags, needles", [
    (["--speculative-method", "ngram", "--num-speculative-tokens", "3", "--draft-tp", "2"], ["--draft-tp", "ngram"]),
    ([*EAGLE3, "--draft-tp", "16"], ["--draft-tp 16 exceeds", "1"]),
    (["--draft-tp", "2"], ["without speculative decoding"]),
    (["--acceptance-rate", "0.5"], ["without draft tokens"]),
    (["--speculative-method", "ngram", "--num-speculative-tokens", "3", "--draft-quant", "fp8"], ["--draft-quant"]),
    (["--speculative-method", "draft_model", "--num-speculative-tokens", "3", "--draft-model", "Qwen/Qwen3-0.6B",
      "--draft-quant", "junk"], ["--draft-quant 'junk'"]),
])
def test_draft_flags_a_method_ignores_are_refused(capsys, flags, needles):
    """Before: --draft-tp / --draft-quant with n-gram (or without speculation), an acceptance rate
    without draft tokens, were accepted and changed nothing; an EAGLE head at --draft-tp 16 on one GPU was priced at 1/16 of its weights;
    a bad --draft-quant was reported as --gemm-quant."""
    rc, out, err = run_cli(capsys, ["estimate", "--model", DENSE, "--system", "h200_sxm", "--backend", "trtllm",
                                    "--isl", "1024", "--osl", "128", "--batch", "4", *flags])
    assert_one_line_error(rc, out, err, *needles)


def test_mtp_draft_tp_must_be_the_targets(capsys):
    base = ["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "trtllm", "--tp", "8",
            "--isl", "1024", "--osl", "128", "--batch", "4", "--nextn", "2", "--json"]
    rc, out, err = run_cli(capsys, [*base, "--draft-tp", "4"])
    assert_one_line_error(rc, out, err, "MTP layers run at the target's TP 8")
    rc, out, err = run_cli(capsys, [*base, "--draft-tp", "8"])
    assert rc == 0, err


def test_search_skips_layouts_a_draft_tp_does_not_fit(capsys):
    """A --draft-tp beyond a layout's GPUs refuses that layout (with the reason), not the search."""
    rc, out, err = run_cli(capsys, ["search", "--model", DENSE, "--system", "h200_sxm", "--backend", "trtllm",
                                    "--isl", "2048", "--osl", "128", "--max-gpus", "8", "--concurrency", "8", *EAGLE3,
                                    "--draft-tp", "2", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert "--draft-tp 2 exceeds" in d["skipped"]["tp1"]
    assert d["best"]["tp"] >= 2


def test_role_engine_cmd_with_speculative_config(capsys):
    """Before: ``serve-disagg --decode-engine-cmd "vllm serve ... --speculative-config {...}"``
    ended in a KeyError traceback."""
    base = ["serve-disagg", "--model", DENSE, "--system", "h200_sxm", "--backend", "vllm", "--isl", "4096",
            "--osl", "128", "--concurrency", "8", "--prefill-workers", "1", "--decode-workers", "1", "--json"]
    cfg = json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    cmd = f"vllm serve {DENSE} --tensor-parallel-size 2 --speculative-config {shlex.quote(cfg)}"
    rc, out, err = run_cli(capsys, [*base, "--decode-engine-cmd", cmd])
    assert rc == 0, err
    via_cmd = json.loads(out)
    rc, out, err = run_cli(capsys, [*base, "--decode-tp", "2", "--speculative-method", "ngram",
                                    "--num-speculative-tokens", "3", "--prompt-lookup-max", "4"])
    assert rc == 0, err
    via_flags = json.loads(out)
    assert via_cmd["tpot_ms"] == pytest.approx(via_flags["tpot_ms"], rel=1e-9)
    assert via_cmd["ttft_ms"] == pytest.approx(via_flags["ttft_ms"], rel=1e-9)
    # the roles share speculative decoding: two methods conflict, in one line
    other = cmd.replace('"ngram"', '"eagle3"').replace(', "prompt_lookup_max": 4', "")
    rc, out, err = run_cli(capsys, [*base, "--prefill-engine-cmd", cmd, "--decode-engine-cmd", other])
    assert_one_line_error(rc, out, err, "conflicts")


def test_launch_files_round_trip_cp_and_eagle(capsys, tmp_path):
    """search --cp 2 with EAGLE-3 writes launch files whose engine command, read back with
    --engine-cmd (the head's path filled in), serves the same layout and method."""
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"hidden_size": 5120, "num_attention_heads": 64,
                                                  "num_key_value_heads": 8, "head_dim": 128,
                                                  "intermediate_size": 25600, "num_hidden_layers": 1,
                                                  "draft_vocab_size": 32000}))
    base = ["--model", DENSE, "--system", "h200_sxm", "--backend", "vllm", "--isl", "8192", "--osl", "128"]
    rc, out, err = run_cli(capsys, ["search", *base, "--max-gpus", "4", "--concurrency", "8", "--cp", "2", *EAGLE3,
                                    "--save-dir", str(tmp_path / "s"), "--json"])
    assert rc == 0, err
    best = json.loads(out)["best"]
    sh = (tmp_path / "s" / "top" / "agg-1" / "launch_agg.sh").read_text()
    cmd = " ".join(x for x in sh.splitlines() if x.strip() and not x.startswith("#"))
    assert "--prefill-context-parallel-size 2" in cmd and "eagle3" in cmd
    assert ", cp 2\n" in sh.splitlines(keepends=True)[2]  # the header names the CP degree (before: not)
    cmd = cmd.replace("PATH_TO_DRAFT_CHECKPOINT", str(head))
    rc, out, err = run_cli(capsys, ["serve", *base, "--concurrency", "8", "--engine-cmd", cmd, "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert (d["cp"], d["gpus"]) == (2, best["gpus"])
    assert any("speculative decoding eagle3, 3 draft tokens" in n for n in d["notes"])


def test_recommend_reads_the_engine_scheduler(capsys):
    """Before: ``recommend --engine-cmd "vllm serve ... --max-num-seqs 4"`` gave the same answer as
    without it (the configuration's scheduler settings never reached the search)."""
    base = ["recommend", "--model", DENSE, "--system", "h200_sxm", "--backend", "vllm", "--isl", "4096", "--osl", "128",
            "--clients", "64", "--max-gpus", "4", "--mode", "agg", "--json"]
    rc, out, err = run_cli(capsys, base)
    assert rc == 0, err
    plain = json.loads(out)["recommendations"][0]["unit"]
    rc, out, err = run_cli(capsys, [*base, "--engine-cmd", f"vllm serve {DENSE} --max-num-seqs 4"])
    assert rc == 0, err
    capped = json.loads(out)["recommendations"][0]["unit"]
    assert capped["concurrency"] <= 4 < plain["concurrency"]


@pytest.mark.parametrize("cmd, flags, needle", [
    ("search", ["--moe-comm", "gather"], "--moe-comm gather: search picks"),
    ("recommend", ["--moe-comm", "alltoall", "--clients", "8"], "--moe-comm alltoall: recommend picks"),
    ("recommend", ["--cp-overlap", "--clients", "8"], "recommend does not search context parallelism"),
])
def test_search_flags_it_would_ignore_are_refused(capsys, cmd, flags, needle):
    """Before: accepted, and the answer identical to the one without them."""
    rc, out, err = run_cli(capsys, [cmd, "--model", MOE, "--system", "h200_sxm", "--backend", "sglang", "--isl", "1024",
                                    "--osl", "128", "--max-gpus", "8", *flags])
    assert_one_line_error(rc, out, err, needle)


def test_launch_files_carry_the_searched_scheduler(capsys, tmp_path):
    """Before: search --save-dir wrote every engine command with the backend's default step budget
    and running requests, whatever --max-num-tokens / --prefill-scheduler / --decode-scheduler the
    search had predicted with (agg 16384 -> 8192 in the file, prefill 4096 -> 8192, decode 32 -> 1024)."""
    rc, out, err = run_cli(capsys, ["search", "--model", DENSE, "--system", "h200_sxm", "--backend", "vllm", "--isl", "4096",
                                    "--osl", "128", "--max-gpus", "4", "--concurrency", "8", "--mode", "both",
                                    "--max-num-tokens", "16384", "--prefill-scheduler", "max_num_tokens=4096",
                                    "--decode-scheduler", "max_batch_size=32", "--save-dir", str(tmp_path), "--json"])
    assert rc == 0, err
    top = tmp_path / "top"
    agg = (top / "agg-1" / "launch_agg.sh").read_text()
    pre = (top / "disagg-1" / "launch_prefill.sh").read_text()
    dec = (top / "disagg-1" / "launch_decode.sh").read_text()
    assert "--max-num-batched-tokens 16384" in agg
    assert "--max-num-batched-tokens 4096" in pre and "--max-num-seqs 1024" in pre
    assert "--max-num-batched-tokens 16384" in dec and "--max-num-seqs 32" in dec
    d = json.loads(out)
    assert d["disagg"]["scheduler"] == {"prefill": {"max_num_tokens": 4096},
                                        "decode": {"max_num_tokens": 16384, "max_batch_size": 32}}
