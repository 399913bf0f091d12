"""Fidelity benchmark: the simulator's error against the real engine on this machine.

Runs ``servesim validate`` (:func:`calibration.validate.validate`) on the CPU fidelity
workloads — ``scenarios/cpu_tiny.yaml`` (Poisson, Azure-conversation-like lengths scaled to
the CPU; in float32 on a CPU that emulates bfloat16, :func:`host_dtype`) and the same with a
shared system prompt (4 groups of 128 tokens) — at loads 0.3,
0.6 and 0.9 of the measured saturation, and writes one markdown file with every error,
the machine, the versions and the seeds (default ``benchmarks/results/fidelity.md``; the
HTML reports and CDF plots go to ``reports/fidelity/<workload>/``). Every replication's
request list is served twice (``validate(again=True)``): how far the engine lies from
itself on this machine is the floor under the simulator's error. Before each workload the
model is calibrated anew on this machine (:func:`fresh_profile`, into
``reports/fidelity/<workload>/profile/``), because a shared CPU host's speed drifts by tens of
% over half an hour; ``--no-calibrate`` validates the scenario's own profile instead.

    python benchmarks/fidelity.py [--replications 3] [--seconds 15] [--min-requests 50]
                                  [--no-calibrate] [--no-serve-again] [--out PATH]

Wall clock: about (calibration + saturation + 2 × loads × replications × seconds) per
workload, a load taking longer where its rate brings fewer than ``--min-requests`` in that
time; the defaults take about 12 minutes per workload on 2 cores of an AMD EPYC. Timed runs
wait for a quiet machine, and the CPU time that other processes used during each timed run
is measured (:class:`CpuWatch`) and reported, so a run disturbed by other work on a shared
machine is visible in the results.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# The shipped profile for CPUs that emulate bfloat16 (host_dtype).
FLOAT32_PROFILE = "cpu-llama-tiny-56m-float32"
# A timed run is disturbed when other processes used more than this share of one core.
BUSY_PCT = 10.0
# Targets against servesim's own engine (calibration.validate_report.Targets): |error| of
# the saturation throughput within 5 %, of TTFT, TPOT and E2EL p50s within 10 % and p99s
# within 20 % at loads 0.3 and 0.6; at the other loads the MAPE band.
TARGETS = {"saturation": 0.05, "p50": 0.10, "p99": 0.20, "percentile_loads": (0.3, 0.6)}
# Fewest requests a load serves: 15 s of load 0.3 bring 49 on an AMD EPYC host but 13 on a
# host a quarter as fast, whose p99 is then the slowest request's figure and moves by tens
# of % with one step's timing (run BK: TPOT p99 +129% in one replication).
MIN_REQUESTS = 50


class CpuWatch:
    """CPU time used by *other* processes during each timed run of a validation.

    ``servesim validate`` reports progress once before each timed engine run (saturation,
    then every load and replication); :meth:`progress` closes the previous segment and opens
    a new one at each message, each measured by :class:`calibration.vllm.core.LoadMeter`
    (machine busy time from ``/proc/stat`` − this process's CPU time, in % of one core).
    """

    def __init__(self, echo=None):
        self.echo = echo
        self.runs: list[dict] = []
        self._open = None

    def progress(self, msg: str) -> None:
        from calibration.vllm.core import LoadMeter

        if self.echo:
            self.echo(msg)
        if msg.startswith(("saturation:", "load ")):
            self.close()
            rep = re.search(r"replication (\d+)", msg)
            label = (msg.split(":")[0] + (f" r{rep.group(1)}" if rep else "")
                     + (" again" if "served again" in msg else ""))
            self._open = (label, time.monotonic(), LoadMeter().__enter__())
        elif msg.startswith("  waited") and self._open:  # the quiet wait is not the run
            self._open = (self._open[0], time.monotonic(), LoadMeter().__enter__())

    def close(self) -> None:
        if self._open is None:
            return
        label, t0, meter = self._open
        meter.__exit__(None, None, None)
        self.runs.append({"run": label, "seconds": time.monotonic() - t0,
                          "others_pct": meter.pct})
        self._open = None

    def summary(self) -> str:
        """One line: mean and worst others' CPU, and the disturbed runs."""
        if not self.runs:
            return "other processes' CPU during timed runs: not measured"
        v = [r["others_pct"] for r in self.runs]
        bad = [f"{r['run']} ({r['others_pct']:.0f}%)" for r in self.runs
               if r["others_pct"] > BUSY_PCT]
        return (f"other processes' CPU during the timed runs (and the simulations after each, "
                f"% of one core): mean {sum(v) / len(v):.1f}%, max {max(v):.1f}% over "
                f"{len(v)} runs; " + (f"disturbed (> {BUSY_PCT:g}%): {', '.join(bad)}" if bad
                                       else "no run disturbed"))


def fresh_profile(scenario, out_dir: Path, repeats: int,
                  attempts: int = 3) -> tuple[Path, str]:
    """Calibrate ``scenario``'s model on this machine now, with the dtype and torch threads
    its profile was measured with, into an emptied ``out_dir``; again (up to ``attempts``
    times in all) while the host's speed moved during it, as ``calibrate`` advises: its
    grid passes more than :data:`calibration.fit.PASS_SPREAD_WARN` apart, or its replay
    MAPE over :data:`simulator.cost_model.HELDOUT_WARN` (run AO's poisson-chat profile, 10%
    and 11.0%, priced the decode steps of the next minutes ×1.12). The last is kept.

    A shared CPU host's speed drifts by tens of % over half an hour
    (``benchmarks/results/fidelity_runs.md``), so a profile measured earlier misprices every
    step by that drift whatever the cost model; measured minutes before the validation, it
    is priced at the speed the validation runs at.

    Returns:
        The new profile's path and one line for the results (command, time, errors, and
        the attempts that moved).
    """
    import shutil

    import pandas as pd

    from calibration.cli import calibrate
    from calibration.fit import PASS_SPREAD_WARN, pass_spread, pass_speeds
    from calibration.validate import profile_threads
    from simulator.cli import build_parser
    from simulator.cost_model import HELDOUT_WARN, build_cost_model, load_profile

    old = build_cost_model(scenario).profile
    threads = profile_threads(old) or 1
    path = out_dir / f"{old.name}.yaml"
    argv = ["calibrate", "--model", scenario.model_shape.name, "--device", "cpu", "--dtype",
            scenario.dtype, "--threads", str(threads), "--repeats", str(repeats), "--out",
            str(path), "--no-progress"]
    moved = []
    for attempt in range(attempts):
        shutil.rmtree(out_dir, ignore_errors=True)   # a leftover CSV would be resumed
        started = time.strftime("%H:%M")
        calibrate(build_parser().parse_args(argv), argv=argv)
        new = load_profile(path)
        spread = pass_spread(pass_speeds(pd.read_csv(
            out_dir / new.provenance.measurements_csv, comment="#")))
        if spread <= PASS_SPREAD_WARN and new.error.replay.mape <= HELDOUT_WARN:
            break
        moved.append(f"passes {spread:.0%} apart, replay MAPE {new.error.replay.mape:.1%}")
    return path, (f"profile measured at {started}, just before this workload "
                  f"(`servesim {' '.join(argv[:-3])} ...`): held-out MAPE "
                  f"{new.error.heldout.mape:.1%}, replay MAPE {new.error.replay.mape:.1%}"
                  + (f"; calibrated {len(moved) + (len(moved) < attempts)} times, the host "
                     f"having moved during {'; '.join(moved)}" if moved else ""))


def check_calibration_fits(scenario) -> None:
    """Refuse, before anything is measured, a scenario whose model :func:`fresh_profile`
    could not calibrate on this host (:func:`calibration.cli.check_fits`, at calibrate's
    default CPU KV cache).

    Raises:
        InputError: the model's weights and KV cache do not fit this host's memory.
    """
    from calibration.cli import DEFAULT_CPU_KV_BYTES, check_fits
    from simulator.errors import InputError

    try:
        check_fits(scenario.model_shape, "cpu", DEFAULT_CPU_KV_BYTES, scenario.dtype)
    except InputError as e:   # its words name calibrate's flags: say that it is calibrate
        raise scenario.error("model", f"each workload is calibrated first (servesim "
                                      f"calibrate --device cpu), and it cannot be here: "
                                      f"{e}") from None


def host_dtype() -> list[str]:
    """``--set`` flags for the default scenario on this CPU: none where bfloat16 runs
    natively; where it is emulated (:func:`calibration.cli.emulated_dtype`: no AVX512, ~23x
    slower than float32; or AVX512 without AVX512-BF16 or AMX-BF16, ~5x and a step from one
    row to two that no roofline follows), float32 and the shipped float32 profile (its
    dtype and threads: each workload is calibrated anew, :func:`fresh_profile`)."""
    from calibration.cli import emulated_dtype

    lacks = emulated_dtype("cpu", "bfloat16")
    if lacks is None:
        return []
    print(f"bfloat16 is emulated on this CPU (no {lacks}): validating in float32",
          file=sys.stderr)
    return ["dtype=float32", f"hardware.profile={FLOAT32_PROFILE}"]


def main(argv=None) -> int:
    from calibration.validate import validate
    from calibration.validate_report import (Targets, markdown_table, target_verdicts,
                                           write_outputs)
    # the same two workloads for both engines
    from calibration.vllm.fidelity import WORKLOADS, chosen_workloads
    from calibration.cli import MAX_REPEATS, add_load_flags
    from simulator.cost_model import build_cost_model
    from simulator.cli import OneLineParser
    from simulator.files import atomic_write, check_file_writable
    from simulator.scenario import load_scenario

    # a bad flag: one line, exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python benchmarks/fidelity.py", error_name="benchmarks/fidelity.py",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=None,
                    help="default scenarios/cpu_tiny.yaml (bfloat16), in float32 with the "
                         "shipped float32 profile on a CPU that emulates bfloat16")
    add_load_flags(ap, "0.3,0.6,0.9", 3, 15.0)
    ap.add_argument("--min-requests", type=int, default=MIN_REQUESTS,
                    help=f"fewest requests a load serves (default {MIN_REQUESTS}; 1 to "
                         f"100000), however few its seconds bring")
    ap.add_argument("--only", choices=list(WORKLOADS), action="append",
                    help="this workload only (repeatable; default every one)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fidelity.md"),
                    help="the markdown file written (default benchmarks/results/fidelity.md)")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="validate the scenario's own profile instead of one measured just "
                         "before each workload (fresh_profile)")
    ap.add_argument("--calibrate-repeats", type=int, default=8,
                    help="timed repeats of each grid cell in each calibration (default 8; 1 "
                         "to 100)")
    ap.add_argument("--calibrate-attempts", type=int, default=3,
                    help="calibrate again while the host's speed moved during it (grid "
                         "passes over 10%% apart or replay MAPE over 10%%), up to this many "
                         "times in all (default 3); the last is kept")
    ap.add_argument("--no-serve-again", action="store_true",
                    help="do not serve each replication's requests a second time (the "
                         "engine's difference from itself, this machine's noise floor)")
    args = ap.parse_args(argv)
    from calibration.validate import (check_loads, check_run_flags, check_validation_args,
                                      parse_loads, servable_cost_model)
    from simulator.errors import InputError

    try:   # the workloads and loads as servesim validate takes them, before any is measured
        names = chosen_workloads(args.only)
        loads = parse_loads(args.loads)
        check_loads(loads)
        check_run_flags(args.replications, args.seconds, min_requests=args.min_requests)
    except InputError as e:
        ap.error(str(e))
    if not 1 <= args.calibrate_repeats <= MAX_REPEATS:   # calibrate's --repeats
        ap.error(f"--calibrate-repeats: 1 to {MAX_REPEATS}, got {args.calibrate_repeats}")
    if args.calibrate_attempts < 1:
        ap.error(f"--calibrate-attempts: a whole number >= 1, got {args.calibrate_attempts}")
    try:   # written at the end: refused now, not after the runs
        check_file_writable(args.out, "--out")
    except InputError as e:
        ap.error(str(e))
    parts = ["# servesim fidelity against its own engine (predicted mode)", ""]
    results = {}
    scenario, base = args.scenario, []
    if scenario is None:
        scenario, base = str(ROOT / "scenarios" / "cpu_tiny.yaml"), host_dtype()
    for name in names:   # every workload's flags and model, before measuring
        sc = load_scenario(scenario, base + WORKLOADS[name])
        check_validation_args(sc, loads, args.replications, args.seconds,
                              min_requests=args.min_requests)
        if args.no_calibrate:   # validated as it is: a profile measured here
            servable_cost_model(sc)
        else:   # calibrated first with its profile's threads: the model must fit this host
            build_cost_model(sc)
            check_calibration_fits(sc)
    for name in names:
        sets = base + WORKLOADS[name]
        sc = load_scenario(scenario, sets)
        print(f"== {name}", file=sys.stderr)
        cal_note = "profile: the scenario's own (--no-calibrate)"
        if not args.no_calibrate:
            path, cal_note = fresh_profile(sc, ROOT / "reports" / "fidelity" / name /
                                           "profile", args.calibrate_repeats,
                                           args.calibrate_attempts)
            sc = load_scenario(scenario, [x for x in sets if not x.startswith(
                "hardware.profile=")] + [f"hardware.profile={path}"])
        watch = CpuWatch(lambda m: print(m, file=sys.stderr, flush=True))
        res = validate(sc, loads, args.replications, seconds_per_load=args.seconds,
                       min_requests=args.min_requests, again=not args.no_serve_again,
                       progress=watch.progress)
        watch.close()
        print(watch.summary(), file=sys.stderr)
        write_outputs(res, ROOT / "reports" / "fidelity" / name)
        results[name] = res
        meta = res["meta"]
        parts += [f"## {name}", "",
                  f"scenario {meta['source']} {' '.join(sets)}; model "
                  f"{meta['model']} ({meta['dtype']}); {meta['cpu']}, torch threads "
                  f"{meta['threads']}, torch {meta['torch']}, Python {meta['python']}, engine "
                  f"{meta['engine']}; cost model {meta['cost_model']} (held-out MAPE "
                  f"{meta['heldout_mape']:.3f}); seed {meta['seed']}, {meta['replications']} "
                  f"replications (seeds SeedSequence([seed, load‰, r])), "
                  f"{meta['seconds_per_load']:g} s of arrivals per load, at least "
                  f"{meta['min_requests']} requests; {meta['date']}.",
                  cal_note + ".",
                  f"engine knobs: {json.dumps(meta['engine_knobs'])}; {meta['scheduling']}.",
                  f"host speed probe: {meta['host_speed_probe'] or 'none'}.",
                  f"front end (between steps, not in the prediction): mean "
                  f"{res['front_end']['gap_us_mean']:.0f} us, p99 "
                  f"{res['front_end']['gap_us_p99']:.0f} us per step.",
                  watch.summary() + ".", "",
                  *[f"- {v}" for v in target_verdicts(res, Targets(**TARGETS))], "",
                  markdown_table(res), ""]
    parts += ["error = (predicted − measured) / measured; cells are mean [min, max] over "
              "replications; 'in MAPE band': the measured figure lies between simulations "
              "with every step cost scaled by (1 − MAPE) and (1 + MAPE); 'around it': the "
              "same times the host speed factor below. 'At host speed': "
              "the same prediction with every step cost scaled by the host's speed during "
              "that run relative to the calibration (four grid cells of the profile, three "
              "decode batches and a prefill, re-measured before and after the run; "
              "geometric mean; "
              "calibration.validate.SpeedProbe): what is left is the cost model's own error.",
              ""]
    print(atomic_write(args.out, "\n".join(parts)))
    return 0


if __name__ == "__main__":
    from simulator.cli import run_script
    run_script(main, "benchmarks/fidelity.py", Path(__file__).name)
