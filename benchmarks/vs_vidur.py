"""servesim vs Vidur: wall time, simulated requests per wall second, peak memory, latencies.

Both simulators serve the same explicit request list: Llama-3(.1)-8B, fp16, one A100-80GB,
one replica, vLLM-style scheduler, at most 128 running requests, no prefix caching, the
same per-step token budget (Vidur's vllm scheduler batches up to ``--max-tokens`` prompt
tokens; servesim's ``max_num_batched_tokens`` is set to the same value). Requests come from
the peer's ``make_requests.py``: lengths resampled from the Azure LLM inference 2023
conversation trace (clipped to prompt + output <= 4096), uncapped Poisson arrivals at
``--load`` (default 70%) of the servesim replica's capacity, which is measured first as the
request throughput of a burst of ``--capacity-requests`` such requests.

Each tool runs in its own fresh process, wrapped by a tiny measuring process that records
the wall time and peak RSS (``getrusage(RUSAGE_CHILDREN)``) of that one child. Start-up
(the median wall time of ``--startup-runs`` 1-request runs) is subtracted before dividing:
``req/s = N / (wall - startup)``. Vidur runs with ``--no-token-metrics`` (its fastest mode).
Latencies (TTFT includes queueing; TPOT = (E2EL - TTFT) / (output - 1), one-token outputs
left out) are shown side by side, not tuned: the two cost models differ. Project target:
servesim/Vidur ratio >= 20.

Vidur lives in its own venv (/work/shared/peers/vidur, README.md there); without it the
benchmark prints how to make it and exits 0, or runs its setup.sh with ``--setup``.

Usage: python benchmarks/vs_vidur.py [--requests 10000,100000] [--load 0.7] [--seed 42]
       [--repeats 1] [--setup] [--venv /tmp/vidur-venv] [--md benchmarks/results/vs_vidur.md]
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER = Path(os.environ.get("VIDUR_PEER_DIR", "/work/shared/peers/vidur"))
TRACE = Path("/work/shared/traces/azure2023/AzureLLMInferenceTrace_conv.csv")

# Runs argv[2:] as one child and writes {"rc", "wall_s", "peak_rss_mib"} to argv[1]; a fresh
# wrapper per measurement keeps RUSAGE_CHILDREN's maximum to that one child (and its own
# children, e.g. run.sh's Vidur process).
MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
json.dump({"rc": rc, "wall_s": wall, "peak_rss_mib": rss}, open(sys.argv[1], "w"))
"""

# The servesim child: argv = scenario JSON path, request CSV, result JSON path.
SERVESIM_CHILD = r"""
import csv, json, sys
from simulator.policy import RequestSpec
from simulator.run import simulate
from simulator.scenario import scenario_from_dict
sc = scenario_from_dict(json.load(open(sys.argv[1])))
with open(sys.argv[2], newline="") as f:
    rows = list(csv.DictReader(f))
specs = [RequestSpec(request_id=i, arrival_ns=round(float(r["arrival_s"]) * 1e9),
                     prompt=((("user", i), int(r["prompt_tokens"])),),
                     max_tokens=int(r["output_tokens"])) for i, r in enumerate(rows)]
s = simulate(sc, specs=specs).summary
json.dump({k: s[k] for k in ("completed", "num_requests", "request_throughput", "duration_s",
                             "preemptions", "engine_steps", "ttft_ms", "tpot_ms", "e2el_ms",
                             "num_gpu_blocks", "cost_model")}, open(sys.argv[3], "w"))
"""


def servesim_scenario(dtype: str, batch_cap: int, max_tokens: int, seed: int) -> dict:
    """The servesim scenario matching the Vidur configuration.

    ``workload`` is a trivial placeholder that only has to validate: the benchmark passes
    the request list as ``specs=``, which replaces it. ``max_num_batched_tokens`` equals
    Vidur's vllm per-batch token budget (its ``--max-tokens``); ``max_model_len`` likewise.
    """
    return {
        "name": "vs_vidur", "model": "llama-3.1-8b", "dtype": dtype,
        "hardware": {"profile": "a100-80gb", "tensor_parallel": 1},
        "engine": {"max_num_seqs": batch_cap, "max_num_batched_tokens": max_tokens,
                   "enable_prefix_caching": False, "max_model_len": max_tokens},
        "cluster": {"replicas": 1},
        "workload": {"seed": seed, "num_requests": 1,
                     "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 16}},
    }


def measure(cmd: list[str], tmp: Path, tag: str) -> dict:
    """Run ``cmd`` in a fresh measuring process; return rc, wall_s, peak_rss_mib."""
    res = tmp / f"measure-{tag}.json"
    subprocess.run([sys.executable, "-c", MEASURE, str(res), *cmd], check=True, cwd=ROOT)
    out = json.loads(res.read_text())
    if out["rc"] != 0:
        raise SystemExit(f"vs_vidur: {tag} failed (exit {out['rc']}): {' '.join(cmd)}")
    return out


def make_requests(out: Path, n: int, qps: float, seed: int, max_tokens: int,
                  arrival: str = "poisson") -> Path:
    """Write an explicit request CSV with the peer's make_requests.py (Azure conv lengths)."""
    subprocess.run([sys.executable, str(PEER / "make_requests.py"), "-n", str(n), "--qps",
                    repr(qps), "--arrival", arrival, "--lengths-from", str(TRACE),
                    "--max-tokens", str(max_tokens), "--seed", str(seed), "-o", str(out)],
                   check=True, stderr=subprocess.DEVNULL)
    return out


def run_servesim(tmp: Path, scenario: Path, csv_path: Path, tag: str) -> tuple[dict, dict]:
    res = tmp / f"servesim-{tag}.json"
    m = measure([sys.executable, "-c", SERVESIM_CHILD, str(scenario), str(csv_path), str(res)],
                tmp, f"servesim-{tag}")
    return m, json.loads(res.read_text())


def run_vidur(tmp: Path, venv: Path, csv_path: Path, tag: str, a) -> tuple[dict, dict]:
    out = tmp / f"vidur-{tag}"
    m = measure([str(PEER / "run.sh"), "--venv", str(venv), "--requests", str(csv_path),
                 "--out", str(out), "--scheduler", "vllm", "--batch-cap", str(a.batch_cap),
                 "--max-tokens", str(a.max_tokens), "--replicas", "1", "--seed", str(a.seed),
                 "--no-token-metrics"], tmp, f"vidur-{tag}")
    summary = json.loads((out / "summary.json").read_text())
    if not a.keep:
        subprocess.run(["rm", "-rf", str(out)], check=False)
    return m, summary


def _median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (the lower middle one for an even count)."""
    return sorted(runs, key=lambda m: m["wall_s"])[(len(runs) - 1) // 2]


def startup(fn, runs: int) -> float:
    return statistics.median(fn(k)[0]["wall_s"] for k in range(runs))


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB, "
            f"{platform.system()} {platform.release()}")


def versions(summary: dict) -> str:
    import numpy
    import simpy
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                         capture_output=True).stdout.strip() or "?"
    return (f"servesim {rev} (python {platform.python_version()}, simpy {simpy.__version__}, "
            f"numpy {numpy.__version__}); vidur {summary.get('simulator_version', '?')}")


def pct(d: dict | None, k: str) -> str:
    v = (d or {}).get(k)
    return "–" if v is None else f"{v:,.1f}"


def main() -> None:
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/vs_vidur.py", error_name="benchmarks/vs_vidur.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="10000,100000",
                    help="comma-separated request counts (default 10000,100000)")
    ap.add_argument("--load", type=float, default=0.7, help="fraction of servesim capacity")
    ap.add_argument("--rate", type=float, help="arrival rate req/s (skips the capacity run)")
    ap.add_argument("--capacity-requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--batch-cap", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--startup-runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed runs per size and tool, alternating; medians are reported")
    ap.add_argument("--venv", default=os.environ.get("VIDUR_VENV", "/tmp/vidur-venv"))
    ap.add_argument("--setup", action="store_true", help="run the peer's setup.sh if needed")
    ap.add_argument("--keep", action="store_true", help="keep Vidur's output folders")
    ap.add_argument("--md", help="also write the results as Markdown to this path")
    a = ap.parse_args()
    sizes = [x.strip() for x in a.requests.split(",") if x.strip()]
    if not sizes or not all(x.isdigit() and int(x) >= 1 for x in sizes):
        ap.error(f"--requests: whole numbers >= 1, comma-separated, got {a.requests!r}")
    sizes = [int(x) for x in sizes]
    for flag, v in (("--capacity-requests", a.capacity_requests), ("--batch-cap", a.batch_cap),
                    ("--max-tokens", a.max_tokens), ("--startup-runs", a.startup_runs),
                    ("--repeats", a.repeats)):
        if v < 1:
            ap.error(f"{flag}: a whole number >= 1, got {v}")
    for flag, v in (("--load", a.load), ("--rate", a.rate)):
        if v is not None and not 0 < v < math.inf:
            ap.error(f"{flag}: a number > 0, got {v}")

    venv = Path(a.venv)
    ready = (venv / "bin" / "python").exists() and (venv / "vidur-cache" / ".data_stamp").exists()
    if not ready and a.setup:
        subprocess.run([str(PEER / "setup.sh"), str(venv)], check=True)
        ready = True
    if not ready:
        print(f"vs_vidur: skipped: no Vidur venv at {venv}. Make it once (about 2 min) with\n"
              f"  {PEER / 'setup.sh'} {venv}\nor rerun this benchmark with --setup.")
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    sc_dict = servesim_scenario(a.dtype, a.batch_cap, a.max_tokens, a.seed)
    with tempfile.TemporaryDirectory(prefix="vs_vidur-") as td:
        tmp = Path(td)
        scen = tmp / "scenario.json"
        scen.write_text(json.dumps(sc_dict))
        if a.rate:
            cap, rate = None, a.rate
        else:
            # capacity = request throughput of a burst (all at t=0), as benchmarks/sim_speed.py
            burst = make_requests(tmp / "burst.csv", a.capacity_requests, 1.0, a.seed,
                                  a.max_tokens, arrival="burst")
            _, cs = run_servesim(tmp, scen, burst, "capacity")
            cap = cs["request_throughput"]
            rate = a.load * cap
        console.print(f"servesim capacity {cap or float('nan'):.2f} req/s -> offered "
                      f"{rate:.3f} req/s")
        one = make_requests(tmp / "one.csv", 1, rate, a.seed, a.max_tokens)
        su_s = startup(lambda k: run_servesim(tmp, scen, one, f"startup{k}"), a.startup_runs)
        su_v = startup(lambda k: run_vidur(tmp, venv, one, f"startup{k}", a), a.startup_runs)
        console.print(f"start-up: servesim {su_s:.2f} s, vidur {su_v:.2f} s")
        rows, loads = [], []
        for n in sizes:
            req = make_requests(tmp / f"req{n}.csv", n, rate, a.seed, a.max_tokens)
            runs_s, runs_v = [], []
            for k in range(a.repeats):
                load = os.getloadavg()[0]
                ms, ss = run_servesim(tmp, scen, req, f"{n}-{k}")
                console.print(f"{n}: servesim {ms['wall_s']:.2f} s (load {load:.2f})")
                mv, sv = run_vidur(tmp, venv, req, f"{n}-{k}", a)
                console.print(f"{n}: vidur {mv['wall_s']:.2f} s")
                runs_s.append(ms)
                runs_v.append(mv)
                loads.append(load)
            rows.append((n, _median_run(runs_s), ss, _median_run(runs_v), sv,
                         [m["wall_s"] for m in runs_s], [m["wall_s"] for m in runs_v]))
            req.unlink()

    head = [f"machine: {machine()}",
            f"versions: {versions(rows[0][4] if rows else {})}",
            f"seed {a.seed}; load {a.load:.0%} of servesim capacity "
            f"({'given' if cap is None else f'{cap:.2f} req/s, burst of {a.capacity_requests:,}'})"
            f" -> Poisson {rate:.3f} req/s (uncapped, make_requests.py)",
            f"workload: Azure 2023 conv lengths resampled, prompt+output <= {a.max_tokens}",
            f"servesim: llama-3.1-8b {a.dtype}, a100-80gb x1, max_num_seqs {a.batch_cap}, "
            f"max_num_batched_tokens {a.max_tokens}, max_model_len {a.max_tokens}, "
            f"prefix caching off, 1 replica",
            f"vidur: Llama-3-8B fp16 A100-80GB TP1, scheduler vllm, --batch-cap {a.batch_cap},"
            f" --max-tokens {a.max_tokens}, --no-token-metrics, 1 replica",
            f"start-up (median of {a.startup_runs} 1-request runs): servesim {su_s:.2f} s, "
            f"vidur {su_v:.2f} s",
            f"timed runs: {a.repeats} per size and tool, alternating; medians shown "
            f"(wall s of every run below); 1-min load average at the runs "
            f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} CPUs"]

    speed = Table(title="Speed (req/s = requests / (wall - start-up))")
    for c in ("requests", "servesim wall s", "servesim req/s", "servesim peak MiB",
              "vidur wall s", "vidur req/s", "vidur peak MiB", "ratio servesim/vidur"):
        speed.add_column(c, justify="right")
    lat = Table(title="Latency percentiles, ms (p50 / p90 / p99)")
    for c in ("requests", "tool", "TTFT", "TPOT", "E2EL", "sim req/s", "completed",
              "preemptions"):
        lat.add_column(c, justify="right")
    md_speed, md_lat = [], []
    for n, ms, ss, mv, sv, _, _ in rows:
        rs = n / max(ms["wall_s"] - su_s, 1e-9)
        rv = n / max(mv["wall_s"] - su_v, 1e-9)
        cells = [f"{n:,}", f"{ms['wall_s']:.2f}", f"{rs:,.0f}", f"{ms['peak_rss_mib']:,.0f}",
                 f"{mv['wall_s']:.2f}", f"{rv:,.0f}", f"{mv['peak_rss_mib']:,.0f}",
                 f"{rs / rv:.2f}"]
        speed.add_row(*cells)
        md_speed.append(cells)
        for tool, t, e, thr, done, pre in (
                ("servesim", ss["ttft_ms"], ss["e2el_ms"], ss["request_throughput"],
                 ss["completed"], ss["preemptions"]),
                ("vidur", sv["ttft_ms"], sv["e2e_ms"], sv["throughput_req_per_sim_s"],
                 sv["num_requests"], sv.get("preemption_restarts"))):
            tp = ss["tpot_ms"] if tool == "servesim" else sv["tpot_ms"]
            c = [f"{n:,}", tool, " / ".join(pct(t, k) for k in ("p50", "p90", "p99")),
                 " / ".join(pct(tp, k) for k in ("p50", "p90", "p99")),
                 " / ".join(pct(e, k) for k in ("p50", "p90", "p99")), f"{thr:.3f}",
                 f"{done:,}", str(pre)]
            lat.add_row(*c)
            md_lat.append(c)
        if not sv.get("all_completed", True) or not sv.get("token_counts_match_input", True):
            console.print(f"[yellow]vidur {n}: all_completed={sv.get('all_completed')}, "
                          f"token_counts_match_input={sv.get('token_counts_match_input')}")
    for n, _, _, _, _, ws, wv in rows:
        head.append(f"{n:,} requests, wall s: servesim {', '.join(f'{w:.2f}' for w in ws)}; "
                    f"vidur {', '.join(f'{w:.2f}' for w in wv)}")
    for line in head:
        console.print(line)
    console.print(speed)
    console.print(lat)
    console.print("target: ratio >= 20")

    if a.md:
        def table(hdr, body):
            return "\n".join(["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
                             + ["| " + " | ".join(r) + " |" for r in body])
        text = ["# servesim vs Vidur (benchmarks/vs_vidur.py)", "",
                f"Command: `python benchmarks/vs_vidur.py --requests {a.requests} "
                f"--load {a.load} --seed {a.seed} --repeats {a.repeats}`", ""]
        text += [f"- {h}" for h in head]
        text += ["", "## Speed", "", "req/s = requests / (wall − start-up); target ratio ≥ 20.",
                 "", table([c.header for c in speed.columns], md_speed), "",
                 "## Latency percentiles (ms, p50 / p90 / p99)", "",
                 "TTFT includes queueing; TPOT = (E2EL − TTFT) / (output − 1). The cost models "
                 "differ (servesim: roofline projection; Vidur: profiled A100 operators), so "
                 "latencies are shown, not tuned. `sim req/s` is achieved throughput in "
                 "simulated time.", "", table([c.header for c in lat.columns], md_lat), ""]
        Path(a.md).write_text("\n".join(text))


if __name__ == "__main__":
    main()
