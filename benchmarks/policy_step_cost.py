"""Policy cost per step with N running decodes (all decoding, nothing else changing).

Prints, for 16 / 256 / 1024 running decodes, the scheduler's schedule()+update() time per
step in microseconds:

* ``quiet step``: a step in which no request crosses a block boundary. This must not grow
  with the running count (steady decodes are not touched).
* ``amortised``: the mean over whole block cycles, including the two per-block visits per
  request (hash registration of the filled block, allocation of the next). This is
  O(running / block_size) Python work per step by design.

Usage: python benchmarks/policy_step_cost.py [--block-size 16] [--cycles 20] [--seed 0]
"""

import argparse
import platform
import sys
import time

from simulator.policy import Request, RequestSpec, Scheduler, SchedulerConfig


def run(n: int, block_size: int, cycles: int) -> tuple[float, float]:
    s = Scheduler(SchedulerConfig(max_num_seqs=max(n, 1), max_num_batched_tokens=n * block_size * 4,
                                  max_model_len=1 << 20, block_size=block_size))
    # Equal prompts of distinct content: every request crosses block boundaries together.
    for i in range(n):
        s.add_request(Request(RequestSpec(i, 0, ((("u", i), block_size * 4 - 1),), 1 << 19)))
    while s.waiting or len(s._steady) < n:
        s.update(s.schedule())
    # Align to the start of a block cycle: the step after an allocation event.
    quiet, cycle_times = [], []
    for _ in range(cycles):
        t_cycle = 0.0
        for _ in range(block_size):
            t0 = time.perf_counter()
            plan = s.schedule()
            s.update(plan)
            dt = time.perf_counter() - t0
            t_cycle += dt
            c = next(iter(s._steady)).num_computed_tokens
            if c % block_size not in (0, 1):
                quiet.append(dt)
        cycle_times.append(t_cycle / block_size)
    quiet.sort()
    return quiet[len(quiet) // 2] * 1e6, sum(cycle_times) / len(cycle_times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=20)
    args = ap.parse_args()
    print(f"# policy step cost — python {sys.version.split()[0]}, {platform.machine()}, "
          f"block_size {args.block_size}, {args.cycles} block cycles (deterministic, no RNG)")
    print(f"{'running decodes':>16} {'quiet step (µs, median)':>24} {'amortised (µs/step)':>20}")
    for n in (16, 256, 1024):
        q, a = run(n, args.block_size, args.cycles)
        print(f"{n:>16} {q:>24.1f} {a:>20.1f}")


if __name__ == "__main__":
    main()
