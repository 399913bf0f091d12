"""Executors return identical results whatever runs the jobs."""

import pytest

from simulator.executors import STABLE_FRACTION, make_executor
from simulator.planner import sweep
from simulator.scenario import scenario_from_dict


def base(n=300):
    return scenario_from_dict({
        "name": "e", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_num_seqs": 4, "max_model_len": 512},
        "workload": {"seed": 3, "num_requests": n,
                     "arrival": {"process": "poisson", "rate": 10},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 4}},
        "sim": {"replications": 2}})


AXES = {"workload.arrival.rate": [20, 60], "engine.max_num_seqs": [2, 4]}


def test_serial_and_local_pool_agree(capsys):
    with make_executor("serial") as ex:
        a = sweep(base(), AXES, ex)
    with make_executor("local", workers=2) as ex:
        b = sweep(base(), AXES, ex)
    # the pool ran the jobs (it runs them here, with a warning, when workers fail)
    assert "worker processes failed" not in capsys.readouterr().err
    assert a.summaries == b.summaries
    assert a.table.equals(b.table)
    # Replications differ from each other (derived seeds), points reuse them (CRN).
    assert a.summaries[0][0] != a.summaries[0][1]


def test_a_pool_that_cannot_start_workers_runs_the_jobs_here(monkeypatch, capsys):
    """A sandbox that refuses the forkserver's socket breaks the pool with BrokenPipeError:
    the jobs then run in-process rather than end the command silently with status 0."""
    from concurrent.futures import ProcessPoolExecutor

    def refuse(self, *a, **k):
        raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(ProcessPoolExecutor, "submit", refuse)
    with make_executor("serial") as ex:
        a = sweep(base(), AXES, ex)
    with make_executor("local", workers=2) as ex:
        b = sweep(base(), AXES, ex)
    assert a.summaries == b.summaries
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == ["servesim: warning: worker processes failed (BrokenPipeError: [Errno "
                       "32] Broken pipe); running the jobs in this process (--workers 1)"]


def test_stability_flag():
    # 2 slots × 4 tokens × 10 ms → 50 req/s; 60 req/s offered is unstable.
    with make_executor("serial") as ex:
        res = sweep(base(), {"workload.arrival.rate": [20, 60],
                             "engine.max_num_seqs": [2]}, ex)
    assert list(res.table["stable"]) == [True, False]
    row = res.table.iloc[1]
    assert row["request_throughput"] < STABLE_FRACTION * row["offered_rate"]


def test_ray_matches_local():
    ray = pytest.importorskip("ray")
    with make_executor("serial") as ex:
        a = sweep(base(), AXES, ex)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with make_executor("ray") as ex:
            b = sweep(base(), AXES, ex)
    finally:
        ray.shutdown()
    assert a.summaries == b.summaries


def test_unknown_executor():
    from simulator.errors import InputError
    with pytest.raises(InputError, match="allowed"):
        make_executor("dask")


def test_plan_is_identical_on_serial_and_local():
    from simulator.planner import plan, plan_table

    sc = scenario_from_dict({
        "name": "p", "model": "llama-test",
        "hardware": {"step_time": {"constant_s": 0.01}, "price_per_gpu_hour": 1.0},
        "engine": {"max_num_seqs": 2, "max_model_len": 512},
        "workload": {"seed": 1, "num_requests": 200,
                     "arrival": {"process": "poisson", "rate": 10},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": {"dist": "fixed", "value": 4}},
        "slo": {"ttft_ms": {"p99": 100}},
        "plan": {"target_rate": 60, "candidates": {"engine.max_num_seqs": [2, 4]},
                 "max_replications": 3}})
    with make_executor("serial") as ex:
        a = plan_table(plan(sc, ex))
    with make_executor("local", workers=2) as ex:
        b = plan_table(plan(sc, ex))
    assert a.equals(b)


def test_ray_address_nobody_listens_at_is_one_error():
    """A closed port is refused at once (ray.init alone retries for minutes)."""
    import socket

    from simulator.errors import InputError
    pytest.importorskip("ray")
    with socket.socket() as s:          # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InputError, match=rf"^--ray-address 127.0.0.1:{port}: no Ray cluster "
                                         r"answers there \(ConnectionRefusedError"):
        make_executor("ray", address=f"127.0.0.1:{port}")


@pytest.mark.parametrize("address", ["", "127.0.0.1:99999", ":6379", "ray://", "host:abc",
                                     "http://h:1", "auto ", "host:\u0966\u0967"])
def test_a_malformed_ray_address_is_one_error(address):
    from simulator.errors import InputError
    from simulator.executors import _check_reachable
    with pytest.raises(InputError, match=r"^--ray-address '.*': expected host:port \(port 1 "
                                         r"to 65535\), ray://host:port, auto or local$"):
        _check_reachable(address)


@pytest.mark.parametrize("reply, ok", [
    # a gRPC server answers the HTTP/2 preface with a SETTINGS frame (type 4; RFC 9113 §6.5)
    (bytes([0, 0, 0x18, 4, 0, 0, 0, 0, 0]), True),
    (b"HTTP/1.0 400 Bad request\r\n\r\n<!DOCTYPE html>", False),   # a web server
    (b"", False),                                                   # one that hangs up
    (None, False),                                                  # one that never answers
])
def test_a_ray_address_must_answer_as_grpc(reply, ok):
    """Something listening that is not Ray is refused at once (ray.init alone retries for
    minutes, ~20 lines of its C++ client's retries); a gRPC answer goes on to ray.init."""
    import socket
    import threading

    from simulator.errors import InputError
    from simulator.executors import _check_reachable

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve():
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if reply is None:
                conn.recv(64)   # blocks until the client gives up
            elif reply:
                conn.sendall(reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        if ok:
            _check_reachable(f"127.0.0.1:{port}", timeout_s=2)
        else:
            with pytest.raises(InputError, match=rf"^--ray-address 127.0.0.1:{port}: something "
                                                 r"listens there but it is not Ray"):
                _check_reachable(f"127.0.0.1:{port}", timeout_s=0.5)
    finally:
        t.join(5)
        server.close()


def test_ray_core_warnings_are_read_from_its_stderr(capfd):
    """What Ray's C++ client printed while joining is read back for the error line."""
    import os

    from simulator.executors import _RAY_WARNING, _stderr_to
    import tempfile
    line = ("[2026-12-02 09:52:38,698 W 10085 10085] gcs_client.cc:210: Failed to get cluster "
            "ID from GCS server: Unauthenticated: RPC error: InvalidAuthToken\n")
    with tempfile.TemporaryFile("w+") as log:
        with _stderr_to(log):
            os.write(2, line.encode())
        os.write(2, b"after\n")
        log.seek(0)
        assert [m.group(1) for m in _RAY_WARNING.finditer(log.read())] == [
            "Failed to get cluster ID from GCS server: Unauthenticated: RPC error: "
            "InvalidAuthToken"]
    assert capfd.readouterr().err == "after\n"


def _sigint_default() -> None:
    """For a child's ``preexec_fn``: Ctrl-C's default action, as a terminal gives it, even
    where the tests run with SIGINT ignored (a background job of a non-interactive shell:
    Python then installs no KeyboardInterrupt handler)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _group(pgid: int) -> list[str]:
    """Command lines of the live processes in process group ``pgid`` (Linux /proc)."""
    import pathlib

    out = []
    for d in pathlib.Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            # fields after the ")" closing the command name: state, ppid, pgrp, ...
            state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError):
            continue
    return out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="needs /proc")
@pytest.mark.parametrize("after_s, how", [
    (0.3, "ctrl-c"), (5.0, "ctrl-c"),   # in the server's imports; in jobs
    (5.0, "sigterm"),   # kill, timeout: servesim alone; its workers stop with it
    (5.0, "sigkill"),   # no handler runs: the workers still stop once their parent is gone
])
def test_ctrl_c_stops_a_sweep_with_one_line_and_no_worker_left(tmp_path, after_s, how):
    # Ctrl-C in a terminal signals the whole process group: the fork server (importing
    # its preloaded modules, the first seconds) and the workers (running jobs) included.
    import os
    import signal
    import subprocess
    import sys
    import time

    y = tmp_path / "s.yaml"
    y.write_text("""name: s
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 200000
  arrival: {process: poisson, rate: 50}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 4}
""")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "sweep", str(y), "--set",
         "workload.arrival.rate=50,60,70,80", "--workers", "2", "--quiet",
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_sigint_default)
    deadline = time.monotonic() + 60
    while not any("forkserver" in c for c in _group(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, "no fork server started"
        time.sleep(0.02)
    time.sleep(after_s)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        (proc.terminate if how == "sigterm" else proc.kill)()
    out, err = proc.communicate(timeout=30)
    if how == "sigkill":   # no handler runs; Python's resource tracker may warn as it
        assert proc.returncode == -signal.SIGKILL and "Traceback" not in err   # frees locks
    else:
        assert (proc.returncode, err) == ((130, "servesim: interrupted\n") if how == "ctrl-c"
                                          else (143, "servesim: terminated\n"))
    assert not (tmp_path / "out").exists()
    deadline = time.monotonic() + 15
    while _group(proc.pid):   # the fork server leaves once its last worker is gone
        assert time.monotonic() < deadline, _group(proc.pid)
        time.sleep(0.1)


@pytest.mark.parametrize("sig, status, said", [
    ("SIGINT", 130, "servesim: interrupted\n"),
    ("SIGTERM", 143, "servesim: terminated\n"),   # one line, not a silent -15
])
def test_a_signal_while_servesim_imports_its_commands_is_one_line(sig, status, said):
    # Building the parser imports every command's modules (a second or more): a signal
    # arriving then, here sent by the process to itself as build_parser starts, is one line.
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os, signal, sys; from simulator import cli; "
         "build = cli.build_parser; "
         f"cli.build_parser = lambda: (os.kill(os.getpid(), signal.{sig}), build())[1]; "
         "sys.argv = ['servesim', 'schema']; sys.exit(cli.main())"],
        capture_output=True, text=True, timeout=120, preexec_fn=_sigint_default)
    assert (proc.returncode, proc.stderr, proc.stdout) == (status, said, "")


def test_a_sigterm_swallowed_or_turned_into_another_error_is_still_one_line():
    # raised inside a weakref callback (where Python prints "Exception ignored in ...") or
    # inside matplotlib's import (where it becomes an ImportError), the signal still ends
    # the command with one line
    import subprocess
    import sys

    swallowed = subprocess.run(
        [sys.executable, "-c", "import weakref; from simulator import cli; "
         "cli._stop_on_signals(None); A = type('A', (), {}); a = A(); "
         "r = weakref.ref(a, lambda r: cli._raise_signal(15, None)); del a; "
         "print('went on')"], capture_output=True, text=True, timeout=120)
    assert (swallowed.returncode, swallowed.stdout, swallowed.stderr) == (0, "went on\n", "")
    in_import = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom simulator import cli\n"
         "def build():\n    cli._signalled = 15\n"
         "    raise ImportError('initialization failed')\n"
         "cli.build_parser = build\nsys.argv = ['servesim', 'schema']\nsys.exit(cli.main())"],
        capture_output=True, text=True, timeout=120)
    assert (in_import.returncode, in_import.stderr) == (143, "servesim: terminated\n")


def _small_scenario(tmp_path):
    """A 20-request scenario file that runs in a moment."""
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                    "engine: {max_num_seqs: 4, max_model_len: 512}\nworkload: {num_requests: "
                    "20, arrival: {process: poisson, rate: 10}, prompt_tokens: {dist: fixed, "
                    "value: 8}, output_tokens: {dist: fixed, value: 4}}\n")
    return scen


@pytest.mark.parametrize("when", ["before_commit", "at_commit", "after_main"])
def test_ctrl_c_leaves_no_output_and_130_or_the_whole_output_and_0(tmp_path, when):
    # The console script (cli.main() with sys.argv) sends itself SIGINT: as the outputs are
    # staged (nothing written, 130), as they are renamed into place or once main returned
    # (both ignored: the report is whole, 0)
    import subprocess
    import sys

    scen = _small_scenario(tmp_path)
    out = tmp_path / "out"
    kill = "os.kill(os.getpid(), signal.SIGINT)"
    patch = {"before_commit": f"report.commit_outputs = lambda: ({kill}, commit())",
             "at_commit": f"report.commit_outputs = lambda: (commit(), {kill})",
             "after_main": "pass"}[when]
    code = ("import os, signal, sys; from simulator import cli, report; "
            f"commit = report.commit_outputs; {patch}; "
            f"sys.argv = ['servesim', 'run', {str(scen)!r}, '--out', {str(out)!r}, '--quiet']; "
            "status = cli.main(); "
            + (f"{kill}; " if when == "after_main" else "") + "sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, preexec_fn=_sigint_default)
    if when == "before_commit":
        assert (proc.returncode, proc.stderr) == (130, "servesim: interrupted\n")
        assert not out.exists()
    else:
        assert proc.returncode == 0 and "interrupt" not in proc.stderr, proc.stderr
        assert (out / "summary.json").is_file() and (out / "report.html").is_file()


@pytest.mark.parametrize("sig, status, said", [(2, 130, "servesim: interrupted\n"),
                                              (15, 143, "servesim: terminated\n")])
def test_a_signal_before_the_command_line_module_loads_is_one_line(sig, status, said):
    # the console script notes Ctrl-C and SIGTERM until main takes over, so one that comes
    # during the imports of simulator.cli is one line (Python's own handler would raise
    # KeyboardInterrupt there, or a RuntimeError in matplotlib's class bodies, and SIGTERM
    # would kill it silently)
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from simulator import console; "
         f"console._note({sig}, None); sys.argv = ['servesim', 'schema']; "
         "sys.exit(console.main())"],
        capture_output=True, text=True, timeout=120, preexec_fn=_sigint_default)
    assert (proc.returncode, proc.stderr, proc.stdout) == (status, said, "")
    # one turned into another error by an import is one line too
    turned = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom simulator import cli\n"
         f"def build():\n    cli._signalled = {sig}\n"
         "    raise RuntimeError('Error calling __set_name__')\n"
         "cli.build_parser = build\nsys.argv = ['servesim', 'schema']\nsys.exit(cli.main())"],
        capture_output=True, text=True, timeout=120)
    assert (turned.returncode, turned.stderr) == (status, said)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_that_cannot_be_written_is_one_line():
    # stdout on a full disk is one error line (the report itself is written)
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "simulator.cli", "schema"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (
        1, "servesim: error: cannot write the output: No space left on device\n")
    for args in (["--help"], ["run", "--help"]):   # said, and not status 0
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "simulator.cli", *args], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        assert (proc.returncode, proc.stderr) == (
            1, "servesim: error: cannot write the output: No space left on device\n"), args
    # started with stdout closed (>&-): sys.stdout is None: nothing is flushed
    for args in ("schema", "--help"):
        proc = subprocess.run(f"{sys.executable} -m simulator.cli {args} >&-", shell=True,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        assert (proc.returncode, proc.stderr) == (
            1, "servesim: error: cannot write the output: standard output is closed\n"), args

# 5 requests on a projected H100: a run that warns (its p99s rest on them)
FIVE_REQUESTS = ("name: s\nmodel: llama-3.1-8b\nhardware: {profile: h100-sxm}\n"
                 "workload: {num_requests: 5, arrival: {process: poisson, rate: 1.0},\n"
                 "  prompt_tokens: {dist: fixed, value: 10}, output_tokens: {dist: fixed, "
                 "value: 5}}\n")


def _servesim(args: str, **kw):
    """``python -m simulator.cli <args>`` through the shell, for its redirections (text)."""
    import subprocess
    import sys

    return subprocess.run(f"{sys.executable} -m simulator.cli {args}", shell=True, text=True,
                          timeout=120, **kw)


@pytest.mark.parametrize("redirect", ["2>&-", "2</dev/null", "2>/dev/full"])
def test_a_stderr_that_takes_nothing_loses_messages_not_exit_statuses(tmp_path, redirect):
    # closed, read-only or full: messages are dropped, not written into stdout among the
    # command's output (print(file=None) would), and an input error still exits 2 and a
    # run with warnings 0 with its "report:" line
    import os
    import subprocess

    if redirect.endswith("/dev/full") and not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    proc = _servesim(f"run {tmp_path}/none.yaml {redirect}", stdout=subprocess.PIPE)
    assert (proc.returncode, proc.stdout) == (2, "")
    scen = tmp_path / "s.yaml"
    scen.write_text(FIVE_REQUESTS)
    said = _servesim(f"run {scen} --out {tmp_path}/said", capture_output=True)
    assert "servesim: warning:" in said.stderr   # the run has a warning to lose
    proc = _servesim(f"run {scen} --out {tmp_path}/r {redirect}", stdout=subprocess.PIPE)
    assert proc.returncode == 0 and "servesim:" not in proc.stdout
    assert proc.stdout.endswith(f"report: {tmp_path}/r/report.html\n")


def test_a_read_only_stdout_is_refused_before_the_run(tmp_path):
    # 1</dev/null: refused before the run, not after its whole report when its table fails
    import subprocess

    proc = _servesim(f"run {tmp_path}/none.yaml --out {tmp_path}/r 1</dev/null",
                     stderr=subprocess.PIPE)
    assert (proc.returncode, proc.stderr) == (
        1, "servesim: error: cannot write the output: standard output is open for reading "
           "only\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("sig, status, said", [(2, 130, "servesim: interrupted\n"),
                                              (15, 143, "servesim: terminated\n")])
def test_a_signal_whose_exception_was_swallowed_still_commits_nothing(tmp_path, sig, status,
                                                                      said):
    # KeyboardInterrupt or Terminated raised inside a weakref callback is ignored by
    # Python ("Exception ignored in ..."), so the run would go on, write its whole report
    # and exit 0 (Ctrl-C "lost" at start-up); it commits nothing instead. The note the
    # handler makes, without the exception, stands in for that here.
    import subprocess
    import sys

    scen = _small_scenario(tmp_path)
    out = tmp_path / "out"
    code = ("import sys; from simulator import cli, report; commit = report.commit_outputs; "
            f"report.commit_outputs = lambda: (setattr(cli, '_signalled', {sig}), commit()); "
            f"sys.argv = ['servesim', 'run', {str(scen)!r}, '--out', {str(out)!r}, '--quiet']; "
            "sys.exit(cli.main())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr) == (status, said)
    assert not out.exists()


def _infinite_server(step, rate, out, n=300):
    """Every request starts at once (1024 slots, a KV cache without limit): with a
    constant step time this is an M/G/inf queue, stable at any rate."""
    return scenario_from_dict({
        "name": "e", "model": "llama-test", "hardware": {"step_time": step},
        "engine": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                   "max_model_len": 2048},
        "workload": {"seed": 3, "num_requests": n,
                     "arrival": {"process": "poisson", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": 8},
                     "output_tokens": out}})


def test_a_short_stable_run_of_long_outputs_is_stable():
    # 30 s of arrivals, outputs of 3 s (median) to 19 s at 10 ms a token: far fewer finish
    # than arrive in the window after the first (short) one finishes, yet an
    # infinite-server queue cannot be unstable, and no backlog trend says otherwise.
    from simulator.executors import backlog_grows, job_output, window_rates
    from simulator.run import simulate

    s = _infinite_server({"constant_s": 0.01}, 10,
                         {"dist": "lognormal", "median": 300, "p90": 1000, "max": 1900})
    for rep in range(3):
        r = simulate(s, replication=rep)
        offered, achieved = window_rates(r)
        assert achieved < STABLE_FRACTION * offered
        assert not backlog_grows(r) and job_output(r)["stable"]


def test_a_run_whose_arrivals_end_within_one_answer_is_not_judged_by_its_swell():
    # 10 requests in about 1 s of arrivals, each answered in 3 s (300 tokens at 10 ms) on
    # an M/G/inf engine: the requests in the system rise throughout the arrivals, since
    # none can finish yet. That is the build-up, not a swell: read as one, 10 requests on
    # 8 idle replicas would be unstable, and plan would size 10 replicas where 2 serve 20
    # req/s.
    from simulator.executors import backlog_grows, job_output, window_rates
    from simulator.run import simulate

    s = _infinite_server({"constant_s": 0.01}, 10, {"dist": "fixed", "value": 300}, n=10)
    for rep in range(5):
        r = simulate(s, replication=rep)
        arr, fin = r.requests["arrival_s"], r.requests["finish_s"]
        assert fin.min() > arr.max()   # no answer before the last arrival
        assert window_rates(r) is None
        assert not backlog_grows(r) and job_output(r)["stable"]
    # ... while a queue that grows is still seen in as short a run: one request at a time
    # (max_num_seqs 1), 10 offered per second, each served in 3 s
    queued = s.model_copy(update={"engine": s.engine.model_copy(update={"max_num_seqs": 1})})
    r = simulate(queued)
    assert backlog_grows(r) and not job_output(r)["stable"]


def test_a_batch_that_swells_without_a_queue_is_unstable():
    # Each decode adds 1 ms to a step: at most 1000 tokens/s however large the batch, so
    # 100-token outputs cap a replica at 10 req/s; 15 offered swell the running batch
    # while no request waits (every one is scheduled on arrival).
    from simulator.executors import backlog_grows, job_output
    from simulator.run import simulate

    s = _infinite_server({"base_s": 0.002, "per_decode_seq_s": 0.001}, 15,
                         {"dist": "fixed", "value": 100})
    r = simulate(s)
    assert r.timeseries["waiting_max"].max() == 0   # no one left waiting by a step
    assert backlog_grows(r) and not job_output(r)["stable"]
    assert r.summary["request_throughput"] < 10


def test_a_batch_still_settling_near_capacity_is_stable():
    # plan_chat's workload at 10 req/s on one H100 (max_num_seqs 64): over its first 40 s
    # the running batch climbs by 12% of the arrivals while each added request slows every
    # step, then settles; 3000 requests (300 s) serve the offered rate with no backlog
    # trend. The short run is stable too (a swelling batch counts from 20%).
    from pathlib import Path

    from simulator.executors import backlog_grows, job_output, window_rates
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "plan_chat.yaml"
    sets = ["workload.arrival.rate=10", "engine.max_num_seqs=64"]
    long = simulate(load_scenario(path, sets + ["workload.num_requests=3000"]))
    offered, achieved = window_rates(long)
    assert achieved >= STABLE_FRACTION * offered and not backlog_grows(long)
    short = simulate(load_scenario(path, sets))
    assert short.summary["num_requests"] == 400 and job_output(short)["stable"]


def test_an_input_error_raised_in_a_worker_comes_back_as_one_error(tmp_path, capsys):
    # compare runs each plan in the pool: DoesNotFit raised there (a plan whose model
    # does not fit its GPU) comes back whole, since it pickles with its detail: the plan's
    # own error, not a worker crash
    import pickle

    from simulator.cli import main
    from simulator.errors import DoesNotFit, KeyedDoesNotFit, KeyedInputError

    for e in (DoesNotFit("f.yaml:3: k: d", "d"), KeyedInputError("k", "d", depends=("x",)),
              KeyedDoesNotFit("k", "d", "line")):
        back = pickle.loads(pickle.dumps(e))
        assert (type(back), str(back), back.args) == (type(e), str(e), e.args)
        assert vars(back) == vars(e)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("name: a\nmodel: llama-test\nhardware: {profile: h100-sxm}\nworkload: "
                 "{num_requests: 20, arrival: {process: poisson, rate: 5}, prompt_tokens: "
                 "{dist: fixed, value: 8}, output_tokens: {dist: fixed, value: 4}}\n")
    b.write_text("name: b\nmodel: llama-3.1-70b\nhardware: {profile: h100-sxm}\n")
    assert main(["compare", str(a), str(b), "--executor", "local", "--workers", "2",
                 "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: b.yaml: engine.gpu_memory_utilization: "
                          "llama-3.1-70b in bfloat16") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
