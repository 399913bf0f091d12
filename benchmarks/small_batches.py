"""Decode step time at small batch sizes, with and without the engine's row padding.

``calibration.engine.model.PAD_ROWS`` runs a two-row matmul as three (oneDNN picks a
slower kernel for exactly two rows on an AVX512-BF16 CPU). One engine, decode batches of
``B = 1..6`` at context 256, interleaved over ``--rounds`` passes (3 steps per visit), with
padding on and off in alternate passes; the medians per B show whether ``t(B)`` rises with
B, as the cost model's smooth form assumes.

    python benchmarks/small_batches.py [--rounds 8] [--out PATH]
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import torch

    from calibration.engine import LLMEngine
    from calibration.engine import model as M
    from calibration.profiler import _Driver

    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/small_batches.py",
                       error_name="benchmarks/small_batches.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=8)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "small_batches.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    eng = LLMEngine.from_catalog("llama-tiny-56m", dict(
        dtype="bfloat16", block_size=16, max_num_seqs=64, max_num_batched_tokens=512,
        num_gpu_blocks=2048, max_model_len=2048))
    d = _Driver(eng, seed=3)
    pad = dict(M.PAD_ROWS)
    times: dict = {}
    for r in range(args.rounds + 1):
        for padded in (True, False):
            M.PAD_ROWS = pad if padded else {}
            for B in range(1, 7):
                rids = d.start_decodes(B, 256)
                recs = [d.step() for _ in range(3)]
                d.stop(rids)
                if r:  # the first round only warms up
                    times.setdefault((padded, B), []).extend(x.duration_ns / 1e6 for x in recs)
    M.PAD_ROWS = pad
    lines = ["# Decode step time at small batches, two rows padded to three or not", "",
             f"`python benchmarks/small_batches.py --rounds {args.rounds}`; "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
             "1 thread, llama-tiny-56m bfloat16, context 256; medians of "
             f"{3 * args.rounds} steps per cell, the two settings interleaved.", "",
             "| decodes | padded (ms) | not padded (ms) |", "|---|---|---|"]
    for B in range(1, 7):
        lines.append(f"| {B} | {np.median(times[(True, B)]):.2f} | "
                     f"{np.median(times[(False, B)]):.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
