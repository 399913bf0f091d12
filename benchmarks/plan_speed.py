"""Benchmark: wall time of `servesim plan` over 3 GPUs × 2 tensor_parallel × 2 max_num_seqs
(scenarios/plan_chat.yaml), and the answer it gives. Target: <= 5 minutes on 2 cores.

    python benchmarks/plan_speed.py [--workers N] [--executor local|serial|ray]
"""

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import simpy

from simulator.cli import OneLineParser
from simulator.errors import InputError
from simulator.executors import EXECUTORS, make_executor
from simulator.planner import plan, plan_table
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = OneLineParser(prog="python benchmarks/plan_speed.py",
                       error_name="benchmarks/plan_speed.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="a whole number >= 1")
    ap.add_argument("--executor", default="local", choices=EXECUTORS)
    args = ap.parse_args()
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers: a whole number >= 1, got {args.workers}")
    sc = load_scenario(ROOT / "scenarios" / "plan_chat.yaml")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; Python "
          f"{sys.version.split()[0]}, numpy {np.__version__}, simpy {simpy.__version__}; "
          f"seed {sc.workload.seed}")
    try:   # ray without Ray installed
        executor = make_executor(args.executor, workers=args.workers)
    except InputError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    with executor as ex:
        res = plan(sc, ex)
    wall = time.perf_counter() - t0
    t = plan_table(res)
    cols = list(sc.plan.candidates) + ["max_rate_per_replica", "max_rate_ci95", "replicas",
                                       "confirmed", "cost_per_hour", "ttft_p99_ms", "status"]
    print(t[cols].to_string())
    best = res.best
    print(f"\ncandidates: {len(t)}, wall time {wall:.1f} s (target <= 300 s)")
    if best is not None:
        print(f"cheapest feasible: {best.candidate.label}: {best.replicas} replicas, "
              f"{best.costs['cost_per_hour']:.2f} USD/h, 95% CI "
              f"{best.costs_ci95['cost_per_hour']}")
    return 0 if wall <= 300 else 1


if __name__ == "__main__":
    sys.exit(main())
