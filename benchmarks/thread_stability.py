"""How steady the engine's step time is with 1 and with 2 torch threads on this host.

One engine, one process: the same step shape (a decode batch of 16 at 256 tokens, and a
256-token prefill) is timed in alternating windows of ``--window`` seconds with
``torch.set_num_threads(1)`` and ``(2)``, for ``--seconds`` in all. Per thread count: the
median step time of every window, their coefficient of variation and max/min. On a shared
2-core VM the host's speed drifts between minutes; a steadier thread count is the one a
measured profile should be calibrated and validated with (``servesim calibrate --threads``).

    python benchmarks/thread_stability.py [--seconds 240] [--window 10] [--out PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = (("decode B=16 L=256", "decode", 16, 256), ("prefill n=256 c=0", "prefill", 256, 0))


def main(argv=None) -> int:
    from calibration.engine import LLMEngine
    from calibration.engine.weights import random_model
    from calibration.profiler import _Driver
    from simulator.catalog import load_model

    from calibration.cli import positive_seconds
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/thread_stability.py",
                       error_name="benchmarks/thread_stability.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=positive_seconds, default=240.0)
    ap.add_argument("--window", type=positive_seconds, default=10.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                         "thread_stability.md"))
    args = ap.parse_args(argv)
    shape = load_model("llama-tiny-56m")
    model = random_model(shape.hf_config(), seed=0, dtype=torch.bfloat16)
    eng = LLMEngine(model, {"block_size": 16, "max_num_seqs": 64,
                            "max_num_batched_tokens": 2048, "max_model_len": 2048,
                            "num_gpu_blocks": 4096, "dtype": "bfloat16", "device": "cpu"})
    drv = _Driver(eng, seed=3)
    windows = {(s[0], th): [] for s in SHAPES for th in (1, 2)}
    t_end = time.monotonic() + args.seconds
    while time.monotonic() < t_end:
        for th in (1, 2):
            torch.set_num_threads(th)
            for key, kind, a, b in SHAPES:
                w_end = time.monotonic() + args.window / len(SHAPES)
                times = []
                while time.monotonic() < w_end:
                    if kind == "decode":
                        rids = drv.start_decodes(a, b)
                        times += [drv.step().duration_ns for _ in range(4)][1:]
                        drv.stop(rids)
                    else:
                        times.append(drv.chunk_step(a, b).duration_ns)
                windows[(key, th)].append(float(np.median(times)) / 1e6)
    lines = ["# Step-time stability: 1 vs 2 torch threads", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}; llama-tiny-56m bfloat16 on the 2-core CPU; "
             f"{args.seconds:g} s, alternating {args.window:g} s windows (each split between "
             f"the shapes); per window the median step time.", "",
             "| shape | threads | windows | mean ms | CV of window medians | max/min |",
             "|---|---|---|---|---|---|"]
    for (key, th), v in windows.items():
        v = np.asarray(v)
        lines.append(f"| {key} | {th} | {v.size} | {v.mean():.2f} | "
                     f"{v.std() / v.mean():.1%} | {v.max() / v.min():.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
