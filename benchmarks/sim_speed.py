"""Simulator speed: simulated requests per wall second on the chat scenario.

Finds the replica's saturation throughput for scenarios/chat.yaml (a burst of requests all
arriving at once), sets the Poisson arrival rate to ~70% of it, and times a run of N
requests on one replica (default 100,000). Prints wall time, simulated requests per wall
second, peak RSS and the simulated load figures. Target (issue: simulator): >= 2,000 req/s.

Usage: python benchmarks/sim_speed.py [--requests 100000] [--load 0.7] [--seed 0]
"""

import argparse
import platform
import resource
import sys
import time
from pathlib import Path

import simpy

from simulator.run import simulate
from simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "chat.yaml"))
    args = ap.parse_args()
    base = [f"workload.seed={args.seed}", "cluster.replicas=1"]
    sat = simulate(load_scenario(args.scenario, base + [
        "workload.num_requests=5000", "workload.arrival={process: poisson, rate: 100000}"]))
    cap = sat.summary["request_throughput"]
    rate = args.load * cap
    sc = load_scenario(args.scenario, base + [
        f"workload.num_requests={args.requests}",
        f"workload.arrival={{process: poisson, rate: {rate}}}"])
    t0 = time.perf_counter()
    res = simulate(sc)
    wall = time.perf_counter() - t0
    s = res.summary
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# sim_speed — python {sys.version.split()[0]}, simpy {simpy.__version__}, "
          f"{platform.machine()}, seed {args.seed}, scenario {Path(args.scenario).name}")
    print(f"saturation throughput        {cap:10.2f} req/s (burst of 5,000)")
    print(f"offered rate                 {rate:10.2f} req/s ({args.load:.0%} load)")
    print(f"achieved throughput          {s['request_throughput']:10.2f} req/s")
    print(f"simulated requests           {s['completed']:10d}")
    print(f"engine steps                 {s['engine_steps']:10d}")
    print(f"wall time                    {wall:10.2f} s")
    print(f"simulated requests / wall s  {s['completed'] / wall:10.0f}   (target >= 2,000)")
    print(f"peak RSS                     {peak_mb:10.0f} MiB")


if __name__ == "__main__":
    main()
