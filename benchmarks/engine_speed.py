"""Speed of servesim's engine against HF ``transformers`` ``generate`` on the same model.

Model: catalog ``llama-tiny-56m``, the shape of the vLLM peer model
(shared/peers/vllm/README.md): Llama, hidden 512, 8 layers, 8 heads / 4 KV heads,
intermediate 1408, vocab 32000, random weights (seeded),
saved once and loaded by both engines. Repeats of the two engines are interleaved, each
repeat with fresh prompts (so prefix caching cannot reuse an earlier repeat), and the
table reports medians and the ratio ours / HF from the same run.

Workloads (greedy, ignore_eos):
  decode-b1    one request, prompt 128, 128 output tokens; output tok/s.
  batch-32     32 requests, prompt lengths spread evenly over 64-512, 128 output tokens
               each; HF batched with left padding; output tok/s.
  prefill-512  one 512-token prompt, 1 output token; prompt tok/s.

On ``--device cuda`` both engines run on the GPU (timings synchronised), and the table adds
our batch-1 decode step time next to the bound of reading every weight once per step
(weight bytes / the device's memory bandwidth, ``--bandwidth`` in GB/s; H200: 4800).

Usage: python benchmarks/engine_speed.py [--repeats 3] [--threads 2] [--dtype bfloat16]
                                         [--device cpu|cuda] [--bandwidth GB/s]
"""

from __future__ import annotations

import logging
import os
import platform
import re
import statistics
import tempfile
import time

import numpy as np
import torch
import transformers
from rich.console import Console
from rich.table import Table

from calibration.engine import LLMEngine, SamplingParams, random_model, save_pretrained
from simulator.catalog import load_model

SHAPE = load_model("llama-tiny-56m").hf_config()   # the vLLM peer model's shape
OUT_TOKENS = 128


def workloads(rng: np.random.Generator):
    """Prompts (token-id lists) and output lengths for each workload, fresh per repeat."""
    def prompt(n):
        return rng.integers(0, SHAPE["vocab_size"], n).tolist()
    return {
        "decode-b1": ([prompt(128)], OUT_TOKENS),
        "batch-32": ([prompt(int(n)) for n in np.linspace(64, 512, 32)], OUT_TOKENS),
        "prefill-512": ([prompt(512)], 1),
    }


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_ours(engine: LLMEngine, prompts, out_tokens) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=out_tokens, ignore_eos=True)
    _sync(engine.model.device)
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    _sync(engine.model.device)
    dt = time.perf_counter() - t
    assert all(len(o.output_token_ids) == out_tokens for o in outs)
    return dt


@torch.inference_mode()
def run_hf(model, prompts, out_tokens) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):           # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    _sync(model.device)
    t = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=out_tokens,
                         min_new_tokens=out_tokens, do_sample=False, pad_token_id=0)
    _sync(model.device)
    dt = time.perf_counter() - t
    assert out.shape[1] == width + out_tokens
    return dt


def main() -> None:
    from calibration.cli import positive_int, seed_arg
    from simulator.cli import OneLineParser

    # a bad flag: one line and exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/engine_speed.py",
                       error_name="benchmarks/engine_speed.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=seed_arg, default=0)
    ap.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:n]")
    ap.add_argument("--bandwidth", type=float, default=4800.0,
                    help="device memory bandwidth in GB/s for the batch-1 bound (cuda)")
    args = ap.parse_args()
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        ap.error(f"--device: cpu or cuda[:n], got {args.device!r}")
    if not 0 < args.bandwidth < float("inf"):   # nan too
        ap.error(f"--bandwidth: a number of GB/s > 0, got {args.bandwidth:g}")
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    dtype = getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory() as d:
        save_pretrained(random_model(SHAPE, seed=args.seed), d)
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
        hf = hf.to(args.device)
        ours = LLMEngine(d, dict(dtype=args.dtype, block_size=16, max_num_seqs=256,
                                 max_num_batched_tokens=4096, max_model_len=4096,
                                 kv_cache_memory_bytes=512 * 2**20, seed=args.seed,
                                 device=args.device))

    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(args.seed)
    warm = workloads(rng)["decode-b1"][0]
    run_ours(ours, warm, 8)
    run_hf(hf, warm, 8)
    times: dict = {}
    tokens: dict = {}
    for rep in range(args.repeats):
        for name, (prompts, out_tokens) in workloads(rng).items():
            if args.only and name not in args.only:
                continue
            tokens[name] = (sum(len(p) for p in prompts) if name.startswith("prefill")
                            else len(prompts) * out_tokens)
            pair = [("ours", run_ours, ours), ("hf", run_hf, hf)]
            if rep % 2:
                pair.reverse()   # alternate who goes first
            for who, fn, eng in pair:
                times.setdefault((name, who), []).append(fn(eng, prompts, out_tokens))
            console.log(f"repeat {rep + 1}/{args.repeats} {name}: ours "
                        f"{times[name, 'ours'][-1]:.2f} s, hf {times[name, 'hf'][-1]:.2f} s")

    table = Table(title=f"engine speed ({args.dtype}, {args.threads} threads, "
                        f"median of {args.repeats})")
    for col in ("workload", "unit", "ours tok/s", "HF tok/s", "ours / HF"):
        table.add_column(col, justify="right" if "tok" in col or "/" in col else "left")
    for name in tokens:
        ours_tps = tokens[name] / statistics.median(times[name, "ours"])
        hf_tps = tokens[name] / statistics.median(times[name, "hf"])
        unit = "prompt" if name.startswith("prefill") else "output"
        table.add_row(name, unit, f"{ours_tps:,.0f}", f"{hf_tps:,.0f}",
                      f"{ours_tps / hf_tps:.2f}x")
    console.print(table)
    if args.device.startswith("cuda") and "decode-b1" in tokens:
        # Our batch-1 decode steps, from the engine's own step records (synchronised).
        ours.step_records.clear()
        run_ours(ours, workloads(rng)["decode-b1"][0], OUT_TOKENS)
        steps = [s.duration_ns * 1e-9 for s in ours.step_records if not s.prefills]
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.model.parameters())
        bound = weight_bytes / (args.bandwidth * 1e9)
        med = statistics.median(steps)
        console.print(f"batch-1 decode step: median {med * 1e3:.3f} ms over {len(steps)} "
                      f"steps; weights {weight_bytes / 1e6:.1f} MB / {args.bandwidth:g} GB/s "
                      f"= {bound * 1e3:.3f} ms bound ({bound / med:.1%} of it reached); "
                      f"{torch.cuda.get_device_name()}")
    console.print(f"machine: {platform.processor() or platform.machine()}, "
                  f"{os.cpu_count()} CPUs; python {platform.python_version()}, torch "
                  f"{torch.__version__}, transformers {transformers.__version__}; "
                  f"seed {args.seed}; 1-min load average {load_before:.2f} before, "
                  f"{os.getloadavg()[0]:.2f} after (this run adds about {args.threads}; more "
                  f"means other jobs shared the cores: rerun)")


if __name__ == "__main__":
    main()
