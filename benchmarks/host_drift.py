"""Which kind of work drifts on this host: in-cache compute, cache-sized and DRAM-sized
weight streaming, and the engine's own steps, side by side.

One process, one torch thread. In turn, for ``--window`` seconds each, until ``--seconds``
have passed, it times:

- ``L2 matmul``: a bfloat16 (128 x 256) @ (256 x 1024) matmul, 0.5 MiB of weights, which
  stay in a core's L2 cache: compute only;
- ``L3 gemv``: a batch of 8 rows times 16 MiB of bfloat16 weights, the size of this host's
  shared L3 cache (``lscpu``): streamed from a cache other tenants share;
- ``DRAM gemv``: the same with 112 MiB of weights, the llama-tiny-56m model's: streamed
  from memory, as a decode step streams the model's weights;
- the engine's ``decode B=8 L=256`` and ``prefill n=256`` steps (llama-tiny-56m, bfloat16),
  the shapes the validation's host-speed probe visits.

Per window it records the median time, the host's steal time (``/proc/stat``, all CPUs,
in ticks of 10 ms) and the process's CPU time over wall time. The table gives per kind the
coefficient of variation of the window medians, their max/min and p90/p10, and the
correlation of its window series with the engine's decode step's (windows of one round are
seconds apart). A kind whose window medians move like the decode step's is a probe that
tracks the engine's speed of the moment; a steady in-cache kernel beside a drifting
streaming one says the drift is other tenants' use of the shared cache and memory, not the
core's clock or stolen time.

    python benchmarks/host_drift.py [--seconds 600] [--window 4] [--out PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _steal_ticks() -> int | None:
    """Steal time of all CPUs (``/proc/stat``'s 8th ``cpu`` field), in USER_HZ ticks."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    except (OSError, IndexError, ValueError):
        return None


def _kernels():
    """``{name: callable}``: each call is one timed operation."""
    from calibration.engine import LLMEngine
    from calibration.engine.weights import random_model
    from calibration.profiler import _Driver
    from simulator.catalog import load_model

    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(bf)

    a, w_l2 = rand(128, 256), rand(256, 1024)
    x, w_l3, w_dram = rand(8, 4096), rand(4096, 2048), rand(4096, 14336)
    shape = load_model("llama-tiny-56m")
    eng = LLMEngine(random_model(shape.hf_config(), seed=0, dtype=bf),
                    {"block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
                     "max_model_len": 2048, "num_gpu_blocks": 4096, "dtype": "bfloat16",
                     "device": "cpu"})
    drv = _Driver(eng, seed=3)

    def decode():   # one decode step of 8 requests at 256 tokens, on a fresh batch each time
        rids = drv.start_decodes(8, 256)
        drv.step()   # the first step after set-up is not measured (as in the calibration)
        t = drv.step().duration_ns
        drv.stop(rids)
        return t

    return {"L2 matmul 0.5 MiB": lambda: a @ w_l2,
            "L3 gemv B=8 16 MiB": lambda: x @ w_l3,
            "DRAM gemv B=8 112 MiB": lambda: x @ w_dram,
            "engine decode B=8 L=256": decode,
            "engine prefill n=256": lambda: drv.chunk_step(256, 0).duration_ns}


def main(argv=None) -> int:
    from calibration.cli import positive_seconds
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/host_drift.py",
                       error_name="benchmarks/host_drift.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=positive_seconds, default=600.0)
    ap.add_argument("--window", type=positive_seconds, default=4.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "host_drift.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    kernels = _kernels()
    for f in kernels.values():   # builds kernels, touches every weight once
        for _ in range(5):
            f()
    med = {k: [] for k in kernels}
    steal, cpu_frac = [], []
    t_end = time.monotonic() + args.seconds
    while time.monotonic() < t_end:
        for name, f in kernels.items():
            s0, c0, w0 = _steal_ticks(), time.thread_time(), time.perf_counter()
            times = []
            while time.perf_counter() - w0 < args.window:
                t = time.perf_counter_ns()
                r = f()
                # engine steps report their own duration (ns); the kernels are timed here
                times.append(r if isinstance(r, int) else time.perf_counter_ns() - t)
            wall = time.perf_counter() - w0
            med[name].append(float(np.median(times)) / 1e3)
            s1 = _steal_ticks()
            steal.append(None if s0 is None or s1 is None else s1 - s0)
            cpu_frac.append((time.thread_time() - c0) / wall)
    rounds = min(len(v) for v in med.values())
    ref = np.asarray(med["engine decode B=8 L=256"][:rounds])
    lines = ["# Host drift: which kind of work drifts", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}; one torch thread, torch {torch.__version__}; "
             f"{args.seconds:g} s in {rounds} rounds of {len(kernels)} windows of "
             f"{args.window:g} s; per window the median time of one operation.", "",
             "| kind | mean µs | CV of window medians | max/min | p90/p10 | "
             "correlation with engine decode |",
             "|---|---|---|---|---|---|"]
    for name, v in med.items():
        v = np.asarray(v[:rounds])
        corr = np.corrcoef(v, ref)[0, 1] if rounds > 2 else float("nan")
        lines.append(f"| {name} | {v.mean():.0f} | {v.std() / v.mean():.1%} | "
                     f"{v.max() / v.min():.3f} | "
                     f"{np.percentile(v, 90) / np.percentile(v, 10):.3f} | {corr:+.2f} |")
    known = [s for s in steal if s is not None]
    if known:
        lines += ["", f"steal time: {np.mean(known) / args.window:.1f} ticks/s mean over "
                      f"windows (of 100 per CPU), max {max(known) / args.window:.1f}; "
                      f"process CPU over wall: min {min(cpu_frac):.3f}, "
                      f"mean {np.mean(cpu_frac):.3f}."]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
