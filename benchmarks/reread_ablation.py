"""Re-read ablation: a fidelity run's predictions again, with the profile refitted without
its re-read rate.

``benchmarks/fidelity.py`` leaves, per workload, ``reports/fidelity/<workload>/`` with the
run's ``validation.json`` and the profile it calibrated just before (``profile/``). This
simulates the run's saturation burst and every load and replication again, on the identical
request lists (the run's seeds, rates and counts), with two profiles: the one as fitted, whose
predictions must be the run's own (checked), and one refitted from the same measurements CSV
without a re-read rate (:func:`calibration.fit.fit_measurements` with ``reread=False``: a
decode that re-reads a shared cached prefix priced as a first read). Each figure's signed
error against the run's measured figure (mean over replications) is written for both. No
engine runs, so it takes seconds and does not need a quiet machine.

    python benchmarks/reread_ablation.py [--reports reports/fidelity]
        [--only shared-system-prompt] [--out PATH]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the working tree's servesim, not an installed one
#: The figures compared: TTFT, TPOT and E2EL at p50 and p99 (the targets of the fidelity run).
FIGURES = [f"{m} p{q}" for m in ("TTFT", "TPOT", "E2EL") for q in (50, 99)]


def refit_without_reread(profile_yaml: Path, into: Path) -> tuple[Path, float]:
    """A copy of the profile (with its measurements CSV) in ``into`` whose cost is refitted
    from that CSV without a re-read rate (:func:`calibration.fit.refit_profile`); returns
    its path and held-out MAPE."""
    from calibration.fit import refit_profile
    from simulator.cost_model import load_profile

    prof = load_profile(str(profile_yaml))
    fit = refit_profile(prof, reread=False)
    csv = profile_yaml.parent / prof.provenance.measurements_csv
    shutil.copy(csv, into / csv.name)
    doc = yaml.safe_load(profile_yaml.read_text())
    doc["cost"] = {**doc["cost"], "form": fit.form, "coefficients": fit.coefficients}
    out = into / profile_yaml.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out, fit.heldout["mape"]


def ablate(folder: Path, name: str) -> list[str]:
    """The markdown lines of one workload's ablation."""
    from calibration.validate import FIGURES as ALL_FIGURES, predict_again
    from simulator.metrics import summary_at
    from calibration.vllm.fidelity import WORKLOADS
    from simulator.scenario import load_scenario

    run = json.loads((folder / "validation.json").read_text())
    profile_yaml = next((folder / "profile").glob("*.yaml"))
    sets = [f"dtype={run['meta']['dtype']}"] + WORKLOADS[name]
    with tempfile.TemporaryDirectory() as tmp:
        refit, mape = refit_without_reread(profile_yaml, Path(tmp))
        sims = [predict_again(run, load_scenario(str(ROOT / "scenarios" / run["meta"]["source"]),
                                              sets + [f"hardware.profile={p}"]))
                for p in (profile_yaml, refit)]
    sat = run["saturation"]
    if sims[0]["saturation_rps"] != sat["predicted_rps"]:
        raise SystemExit(f"{folder}: the profile as fitted does not reproduce the run's "
                         f"prediction (saturation {sims[0]['saturation_rps']:.4f} req/s, the "
                         f"run {sat['predicted_rps']:.4f}): another scenario or code version")

    def err(pred, meas):
        return f"{np.mean([p / m - 1 for p, m in zip(pred, meas)]):+.1%}"

    lines = [f"## {name}", "", f"run of {run['meta']['date']}; profile "
             f"{profile_yaml.name} (held-out MAPE {run['meta']['heldout_mape']:.1%}), refitted "
             f"without the re-read rate: held-out MAPE {mape:.1%}.", "",
             "| figure | measured (mean) | error with the rate | error without |",
             "|---|---|---|---|",
             f"| saturation req/s | {sat['measured_rps']:.3f} | "
             f"{err([sims[0]['saturation_rps']], [sat['measured_rps']])} | "
             f"{err([sims[1]['saturation_rps']], [sat['measured_rps']])} |"]
    paths = dict(ALL_FIGURES)
    for i, load in enumerate(run["loads"]):
        rows = {r["figure"]: r for r in load["table"]}
        for fig in FIGURES:
            meas = rows[fig]["measured"]["each"]
            pred = [[summary_at(s, paths[fig]) for s in sim["loads"][i]] for sim in sims]
            lines.append(f"| load {load['load']:g} {fig} | {np.mean(meas):.1f} ms | "
                         f"{err(pred[0], meas)} | {err(pred[1], meas)} |")
    return lines + [""]


def main(argv=None) -> int:
    from calibration.vllm.fidelity import WORKLOADS, chosen_workloads
    from simulator.cli import OneLineParser
    from simulator.errors import InputError
    from simulator.files import atomic_write

    ap = OneLineParser(prog="python benchmarks/reread_ablation.py",
                       error_name="benchmarks/reread_ablation.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--reports", default=str(ROOT / "reports" / "fidelity"),
                    help="the folder benchmarks/fidelity.py wrote (one folder per workload)")
    ap.add_argument("--only", choices=list(WORKLOADS), action="append")
    ap.add_argument("--out", default=None, help="markdown file (default: stdout)")
    args = ap.parse_args(argv)
    try:
        names = chosen_workloads(args.only or ["shared-system-prompt"])
    except InputError as e:
        ap.error(str(e))
    if not Path(args.reports).is_dir():
        ap.error(f"--reports {args.reports}: not a folder (benchmarks/fidelity.py writes "
                 f"reports/fidelity)")
    folders = {n: Path(args.reports) / n for n in names}
    for n, f in folders.items():
        if not (f / "validation.json").is_file() or not list((f / "profile").glob("*.yaml")):
            ap.error(f"--reports {args.reports}: no {n}/validation.json with its profile/ "
                     f"(run benchmarks/fidelity.py first)")
    parts = ["# Re-read ablation: a fidelity run predicted again without the re-read rate", ""]
    for n, f in folders.items():
        parts += ablate(f, n)
    text = "\n".join(parts) + "\n"
    if args.out:
        atomic_write(Path(args.out), text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
