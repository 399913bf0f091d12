"""Policy cost per step with N running decodes (all decoding, nothing else changing).

Prints, for 16 / 256 / 1024 running decodes and two kinds of request, the scheduler's
schedule()+update() time per step in microseconds:

* ``hashed``: prefix caching on and content another request might share, so every filled
  block's hash is registered (one visit when a block fills, one when the next starts).
* ``light``: requests whose first token starts no other request (``cache_private``, as the
  simulator marks them) or prefix caching off: nothing to hash, so a step finds the
  decodes that start a block by their phase, without per-request visits.

Columns:

* ``quiet step``: median step in which no request crosses a block boundary. This must not
  grow with the running count (steady decodes are not touched).
* ``amortised``: the median over block cycles of the mean step in the cycle, including
  block allocations (and, for hashed requests, hash registrations): O(running /
  block_size) work per step by design.
* ``quiet_step()``: the same cycles taken through :meth:`Scheduler.quiet_step` where it
  applies (the simulator's single-replica loop), else schedule()+update().

Usage: python benchmarks/policy_step_cost.py [--block-size 16] [--cycles 20]
"""

import platform
import sys
import time

from simulator.policy import Request, RequestSpec, Scheduler, SchedulerConfig


def _scheduler(n: int, block_size: int, private: bool) -> Scheduler:
    s = Scheduler(SchedulerConfig(max_num_seqs=max(n, 1), max_num_batched_tokens=n * block_size * 4,
                                  max_model_len=1 << 20, block_size=block_size))
    # Equal prompts of distinct content: every request crosses block boundaries together.
    for i in range(n):
        r = Request(RequestSpec(i, 0, ((("u", i), block_size * 4 - 1),), 1 << 19))
        r.cache_private = private
        s.add_request(r)
    while s.waiting or len(s._steady) < n:
        s.update(s.schedule())
    return s


def run(n: int, block_size: int, cycles: int, private: bool) -> tuple[float, float, float]:
    s = _scheduler(n, block_size, private)
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
    cycle_times.sort()
    quiet.sort()
    s = _scheduler(n, block_size, private)
    steps = cycles * block_size
    t0 = time.perf_counter()
    for _ in range(steps):
        if s.quiet_step() is None:
            s.update(s.schedule())
    fast = (time.perf_counter() - t0) / steps
    return quiet[len(quiet) // 2] * 1e6, cycle_times[len(cycle_times) // 2] * 1e6, fast * 1e6


def main() -> None:
    from simulator.cli import OneLineParser
    from simulator.scenario import BLOCK_SIZES

    ap = OneLineParser(prog="python benchmarks/policy_step_cost.py",
                       error_name="benchmarks/policy_step_cost.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--block-size", type=int, default=16, choices=BLOCK_SIZES)
    ap.add_argument("--cycles", type=int, default=20, help="a whole number >= 1")
    args = ap.parse_args()
    if args.cycles < 1:
        ap.error(f"--cycles: a whole number >= 1, got {args.cycles}")
    print(f"# policy step cost — python {sys.version.split()[0]}, {platform.machine()}, "
          f"block_size {args.block_size}, {args.cycles} block cycles (deterministic, no RNG)")
    print(f"{'requests':>8} {'running decodes':>16} {'quiet step (µs, median)':>24} "
          f"{'amortised (µs/step)':>20} {'quiet_step() (µs/step)':>23}")
    for private in (False, True):
        for n in (16, 256, 1024):
            q, a, f = run(n, args.block_size, args.cycles, private)
            kind = "light" if private else "hashed"
            print(f"{kind:>8} {n:>16} {q:>24.1f} {a:>20.1f} {f:>23.1f}")


if __name__ == "__main__":
    main()
