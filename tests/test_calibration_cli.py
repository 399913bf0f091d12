"""`servesim calibrate` end to end on a tiny grid (llama-test): profile written, the simulator
predicts the fitted step times from it, the CSV reproduces its held-out error, an
interrupted run resumes; `servesim profiles` lists it."""

import os
import shutil
from pathlib import Path

import pytest
import torch

import calibration.profiler as profiler
from calibration.cli import calibrate, parse_bytes, profile_out, profiles_table
from calibration.fit import predict, refit_profile
from calibration.profiler import Grid, read_measurements
from simulator.cli import build_parser, main
from simulator.cost_model import PROFILES_DIR, build_cost_model, load_profile, step_features
from simulator.errors import InputError
from simulator.policy import Request, Scheduler, SchedulerConfig
from simulator.scenario import scenario_from_dict

TINY = Grid(prefill_chunks=(16, 64), prefill_contexts=(0, 32), decode_batches=(1, 3),
            decode_contexts=(24, 96), mixed_batches=(2,), mixed_contexts=(48,),
            mixed_chunks=((16, 0), (32, 32)), repeats=2, decode_steps_per_visit=2)


@pytest.fixture
def tiny_grid(monkeypatch):
    """The TINY grid, and fixed device ceilings (measured in their own test)."""
    monkeypatch.setattr(profiler, "default_grid", lambda device, quick, max_len: TINY)
    monkeypatch.setattr(profiler, "measure_ceilings", lambda *a, **k: (5e10, 1e10))
    monkeypatch.setattr(profiler, "IDLE_GAPS_S", (0.001, 0.002))   # seconds, not minutes
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def run_calibrate(out, on_measure=None, *extra):
    """``servesim calibrate`` of a tiny grid; ``extra`` flags replace the defaults here (a
    value flag may be given once)."""
    opts = {"--model": "llama-test", "--out": str(out), "--threads": "1",
            "--kv-cache-memory": "4MiB", "--max-model-len": "512", "--replay-seconds": "0.5"}
    rest, i = [], 0
    while i < len(extra):
        if extra[i] in opts and i + 1 < len(extra):
            opts[extra[i]] = extra[i + 1]
            i += 2
        else:
            rest.append(extra[i])
            i += 1
    if "--no-replay" in rest:   # no replay to give a length
        del opts["--replay-seconds"]
    argv = ["calibrate", *(x for kv in opts.items() for x in kv), "--no-progress", "--quick",
            *rest]
    args = build_parser().parse_args(argv)
    return calibrate(args, argv=argv, on_measure=on_measure)


def one_step_plan(prompt_tokens, block_size=16):
    """A single-step batch from the policy scheduler: one prompt prefilled whole."""
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512,
                                  max_model_len=512, block_size=block_size))
    s.add_request(Request(request_id=0, prompt_token_ids=list(range(prompt_tokens)),
                          max_tokens=4, arrival_ns=0))
    return s.schedule()


def scenario_for(profile_path, model="llama-test", dtype="float32"):
    return scenario_from_dict({
        "name": "t", "model": model, "dtype": dtype, "hardware": {"profile": str(profile_path)},
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 512, "max_model_len": 512},
        "workload": {"num_requests": 2, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 4}}}, source="t.yaml")


def test_calibrate_writes_a_profile_the_simulator_reproduces(tmp_path, tiny_grid, capsys):
    out = tmp_path / "tiny.yaml"
    run_calibrate(out)
    prof = load_profile(out)
    assert prof.measured and prof.engine.startswith("servesim-torch ")
    # the first step after idle: timed after each gap, extras >= 0 and non-decreasing
    assert prof.idle.gaps_s == [0.001, 0.002] and 0 <= prof.idle.extra_s[0] <= \
        prof.idle.extra_s[1] and prof.idle.reference_s > 0
    assert (prof.model.name, prof.dtype, prof.device.kind) == ("llama-test", "float32", "cpu")
    # KV facts: 2 x 2 layers x 2 kv heads x 16 x 4 bytes = 512 B/token; 4 MiB -> 512 blocks
    assert prof.kv.bytes_per_token == 512 and prof.kv.num_gpu_blocks == 512
    assert prof.error.heldout.n == len(TINY.cells(16, 512, 10 ** 6))
    assert prof.error.replay is not None and prof.error.replay.n > 0
    assert (tmp_path / "tiny.measurements.csv").is_file()
    assert (tmp_path / "tiny.replay.csv").is_file()
    page = (tmp_path / "tiny.calibration-report.html").read_text()
    # the report's error table states the profile's held-out error, its plot inline
    h = prof.error.heldout
    assert (f"<tr><td>held-out grid cells</td><td>{h.n}</td><td>{100 * h.mape:.1f}%</td>"
            in page) and page.count("data:image/png;base64,") == 1
    assert (tmp_path / "tiny.calibration-report.png").stat().st_size > 10_000
    assert "held-out grid cells" in capsys.readouterr().out

    # the CSV alone reproduces the coefficients and the reported held-out error
    refit = refit_profile(prof)
    assert refit.form == prof.cost.form
    assert refit.heldout["mape"] == pytest.approx(prof.error.heldout.mape, rel=1e-9)
    assert refit.heldout["max"] == pytest.approx(prof.error.heldout.max, rel=1e-9)
    for name, v in prof.cost.coefficients.items():
        assert refit.coefficients[name] == pytest.approx(v, rel=1e-9)

    # the simulator, given the profile and a single-step batch, predicts the fitted value
    # of that step as measured: the cell's first pass ran 72 tokens (pass_chunk_tokens)
    cost = build_cost_model(scenario_for(out))
    assert cost.measured and cost.num_gpu_blocks == 512
    rows = read_measurements(tmp_path / "tiny.measurements.csv")
    row = rows[(rows["cell"] == "prefill n=64 c=0") & (rows["pass"] == 0)]
    assert row["prefills"].tolist() == ["72@0"]
    plan = one_step_plan(72)
    assert cost.step_seconds(plan) == pytest.approx(
        predict(refit.form, refit.coefficients, refit_k(prof), row)[0], rel=1e-9)
    f = step_features(plan)
    X = {k: [getattr(f, k)] for k in ("tokens", "requests", "prefill_tokens", "decodes",
                                      "context_tokens", "attn_pairs", "sampled")}
    assert cost.step_seconds(plan) == pytest.approx(
        predict(prof.cost.form, prof.cost.coefficients, refit_k(prof), X)[0], rel=1e-12)

    # a profile for another model or dtype is refused, not silently used
    with pytest.raises(InputError, match="measured for model llama-test"):
        build_cost_model(scenario_for(out, model="llama-tiny-56m"))
    with pytest.raises(InputError, match=r"llama-test \(float32\).*\(bfloat16\)"):
        build_cost_model(scenario_for(out, dtype="bfloat16"))


def refit_k(prof):
    from simulator.cost_model import RooflineConstants
    return RooflineConstants.of(prof.model_shape, prof.dtype)


def killed_calibration(out, rows: int, monkeypatch) -> None:
    """A calibration into ``out`` (no replay, no report) killed after ``rows`` rows."""
    import calibration.report
    monkeypatch.setattr(calibration.report, "report_files", lambda *a: {})
    seen = []

    def kill(row):
        seen.append(row)
        if len(seen) == rows:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_calibrate(out, kill, "--no-replay")


def test_killed_calibration_resumes_from_the_csv(tmp_path, tiny_grid, monkeypatch):
    out = tmp_path / "r.yaml"
    killed_calibration(out, 5, monkeypatch)
    assert not out.exists()
    assert len(read_measurements(tmp_path / "r.measurements.csv")) == 5
    # the resumed run fits with the ceilings recorded in the CSV, not new ones
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("ceilings measured again"))
    again = []
    run_calibrate(out, again.append, "--no-replay")
    assert load_profile(out).device.peak_flops == 5e10
    total = sum(TINY.repeats * TINY.rows_per_visit(c) for c in TINY.cells(16, 512, 10 ** 6))
    assert len(again) == total - 5
    assert len(read_measurements(tmp_path / "r.measurements.csv")) == total


def test_an_interrupt_while_the_report_is_drawn_leaves_no_profile(tmp_path, tiny_grid,
                                                                  monkeypatch):
    # The profile and its report go in place together, after commit_outputs, so Ctrl-C or
    # SIGTERM while the plot is drawn leaves neither.
    import calibration.report
    from simulator import files

    def interrupted(*a):
        raise KeyboardInterrupt

    out = tmp_path / "r.yaml"
    figure = calibration.report._figure
    monkeypatch.setattr(calibration.report, "_figure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_calibrate(out, None, "--no-replay")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.measurements.csv"]

    monkeypatch.setattr(calibration.report, "_figure", figure)
    seen = []
    monkeypatch.setattr(files, "on_commit", lambda: seen.append(sorted(
        p.name for p in tmp_path.iterdir())))
    run_calibrate(out, None, "--no-replay")   # resumed from the CSV, nothing measured again
    assert seen == [["r.measurements.csv"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "r.calibration-report.html", "r.calibration-report.png", "r.measurements.csv",
        "r.yaml"]
    assert load_profile(out).name == "r"


def test_resuming_with_another_thread_count_is_refused(tmp_path, tiny_grid, monkeypatch):
    out = tmp_path / "r.yaml"
    killed_calibration(out, 3, monkeypatch)
    before = (tmp_path / "r.measurements.csv").read_bytes()
    # refused before anything is measured (before the ceilings' 30 s and a grid's minutes)
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured before the CSV was checked"))
    with pytest.raises(InputError, match=r"r\.measurements\.csv: measured with threads = 1, "
                                         r"this run has 2: use another --out"):
        run_calibrate(out, None, "--no-replay", "--threads", "2")
    assert (tmp_path / "r.measurements.csv").read_bytes() == before
    assert not out.exists()


def test_resuming_with_another_pass_count_is_refused(tmp_path, tiny_grid, monkeypatch):
    # a pass's chunks and contexts depend on the pass count (pass_chunk_tokens): rows of
    # two counts would average other points of their cells
    out = tmp_path / "r.yaml"
    killed_calibration(out, 3, monkeypatch)   # TINY's 2 passes, in the CSV's header
    before = (tmp_path / "r.measurements.csv").read_bytes()
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured before the CSV was checked"))
    with pytest.raises(InputError, match=r"r\.measurements\.csv: measured with --repeats 2, "
                                         r"this run has 3: give --repeats 2 to resume it, or "
                                         r"use another --out$"):
        run_calibrate(out, None, "--no-replay", "--repeats", "3")
    assert (tmp_path / "r.measurements.csv").read_bytes() == before
    assert not out.exists()


@pytest.mark.parametrize("key, value, want", [
    ("repeats", '"2"', "'2': a whole number from 1 to 100, the --repeats its rows were "
                       "measured with"),
    ("repeats", "0", "0: a whole number from 1 to 100, the --repeats its rows were measured "
                     "with"),
    ("repeats", "2.5", "2.5: a whole number from 1 to 100, the --repeats its rows were "
                       "measured with"),
    *(("ceilings", v, f"{shown}: two finite numbers > 0, the matmul FLOP/s and memory "
                      f"bytes/s measured")
      for v, shown in (("[1]", "[1]"), ('"ab"', "'ab'"), ("[0, 0]", "[0, 0]"),
                       ('[-5, "x"]', "[-5, 'x']"), ("[1e400, 1]", "[inf, 1]"))),
])
def test_a_header_edited_past_what_a_resume_reads_is_refused(tmp_path, tiny_grid, monkeypatch,
                                                              key, value, want):
    # the resume reads these two values of line 1: one error line, before any measuring
    import json
    out = tmp_path / "r.yaml"
    killed_calibration(out, 3, monkeypatch)
    csv = tmp_path / "r.measurements.csv"
    first, rest = csv.read_text().split("\n", 1)
    header = json.loads(first[2:])
    assert key in header
    text = first.replace(f'"{key}": {json.dumps(header[key])}', f'"{key}": {value}')
    assert text != first
    csv.write_text(text + "\n" + rest)
    before = csv.read_bytes()
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured before the CSV was checked"))
    with pytest.raises(InputError) as e:
        run_calibrate(out, None, "--no-replay")
    assert str(e.value) == (f"{csv}:1: the header's {key} is {want} (use another --out, or "
                            f"delete the file to measure again)")
    assert csv.read_bytes() == before
    assert not out.exists()


def test_an_out_folder_that_cannot_be_written_is_refused_before_measuring(tiny_grid):
    # /proc takes no new files (even for root); found before the first step, not after
    measured = []
    with pytest.raises(InputError, match=r"^--out /proc/p\.yaml: cannot write there \("):
        run_calibrate(Path("/proc/p.yaml"), measured.append)
    assert measured == []


def test_an_out_that_is_a_folder_is_refused_before_measuring(tiny_grid, tmp_path):
    # refused before the grid, not when the profile is saved
    (tmp_path / "p.yaml").mkdir()
    measured = []
    with pytest.raises(InputError, match=r"^--out: .*p\.yaml is a folder; give the "
                                         r"profile's \.yaml file$"):
        run_calibrate(tmp_path / "p.yaml", measured.append)
    assert measured == []


@pytest.mark.parametrize("name, what, report", [
    ("p.measurements.csv", "measurements", False), ("p.replay.csv", "replay", False),
    ("p.calibration-report.html", "report", False), ("p.calibration-report.png", "plot", True),
])
def test_a_folder_where_an_output_goes_is_refused_before_measuring(tiny_grid, tmp_path, name,
                                                                   what, report):
    # a folder where the measurements CSV goes is one error line
    folder = tmp_path / "rep" if report else tmp_path
    (folder / name).mkdir(parents=True)
    measured = []
    extra = ("--report-dir", str(folder)) if report else ()
    flag = "--report-dir" if report else "--out"
    with pytest.raises(InputError) as e:
        run_calibrate(tmp_path / "p.yaml", measured.append, *extra)
    assert str(e.value) == (f"{flag}: {folder / name} is a folder, where calibrate writes its "
                            f"{what}: move it or give another {flag}")
    assert measured == []


def test_least_max_model_len_is_where_the_grid_first_holds_enough_cells():
    # checked against a scan of every length, not the bisection's own steps
    from calibration.profiler import IDLE_STEP_TOKENS, default_grid, least_max_model_len
    for device, quick in (("cpu", True), ("cpu", False), ("cuda", False)):
        enough = [n > IDLE_STEP_TOKENS and len(default_grid(device, quick, n).cells(
            16, n, 1 << 62)) >= 4 for n in range(1, 700)]
        first = enough.index(True) + 1
        assert all(enough[first - 1:])   # it only grows
        assert least_max_model_len(device, quick, 16, 4) == first


def test_a_max_model_len_too_short_for_the_grid_is_refused_before_measuring(tmp_path, capsys,
                                                                          monkeypatch):
    # lengths 17-100 are refused before measuring (the engine or the fit cannot take them)
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured despite the bad flag"))
    from calibration.profiler import least_max_model_len
    least = least_max_model_len("cpu", True, 16, 4)
    argv = ["calibrate", "--model", "llama-test", "--quick", "--out", str(tmp_path / "p.yaml"),
            "--max-model-len", str(least - 1)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"servesim: error: --max-model-len {least - 1}: calibration needs at least {least} (4 "
        f"grid shapes to fit and hold out, and the 64-token step timed after idle)\n")
    assert not any(tmp_path.iterdir())


def test_an_out_that_holds_another_yaml_file_is_refused_before_measuring(tiny_grid,
                                                                        tmp_path):
    # a scenario named as --out is refused; a profile (stale or not) is overwritten
    scen = tmp_path / "s.yaml"
    scen.write_text("name: s\nmodel: llama-test\n")
    measured = []
    with pytest.raises(InputError, match=r"^--out: .*s\.yaml exists and is not a profile "
                                         r"\(calibrate overwrites only a profile's \.yaml\)"):
        run_calibrate(scen, measured.append)
    assert measured == [] and scen.read_text() == "name: s\nmodel: llama-test\n"
    from calibration.cli import _is_profile
    stale = tmp_path / "p.yaml"
    stale.write_text("cost: {form: constant}\nprovenance: {kind: measured}\n")
    assert _is_profile(stale) and not _is_profile(scen)


@pytest.mark.parametrize("flags, said", [
    (["--out", ""], "--out: empty path (give the profile's .yaml file)"),
    (["--out", "{tmp}/p.yaml", "--report-dir", ""], "--report-dir: empty path (give a folder)"),
    (["--out", "{tmp}/p.yaml", "--report-dir", "-"], "--report-dir -: standard output takes "
                                                     "no report: give a folder (./- names one "
                                                     "called -)"),
])
def test_an_empty_out_or_report_dir_is_refused(tmp_path, capsys, monkeypatch, flags, said):
    # an empty --report-dir is refused, not taken as none (a report beside --out)
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured despite the bad flag"))
    argv = ["calibrate", "--model", "llama-test", *[f.format(tmp=tmp_path) for f in flags]]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"servesim: error: {said}\n"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--out", "--report-dir"])
def test_a_folder_holding_another_report_is_refused_before_measuring(tmp_path, capsys,
                                                                     monkeypatch, flag):
    # a profile's CSV in a run's folder would make `run --out` refuse it later: refused here
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text("{}")
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured despite the bad flag"))
    out = tmp_path / "r" / "p.yaml" if flag == "--out" else tmp_path / "p.yaml"
    extra = ["--report-dir", str(tmp_path / "r")] if flag == "--report-dir" else []
    assert main(["calibrate", "--model", "llama-test", "--out", str(out), *extra]) == 2
    shown, where = (out, "its folder holds") if flag == "--out" else (tmp_path / "r", "holds")
    assert capsys.readouterr().err == (
        f"servesim: error: {flag} {shown}: {where} a run report (summary.json); the "
        f"profile's files there would mix with it: give another folder\n")
    assert sorted(f.name for f in (tmp_path / "r").iterdir()) == ["summary.json"]


def test_a_model_or_out_the_file_system_cannot_take_is_refused(tmp_path, capsys, monkeypatch):
    # --model's error names the flag; a profile name too long for the file system is one
    # error line
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured despite the bad flag"))
    assert main(["calibrate", "--model", str(tmp_path / "config.json"), "--out",
                 str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: --model {tmp_path / 'config.json'}: "
                          f"'{tmp_path / 'config.json'}' is neither a catalog model")
    stem = "p" * 240   # fits alone; "<stem>.calibration-report.html" does not
    out = tmp_path / f"{stem}.yaml"
    assert main(["calibrate", "--model", "llama-test", "--out", str(out)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    args = build_parser().parse_args(["calibrate", "--model", "llama-test", "--out", str(out)])
    with pytest.raises(InputError) as e:
        profile_out(args)
    assert str(e.value) == (f"--out {out}: name too long for the file system (calibrate "
                            f"also writes {stem}.calibration-report.html); give a shorter one")
    assert not any(tmp_path.iterdir())


def test_more_threads_than_usable_cpus_is_refused(tmp_path, tiny_grid):
    import os
    cpus = len(os.sched_getaffinity(0))
    with pytest.raises(InputError, match=rf"^--threads {cpus + 1}: this process may use "
                                         rf"{cpus} CPUs; give at most {cpus}$"):
        run_calibrate(tmp_path / "p.yaml", None, "--threads", str(cpus + 1))
    assert not any(tmp_path.iterdir())


def test_profiles_lists_shipped_and_local(tmp_path, monkeypatch, capsys):
    shipped = sorted(PROFILES_DIR.glob("*.yaml"))
    local = tmp_path / "local"
    local.mkdir()
    if shipped:
        shutil.copy(shipped[0], local / "my-copy.yaml")
        text = (local / "my-copy.yaml").read_text()
        (local / "my-copy.yaml").write_text(text.replace(f"name: {shipped[0].stem}",
                                                         "name: my-copy", 1))
    (local / "broken.yaml").write_text("name: [unclosed\n")
    monkeypatch.setenv("SERVESIM_PROFILES", str(local))
    rows = {r[0]: r for r in profiles_table()}
    # the error names the file, not its folder again (the 'where' column has it)
    assert rows["broken"][1:3] == ("unreadable", "broken.yaml:2: YAML syntax error: expected ',' "
                                   "or ']', but got '<stream end>' (in the flow sequence that "
                                   "starts at line 1)")
    assert rows["broken"][-1] == str(local)
    for p in shipped:
        prof = load_profile(p)
        r = rows[prof.name]
        assert r[1:5] == (prof.provenance.kind, prof.device.name, prof.model.name, prof.dtype)
        assert r[-1] == "shipped"
        if prof.error and prof.error.heldout:
            assert r[7] == f"{100 * prof.error.heldout.mape:.1f}%"
    if shipped:
        assert rows["my-copy"][-1] == str(local)
    assert main(["profiles"]) == 0
    out = capsys.readouterr()
    assert "broken" in out.out and "calibration profiles" in out.out and out.err == ""
    # a folder the variable names that does not exist is said, not silently skipped
    monkeypatch.setenv("SERVESIM_PROFILES", f"{local}{os.pathsep}{tmp_path / 'typo'}")
    assert main(["profiles"]) == 0
    assert capsys.readouterr().err == ("servesim: warning: $SERVESIM_PROFILES names folders "
                                       f"that do not exist: {tmp_path / 'typo'}\n")
    # a local profile of a shipped one's name hides it: said, not left unseen
    if shipped:
        shutil.copy(shipped[0], local / shipped[0].name)
        assert main(["profiles"]) == 0
        assert capsys.readouterr().err.endswith(
            f"servesim: note: profile {shipped[0].stem} is {local / shipped[0].name}; it "
            f"hides the shipped one\n")
    # a file named after a catalog GPU: hardware.profile: h100-sxm projects that GPU
    shutil.copy(local / "my-copy.yaml" if shipped else local / "broken.yaml",
                local / "h100-sxm.yaml")
    assert main(["profiles"]) == 0
    assert capsys.readouterr().err.endswith(
        f"servesim: note: profile h100-sxm ({local / 'h100-sxm.yaml'}) is hidden by the "
        f"catalog GPU h100-sxm, which hardware.profile: h100-sxm projects; rename the file to "
        f"select it by name\n")


def test_profiles_table_never_cuts_or_wraps_a_name():
    import io

    from rich.console import Console

    from calibration.cli import profile_column_widths, profiles_rich_table

    long = "a-very-long-profile-name-for-the-h200-nodes-in-rack-12-with-fp8-kv-cache-v2"
    row = (long, "measured", "cpu AMD EPYC 7763 64-Core Processor (16 threads)",
           "llama-3.1-8b", "bfloat16", "servesim-torch 0.1.0", "2026-01-01", "4.9%", "8.6%",
           "/home/someone/.servesim/profiles")
    rows = [row, ("short", *row[1:])]
    for terminal in (80, 160, 300):
        widths = profile_column_widths(rows, terminal)
        assert widths[0] == len(long)
        # no column narrower than its longest word: cells wrap between words only
        assert widths[2] >= len("64-Core") and widths[5] >= len("servesim-torch")
        assert widths[9] >= len("/home/someone/.servesim/profiles")
        width = sum(widths) + 3 * len(widths) + 1
        if terminal == 300:   # room for every cell unwrapped: nothing wraps
            assert widths[2] == len(row[2]) and width <= 300
        else:                 # 160 columns are too few here: only as wide as needed
            assert width > 160 and widths[2] < len(row[2])
        buf = io.StringIO()
        Console(file=buf, width=width).print(profiles_rich_table(rows, terminal))
        lines = buf.getvalue().splitlines()
        assert max(map(len, lines)) <= width
        assert sum(long in line for line in lines) == 1          # whole, on one line
        text = " ".join(lines)
        for word in " ".join(row[1:]).split():                   # no word broken
            assert word in text, word


@pytest.mark.parametrize("busy, warned", [(0.0, False), (0.5, False), (0.51, True),
                                          (1.84, True)])
def test_busy_cpu_warning_rule(busy, warned):
    from calibration.cli import busy_cpu_warning

    line = busy_cpu_warning(busy, 2)
    assert (line is not None) == warned     # other work above half a core
    if warned:
        assert "\n" not in line and line.startswith("servesim: warning: the CPU is busy")
        assert f"used {busy:.1f} cores of 2 CPUs" in line and "noisy" in line


def test_busy_cores_reads_the_interval_not_the_past(tmp_path, monkeypatch):
    """Cores busy = CPUs × (1 − Δidle / Δtotal) between two /proc/stat samples."""
    import os

    stat = tmp_path / "stat"
    samples = iter(["cpu 100 0 100 700 100 0 0 0 0 0", "cpu 175 0 125 750 150 0 0 0 0 0"])
    monkeypatch.setattr(profiler.time, "sleep", lambda s: stat.write_text(next(samples, "")))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    stat.write_text(next(samples))
    # Δtotal = 200 ticks, Δidle (idle + iowait) = 100: half of 2 CPUs busy
    assert profiler.busy_cores(1.0, str(stat)) == pytest.approx(1.0)
    assert profiler.busy_cores(1.0, str(tmp_path / "none")) is None


def test_calibrate_warns_on_a_busy_cpu_before_measuring(tmp_path, monkeypatch, capsys,
                                                        tiny_grid):
    from calibration.cli import warn_if_busy

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(profiler, "busy_cores", lambda s: 1.84)
    assert warn_if_busy("cuda") is None and capsys.readouterr().err == ""
    monkeypatch.setattr(profiler, "measure_ceilings", stop)   # the first measurement
    with pytest.raises(Stop):
        run_calibrate(tmp_path / "p.yaml")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "used 1.8 cores" in err[0] and "noisy" in err[0]
    monkeypatch.setattr(profiler, "busy_cores", lambda s: 0.2)
    with pytest.raises(Stop):
        run_calibrate(tmp_path / "p.yaml")
    assert capsys.readouterr().err == ""


def test_device_ceilings_are_the_best_of_their_timed_runs(monkeypatch):
    """FLOP/s = 2·n³ over the fastest of the matmuls, bytes/s = the copy's read and write
    (2 · size) over the fastest copy; on a fake clock: matmuls of 0.3, 0.1 and 0.2 s,
    copies of 0.05, 0.02 and 0.04 s (a start and an end reading each)."""
    ticks = iter([0, 0.3, 1, 1.1, 2, 2.2, 3, 3.05, 4, 4.02, 5, 5.04])
    monkeypatch.setattr(profiler.time, "perf_counter", lambda: next(ticks))
    flops, bw = profiler.measure_ceilings("cpu", "float32", quick=True, matmul_n=256,
                                          copy_bytes=8 << 20)
    assert flops == pytest.approx(2 * 256 ** 3 / 0.1)
    assert bw == pytest.approx(2 * (8 << 20) / 0.02)


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("512 MiB") == 512 << 20
    assert parse_bytes("2e9") == 2 * 10 ** 9 and parse_bytes("1.5e3 MiB") == 1500 << 20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes("4096") == 4096
    for bad in ("lots", "-1", "0", "0.5"):
        with pytest.raises(InputError, match=rf"^--kv-cache-memory: '{bad}' is "):
            parse_bytes(bad)
    # 1e400 reads as inf: refused with the flag
    for big in ("1e400", "1e308GiB"):
        with pytest.raises(InputError, match=rf"^--kv-cache-memory: '{big}' is past the "
                                             rf"largest number of bytes this reads"):
            parse_bytes(big)
    assert parse_bytes("1e300") == int(1e300)   # a size the host check then refuses


@pytest.mark.parametrize("value, message", [
    ("-1", "'-1' is not a size: give a positive number of bytes, or one with KiB, MiB, "
           "GiB, KB, MB or GB (e.g. 2GiB)"),
    ("0", "'0' is 0 bytes: give a positive size (e.g. 2GiB)"),
])
def test_kv_cache_memory_error_names_the_flag(tmp_path, capsys, value, message):
    # argparse's own wording would name the parsing function ("invalid parse_bytes value")
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "p.yaml"),
              "--kv-cache-memory", value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"servesim: error: --kv-cache-memory: {message} (see servesim "
                   f"calibrate --help)"]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["-1", "4294967296", "x"])
def test_a_bad_seed_is_refused_before_measuring(tmp_path, capsys, value):
    # NumPy's generator refused -1 after the grid's first minute, leaving a partial CSV
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "p.yaml"),
              "--seed", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"servesim: error: --seed: {value!r}: give a whole number from 0 to "
        f"4294967295 (see servesim calibrate --help)"]
    assert not any(tmp_path.iterdir())


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    assert main(["calibrate", "--model", "no-such-model", "--out",
                 str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("servesim: error: --model no-such-model: ")
    assert main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "x.csv")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_model_too_big_for_the_device_is_refused_before_allocating(tmp_path, capsys):
    from simulator.catalog import load_model

    from calibration.profiler import memory_bytes

    # 70B params drawn in float32 = 4 bytes each, far beyond this machine's RAM.
    assert load_model("llama-3.1-70b").weight_bytes("float32") > memory_bytes("cpu")
    assert main(["calibrate", "--model", "llama-3.1-70b", "--device", "cpu",
                 "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model llama-3.1-70b" in err[0] and "GB" in err[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("flags,fragment", [
    (["--block-size", "7"], "--block-size 7"),
    (["--gpu-memory-utilization", "2"], "--gpu-memory-utilization"),
    # ignored on a CPU, or beside the KV size it would set
    (["--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization 0.5: sizes the KV cache "
     "on --device cuda without --kv-cache-memory only; a CPU's KV cache is --kv-cache-memory"),
    (["--device", "cuda", "--gpu-memory-utilization", "0.5", "--kv-cache-memory", "1GiB"],
     "--gpu-memory-utilization 0.5: sizes the KV cache on --device cuda without "
     "--kv-cache-memory only; give one of the two"),
    (["--backend", "vllm", "--gpu-memory-utilization", "0.5"], "vllm-cpu sizes its KV cache "
     "by VLLM_CPU_KVCACHE_SPACE"),
])
def test_calibrate_checks_engine_flags_before_measuring(tmp_path, capsys, flags, fragment):
    assert main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "p.yaml"),
                 *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]
    assert not any(tmp_path.iterdir())


def test_engine_commands_without_torch_say_how_to_install(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "pip install torch==2.13.0" in capsys.readouterr().err
    # a bad flag is said first, as validate does (before the torch line)
    assert main(["calibrate", "--model", "llama-test", "--block-size", "0", "--out",
                 str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err.startswith("servesim: error: --block-size 0: allowed 1,")
    scen = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    assert main(["validate", "--scenario", str(scen), "--out", str(tmp_path / "v")]) == 2
    assert "pip install torch==2.13.0" in capsys.readouterr().err


# 1e12 s is refused at the flag, not after the grid
@pytest.mark.parametrize("value", ["-1", "0", "inf", "soon", "1e12", "3601"])
def test_calibrate_refuses_a_bad_replay_length(value, tmp_path, capsys):
    from simulator.cli import main
    out = tmp_path / "p.yaml"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "llama-test", "--out", str(out), "--replay-seconds",
              value])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"servesim: error: --replay-seconds: {value!r}: give a "
                   f"number of seconds > 0 and <= 3600 (see servesim calibrate --help)"]
    assert not out.exists()


def test_a_kv_cache_larger_than_the_host_names_the_flag_and_readable_sizes(tmp_path, capsys,
                                                                          monkeypatch):
    # 1e99 bytes prints as 1e+90 GB, not 90 digits; the host's memory is fixed at 25 GB here
    from calibration import profiler
    from simulator.cli import main
    monkeypatch.setattr(profiler, "memory_bytes", lambda device: 25 * 10**9)
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--model", "llama-test", "--kv-cache-memory", "1e99", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servesim: error: --model llama-test: its weights (drawn in float32) "
                          "and KV cache (1e+90 GB, --kv-cache-memory) need 1e+90 GB but the "
                          "cpu device has 25.0 GB"), err
    assert not out.exists()


def test_folders_made_for_an_interrupted_calibration_go_again_unless_written(tmp_path):
    # Ctrl-C before the first measurement removes the --out folder it made
    from simulator.files import removed_if_left_empty
    keep = tmp_path / "kept"
    keep.mkdir()
    for wrote in (False, True):
        out, rep = tmp_path / "a" / "b", keep / "r"
        with pytest.raises(KeyboardInterrupt):
            with removed_if_left_empty(out, rep, None):
                out.mkdir(parents=True)
                rep.mkdir()
                if wrote:   # a resumable measurements CSV stays, with its folders
                    (out / "x.measurements.csv").write_text("# {}\n")
                raise KeyboardInterrupt
        assert (out.exists(), (tmp_path / "a").exists(), rep.exists()) == (wrote, wrote, False)
        assert keep.is_dir()   # it was there before
    with removed_if_left_empty(tmp_path / "c"):   # no error: what it made stays
        (tmp_path / "c").mkdir()
    assert (tmp_path / "c").is_dir()


@pytest.mark.parametrize("value,allowed", [("0", "from 1 to 100"), ("101", "from 1 to 100"),
                                           ("1e3", "from 1 to 100"), ("2.5", "from 1 to 100")])
def test_calibrate_refuses_a_bad_repeat_count(value, allowed, tmp_path, capsys):
    from simulator.cli import main
    out = tmp_path / "p.yaml"
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "llama-test", "--out", str(out), "--repeats", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"servesim: error: --repeats: {value!r}: give a whole number {allowed} "
        f"(see servesim calibrate --help)"]
    assert not out.exists()


def test_fit_warning_when_errors_are_high():
    from calibration.cli import fit_warning
    assert fit_warning({"mape": 0.041}, {"mape": 0.091}) is None
    assert fit_warning({"mape": 0.10}, None) is None              # at the bound: fine
    line = fit_warning({"mape": 0.154}, {"mape": 0.337})
    assert line.startswith("servesim: warning: this profile's held-out MAPE 15.4% (> 10%) "
                           "and replay MAPE 33.7% (> 20%) is high")
    assert "replay" in fit_warning({"mape": 0.05}, {"mape": 0.25}) and "\n" not in line


@pytest.mark.parametrize("flags, message", [
    (["--max-model-len", "0"], "--max-model-len: '0': give a whole number >= 1"),
    (["--threads", "-2"], "--threads: '-2': give a whole number >= 1"),
    (["--device-name", " "], "--device-name: empty: give a name"),
    # stored in the profile and shown in every profile table
    (["--device-name", "x" * 201], "--device-name: 201 characters: at most 200"),
    (["--device-name", "gpu\nname"], "--device-name: 'gpu\\nname': printable "
                                      "characters only (no newline or tab)"),
])
def test_calibrate_refuses_bad_counts_and_names(flags, message, tmp_path, capsys):
    from simulator.cli import main
    with pytest.raises(SystemExit) as e:
        main(["calibrate", "--model", "llama-test", "--out", str(tmp_path / "p.yaml"), *flags])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"servesim: error: {message} (see servesim calibrate --help)"]


@pytest.mark.parametrize("flags, message", [
    (["--max-num-batched-tokens", "512"], "--max-num-batched-tokens: only for --backend vllm"),
    # a CPU profile labelled as a catalog GPU reads as that GPU in every profile table
    (["--device-name", "h200"], "--device-name h200: a catalog GPU's name, and the profile "
                                "measures --device cpu"),
    # a replay length beside --no-replay would be dropped without a word
    (["--replay-seconds", "5", "--no-replay"], "--replay-seconds 5: the replay check's "
                                               "length, which --no-replay skips"),
    (["--out", "{f}/x/p.yaml"], "--out {f}/x/p.yaml: {f} is a file, not a folder"),
    # the folder of the profile file is a file: named by the path given
    (["--out", "{f}/p.yaml"], "--out {f}/p.yaml: {f} is a file, not a folder"),
    (["--report-dir", "{f}/x"], "--report-dir {f}/x: {f} is a file, not a folder"),
    # refused before the device ceilings are measured, and no folder is made
    (["--kv-cache-memory", "10"], "--kv-cache-memory (10 bytes): 0 KV blocks of"),
    # the bytes it read, as a fraction of a byte is dropped
    (["--kv-cache-memory", "1.5kb"], "--kv-cache-memory (1,500 bytes): 0 KV blocks of"),
    (["--max-model-len", "100000000"], "--max-model-len 100000000: above llama-test's "
                                       "max_position_embeddings"),
    # a catalog GPU's name selects its projection, never this profile
    (["--out", "{d}/h100-sxm.yaml"], "--out {d}/h100-sxm.yaml: h100-sxm is a catalog GPU's "
                                     "name (hardware.profile: h100-sxm projects that GPU, "
                                     "never a profile): give another, e.g. h100-sxm-llama-test"),
    (["--name", "l4"], "--name l4: l4 is a catalog GPU's name"),
])
def test_calibrate_refuses_before_measuring(flags, message, tmp_path, capsys):
    from simulator.cli import main
    f = tmp_path / "afile"
    f.write_text("x")
    flags = [a.format(f=f, d=tmp_path) for a in flags]
    argv = ["calibrate", "--model", "llama-test"] + (   # a flag may be given once
        [] if "--out" in flags else ["--out", str(tmp_path / "p.yaml")])
    assert main(argv + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(f=f, d=tmp_path) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_kv_cache_that_cannot_hold_max_model_len_is_refused_before_measuring(
        tmp_path, monkeypatch):
    # vLLM's rule: one request of max_model_len tokens fits beside the null block
    from simulator.catalog import load_model
    m = load_model("llama-test")
    per_block = 16 * 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * 4  # float32
    need = 512 // 16 + 1
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: pytest.fail("measured before the KV cache was checked"))
    out = tmp_path / "d" / "p.yaml"
    with pytest.raises(InputError, match=(
            rf"^--kv-cache-memory \({need * per_block - 1:,} bytes\): {need - 1} KV blocks of "
            rf"{per_block:,} bytes \(16 tokens of llama-test in float32\); max_model_len 512 "
            rf"needs {need - 1} besides the null block: give at least {need * per_block:,} "
            rf"bytes, or a lower --max-model-len$")):
        run_calibrate(out, None, "--kv-cache-memory", str(need * per_block - 1))
    assert not (tmp_path / "d").exists()
    # one byte more passes the check: measuring starts (here, the stub says so)
    monkeypatch.setattr(profiler, "measure_ceilings",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("measuring")))
    with pytest.raises(RuntimeError, match="measuring"):
        run_calibrate(out, None, "--kv-cache-memory", str(need * per_block))


def test_an_emulated_dtype_on_the_cpu_gets_one_warning(monkeypatch, capsys):
    # oneDNN refuses to prepack bfloat16 without AVX512 (prepack_supported False): there
    # bfloat16 is emulated, and the warning says so once; elsewhere nothing is printed.
    from calibration import profiler
    from calibration.cli import warn_if_emulated
    from calibration.engine import model as M

    monkeypatch.setattr(profiler, "cpu_isa", lambda: "AVX512-BF16")
    monkeypatch.setitem(M._prepack_ok, torch.bfloat16, False)
    line = warn_if_emulated("cpu", "bfloat16")
    assert line.startswith("servesim: warning: this CPU has no AVX512")
    assert "--dtype float32" in line and capsys.readouterr().err == line + "\n"
    assert warn_if_emulated("cpu", "float32") is None
    assert warn_if_emulated("cuda", "bfloat16") is None
    monkeypatch.setitem(M._prepack_ok, torch.bfloat16, True)
    assert warn_if_emulated("cpu", "bfloat16") is None
    assert capsys.readouterr().err == ""
    # float16 likewise, where oneDNN has no float16 kernels (an AMD EPYC without float16 kernels)
    monkeypatch.setitem(M._prepack_ok, torch.float16, False)
    line = warn_if_emulated("cpu", "float16")
    assert line.startswith("servesim: warning: this CPU has no float16 matmul kernels "
                           "(AVX512-FP16), so float16 matmuls are emulated")
    monkeypatch.setitem(M._prepack_ok, torch.float16, True)
    assert warn_if_emulated("cpu", "float16") is None
    # AVX512 without a bfloat16 extension: oneDNN prepacks bfloat16 and converts it through
    # float32 (an Intel Xeon: one row 3.5x faster than two); float16 is not judged by it
    monkeypatch.setattr(profiler, "cpu_isa", lambda: "AVX512")
    line = warn_if_emulated("cpu", "bfloat16")
    assert line.startswith("servesim: warning: this CPU has no AVX512-BF16 or AMX-BF16, so "
                           "bfloat16 matmuls are emulated")
    assert warn_if_emulated("cpu", "float16") is None
    for isa in ("AVX512-BF16", "AMX-BF16, AVX512-FP16, AVX512-BF16", ""):   # "": unknown
        monkeypatch.setattr(profiler, "cpu_isa", lambda: isa)
        assert warn_if_emulated("cpu", "bfloat16") is None


@pytest.mark.parametrize("name, expected", [
    (None, "p"),            # the file's stem
    ("h100-llama8b", "h100-llama8b"),
    ("", "--name: '': use letters, digits, '.', '_' and '-', starting with a letter or "
         "digit"),
    ("my profile", "--name: 'my profile': use letters, digits, '.', '_' and '-', starting "
                   "with a letter or digit"),
    # only those characters, yet refused, naming the first one
    ("..", "--name: '..': use letters, digits, '.', '_' and '-', starting with a letter or "
           "digit"),
])
def test_profile_name_is_the_flags_or_the_files(tmp_path, name, expected):
    from argparse import Namespace

    from calibration.cli import profile_out

    args = Namespace(out=str(tmp_path / "p.yaml"), name=name, report_dir=None)
    if expected.startswith("--name"):
        with pytest.raises(InputError) as e:
            profile_out(args)
        assert str(e.value) == expected
    else:
        assert profile_out(args) == (tmp_path / "p.yaml", expected)


def test_the_replay_workload_of_a_short_max_model_len_keeps_p90_within_its_max():
    # GPU lengths (prompts p90 2735) under max_model_len 4096: prompts are capped at
    # min(4 x 2735, 2048, 4096 - 4 x 424) = 2048, so the p90 asked for is 2048 too (a max
    # below p90 is refused: a tenth of the draws would pile at it)
    from calibration.cli import replay_workload

    wl = replay_workload("cuda", True, lambda n, c, b: 0.01, 4096)
    assert (wl.prompt_tokens.max, wl.prompt_tokens.p90, wl.prompt_tokens.median) == \
        (2048, 2048, 1020)
    wl = replay_workload("cuda", True, lambda n, c, b: 0.01, 1024)   # 512: the median too
    assert (wl.prompt_tokens.max, wl.prompt_tokens.p90, wl.prompt_tokens.median) == \
        (512, 512, 512)


@pytest.mark.parametrize("flags, isa", [
    ("fpu avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 avx512_fp16",
     "AMX-BF16, AVX512-FP16, AVX512-BF16"),
    ("fpu avx avx2 avx512f avx512bw avx512_bf16", "AVX512-BF16"),
    ("fpu avx avx2 avx512f", "AVX512"),
    ("fpu avx avx2", "AVX2"),
    ("fpu sse2", ""),
])
def test_a_cpu_profile_names_the_instruction_sets_its_matmuls_ran_on(tmp_path, flags, isa):
    # bfloat16 is many times slower without AVX512: two profiles of one "AMD EPYC" differ
    from calibration.profiler import cpu_isa

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n")
    assert cpu_isa(str(info)) == isa
    assert cpu_isa(str(tmp_path / "missing")) == ""


def test_calibrate_names_a_bad_model_before_a_missing_torch(tmp_path, capsys, monkeypatch):
    # a planner-only install (no torch) hears of its typo first, then of torch
    import importlib.util

    from simulator.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    out = ["--out", str(tmp_path / "p.yaml"), "--report-dir", str(tmp_path / "r")]
    assert main(["calibrate", "--model", "llama-tiny-56n", *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: --model llama-tiny-56n") and "torch" not in err
    # an empty one is refused as empty, not taken as the current folder
    assert main(["calibrate", "--model", "", *out]) == 2
    assert capsys.readouterr().err == ("servesim: error: --model: empty: give a catalog model "
                                       "name or the path to an HF config.json (or its "
                                       "folder)\n")
    assert main(["calibrate", "--model", "llama-tiny-56m", *out]) == 2
    assert "needs torch" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_replay_table_says_how_long_the_engine_waited_before_each_step():
    # the first step waited since the replay began (0); a step after one that left work
    # behind did not wait; one after a step that left nothing waited from its end
    from types import SimpleNamespace

    from calibration.cli import _steps_table

    def rec(start, running, waiting=0):
        return SimpleNamespace(step=start, start_ns=start, duration_ns=10, execute_ns=8,
                               prefills=[("r", 4, 0)], num_decodes=0,
                               decode_context_tokens=0, num_sampled=1, reread_tokens=0,
                               num_running=running, num_waiting=waiting)
    table = _steps_table([rec(100, 1), rec(112, 0, 1), rec(130, 0), rec(500, 0)])
    assert table["idle_ns"].tolist() == [100, 0, 0, 500 - 140]
