"""`servesim` command line.

Every user-input error ends as one line ``servesim: error: ...`` on stderr with exit status
2 and no traceback (argparse does the same for bad flags).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib.metadata
import json
import os
import re
import sys
import typing

from .errors import InputError, one_line
from .files import check_folder, out_folder


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set engine.max_num_seqs=128 "
                        "(repeatable; values are YAML)")


def add_replications_arg(p: argparse.ArgumentParser) -> None:
    """``--replications N`` (run, sweep, compare): see :func:`with_replications`."""
    from .scenario import MAX_REPLICATIONS

    p.add_argument("--replications", type=int,
                   help=f"override sim.replications (1 to {MAX_REPLICATIONS})")


def with_replications(scenario, n: int | None):
    """``scenario`` with ``sim.replications`` set to ``n`` (unchanged when ``n`` is None).

    Raises:
        InputError: ``n`` outside 1 .. ``MAX_REPLICATIONS``, naming ``--replications``.
    """
    from .scenario import MAX_REPLICATIONS

    if n is None:
        return scenario
    if not 1 <= n <= MAX_REPLICATIONS:
        raise InputError(f"--replications: 1 to {MAX_REPLICATIONS}, got {n}")
    return scenario.model_copy(update={"sim": scenario.sim.model_copy(
        update={"replications": n})})


def _cmd_run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from .cost_model import build_cost_model, extrapolation_warning, profile_warning
    from .report import print_summary, write_run_outputs
    from .run import (check_workload_span, client_warning, max_model_len_text,
                      memory_warning, report_meta,
                      simulate_replications, start_burst_warning, tail_warning,
                      trace_shortfall, unstable_warning)
    from .scenario import load_scenario
    from .sweep import with_sweep_hint
    from .session_ramp import ramp_warning
    from .terminal import Terminal
    from .workload import workload_warnings

    try:
        scenario = load_scenario(args.scenario, args.overrides)
    except InputError as e:
        raise with_sweep_hint(e, args.overrides, "run") from None
    scenario = with_replications(scenario, args.replications)
    if args.exact_steps:
        scenario = scenario.model_copy(update={"sim": scenario.sim.model_copy(
            update={"exact_steps": True})})
    out = out_folder(args.out, scenario.default_folder)   # its name, only without --out
    check_folder(out, "--out", "run")   # fail before simulating, not after
    cost = build_cost_model(scenario)
    check_workload_span(scenario)   # one error, not after a memory warning and minutes
    heavy = memory_warning(scenario)
    if heavy:   # before the run: it may not get to the end
        print(f"servesim: warning: {heavy}", file=sys.stderr)
    console = Terminal(stderr=True)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True,
                  disable=args.quiet or not console.is_terminal) as bar:
        task = bar.add_task(f"simulating {scenario.name}", total=None)
        results, combined = simulate_replications(
            scenario, progress=lambda done, total: bar.update(task, completed=done,
                                                              total=total))
    from .diagnosis import diagnose
    diagnosis = diagnose(scenario, results[0])
    # the report says them too: a shared report is read without the terminal
    prefix = "servesim: warning: "
    ramp = ramp_warning(results[0].summary)   # says the count itself: the tail's would repeat it
    warnings = [w.removeprefix(prefix) for w in [
        profile_warning(cost), cost.setup_warning,
        extrapolation_warning(cost, scenario, results[0]),
        ramp, client_warning(results[0].summary),
        None if ramp else unstable_warning(results[0], diagnosis),
        start_burst_warning(scenario, results[0]),
        *workload_warnings(scenario.workload, scenario.base_dir),
        None if ramp else tail_warning(scenario, results[0].summary)] if w]
    paths = write_run_outputs(out, results[0], title=scenario.name,
                              meta=report_meta(scenario, results[0].summary),
                              replications=combined, diagnosis=diagnosis, warnings=warnings)
    used = max_model_len_text(scenario, results[0].summary)
    print_summary(results[0], replications=combined, max_model_len=used,
                  diagnosis=diagnosis)
    if used != str(scenario.max_model_len) and not results[0].summary.get("rejected"):
        # said beside the rejections when there are some
        print(f"servesim: note: max_model_len {used}", file=sys.stderr)
    short = trace_shortfall(scenario, results[0].summary)
    if short:
        print(f"servesim: note: {short}", file=sys.stderr)
    if scenario.plan is not None:   # as compare says it: its candidates were never tried
        print(f"servesim: note: the plan: section of {scenario.source} is not used: run "
              f"serves the settings as written (servesim plan searches its candidates)",
              file=sys.stderr)
    for w in warnings:   # after the runs, so that an error in them stays the one line
        print(prefix + w, file=sys.stderr)
    print(f"report: {paths['report.html']}")
    return 0


def _cmd_schema(args) -> int:
    from .scenario import scenario_json_schema

    print(json.dumps(scenario_json_schema(), indent=2))
    return 0


def _attach_dash_values(argv: list[str]) -> list[str]:
    """``--loads -0.3,0.6`` → ``--loads=-0.3,0.6``: argparse reads a value that starts
    with ``-`` and is not one plain negative number as an unknown option ("expected one
    argument"); attached, it reaches the option's own check, whose message names what is
    allowed."""
    out: list[str] = []
    for a in argv:
        prev = out[-1] if out else ""
        if (prev.startswith("--") and "=" not in prev and len(a) > 1 and a[0] == "-"
                and (a[1].isdigit() or a[1] == ".")):
            out[-1] = f"{prev}={a}"
        else:
            out.append(a)
    return out


_NOT_A_NUMBER = re.compile(r"^argument (\S+): invalid (int|float) value: (.*)$")


def run_script(main, error_name: str, interrupted_name: str | None = None) -> None:
    """Exit with ``main()``'s status, saying an input error or Ctrl-C in one line as
    servesim's commands do: ``<error_name>: error: ...`` (exit 2) and
    ``<interrupted_name>: interrupted`` (exit 130; default ``error_name``). For the
    scripts of ``benchmarks/`` and ``calibration/``, beside :class:`OneLineParser`."""
    try:
        status = main()
    except InputError as e:   # a bad scenario or profile
        print(f"{error_name}: error: {one_line(str(e))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{interrupted_name or error_name}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(status)


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error, ``servesim: error: ...`` as every other input error
    (exit 2), naming the command's ``--help`` instead of printing the usage block; no
    abbreviated flags (``--ou`` for ``--out`` would slip past the given-twice check).

    ``error_name``: the name the error line starts with (default: the first word of
    ``prog``, ``servesim`` for ``servesim run``); the scripts of ``benchmarks/`` and
    ``calibration/`` give their own."""

    def __init__(self, *args, error_name: str | None = None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_name = error_name or self.prog.split()[0]

    def error(self, message):
        hint = f" (see {self.prog} --help)" if " " in self.prog else ""
        self.exit(2, f"{self.error_name}: error: "
                     f"{one_line(self._with_allowed(message))}{hint}\n")

    def _print_message(self, message, file=None):
        # argparse drops an OSError here, so --help into a full disk would exit 0 silently
        if message:
            (file or sys.stderr).write(message)

    def _with_allowed(self, message: str) -> str:
        """argparse's ``invalid int value: '1e9'`` says what the flag is not; say what it
        takes, from the flag's own help (which states its range). Any other ``argument
        --flag: ...`` starts with the flag, as servesim's own flag errors do."""
        m = _NOT_A_NUMBER.match(message)
        if not m:
            return message.removeprefix("argument ")
        flag, kind, value = m.groups()
        action = next((a for a in self._actions if flag in a.option_strings), None)
        allowed = self._get_formatter()._expand_help(action) if action and action.help else ""
        what = "a whole number in digits" if kind == "int" else "a number"
        return f"{flag}: {value} is not {what}" + (f" — its help: {allowed}" if allowed else "")

    def _get_value(self, action, arg_string):
        # Python's int() and float() read ６４ and 4_0; YAML, and so every scenario value,
        # reads only the digits 0-9: a flag takes a number as a file does
        import unicodedata

        from .scenario import PLAIN_NUMBER
        plain = unicodedata.normalize("NFKC", arg_string).replace("_", "")
        if action.type not in (None, str) and plain != arg_string \
                and PLAIN_NUMBER.fullmatch(plain):
            self.error(f"{'/'.join(action.option_strings)}: {arg_string!r} is not a number "
                       f"in the digits 0-9 (write {plain.strip()})")
        return super()._get_value(action, arg_string)

    def parse_args(self, args=None, namespace=None):
        # argparse reports flags no command knows from the top parser, which cannot name
        # the command's --help; the command's own parser can.
        ns, extra = self.parse_known_args(args, namespace)
        cmd = getattr(self, "commands", {}).get(getattr(ns, "command", None), self)
        argv = sys.argv[1:] if args is None else list(args)
        if extra:
            # --set engine.max_num_seqs 64: the value went astray, say how --set takes it
            i = next((i for i in range(len(argv) - 2) if argv[i] == "--set"
                      and "=" not in argv[i + 1] and argv[i + 2] == extra[0]), None)
            if i is not None:
                cmd.error(f"--set {argv[i + 1]} {extra[0]}: --set takes KEY=VALUE "
                          f"(--set {argv[i + 1]}={extra[0]})")
            # --max-num-seqs 64, as vLLM takes it: scenario keys here, set with --set
            sets = _scenario_sets(extra) if "--set" in cmd._option_string_actions else []
            if sets:
                keys = [k for k, _ in sets]
                named = " and ".join(filter(None, [", ".join(keys[:-1]), keys[-1]]))
                cmd.error(f"unrecognized arguments: {' '.join(extra)}; the scenario key"
                          f"{'s' if len(keys) > 1 else ''} {named} "
                          f"{'are' if len(keys) > 1 else 'is'} set with "
                          + " ".join(f"--set {k}={v}" for k, v in sets))
            cmd.error(f"unrecognized arguments: {' '.join(extra)}")
        # A value option given twice would silently keep the last one (--out A --out B).
        for action in cmd._actions:
            if isinstance(action, argparse._StoreAction):
                for opt in action.option_strings:
                    n = sum(a == opt or a.startswith(opt + "=") for a in argv)
                    if n > 1:
                        cmd.error(f"{opt} is given {n} times; give it once")
        return ns


#: vLLM's flags (``vllm serve``, ``vllm bench serve``) whose scenario key has another name,
#: with the value a flag without one stands for.
VLLM_FLAG_KEYS = {
    "tensor_parallel_size": ("hardware.tensor_parallel", None),
    "tp": ("hardware.tensor_parallel", None),
    "num_gpu_blocks_override": ("engine.num_gpu_blocks", None),
    "no_enable_prefix_caching": ("engine.enable_prefix_caching", "false"),
    "no_enable_chunked_prefill": ("engine.enable_chunked_prefill", "false"),
    "request_rate": ("workload.arrival.rate", None),
    "num_prompts": ("workload.num_requests", None),
}


def _scenario_key(flag: str) -> tuple[str, str | None] | None:
    """``("engine.max_num_seqs", None)`` for the flag ``--max-num-seqs`` (or
    ``--max_num_seqs=64``): the one scenario key of that name in a section of
    :class:`~.scenario.Scenario`, or the key of a vLLM flag of another name
    (:data:`VLLM_FLAG_KEYS`: ``-tp``, ``--no-enable-prefix-caching``), with the value the
    flag stands for when given without one (``"true"`` for a boolean key); None when there
    is no such key or one in several sections."""
    from .scenario import Scenario

    name = flag.lstrip("-").partition("=")[0].replace("-", "_")
    if not flag.startswith("--") and name != "tp":   # vLLM's one short flag
        return None
    if name in VLLM_FLAG_KEYS:
        return VLLM_FLAG_KEYS[name]
    keys = [(f"{section}.{name}", t.model_fields[name].annotation)
            for section, info in Scenario.model_fields.items()
            for t in (info.annotation, *typing.get_args(info.annotation))   # Optional[...]
            if name in getattr(t, "model_fields", {})]
    if len(keys) != 1:
        return None
    return keys[0][0], "true" if keys[0][1] is bool else None


def _scenario_sets(extra: list[str]) -> list[tuple[str, str]]:
    """``[(key, value)]`` for the unknown flags in ``extra`` that name scenario keys
    (:func:`_scenario_key`), the value from ``--flag=V`` or the word after the flag, else
    the flag's own (``true`` for a boolean), else ``VALUE``."""
    sets = []
    for i, arg in enumerate(extra):
        found = _scenario_key(arg) if arg.startswith("-") else None
        if found is None:
            continue
        value = arg.partition("=")[2]
        after = extra[i + 1] if i + 1 < len(extra) else "-"
        if not value and (not after.startswith("-") or after[1:2].isdigit()):   # -1: a value
            value = after
        sets.append((found[0], value or found[1] or "VALUE"))
    return sets


def build_parser() -> argparse.ArgumentParser:
    """The ``servesim`` argument parser: run and schema, sweep, plan and compare
    (:mod:`.planner_cli`), calibrate, profiles and validate (:mod:`calibration.cli`). Its
    usage errors exit 2."""
    ap = OneLineParser(
        prog="servesim",
        description="Capacity planning for LLM inference: simulate a vLLM-style serving "
                    "engine on a workload and report TTFT, TPOT, ITL, E2EL, throughput.")
    ap.add_argument("--version", action="version",
                    version=f"servesim {importlib.metadata.version('servesim')}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ap.commands = sub.choices
    p = sub.add_parser("run", help="simulate a scenario and write a report")
    _add_scenario_args(p)
    p.add_argument("--out", help="output folder (default reports/<scenario name>)")
    add_replications_arg(p)
    p.add_argument("--exact-steps", action="store_true",
                   help="one simulation event per engine step (the reference for the "
                        "fast-forward, which gives identical results)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("schema", help="print the scenario JSON Schema")
    p.set_defaults(func=_cmd_schema)
    from calibration import cli as calibration_cli

    from . import planner_cli

    planner_cli.add_parsers(sub)
    # calibrate / profiles / validate: calibration.cli imports torch only when one runs,
    # so a planner-only install (no torch) keeps every other command.
    calibration_cli.add_parsers(sub)
    return ap


def _check_utf8(argv: list[str]) -> None:
    """Refuse an argument that is not UTF-8 (a file name with a Latin-1 byte reaches Python
    as a lone surrogate): reports name their inputs in UTF-8 files, which could not be
    written after the whole run.

    Raises:
        InputError: ``[<flag>] <argument>: not UTF-8 (byte 0x.. at character N); ...``
            (the flag before a value given apart from it).
    """
    for i, a in enumerate(argv):
        try:
            a.encode("utf-8")
        except UnicodeEncodeError as e:
            shown = os.fsencode(a).decode("utf-8", "backslashreplace")
            prev = argv[i - 1] if i else ""
            if prev.startswith("--") and "=" not in prev:   # the flag this value is for
                shown = f"{prev} {shown}"
            byte = ord(a[e.start]) - 0xDC00   # the surrogate escape of that byte
            raise InputError(f"{shown}: not UTF-8 (byte 0x{byte:02x} at character "
                             f"{e.start + 1}); give file names and values in UTF-8 (the "
                             f"reports name them in UTF-8 files)") from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a batch system), raised where Ctrl-C's
    KeyboardInterrupt would be, so that both stop the worker processes and leave no output
    the same way; the command then exits 143 (128 + SIGTERM) instead of 130."""


def _on_main_thread(f):
    """Run ``f`` on the main thread only (the only one that may set a signal handler)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        f()


#: The first SIGINT or SIGTERM of a console run. Its exception can be lost (raised inside
#: a callback whose exceptions Python ignores, such as a weakref's) or turned into another
#: error (an ImportError, or the RuntimeError of a class body's __set_name__), and the
#: command must still not commit its outputs, and exit as the signal asks.
_signalled: int | None = None
_SIGINT, _SIGTERM = 2, 15
#: What a command stopped by each signal prints, and its exit status (128 + the signal).
_STOPPED = {_SIGINT: ("servesim: interrupted", 130), _SIGTERM: ("servesim: terminated", 143)}


def _raise_signal(signum, frame):
    """The console run's handler of SIGINT and SIGTERM: note the first, then raise
    KeyboardInterrupt (Ctrl-C, as Python's own handler does) or :class:`Terminated`."""
    global _signalled
    _signalled = _signalled or signum
    raise Terminated if signum == _SIGTERM else KeyboardInterrupt


def _raise_if_signalled() -> None:
    """Raise the exception of the signal noted in :data:`_signalled`, if any."""
    if _signalled is not None:
        _raise_signal(_signalled, None)


def _commit_outputs_hook() -> None:
    """:data:`simulator.files.on_commit` of the console script: stop before the outputs go
    in place if a signal came (even one whose exception was swallowed), else ignore Ctrl-C
    and SIGTERM from here on (:func:`_ignore_interrupts`)."""
    _raise_if_signalled()
    _ignore_interrupts()


def _stop_on_signals(noted: list[int] | None) -> None:
    """Raise KeyboardInterrupt on SIGINT and :class:`Terminated` on SIGTERM, each unless it
    was ignored when servesim started (a background job's SIGINT, ``nohup``'s SIGTERM:
    the parent means them to be), noting the first (:data:`_signalled`); then raise for a
    signal in ``noted`` (those :mod:`simulator.console` noted while this module loaded).
    One swallowed where it was raised (a weakref callback) is not printed as "Exception
    ignored in ...": the note stops the command."""
    import signal

    def install():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, _raise_signal)
    _on_main_thread(install)
    default = sys.unraisablehook
    sys.unraisablehook = lambda u: (None if isinstance(u.exc_value, KeyboardInterrupt)
                                    else default(u))
    if noted:
        _raise_signal(noted[0], None)


def _ignore_interrupts() -> None:
    """Ignore Ctrl-C and SIGTERM from now on."""
    import signal

    _on_main_thread(lambda: (signal.signal(signal.SIGINT, signal.SIG_IGN),
                             signal.signal(signal.SIGTERM, signal.SIG_IGN)))


def main(argv=None, *, noted: list[int] | None = None) -> int:
    """Entry point of the ``servesim`` console script (:mod:`simulator.console`); returns
    the exit status.

    Run as the console script (``argv`` None), Ctrl-C stops a command with one line and
    exit status 130, SIGTERM likewise with 143 (:class:`Terminated`), and both are ignored
    once a command starts renaming its outputs into place and after it returns
    (interpreter shutdown): an interrupt then lets it finish, exit 0, rather than exiting
    130 over a whole report. ``noted``: signals that came before this module was loaded.

    Returns 2 after printing an :class:`InputError` as one line on stderr, 1 when stdout
    or stderr cannot be written, 0 when the reader of stdout goes away.

    Raises:
        SystemExit: a usage error, said on stderr by argparse (exit status 2).
        OSError: one that names a file (``filename`` set), which the commands do not
            turn into an :class:`InputError`.
        Exception: any other error of a command (a defect), with its traceback.
    """
    global _signalled
    from . import files

    console = argv is None
    if console:
        _hold_closed_descriptors()
    try:
        if sys.stdout is None:   # started with stdout closed (>&-): nothing could be said
            raise OSError(errno.EBADF, "standard output is closed")
        if _read_only(sys.stdout):   # 1</dev/null: found only once the report was written
            raise OSError(errno.EBADF, "standard output is open for reading only")
        if console:
            _signalled = None
            _stop_on_signals(noted)
        # Building the parser imports every command's modules (seconds): inside the try,
        # so that Ctrl-C or SIGTERM then is one line too.
        ap = build_parser()
        argv = sys.argv[1:] if argv is None else list(argv)
        _check_utf8(argv)
        try:
            args = ap.parse_args(_attach_dash_values(argv))
        except SystemExit as e:
            if e.code not in (0, None):   # a usage error, said on stderr by argparse
                raise
            sys.stdout.flush()   # --help: a full disk is said here, as for any output
            return 0
        if console:
            files.on_commit = _commit_outputs_hook
        status = args.func(args)
        if console:
            _raise_if_signalled()   # swallowed where it was raised: stop, as it was meant
            _ignore_interrupts()
        sys.stdout.flush()   # a full disk or a closed reader is said here, not at exit
        return status
    except InputError as e:
        print(f"servesim: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        said, status = _STOPPED[_SIGTERM if isinstance(e, Terminated) else _SIGINT]
        print(said, file=sys.stderr)
        return status
    except BrokenPipeError:  # e.g. `servesim schema | head`
        _stdout_to_devnull()
        return 0
    except Exception as e:
        if console and _signalled is not None:   # turned into another error by an import
            said, status = _STOPPED[_signalled]
            print(said, file=sys.stderr)
            return status
        if isinstance(e, OSError) and e.filename is None:   # writing to stdout or stderr
            _stdout_to_devnull()
            print(f"servesim: error: cannot write the output: {e.strerror or e}",
                  file=sys.stderr)
            return 1
        raise


def _hold_closed_descriptors() -> None:
    """Hold standard descriptors closed at start (``2>&-``) on /dev/null: the next file
    opened would take the number, and worker processes would inherit it as theirs. A
    closed stderr then keeps silent (``print(file=None)`` wrote its errors and warnings
    into stdout, among the command's output); a closed stdout is still refused."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)   # the lowest free number: fd
    if sys.stderr is None or _read_only(sys.stderr):   # 2</dev/null: every print would fail
        sys.stderr = open(os.devnull, "w")
    sys.stderr = _Lossy(sys.stderr)


class _Lossy:
    """stderr that drops what it cannot write (``2>/dev/full``) rather than raise, so
    that a warning that cannot be written does not fail a run whose report is written,
    and an input error still exits 2."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name):   # fileno, isatty, encoding, ... as the stream's
        return getattr(self._stream, name)


def _read_only(stream) -> bool:
    """Whether ``stream``'s file descriptor is open for reading only (``1</dev/null``);
    False for one without a descriptor (a test's captured stream)."""
    try:
        return fcntl.fcntl(stream.fileno(), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation: a ValueError
        return False


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit finds no reader
    gone (it would print "Exception ignored ... BrokenPipeError")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # no file descriptor (a test's captured
        pass                                         # stdout), or no stdout at all


if __name__ == "__main__":
    sys.exit(main())
