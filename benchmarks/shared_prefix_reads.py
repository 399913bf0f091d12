"""Shared prefix reads: does a decode step cost less when its requests share cached blocks?

The cost model prices a step's KV reads by its context tokens, every decode's whole context.
Requests that hit one cached prefix (a shared system prompt) read the same blocks in one
step; on a CPU the second and later reads of a block find it in the caches. This serves
the fidelity workloads (``cpu_tiny.yaml`` as it is, and with a shared system prompt of 4
groups of 128 tokens) on the engine, takes each step's *re-read* context tokens (the engine's count,
:attr:`simulator.policy.StepPlan.reread_tokens`: for each block k >= 2 requests of the step
attend to, k - 1 blocks of tokens), prices every step as the simulator does with a profile,
and fits ``measured ≈ κ · priced − δ · (KV-read price of the re-read tokens, as first
reads)`` over all steps: κ the host's speed against the profile, δ the share of a read that
a re-read saves beyond what the profile prices (all of it for a profile without a re-read
rate, ``w_reread_bytes_per_s``).

    python benchmarks/shared_prefix_reads.py --profile P.yaml [--rates 21.5,25.8]
        [--seconds 15] [--seeds 0,1] [--out benchmarks/results/shared_prefix_reads.md]

Calibrate the profile minutes before (``servesim calibrate --model llama-tiny-56m --device
cpu --dtype bfloat16 --threads 1 --repeats 8``): a shared host drifts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"poisson-chat": [],
             "shared-system-prompt": ["workload.prefix.shared_tokens=128",
                                      "workload.prefix.groups=4"]}


def main(argv=None) -> int:
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/shared_prefix_reads.py",
                       error_name="benchmarks/shared_prefix_reads.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="a measured roofline profile (YAML)")
    ap.add_argument("--rates", default="21.5,25.8",
                    help="req/s of poisson-chat and shared-system-prompt (default: 0.9 of "
                         "their saturation on a 2-core Xeon)")
    ap.add_argument("--seconds", type=float, default=15.0, help="arrivals per serving")
    ap.add_argument("--seeds", default="0,1", help="one serving of each workload per seed")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                         "shared_prefix_reads.md"))
    args = ap.parse_args(argv)
    try:
        rates = [float(x) for x in args.rates.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--rates {args.rates!r} / --seeds {args.seeds!r}: comma-separated numbers "
                 "(rates in req/s, seeds whole numbers)")
    if len(rates) != len(WORKLOADS) or not all(0 < r < float("inf") for r in rates):
        ap.error(f"--rates: give {len(WORKLOADS)} rates > 0 (req/s), one per workload")
    if not 0 < args.seconds <= 3600:   # each serving runs in real time
        ap.error(f"--seconds: seconds of arrivals in (0, 3600], got {args.seconds:g}")
    from simulator.cost_model import RooflineConstants, load_profile, roofline_seconds
    load_profile(args.profile)   # a bad profile is named as given, before torch loads

    import pandas as pd
    import torch

    from calibration.cli import _steps_table
    from calibration.engine import LLMEngine
    from calibration.engine.replay import replay
    from calibration.engine.weights import parse_dtype, random_model
    from calibration.timing_replay import engine_config
    from calibration.validate import load_specs, profile_threads, servable_cost_model
    from simulator.files import atomic_write
    from simulator.scenario import load_scenario

    prof_arg = f"hardware.profile={Path(args.profile).resolve()}"
    scs = {w: load_scenario(ROOT / "scenarios" / "cpu_tiny.yaml", [prof_arg, *sets])
           for w, sets in WORKLOADS.items()}
    base = servable_cost_model(scs["poisson-chat"])
    prof = base.profile
    if prof.cost.form != "roofline":
        ap.error(f"--profile: a roofline profile, got form {prof.cost.form}")
    torch.set_num_threads(profile_threads(prof) or 1)
    sc0 = scs["poisson-chat"]
    cfg = engine_config(sc0, base.num_gpu_blocks, 0)
    model = random_model(sc0.model_shape.hf_config(), seed=0, dtype=parse_dtype(sc0.dtype))
    k = RooflineConstants.of(prof.model_shape, prof.dtype)
    coef = prof.cost.coefficients
    s_ctx = k.kv_bytes_per_token / coef["w_attn_bytes_per_s"]   # seconds per token read

    tables = []
    for seed in seeds:   # the workloads interleave, so host drift spreads over both
        for (name, sc), rate in zip(scs.items(), rates):
            specs = load_specs(sc, rate, max(8, round(rate * args.seconds)), seed)
            d = _steps_table(replay(LLMEngine(model, cfg), specs).steps)   # a fresh engine
            d["run"] = f"{name} seed {seed}"
            tables.append(d)
            print(f"{name} seed {seed}: {len(d)} steps", file=sys.stderr)
    D = pd.concat(tables, ignore_index=True)
    D["priced"] = roofline_seconds(coef, k, D.tokens, D.requests, D.context_tokens,
                                   D.attn_pairs, D.sampled, D.prefill_tokens, D.decodes,
                                   D.reread_tokens)
    D["measured"] = D.duration_ns / 1e9
    D["kv_reread"] = s_ctx * D.reread_tokens
    # relative residuals, as the calibration fits (every step counts alike)
    A = np.c_[D.priced, -D.kv_reread] / D.measured.to_numpy()[:, None]
    (kappa, delta), *_ = np.linalg.lstsq(A, np.ones(len(D)), rcond=None)
    lines = ["# Shared prefix reads: priced vs measured steps", "",
             f"profile {prof.name} ({Path(args.profile).resolve()}); rates {args.rates} "
             f"req/s, {args.seconds:g} s of arrivals, seeds {args.seeds}; "
             f"{time.strftime('%Y-%m-%d %H:%M')}.", "",
             f"Fit over all {len(D)} steps: measured ≈ κ · priced − δ · KV-read price of "
             f"the re-read tokens, κ = {kappa:.3f}, δ = {delta:.3f} (a re-read token costs "
             f"{1 - delta:.2f} of a token read once).", "",
             "| serving | steps | priced / measured | re-read share of context tokens | "
             "KV-read share of the priced time | priced / measured, re-reads at (1 − δ), "
             "× κ | the same without the re-read term, × κ |", "|---|---|---|---|---|---|---|"]
    for run, g in D.groupby("run", sort=False):
        adj = kappa * g.priced - delta * g.kv_reread
        lines.append(f"| {run} | {len(g)} | ×{g.priced.sum() / g.measured.sum():.3f} | "
                     f"{g.reread_tokens.sum() / g.context_tokens.sum():.3f} | "
                     f"{(s_ctx * g.context_tokens).sum() / g.priced.sum():.3f} | "
                     f"×{adj.sum() / g.measured.sum():.3f} | "
                     f"×{kappa * g.priced.sum() / g.measured.sum():.3f} |")
    print(atomic_write(args.out, "\n".join(lines) + "\n"))
    return 0


if __name__ == "__main__":
    from simulator.cli import run_script
    run_script(main, "benchmarks/shared_prefix_reads.py")
