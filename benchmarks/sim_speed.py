"""Simulator speed: simulated requests per wall second on the chat scenario.

Finds the replica's saturation throughput for scenarios/chat.yaml (a burst of requests all
arriving at once), sets the Poisson arrival rate to ~70% of it, and times runs of N
requests on one replica (default 100,000; the target is 1,000,000 in <= 60 s on one
core with peak RSS <= 2 GiB). Each run includes building the workload and the final
statistics, as ``servesim run`` does. Prints the wall and CPU time of every repetition
and their medians, simulated requests per wall second, peak RSS, the 1-minute load
average before and after (the machine may be shared: runs under load are slower) and the
simulated load figures.

Usage: python benchmarks/sim_speed.py [--requests 100000] [--repeats 1] [--load 0.7]
       [--seed 0]
"""

import math
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import simpy

from simulator.cli import OneLineParser
from simulator.errors import InputError
from simulator.run import simulate
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    # a bad flag or scenario: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/sim_speed.py",
                       error_name="benchmarks/sim_speed.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000, help="a whole number >= 1")
    ap.add_argument("--repeats", type=int, default=1, help="a whole number >= 1")
    ap.add_argument("--load", type=float, default=0.7, help="fraction of saturation, > 0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "chat.yaml"))
    args = ap.parse_args()
    for flag, v in (("--requests", args.requests), ("--repeats", args.repeats)):
        if v < 1:
            ap.error(f"{flag}: a whole number >= 1, got {v}")
    if not 0 < args.load < math.inf:
        ap.error(f"--load: a fraction of saturation > 0, got {args.load}")
    base = [f"workload.seed={args.seed}", "cluster.replicas=1"]
    try:
        sat = simulate(load_scenario(args.scenario, base + [
            "workload.num_requests=5000", "workload.arrival={process: poisson, rate: 100000}"]))
        cap = sat.summary["request_throughput"]
        rate = args.load * cap
        sc = load_scenario(args.scenario, base + [
            f"workload.num_requests={args.requests}",
            f"workload.arrival={{process: poisson, rate: {rate}}}"])
    except InputError as e:
        ap.error(str(e))
    load_before = os.getloadavg()[0]
    walls, cpus = [], []
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate(sc)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        del res.requests   # keep one run's table at a time
    load_after = os.getloadavg()[0]
    s = res.summary
    wall = statistics.median(walls)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# sim_speed — python {sys.version.split()[0]}, simpy {simpy.__version__}, "
          f"{platform.machine()}, seed {args.seed}, scenario {Path(args.scenario).name}")
    print(f"saturation throughput        {cap:10.2f} req/s (burst of 5,000)")
    print(f"offered rate                 {rate:10.2f} req/s ({args.load:.0%} load)")
    print(f"achieved throughput          {s['request_throughput']:10.2f} req/s")
    print(f"simulated requests           {s['completed']:10d}")
    print(f"engine steps                 {s['engine_steps']:10d}")
    print(f"wall time, each run          {', '.join(f'{w:.2f}' for w in walls)} s")
    print(f"cpu time, each run           {', '.join(f'{c:.2f}' for c in cpus)} s")
    print(f"wall time (median)           {wall:10.2f} s")
    print(f"simulated requests / wall s  {s['completed'] / wall:10.0f}")
    print(f"peak RSS                     {peak_mb:10.0f} MiB")
    print(f"load average (1 min)         {load_before:.2f} before, {load_after:.2f} after "
          f"({os.cpu_count()} CPUs)")
    if args.requests >= 1_000_000:
        ok = wall * 1_000_000 / args.requests <= 60 and peak_mb <= 2048
        print(f"target (1,000,000 in <= 60 s, <= 2 GiB): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
