"""Fit synthetic-workload parameters to the Azure LLM inference 2023 traces.

For the conv and code traces (Patel et al., "Splitwise", ISCA 2024) this prints:

* prompt and output lengths as ``lognormal {median, p90}`` — the data's own median and
  90th percentile (``numpy.percentile``, linear), which the servesim lognormal reproduces
  exactly — with the data's p99 next to the fitted p99 and the Kolmogorov–Smirnov distance
  between data and fit, to show how well the two-number summary carries the tail;
* arrivals as ``gamma {rate, burstiness}``: rate = (rows − 1) / span, and the gamma shape
  from the coefficient of variation of the gaps, k = 1 / CV² (a gamma renewal process with
  shape k has gap CV 1/sqrt(k); k = 1 is Poisson);
* a ``workload:`` YAML fragment per trace to paste into a scenario.

Reads the traces from ``../shared/traces`` (relative to the repository root) unless
``--traces`` says otherwise; the traces are not part of the repository.

Usage: python benchmarks/fit_traces.py [--traces DIR]
"""

from __future__ import annotations

import math
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import scipy
from rich.console import Console
from rich.table import Table
from scipy import stats

from simulator.traces import TraceConfig, load_trace
from simulator.workload import Z90

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
FILES = {"azure-conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
         "azure-code": "azure2023/AzureLLMInferenceTrace_code.csv"}


def fit_lengths(x: np.ndarray) -> dict:
    """Lognormal (median, p90) from data quantiles, plus tail and KS checks."""
    median, p90, p99 = np.percentile(x, [50, 90, 99])
    sigma = math.log(p90 / median) / Z90
    model = stats.lognorm(s=sigma, scale=median)
    return {"median": float(median), "p90": float(p90), "p99": float(p99),
            "fit_p99": float(model.ppf(0.99)), "ks": float(stats.kstest(x, model.cdf).statistic)}


def fit_arrivals(arrival_ns: np.ndarray) -> dict:
    """Mean rate and gamma shape k = 1/CV² of the inter-arrival gaps."""
    t = arrival_ns / 1e9
    gaps = np.diff(t)
    cv = float(gaps.std() / gaps.mean())
    return {"rate": (len(t) - 1) / (t[-1] - t[0]), "cv": cv, "k": 1.0 / cv ** 2,
            "span_s": float(t[-1] - t[0])}


def main() -> None:
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/fit_traces.py",
                       error_name="benchmarks/fit_traces.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=None,
                    help=f"folder of shared traces (default {TRACES}; skipped when absent)")
    args = ap.parse_args()
    if args.traces is not None and not args.traces.is_dir():   # a folder named, not found
        ap.error(f"--traces {args.traces}: not a folder")
    args.traces = args.traces or TRACES
    console = Console()
    console.print(f"# fit_traces — python {sys.version.split()[0]}, numpy {np.__version__}, "
                  f"pandas {pd.__version__}, scipy {scipy.__version__}, {platform.machine()}; "
                  "deterministic (no RNG)")

    table = Table(title="Azure LLM inference 2023: lognormal lengths, gamma arrivals")
    for col in ("trace", "rows", "span s", "rate req/s", "gap CV", "burstiness k",
                "what", "median", "p90", "p99 data", "p99 fit", "KS"):
        table.add_column(col, justify="left" if col in ("trace", "what") else "right")
    fragments = []
    for name, rel in FILES.items():
        path = args.traces / rel
        if not path.is_file():
            console.print(f"[yellow]skip {name}: {path} not found[/]")
            continue
        t = load_trace(TraceConfig(path=str(path), format="azure"))
        arr = fit_arrivals(t.arrival_ns)
        fits = {"prompt": fit_lengths(t.prompt_tokens), "output": fit_lengths(t.output_tokens)}
        for i, (what, f) in enumerate(fits.items()):
            head = ([name, f"{len(t):,}", f"{arr['span_s']:.0f}", f"{arr['rate']:.3f}",
                     f"{arr['cv']:.2f}", f"{arr['k']:.4g}"] if i == 0 else [""] * 6)
            table.add_row(*head, what, f"{f['median']:.0f}", f"{f['p90']:.0f}",
                          f"{f['p99']:.0f}", f"{f['fit_p99']:.0f}", f"{f['ks']:.3f}")
        p, o = fits["prompt"], fits["output"]
        fragments.append(
            f"# {name}\nworkload:\n"
            f"  arrival: {{process: gamma, rate: {arr['rate']:.2f}, "
            f"burstiness: {arr['k']:.3g}}}\n"
            f"  prompt_tokens: {{dist: lognormal, median: {p['median']:.0f}, "
            f"p90: {p['p90']:.0f}, max: {int(t.prompt_tokens.max())}}}\n"
            f"  output_tokens: {{dist: lognormal, median: {o['median']:.0f}, "
            f"p90: {o['p90']:.0f}, max: {int(t.output_tokens.max())}}}")
    console.print(table)
    console.print("KS: largest gap between the data's and the fitted CDF (0 = identical).")
    for frag in fragments:
        console.print(frag, markup=False, highlight=False)


if __name__ == "__main__":
    main()
