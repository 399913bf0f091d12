"""What the engine's start-up kernel build (``Transformer.warm_up``) saves in served steps.

oneDNN builds a matmul kernel the first time a weight meets a new row count, and the CPU
attention one the first time it meets a new (padded) shape. The same
burst of chat-like requests (lognormal prompts median 96, outputs 24; one admitted every
three steps, so steps mix decodes with prefill chunks of many sizes) is served twice by one
engine: the second pass repeats the first one's step shapes exactly, with every kernel
built. Per step kind: the first pass's total over the second's, and the median per-step
difference. Run with the warm-up (the engine as shipped) and without (``WARMUP_MAX_ROWS``,
``WARMUP_MAX_CONTEXT`` and ``WARMUP_MAX_PIECES`` set to 0), each in a fresh process,
``--rounds`` times interleaved.

    python benchmarks/warmup_effect.py [--rounds 2] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENGINE = dict(dtype="bfloat16", device="cpu", block_size=16, max_num_seqs=32,
              max_num_batched_tokens=512, max_model_len=2048, enable_prefix_caching=False,
              num_gpu_blocks=4096)


def one_run(warm: bool, seed: int) -> dict:
    """Two passes of the burst in one engine; per kind ``(pass1/pass2, median diff ms)``."""
    import torch

    from calibration.engine import LLMEngine, SamplingParams
    from calibration.engine import model as M

    torch.set_num_threads(1)
    if not warm:
        M.WARMUP_MAX_ROWS = M.WARMUP_MAX_CONTEXT = M.WARMUP_MAX_PIECES = 0
    eng = LLMEngine.from_catalog("llama-tiny-56m", ENGINE)
    rng = np.random.default_rng(seed)
    n = 60
    P = np.clip(rng.lognormal(np.log(96), 0.95, n).astype(int), 4, 1000)
    O = np.clip(rng.lognormal(np.log(24), 0.7, n).astype(int), 1, 200)
    prompts = [rng.integers(10, 30000, int(p)).tolist() for p in P]

    def serve():
        first = len(eng.step_records)
        for prompt, o in zip(prompts, O):
            eng.add_request(prompt, SamplingParams(max_tokens=int(o), ignore_eos=True))
            for _ in range(3):
                eng.step()
        while eng.has_unfinished_requests():
            eng.step()
        return eng.step_records[first:]

    a, b = serve(), serve()
    assert [r.num_scheduled_tokens for r in a] == [r.num_scheduled_tokens for r in b]
    da = np.array([r.duration_ns for r in a]) / 1e6
    db = np.array([r.duration_ns for r in b]) / 1e6
    mixed = np.array([bool(r.prefills) for r in a])
    out = {"steps": len(a), "row_counts": len({r.num_scheduled_tokens for r in a})}
    for kind, m in (("with a prefill chunk", mixed), ("decode only", ~mixed)):
        out[kind] = (float(da[m].sum() / db[m].sum()), float(np.median(da[m] - db[m])),
                     int(m.sum()))
    return out


def main(argv=None) -> int:
    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/warmup_effect.py",
                       error_name="benchmarks/warmup_effect.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=positive_int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "warmup.md"))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(one_run(args.child[0] == "warm", int(args.child[1]))))
        return 0
    import torch

    rows = []
    for r in range(args.rounds):
        for warm in (False, True):
            res = subprocess.run([sys.executable, __file__, "--child",
                                  "warm" if warm else "cold", str(r)],
                                 capture_output=True, text=True, check=True)
            rows.append((r, warm, json.loads(res.stdout.splitlines()[-1])))
            print(rows[-1], flush=True)
    lines = ["# Start-up kernel build: served steps, first pass over second", "",
             f"`python benchmarks/warmup_effect.py --rounds {args.rounds}`; "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
             "1 thread, llama-tiny-56m bfloat16, engine " + json.dumps(ENGINE) + ".", "",
             "A ratio above 1 is what a step pays for kernels built while serving.", "",
             "| round (seed) | warm-up | steps | row counts | kind | steps of kind "
             "| pass 1 / pass 2 | median extra ms |", "|---|---|---|---|---|---|---|---|"]
    for r, warm, o in rows:
        for kind in ("with a prefill chunk", "decode only"):
            ratio, diff, n = o[kind]
            lines.append(f"| {r} | {'yes' if warm else 'no'} | {o['steps']} | "
                         f"{o['row_counts']} | {kind} | {n} | {ratio:.3f} | {diff:+.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
