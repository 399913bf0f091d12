"""Does servesim's scheduler take vLLM's decisions at each scheduler knob? A timing replay
of vLLM-CPU per knob setting, step for step.

For each variant of ``scenarios/cpu_tiny.yaml`` (vLLM's defaults; chunked prefill off;
``long_prefill_token_threshold``; a KV cache small enough to preempt, without and with a
``watermark``) it starts vLLM's in-process engine with those knobs
(:class:`calibration.vllm.runner.VllmEngine`; its block size, 128 on CPU, and KV block
count read back from the engine), serves a burst and a Poisson run of requests with
shared 256-token system prompts, and replays each through the simulator with vLLM's own
step durations (:func:`calibration.timing_replay.simulate_timing`). A variant agrees when
every step has the same prefill chunks, decode count, decode context, sampled count and
preemptions, every request the same prefix-cache hits, and every timestamp (and the
simulator's inter-token gaps) lies within 1 ms
(:func:`calibration.timing_replay.compare_timing`). The table also counts the prefill
entries (chunks) per request: 1 means every prompt ran whole.

Runs in the vLLM peer's venv (``benchmarks/vllm_fidelity.sh`` sets it up and installs
servesim there)::

    . ../shared/peers/vllm/env.sh
    OMP_NUM_THREADS=1 /tmp/vllm-venv/bin/python benchmarks/vllm_policy.py \\
        [--model-dir /tmp/vllm-peer-model] [--requests 60] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (name, scenario overrides) per variant; the budget holds max_model_len so that chunked
#: prefill can be off (vLLM requires it then).
BASE = ["engine.max_model_len=1024", "engine.max_num_batched_tokens=1024",
        "engine.max_num_seqs=16", "workload.prefix={shared_tokens: 256, groups: 2}",
        "workload.prompt_tokens.max=900"]
SMALL_KV = ["engine.num_gpu_blocks=16",
            "workload.output_tokens={dist: lognormal, median: 128, p90: 320, max: 512}"]
VARIANTS = [("vLLM defaults", []),
            ("enable_chunked_prefill=false", ["engine.enable_chunked_prefill=false"]),
            ("long_prefill_token_threshold=128", ["engine.long_prefill_token_threshold=128"]),
            # 15 usable blocks of 128 tokens for max_num_seqs 16 and longer answers: decodes
            # outgrow the cache and preempt
            ("num_gpu_blocks=16", SMALL_KV),
            ("num_gpu_blocks=16, watermark=0.1", SMALL_KV + ["engine.watermark=0.1"])]
#: (run, Poisson rate in req/s or None for a burst at t = 0)
RUNS = [("burst", None), ("poisson 6/s", 6.0)]


def run_variant(overrides, model_dir: str, n: int, seed: int) -> tuple[dict, list]:
    """Serve and replay one variant: ``(vLLM's effective knobs, [(run, compare dict,
    prefill entries per request)])``."""
    from calibration.timing_replay import compare_timing, simulate_timing
    from calibration.validate import load_specs
    from calibration.vllm.commands import engine_scenario
    from calibration.vllm.runner import VllmEngine
    from simulator.scenario import load_scenario

    sc = load_scenario(ROOT / "scenarios" / "cpu_tiny.yaml", BASE + overrides)
    e = sc.engine
    eng = VllmEngine(model_dir, dtype=sc.dtype, max_model_len=sc.max_model_len,
                     max_num_seqs=sc.max_num_seqs,
                     max_num_batched_tokens=sc.max_num_batched_tokens,
                     enable_prefix_caching=e.enable_prefix_caching, block_size=None,
                     long_prefill_token_threshold=e.long_prefill_token_threshold,
                     enable_chunked_prefill=e.enable_chunked_prefill,
                     num_gpu_blocks=e.num_gpu_blocks, watermark=e.watermark, seed=seed)
    eng.warm_up(seed=seed + 1)
    sc1 = engine_scenario(sc, eng)
    out = []
    for label, rate in RUNS:
        specs = load_specs(sc1, rate, n, seed, burst=rate is None)
        run = eng.replay(specs)
        res, cost = simulate_timing(sc1, specs, run)
        entries = sum(len(s.prefills) for s in run.steps) / len(specs)
        out.append((label, compare_timing(run, res, cost), entries, run.prefix_hits,
                    sum(r.preemptions for r in run.records)))
    knobs = {k: eng.knobs.get(k) for k in ("enable_chunked_prefill",
                                           "long_prefill_token_threshold",
                                           "scheduler_reserve_full_isl", "watermark")}
    knobs.update(block_size=eng.block_size, num_gpu_blocks=eng.num_gpu_blocks,
                 max_num_batched_tokens=eng.max_num_batched_tokens,
                 max_num_seqs=eng.max_num_seqs, max_model_len=eng.max_model_len)
    return knobs, [(label, {k: c[k] for k in ("steps_engine", "steps_sim", "step_mismatches",
                                             "prefix_hits_equal", "preemptions_equal",
                                             "max_abs_diff_ms", "handback_max_ms",
                                             "late_wakes", "ok")},
                    entries, hits, pre) for label, c, entries, hits, pre in out]


def main(argv=None) -> int:
    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/vllm_policy.py",
                       error_name="benchmarks/vllm_policy.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=os.environ.get("VLLM_PEER_MODEL",
                                                           "/tmp/vllm-peer-model"))
    ap.add_argument("--requests", type=positive_int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_policy.md"))
    ap.add_argument("--variant", type=int, help=argparse.SUPPRESS)   # one, JSON to stdout
    args = ap.parse_args(argv)
    from calibration.vllm import require_vllm
    ver = require_vllm()
    if args.variant is not None:
        res = run_variant(VARIANTS[args.variant][1], args.model_dir, args.requests, args.seed)
        print("RESULT " + json.dumps(res))
        return 0
    rows, knob_lines = [], []
    for k, (name, _) in enumerate(VARIANTS):
        # one vLLM engine per process: each variant in its own
        proc = subprocess.run([sys.executable, __file__, "--variant", str(k), "--model-dir",
                               args.model_dir, "--requests", str(args.requests), "--seed",
                               str(args.seed)], capture_output=True, text=True)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.stderr.write(proc.stderr[-3000:])
            raise SystemExit(f"variant {name!r} failed (exit {proc.returncode})")
        knobs, runs = json.loads(line[-1][len("RESULT "):])
        knob_lines.append(f"- {name}: " + ", ".join(f"{k}={v}" for k, v in knobs.items()))
        for label, c, entries, hits, pre in runs:
            d = c["max_abs_diff_ms"]
            same = (c["step_mismatches"] == 0 and c["prefix_hits_equal"]
                    and c["preemptions_equal"])
            rows.append(f"| {name} | {label} | {c['steps_engine']} | {c['steps_sim']} | "
                        f"{c['step_mismatches']} | {c['prefix_hits_equal']} / "
                        f"{c['preemptions_equal']} | {hits} | {pre} | {entries:.2f} | "
                        f"{max(d.values()):.3f} | {c['handback_max_ms']:.3f} | "
                        f"{c['late_wakes']} | {'yes' if same else 'NO'} | "
                        f"{'yes' if max(d.values()) <= 1.0 else 'no'} |")
            print(rows[-1], flush=True)
    import torch
    text = "\n".join([
        "# servesim's policy against vLLM's scheduler, per knob (timing replay)", "",
        f"`benchmarks/vllm_policy.py`, {time.strftime('%Y-%m-%d %H:%M')}: {ver}, torch "
        f"{torch.__version__} ({torch.get_num_threads()} thread), Python "
        f"{platform.python_version()}, {platform.machine()} {os.cpu_count()} CPUs; model "
        f"{args.model_dir} (llama-tiny-56m, random weights); scenarios/cpu_tiny.yaml with "
        f"{' '.join(BASE)}; {args.requests} requests per run, seed {args.seed}.", "",
        "Each run is served by vLLM in real time, then simulated on the identical request "
        "list with vLLM's recorded step durations. *same batches*: every step the same "
        "prefill chunks, decode count, decode context, sampled count and preemptions, every "
        "request the same prefix-cache hits and preemptions (the scheduler's decisions). "
        "*timestamps*: every request's and token's time within 1 ms of vLLM's, and the "
        "simulator's inter-token gaps (sorted) within 1 ms of vLLM's. *handback*: vLLM's longest "
        "time from a step's end to its next queue check (detokenising, handing tokens "
        "back); the simulator's step ends at that check, so a token's time can differ by up "
        "to it, and a run with a handback over 1 ms cannot meet the 1 ms bound.", "",
        "| variant | run | steps vLLM | steps sim | step mismatches | hits / preemptions "
        "equal | hit tokens | preemptions | prefill entries per request | max timestamp "
        "diff (ms) | handback max (ms) | late wakes | same batches | timestamps within "
        "1 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "vLLM's effective knobs per variant:", "", *knob_lines, ""])
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
