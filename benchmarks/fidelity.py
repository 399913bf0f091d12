"""Fidelity benchmark: the simulator's error against the real engine on this machine.

Runs ``servesim validate`` (:func:`calibration.validate.validate`) on the CPU fidelity
workloads — ``scenarios/cpu_tiny.yaml`` (Poisson, Azure-conversation-like lengths scaled to
the CPU) and the same with a shared system prompt (4 groups of 128 tokens) — at loads 0.3,
0.6 and 0.9 of the measured saturation, and writes one markdown file with every error,
the machine, the versions and the seeds (default ``benchmarks/results/fidelity.md``; the
HTML reports and CDF plots go to ``reports/fidelity/<workload>/``).

    python benchmarks/fidelity.py [--replications 2] [--seconds 30] [--out PATH]

Wall clock: about (saturation + loads × replications × seconds) per workload; the defaults
take about 10 minutes on 2 cores. Timed runs wait for a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "poisson-chat": [],
    "shared-system-prompt": ["workload.prefix.shared_tokens=128", "workload.prefix.groups=4"],
}


def main(argv=None) -> int:
    from calibration.validate import markdown_table, validate, write_outputs
    from simulator.scenario import load_scenario

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "cpu_tiny.yaml"))
    ap.add_argument("--loads", default="0.3,0.6,0.9")
    ap.add_argument("--replications", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--only", choices=list(WORKLOADS), action="append")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fidelity.md"))
    args = ap.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")]
    parts = ["# servesim fidelity against its own engine (predicted mode)", ""]
    results = {}
    for name in args.only or list(WORKLOADS):
        sc = load_scenario(args.scenario, WORKLOADS[name])
        print(f"== {name}", file=sys.stderr)
        res = validate(sc, loads, args.replications, seconds_per_load=args.seconds,
                       progress=lambda m: print(m, file=sys.stderr, flush=True))
        write_outputs(res, ROOT / "reports" / "fidelity" / name)
        results[name] = res
        meta = res["meta"]
        parts += [f"## {name}", "",
                  f"scenario {meta['source']} {' '.join(WORKLOADS[name])}; model "
                  f"{meta['model']} ({meta['dtype']}); {meta['cpu']}, {meta['threads']} torch "
                  f"threads, torch {meta['torch']}, Python {meta['python']}, engine "
                  f"{meta['engine']}; cost model {meta['cost_model']} (held-out MAPE "
                  f"{meta['heldout_mape']:.3f}); seed {meta['seed']}, {meta['replications']} "
                  f"replications (seeds SeedSequence([seed, load‰, r])), "
                  f"{meta['seconds_per_load']:g} s of arrivals per load; {meta['date']}.",
                  f"engine knobs: {json.dumps(meta['engine_knobs'])}; {meta['scheduling']}.",
                  f"front end (between steps, not in the prediction): mean "
                  f"{res['front_end']['gap_us_mean']:.0f} us, p99 "
                  f"{res['front_end']['gap_us_p99']:.0f} us per step.", "",
                  markdown_table(res), ""]
    parts += ["error = (predicted − measured) / measured; cells are mean [min, max] over "
              "replications; 'in MAPE band': the measured figure lies between simulations "
              "with every step cost scaled by (1 − MAPE) and (1 + MAPE).", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
