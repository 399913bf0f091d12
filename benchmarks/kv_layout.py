"""KV block layout: does a decode step cost more when its blocks are scattered?

A fresh engine hands out KV blocks in id order, so each request's block table is a run of
consecutive blocks; an engine that has served a while hands them out in the order its
requests freed them (vLLM's LRU free queue), mixed across the cache. The cost model prices
a step by its token counts only, so if layout changes the step time, calibration and serving
must see the same layout. This measures decode steps (``decode B=.. L=..`` cells, as the
calibration grid builds them) on two engines over the same model and KV cache size: one
fresh, one whose free queue was shuffled, interleaved in rounds.

    python benchmarks/kv_layout.py [--scenario scenarios/cpu_tiny.yaml] [--rounds 8]
                                   [--out benchmarks/results/kv_layout.md]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CELLS = ((8, 256), (32, 256), (32, 512))


def main(argv=None) -> int:
    import torch

    from calibration.engine import LLMEngine
    from calibration.engine.weights import parse_dtype, random_model
    from calibration.profiler import _Driver
    from calibration.timing_replay import engine_config
    from calibration.validate import profile_threads
    from simulator.cost_model import build_cost_model
    from simulator.files import atomic_write
    from simulator.scenario import load_scenario

    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/kv_layout.py",
                       error_name="benchmarks/kv_layout.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "cpu_tiny.yaml"))
    ap.add_argument("--rounds", type=positive_int, default=8)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kv_layout.md"))
    args = ap.parse_args(argv)
    from simulator.errors import InputError

    try:
        sc = load_scenario(args.scenario)
    except InputError as e:
        ap.error(str(e))
    base = build_cost_model(sc)
    threads = profile_threads(base.profile) or 1
    torch.set_num_threads(threads)
    cfg = {**engine_config(sc, base.num_gpu_blocks, 0),
           "max_num_seqs": max(b for b, _ in CELLS) + 1}
    model = random_model(sc.model_shape.hf_config(), seed=0, dtype=parse_dtype(sc.dtype))

    def engine(shuffled: bool):
        eng = LLMEngine(model, cfg)
        if shuffled:   # the free queue in a random order, as after long serving
            eng.scheduler.kv.pool.scatter(1)
        return eng, _Driver(eng, seed=3)

    def visit(eng, driver, B, L) -> list[int]:
        rids = driver.start_decodes(B, L)
        out = []
        for _ in range(2):
            driver.step()
            out.append(eng.step_records[-1].execute_ns)
        driver.stop(rids)
        return out

    sides = {"consecutive": engine(False), "scattered": engine(True)}
    times = {(s, c): [] for s in sides for c in CELLS}
    for s, (eng, d) in sides.items():      # untimed visit: kernels, workspaces
        for B, L in CELLS:
            visit(eng, d, B, L)
    ratios = {c: [] for c in CELLS}
    for r in range(args.rounds):
        for B, L in CELLS:
            med = {}
            for s in (("consecutive", "scattered") if r % 2 == 0
                      else ("scattered", "consecutive")):
                eng, d = sides[s]
                t = visit(eng, d, B, L) + visit(eng, d, B, L)
                times[(s, (B, L))] += t
                med[s] = float(np.median(t))
            ratios[(B, L)].append(med["scattered"] / med["consecutive"])
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    lines = ["# Decode step time: scattered vs consecutive KV blocks", "",
             f"scenario {sc.source}; model {sc.model_shape.name} ({sc.dtype}); "
             f"{cfg['num_gpu_blocks']} blocks of {cfg['block_size']}; torch threads {threads}, "
             f"torch {torch.__version__}; {args.rounds} interleaved rounds of 4 steps per side "
             f"and cell; forward + sampling time (`execute_ns`); "
             f"{time.strftime('%Y-%m-%d %H:%M')}.", "",
             "| cell | consecutive ms (median) | scattered ms (median) | scattered / "
             "consecutive per round: median [min, max] |", "|---|---|---|---|"]
    for B, L in CELLS:
        c = np.median(times[("consecutive", (B, L))]) / 1e6
        s = np.median(times[("scattered", (B, L))]) / 1e6
        r = ratios[(B, L)]
        lines.append(f"| decode B={B} L={L} | {c:.2f} | {s:.2f} | ×{np.median(r):.3f} "
                     f"[{min(r):.3f}, {max(r):.3f}] |")
    atomic_write(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
