"""End to end inside the real vLLM engine: tiny DeepSeek-V4 models served on the CPU with dsv4's plugin.

Each case writes a tiny config, then runs vLLM offline (``load_format="dummy"``, token-id prompts, greedy; four
prompts on three sequence slots, so the steps are prefill-only, decode-only and mixed) twice in child processes:
a baseline (vLLM's own kernels on dsv4's eager metadata, ``DSV4_VLLM=metadata``) and dsv4's kernels
(``kernels``, or ``full`` for the V4-Pro shape whose index top-k of 1024 vLLM's CPU indexer cannot run; its
baseline runs dsv4's indexer with vLLM's other kernels). Checks:

(a) the same greedy tokens, and per-step logprobs of the chosen tokens within LOGPROB_TOLERANCE; where a
    token differs, the prompt's comparison ends there, and it counts as a failure unless the baseline's
    top-2 logprobs were within TIE_MARGIN (a tie the kernels' rounding may break either way);
(b) every op that runs in each step ran steps x layers times, and the indexer's ops as often as in the baseline;
(c) triton-cpu absent and TRITON_INTERPRET unset in the engine.

vLLM's dummy weights (uniform +-1e-3) make every logit a tie, so the children draw the dummy weights at a
realistic scale from a fixed seed (the same weights in both runs). Prefill / decode tokens per second and
each op's time per decode step (torch.profiler) are reported for both kernel sets. ``--plant-fault`` makes
dsv4's attention output wrong by 2% in the candidate run: the comparison must then fail.

DeepSeek-V4.1 runs through dsv4's own model layers (``v41``, after the vLLM cases), with the installed wheel:
vLLM 0.32.0 has no CPU path for it (V41_REASON), so the tiny V4.1 preset's demo is served here, prefill and
decode over V4.1 caches with its correctness check; ``--plant-fault`` makes its attention output 10% too large
(the check bounds the error at 3%), and its check must then fail.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsv4.compat import vllm_cpu

OPS = vllm_cpu.OPS  # the nine DeepSeek-V4 CPU ops of vLLM
INDEXER_OP = "dsv4::fp8_paged_mqa_topk"  # what dsv4's CPU indexer runs instead of the logits + top-k pair
LOGPROB_TOLERANCE = 0.3  # nats, chosen-token logprob, baseline vs dsv4 (seen: up to 0.21 from 1-ulp differences)
TIE_MARGIN = 0.25  # nats: four bf16 steps of a logit in [8, 16)
MAX_TOKENS = 16
MAX_NUM_SEQS = 3  # four prompts, three slots: the last one is prefilled beside decodes (a mixed batch)
N_EXPERTS = 256  # the CPU router rejects small expert counts
VOCAB = 1024
LOGIT_SCALE = 6.0  # lm_head std 6/sqrt(hidden): logits of std ~6, so greedy choices are rarely near ties


# Why the V4.1 check cannot run inside vLLM 0.32.0 on the CPU (docs/vllm.md has the whole trace).
V41_REASON = ("vLLM 0.32.0 loads its NVIDIA DeepseekV41ForCausalLM on the CPU platform (deepseek_v41 has no CPU "
              "module); its first attention layer asserts 'DeepseekV4 attention requires a CUDA device', the CPU "
              "platform forces KV block size 16 where the V4.1 backend takes only 128, and the forward needs "
              "FlashMLA, DeepGEMM and Triton kernels without a CPU build")
V41_DEMO = dict(prompt_lens=[1500, 40], decode_steps=2, num_layers=5, step_tokens=512, preset="tiny-v4.1", seed=0)


def v41_check(plant: bool) -> list[str]:
    """The tiny V4.1 preset through dsv4.model: a chunked prefill, decode steps, the demo's check. Failures."""
    from dsv4 import ops
    from dsv4.model.demo import run_demo

    exact = ops.sparse_mla_decode

    def planted(*args, **kwargs):
        out, lse = exact(*args, **kwargs)
        return out * 1.1, lse  # the demo's check bounds the error at 3 %: a 10 % fault, as its own tests plant

    ops.sparse_mla_decode = planted if plant else exact
    try:
        passed = run_demo(**V41_DEMO)
    finally:
        ops.sparse_mla_decode = exact
    return [] if passed else ["the V4.1 demo check failed"]


@dataclass
class Case:
    name: str
    heads: int
    compress_ratios: list[int]
    index_topk: int = 512
    index_heads: int = 8
    long_prompt: int = 2200  # longer than the 128-token window; crosses several 128-token compression groups
    baseline_mode: str = "metadata"
    candidate_mode: str = "kernels"
    baseline_indexer: bool = False  # dsv4's indexer in the baseline too (vLLM's cannot run this top-k)
    max_model_len: int = 4096
    short_prompts: list[int] = field(default_factory=lambda: [5, 37, 130])


CASES = [
    Case("v4-flash-h8", heads=8, compress_ratios=[0, 0, 4, 128]),
    Case("v4-flash-h64", heads=64, index_heads=64, compress_ratios=[0, 4, 128, 4]),
    Case("v4-pro-topk1024", heads=8, compress_ratios=[0, 4, 128, 4], index_topk=1024, long_prompt=4500,
         candidate_mode="full", baseline_indexer=True, max_model_len=6144),
]


CASES_BY_NAME = {c.name: c for c in CASES}


def config_json(case: Case) -> dict:
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "torch_dtype": "bfloat16",
        "hidden_size": 256, "num_hidden_layers": len(case.compress_ratios), "compress_ratios": case.compress_ratios,
        "num_attention_heads": case.heads, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 128, "o_lora_rank": 64, "o_groups": 2, "sliding_window": 128,
        "index_topk": case.index_topk, "index_n_heads": case.index_heads, "index_head_dim": 128,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "n_routed_experts": N_EXPERTS, "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 64,
        # every layer hash-routed: routing by token id, so 1-ulp differences cannot flip an expert choice
        "num_hash_layers": len(case.compress_ratios), "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "hidden_act": "silu", "swiglu_limit": 10,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "expert_dtype": "bf16", "vocab_size": VOCAB, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }


def prompts(case: Case) -> list[list[int]]:
    import random

    rng = random.Random(20261202)
    return [[rng.randrange(1, 1024) for _ in range(n)] for n in (case.long_prompt, *case.short_prompts)]


def token_budgets(case: Case, max_tokens: int) -> list[int]:
    """Tokens each prompt generates: the second prompt stops after 2, freeing its slot for the last prompt."""
    budgets = [max_tokens] * (1 + len(case.short_prompts))
    budgets[1] = min(2, max_tokens)
    return budgets


def schedule(budgets: list[int]) -> tuple[int, int]:
    """(forward steps, mixed steps) when requests take free slots in order and a request's prefill step makes
    its first token: prefill-only, decode-only and mixed steps as vLLM schedules them here."""
    waiting, running, steps, mixed = list(budgets), [], 0, 0
    while waiting or running:
        decodes = len(running)
        running = [left - 1 for left in running if left > 1]  # each running request decodes one token
        admitted = 0
        while waiting and len(running) + admitted < MAX_NUM_SEQS:
            left = waiting.pop(0)
            admitted += 1
            if left > 1:
                running.append(left - 1)
        steps += 1
        mixed += bool(decodes and admitted)
    return steps, mixed


# ---------------------------------------------------------------------------------------------
# Child: one engine run
# ---------------------------------------------------------------------------------------------


def realistic_dummy_weights(seed: int = 7):
    """Replaces vLLM's dummy initializer: weights ~ N(0, 1/fan_in), 1-D tensors 1 + N(0, 0.1^2), integer
    tables (the hash layer's token -> expert map) uniform expert ids; one seeded stream in load order."""
    import torch
    from vllm.model_executor.model_loader import dummy_loader

    generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def init(param, *args, **kwargs):
        if param.device.type == "meta":
            return
        if not torch.is_floating_point(param):
            param.copy_(torch.randint(0, N_EXPERTS, param.shape, generator=generator))
        elif param.dim() == 1:
            param.copy_(1 + 0.1 * torch.randn(param.shape, generator=generator))
        else:  # the vocabulary's rows (embedding, lm_head) larger: decisive logits
            scale = LOGIT_SCALE if param.shape[0] == VOCAB else 1.0
            param.copy_(torch.randn(param.shape, generator=generator) * scale / math.sqrt(param.shape[-1]))

    dummy_loader.initialize_single_dummy_weight = init


def plant_fault():
    """dsv4's attention output scaled by 1.02 (the check must notice)."""
    import dsv4.compat.vllm_cpu as compat

    exact = compat.flash_mla_with_kvcache_cpu

    def faulty(out, *args):
        exact(out, *args)
        out.mul_(1.02)

    compat.flash_mla_with_kvcache_cpu = faulty


def op_profile(prof, prefill_calls: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Calls and CPU time (us, self + children) of each DeepSeek-V4 op and of dsv4's fused indexer; with
    prefill_calls (an op's calls in the prefill step), also the time of the calls after them (the decode steps)."""
    names = {f"_C::{op}": op for op in OPS} | {INDEXER_OP: INDEXER_OP}
    out: dict[str, dict[str, float]] = {}
    for event in sorted((e for e in prof.events() if e.name in names), key=lambda e: e.time_range.start):
        entry = out.setdefault(names[event.name], {"calls": 0, "us": 0.0, "decode_us": 0.0})
        entry["calls"] += 1
        entry["us"] += event.cpu_time_total
        if prefill_calls is not None and entry["calls"] > prefill_calls.get(names[event.name], 0):
            entry["decode_us"] += event.cpu_time_total
    return out


def child(args) -> None:
    os.environ["DSV4_VLLM"] = args.mode
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    case = next(c for c in CASES if c.name == args.case[0])
    realistic_dummy_weights()
    if args.plant_fault:
        plant_fault()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams
    from vllm.triton_utils import HAS_TRITON

    if args.baseline_indexer:
        from dsv4.integrations.vllm import indexer

        indexer.install()
    started = time.perf_counter()
    llm = LLM(model=args.model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=case.max_model_len, max_num_batched_tokens=case.max_model_len + 512, seed=0,
              max_num_seqs=MAX_NUM_SEQS,
              disable_log_stats=False)  # per-request timestamps: prefill and decode times of one run
    engine_s = time.perf_counter() - started
    batch = [{"prompt_token_ids": p} for p in prompts(case)]

    def generate(max_tokens: int, prefill_calls=None):
        params = [SamplingParams(temperature=0, max_tokens=n, logprobs=2, detokenize=False, ignore_eos=True)
                  for n in token_budgets(case, max_tokens)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            outputs = llm.generate(batch, params, use_tqdm=False)
            wall = time.perf_counter() - t0
        return outputs, wall, op_profile(prof, prefill_calls)

    generate(1)  # warm-up: first-call allocations and caches stay out of the timings
    _, _, prefill_ops = generate(1)
    outputs, total_s, total_ops = generate(MAX_TOKENS, {op: v["calls"] for op, v in prefill_ops.items()})
    # Engine timestamps: the first step prefills the prompts that got a slot; the window from the first token
    # to the last is decode steps (one of them also prefills the last prompt, a small one).
    metrics = [o.metrics for o in outputs]
    first = min(m.first_token_ts for m in metrics)
    prefill_s = first - min(m.scheduled_ts for m in metrics)
    prefill_tokens = sum(len(o.prompt_token_ids) for o, m in zip(outputs, metrics, strict=True)
                         if m.first_token_ts <= first + 1e-6)
    decode_s = max(m.last_token_ts for m in metrics) - first
    decode_tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outputs)
    steps = []
    for o in outputs:
        rows = []
        for token, logprobs in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True):
            ranked = sorted(logprobs.values(), key=lambda lp: lp.rank)
            rows.append({"token": token, "logprob": logprobs[token].logprob,
                         "top2": [lp.logprob for lp in ranked[:2]]})
        steps.append(rows)
    from dsv4.integrations import vllm as plugin

    result = {
        "case": case.name, "mode": args.mode, "engine_s": engine_s, "prefill_s": prefill_s, "decode_s": decode_s,
        "prefill_tokens": prefill_tokens, "decode_tokens": decode_tokens,
        "total_s": total_s,
        "prompt_tokens": sum(len(p) for p in prompts(case)), "num_prompts": len(batch), "steps": steps,
        "prefill_ops": prefill_ops, "total_ops": total_ops, "has_triton": HAS_TRITON,
        "triton_interpret": os.environ.get("TRITON_INTERPRET"), "taken_over": plugin.taken_over(),
        "threads": torch.get_num_threads(),
    }
    Path(args.json).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# Parent: run, compare, report
# ---------------------------------------------------------------------------------------------


def run_child(case: Case, model: Path, mode: str, out: Path, *, baseline_indexer=False, plant=False) -> dict:
    cmd = [sys.executable, __file__, "--child", "--case", case.name, "--model", str(model), "--mode", mode,
           "--json", str(out)]
    cmd += ["--baseline-indexer"] if baseline_indexer else []
    cmd += ["--plant-fault"] if plant else []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    log = out.with_suffix(".log")
    with open(log, "w") as f:
        rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-30:])
        raise SystemExit(f"{case.name} [{mode}] engine run failed (rc {rc}); the log ends:\n{tail}")
    return json.loads(out.read_text())


def compare_tokens(base: dict, cand: dict) -> tuple[list[str], float, int, int]:
    """(failures, largest chosen-token logprob difference, tokens compared, prompts parted at a tie)."""
    failures, worst, compared, ties = [], 0.0, 0, 0
    for p, (b_rows, c_rows) in enumerate(zip(base["steps"], cand["steps"], strict=True)):
        for s, (b, c) in enumerate(zip(b_rows, c_rows, strict=True)):
            if b["token"] != c["token"]:
                gap = b["top2"][0] - b["top2"][1]
                if gap > TIE_MARGIN:
                    failures.append(f"prompt {p} step {s}: token {c['token']} instead of {b['token']} "
                                    f"(baseline top-2 gap {gap:.3f} > {TIE_MARGIN})")
                ties += gap <= TIE_MARGIN
                break  # the continuations differ from here on
            compared += 1
            diff = abs(b["logprob"] - c["logprob"])
            worst = max(worst, diff)
            if diff > LOGPROB_TOLERANCE:
                failures.append(f"prompt {p} step {s}: logprob {c['logprob']:.4f} vs {b['logprob']:.4f}")
    return failures, worst, compared, ties


INDEXER_OPS = ("fused_indexer_q_rope_quant_cpu", "fp8_paged_mqa_logits_cpu", "topk_transform_512_cpu", INDEXER_OP)


def expected_calls(case: Case, phase: str) -> dict[str, int]:
    """Calls of the ops that run in every forward step: steps x layers of each kind (a mixed step calls each
    once). The indexer's ops are left out: vLLM skips the indexer in steps where no row has more compressed
    entries than the top-k; check_calls holds them to the baseline's counts instead."""
    steps, _ = schedule(token_budgets(case, 1 if phase == "prefill" else MAX_TOKENS))
    layers = len(case.compress_ratios)
    c4 = sum(r == 4 for r in case.compress_ratios)
    compressed = sum(r > 1 for r in case.compress_ratios)
    calls = {
        "fused_qnorm_rope_kv_insert_cpu": layers, "inverse_gptj_rope_o_proj_cpu": layers,
        "flash_mla_with_kvcache_cpu": layers, "save_partial_states_cpu": compressed + c4,
        "compress_norm_rope_store_cpu": compressed, "compress_norm_rope_store_indexer_cpu": c4,
    }
    return {op: n * steps for op, n in calls.items()}


def check_calls(case: Case, base: dict, cand: dict) -> list[str]:
    """Every-step ops against the schedule; the indexer's ops as often as in the baseline, where vLLM's (or,
    when vLLM's cannot run the top-k, dsv4's) indexer ran; triton-cpu absent in both engines."""
    failures = []
    for run in (base, cand):
        for phase in ("prefill", "total"):
            ops = run[f"{phase}_ops"]
            for op, want in expected_calls(case, phase).items():
                got = int(ops.get(op, {}).get("calls", 0))
                if got != want:
                    failures.append(f"{run['mode']} {phase}: {op} called {got} times, expected {want}")
        if run["has_triton"] or run["triton_interpret"]:
            failures.append(f"{run['mode']}: triton usable in the engine (HAS_TRITON {run['has_triton']}, "
                            f"TRITON_INTERPRET {run['triton_interpret']!r})")
    calls = {name: {op: int(run["total_ops"].get(op, {}).get("calls", 0)) for op in INDEXER_OPS}
             for name, run in (("baseline", base), ("dsv4", cand))}
    selections = calls["baseline"]["topk_transform_512_cpu"] + calls["baseline"][INDEXER_OP]
    want = {"fused_indexer_q_rope_quant_cpu": calls["baseline"]["fused_indexer_q_rope_quant_cpu"]}
    if cand["mode"] == "full":  # dsv4's fused indexer replaces the logits + top-k pair call for call
        want |= {"fp8_paged_mqa_logits_cpu": 0, "topk_transform_512_cpu": 0, INDEXER_OP: selections}
    else:
        want |= {op: calls["baseline"][op] for op in ("fp8_paged_mqa_logits_cpu", "topk_transform_512_cpu")}
        want[INDEXER_OP] = calls["baseline"][INDEXER_OP]
    if any(r == 4 for r in case.compress_ratios) and selections == 0:
        failures.append("the indexer never ran: no prompt is longer than the top-k in compressed entries")
    for op, n in want.items():
        if calls["dsv4"][op] != n:
            failures.append(f"{cand['mode']}: {op} called {calls['dsv4'][op]} times, the baseline's count is {n}")
    return failures


def timing_lines(run: dict) -> list[str]:
    steps, _ = schedule(token_budgets(CASES_BY_NAME[run["case"]], MAX_TOKENS))
    prefill_steps, _ = schedule(token_budgets(CASES_BY_NAME[run["case"]], 1))
    decode_steps = steps - prefill_steps  # the op times after the calls of a prefill-only run
    decode_s = run["decode_s"]
    prefill_tps = run["prefill_tokens"] / run["prefill_s"]
    decode_tps = run["decode_tokens"] / decode_s
    per_step = {op: v["decode_us"] / decode_steps for op, v in run["total_ops"].items()}
    attention_us = sum(per_step.values())
    step_us = decode_s / (steps - 1) * 1e6
    top = ", ".join(f"{op.removesuffix('_cpu')} {us:.0f}" for op, us in sorted(per_step.items(), key=lambda kv: -kv[1]))
    return [f"  {run['mode']:<8} prefill {prefill_tps:7.0f} tok/s   decode {decode_tps:6.1f} tok/s "
            f"({step_us / 1e3:.1f} ms/step, attention ops {attention_us / 1e3:.2f} ms = "
            f"{100 * attention_us / step_us:.0f}% of the step)",
            f"           per decode step (us): {top}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES] + ["v41"],
                        help="run only these cases (default: all)")
    parser.add_argument("--plant-fault", action="store_true", help="dsv4's attention output made 2%% wrong")
    parser.add_argument("--json", help="write the report here (parent) / the run's result (child)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-indexer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    import vllm

    cases = [c for c in CASES if not args.case or c.name in args.case]  # "v41" runs after them
    print(f"vLLM {vllm.__version__}; {len(cases)} case(s), {MAX_TOKENS} greedy tokens per prompt"
          + ("; PLANTED FAULT in dsv4's attention" if args.plant_fault else ""), flush=True)
    all_failures, report = [], []
    with tempfile.TemporaryDirectory(prefix="dsv4-e2e-") as tmp:
        for case in cases:
            model = Path(tmp) / case.name
            model.mkdir()
            (model / "config.json").write_text(json.dumps(config_json(case)))
            base = run_child(case, model, case.baseline_mode, model / "base.json",
                             baseline_indexer=case.baseline_indexer)
            cand = run_child(case, model, case.candidate_mode, model / "cand.json", plant=args.plant_fault)
            failures, worst, compared, ties = compare_tokens(base, cand)
            failures += check_calls(case, base, cand)
            lens = [case.long_prompt, *case.short_prompts]
            print(f"{case.name}: heads {case.heads}, ratios {case.compress_ratios}, index top-k {case.index_topk}, "
                  f"prompts {lens}; {base['mode']} vs {cand['mode']}: {compared} tokens equal, {ties} prompt(s) "
                  f"parted at a tie, largest logprob difference {worst:.4f}; {'PASS' if not failures else 'FAIL'}")
            print(f"  dsv4 took over ({cand['mode']}): {len(cand['taken_over'])} names; op calls "
                  + ", ".join(f"{op.removesuffix('_cpu')} {int(v['calls'])}"
                              for op, v in sorted(cand['total_ops'].items())))
            for line in timing_lines(base) + timing_lines(cand):
                print(line)
            for f in failures:
                print(f"  FAIL {f}")
            all_failures += [f"{case.name}: {f}" for f in failures]
            report.append({"case": case.name, "baseline": base, "candidate": cand, "failures": failures,
                           "largest_logprob_difference": worst, "tokens_compared": compared})
            sys.stdout.flush()
    if not args.case or "v41" in args.case:
        print(f"v41: through dsv4.model, not vLLM: {V41_REASON}", flush=True)
        failures = v41_check(args.plant_fault)
        print(f"v41: tiny-v4.1 demo (5 layers, prompts 1500/40, 2 decode steps): {'PASS' if not failures else 'FAIL'}")
        all_failures += [f"v41: {f}" for f in failures]
        report.append({"case": "v41", "through": "dsv4.model", "reason": V41_REASON, "failures": failures})
        cases = [*cases, Case("v41", 4, [0, 2, 2, 1, 1])]
    if args.json:
        Path(args.json).write_text(json.dumps(report))
    print(f"e2e-vllm: {len(cases) - len({f.split(':')[0] for f in all_failures})} passed, "
          f"{len({f.split(':')[0] for f in all_failures})} failed")
    return 1 if all_failures else 0


if __name__ == "__main__":
    sys.exit(main())
