"""`servesim` as a user meets it: determinism, replications, and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.scenario import load_scenario

SCENARIO = """
name: small
model: llama-3.1-8b
hardware: {profile: h100-sxm}
engine: {max_num_seqs: 64, max_model_len: 8192}
workload:
  seed: 5
  num_requests: 300
  arrival: {process: poisson, rate: 20}
  prompt_tokens: {dist: lognormal, median: 500, p90: 1500, max: 6000}
  output_tokens: {dist: lognormal, median: 100, p90: 300, max: 1000}
  prefix: {shared_tokens: 256, groups: 4}
slo: {ttft_ms: {p99: 500}}
"""


@pytest.fixture
def scen(tmp_path):
    p = tmp_path / "small.yaml"
    p.write_text(SCENARIO)
    return p


def run_cli(*args):
    """Run the console entry point in a subprocess: (exit status, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def test_same_scenario_and_seed_give_byte_identical_summary(scen, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(scen), "--out", str(a), "--quiet"]) == 0
    assert main(["run", str(scen), "--out", str(b), "--quiet"]) == 0
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    s = json.loads((a / "summary.json").read_text())
    assert s["cost_kind"] == "projected" and s["prefix_cache_hit_rate"] > 0
    c = tmp_path / "c"
    assert main(["run", str(scen), "--out", str(c), "--quiet", "--set", "workload.seed=6"]) == 0
    assert (a / "summary.json").read_bytes() != (c / "summary.json").read_bytes()


def test_replications_give_confidence_intervals(scen, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", str(scen), "--out", str(out), "--quiet", "--replications", "3"]) == 0
    assert "tables above are replication 1 of 3" in " ".join(capsys.readouterr().out.split())
    rep = json.loads((out / "replications.json").read_text())
    ttft = rep["ttft_ms"]["p99"]
    assert ttft["n"] == 3 and ttft["ci95"][0] <= ttft["mean"] <= ttft["ci95"][1]


BAD_CASES = [
    # (scenario text or None for the good one, extra args, expected fragment)
    ("name: x\nmodel: llama-3.1-8b\nhardware: {profile: h100-sxm\n", [], "s.yaml:4: YAML"),
    (SCENARIO.replace("max_num_seqs: 64", "max_num_seq: 64"), [], "engine.max_num_seq"),
    (SCENARIO.replace("max_num_seqs: 64", "max_num_seqs: -3"), [], "engine.max_num_seqs"),
    (SCENARIO.replace("max_num_seqs: 64", "max_num_seqs: 64, max_num_seqs: 32"), [],
     "duplicate key 'max_num_seqs'"),
    (SCENARIO.replace("rate: 20", "rate: fast"), [], "workload.arrival"),
    (SCENARIO.replace("{dist: lognormal, median: 100, p90: 300, max: 1000}",
                      "{dist: uniform, min: 1.2, max: 1.8}"), [],
     "workload.output_tokens: uniform [1.2, 1.8] holds no integer"),
    (SCENARIO.replace("engine: {max_num_seqs: 64, max_model_len: 8192}", "engine: 5"), [],
     "s.yaml:5: engine: must be a mapping of keys (got 5)"),
    # a list where a mapping of the field's own keys goes: what one looks like
    (None, ["--set", "slo.ttft_ms=[500]"], "--set slo.ttft_ms=[500]: must be a mapping (got "
     "[500]): {mean | pNN: bound in ms}, e.g. {p50: 200, p99.9: 2000}"),
    (SCENARIO.replace("{dist: lognormal, median: 500", "{dist: weibull, median: 500"), [],
     # named at the dist key (its line is the mapping's here, a flow mapping)
     "s.yaml:10: workload.prompt_tokens.dist: 'weibull' is not one of 'fixed', 'uniform', "
     "'normal', 'lognormal', 'empirical'"),
    (None, ["--set", "engine.block_size=abc"], "engine.block_size"),
    (None, ["--set", "engine.nope=1"], "engine.nope"),
    (None, ["--set", "noequals"], "--set"),
    (SCENARIO.replace("max_model_len: 8192", "max_model_len: 9000000"), [], "max_model_len"),
    (SCENARIO.replace("h100-sxm", "h900"), [], "h900"),
    (None, ["--set", "engine.num_gpu_blocks=100"], "max_model_len"),  # KV cannot hold one
    (None, ["--set", "hardware.profile=l4", "--set", "model=llama-3.1-70b"], "l4"),
    ("name: t\nmodel: llama-3.1-8b\nhardware: {step_time: {constant_s: 0.01}}\n"
     "workload: {trace: {path: missing.csv, format: azure}}\n", [], "missing.csv"),
    ("name: t\nmodel: llama-3.1-8b\nhardware: {step_time: {constant_s: 0.01}}\n"
     "workload: {trace: {path: bad.csv, format: azure}}\n", [], "bad.csv:3"),
    ("name: t\nmodel: llama-3.1-8b\nhardware: {step_time: {constant_s: 0.01}}\n"
     "workload: {trace: {path: late.csv, format: azure}}\n", [],
     "late.csv:3: TIMESTAMP: '2023-11-16 18:15:45.0' is earlier than"),
    ("", [], "s.yaml: the scenario file is empty (a scenario needs at least model, hardware "
             "and workload"),
    ("# nothing yet\n", [], "s.yaml: the scenario file is empty"),
    (None, ["--set", "hardware.profile=empty.yaml"],
     # named with its folder (the scenario's, where a relative profile path is found)
     "--set hardware.profile=empty.yaml: {d}/empty.yaml: the profile file is empty"),
    # a list where the profile's mapping goes: told the keys a profile holds
    (None, ["--set", "hardware.profile=list.yaml"],
     "--set hardware.profile=list.yaml: {d}/list.yaml: holds a list, not a mapping of keys "
     "(a profile is the YAML mapping servesim calibrate writes: schema_version, name, "
     "device, engine, model, dtype, tensor_parallel, kv, cost"),
    (None, ["--replications", "100000"], "--replications: 1 to 1000, got 100000"),
    # nested past PyYAML's recursion: one error line
    ("name: x\nmodel: " + "[" * 600 + "]" * 600 + "\n", [],
     "s.yaml: YAML syntax error: collections nested too deeply"),
    # a scalar or list where a section goes: its keys, or how an arrival is written
    (None, ["--set", "slo=[1,2]"], "--set slo=[1,2]: must be a mapping of keys (got [1, 2]); "
     "its keys: ttft_ms, tpot_ms, itl_ms, e2el_ms, queue_ms"),
    (None, ["--set", "workload.arrival=[poisson]"], "(got [poisson]); e.g. {process: "
     "poisson, rate: N} (process: poisson, gamma, constant, closed_loop)"),
    # several flow collections in one flag (a sweep of mappings): one value per key
    (None, ["--set", "slo.ttft_ms={p99: 1},{p99: 3}"], "not valid YAML: expected '<document "
     "start>', but found ','; one value per key (a sweep's values are scalars: sweep a key "
     "inside the mapping or list, e.g. slo.ttft_ms.p99=200,500)"),
    # two scenarios in one file: PyYAML says only "but found another document"
    (SCENARIO + "---\nname: y\n", [], "YAML syntax error: a second YAML document ('---'): "
                                      "the file must hold one (one per file)"),
    (None, ["--set", "name=" + "[" * 600 + "]" * 600], "value is not valid YAML: collections "
                                                       "nested too deeply"),
    # a newline or escape in a flag is shown escaped, on one line with its reason; in a
    # name it is refused (YAML would fold a newline to a space)
    (None, ["--set", "workload.num_requests=2\n0"],
     "--set workload.num_requests=2\\n0: a control character (newline, tab, escape) in the "
     "flag; give the key and value on one line, printable characters only"),
    (None, ["--set", "name=a\x1b[31mred"], "--set name=a\\x1b[31mred: a control character"),
    # a top-level key YAML reads as a number or null: its line, as for an unknown key
    (SCENARIO + "1: foo\n", [], "s.yaml:14: key 1 is not text: keys are names (allowed: "),
    (SCENARIO + "~: foo\n", [], "s.yaml:14: key null is not text: keys are names"),
    (None, ["--set", "sim.replications=5000"],
     "--set sim.replications=5000: Input should be less than or equal to 1000"),
    (None, ["--set", "engine.max_num_seqs=16", "--set", "engine. max_num_seqs=32"],
     "--set engine. max_num_seqs=32: engine.max_num_seqs is already set by --set "
     "engine.max_num_seqs=16"),
    # past one node of 8 the projection would price an all-reduce over NVLink
    (None, ["--set", "hardware.tensor_parallel=16", "--set", "model=llama-3.1-70b"],
     "--set hardware.tensor_parallel=16: 16 GPUs span more than one node of 8"),
]


@pytest.mark.parametrize("text,args,fragment", BAD_CASES)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, text, args,
                                                          fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,oops,16\n")
    (tmp_path / "late.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:45.0,20,16\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- name: p\n- device: cpu\n")
    p = tmp_path / "s.yaml"
    p.write_text(text if text is not None else SCENARIO)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", p, "--out", out, "--quiet", *args)
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servesim: error:"), stderr
    assert fragment.replace("{d}", str(tmp_path)) in lines[0]
    assert "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.parametrize("where", ["scenario", "out"])
def test_an_argument_that_is_not_utf8_is_refused_before_the_run(scen, tmp_path, where):
    # a Latin-1 byte in a file name is refused before the run, since the report could not
    # be written after it
    bad = os.fsencode(tmp_path) + b"/bad\xffname"
    if where == "scenario":
        Path(os.fsdecode(bad + b".yaml")).write_text(SCENARIO)
        args = [b"run", bad + b".yaml", b"--out", os.fsencode(tmp_path / "o")]
    else:
        args = [b"run", os.fsencode(scen), b"--out", bad]
    r = subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True,
                       timeout=300)
    shown = (bad + (b".yaml" if where == "scenario" else b"")).decode("utf-8",
                                                                      "backslashreplace")
    shown = shown if where == "scenario" else f"--out {shown}"   # the flag it is for
    assert r.returncode == 2
    assert r.stderr.decode().splitlines() == [
        f"servesim: error: {shown}: not UTF-8 (byte 0xff at character "
        f"{len(os.fsencode(tmp_path)) + 5}); give file names and values in UTF-8 (the "
        f"reports name them in UTF-8 files)"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["small.yaml"] + ([os.fsdecode(bad + b".yaml")[len(str(tmp_path)) + 1:]]
                          if where == "scenario" else []))


def test_missing_scenario_file_and_bad_flag(tmp_path):
    code, _, err = run_cli("run", tmp_path / "nope.yaml")
    assert code == 2 and "nope.yaml" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("run", tmp_path / "nope.yaml", "--replications", "x")
    assert code == 2 and "Traceback" not in err


@pytest.mark.parametrize("argv, expected", [
    (["run", "s.yaml", "--bogus", "1"],
     "servesim: error: unrecognized arguments: --bogus 1 (see servesim run --help)"),
    (["plan", "s.yaml", "--nope"],
     "servesim: error: unrecognized arguments: --nope (see servesim plan --help)"),
    # a scenario key written as vLLM's flag: said with how --set takes it
    (["run", "s.yaml", "--max-num-seqs", "64"],
     "servesim: error: unrecognized arguments: --max-num-seqs 64; the scenario key "
     "engine.max_num_seqs is set with --set engine.max_num_seqs=64 (see servesim run --help)"),
    (["validate", "--seed=3"],
     "servesim: error: unrecognized arguments: --seed=3; the scenario key workload.seed is "
     "set with --set workload.seed=3 (see servesim validate --help)"),
    (["sweep", "s.yaml", "--block_size"],
     "servesim: error: unrecognized arguments: --block_size; the scenario key "
     "engine.block_size is set with --set engine.block_size=VALUE (see servesim sweep --help)"),
    # vLLM's flags of other names, booleans without a value, several at once
    (["run", "s.yaml", "-tp", "2", "--no-enable-prefix-caching"],
     "servesim: error: unrecognized arguments: -tp 2 --no-enable-prefix-caching; the "
     "scenario keys hardware.tensor_parallel and engine.enable_prefix_caching are set with "
     "--set hardware.tensor_parallel=2 --set engine.enable_prefix_caching=false (see "
     "servesim run --help)"),
    (["sweep", "s.yaml", "--enable-chunked-prefill", "--num-prompts=200", "--seed", "-1"],
     "servesim: error: unrecognized arguments: --enable-chunked-prefill --num-prompts=200 "
     "--seed=-1; the scenario keys engine.enable_chunked_prefill, workload.num_requests "
     "and workload.seed are set with --set engine.enable_chunked_prefill=true --set "
     "workload.num_requests=200 --set workload.seed=-1 (see servesim sweep --help)"),
    (["profiles", "--seed", "3"],   # no --set here: nothing to suggest
     "servesim: error: unrecognized arguments: --seed 3 (see servesim profiles --help)"),
    # a space for the = of --set: said with how --set takes its value
    (["run", "s.yaml", "--set", "engine.max_num_seqs", "64"],
     "servesim: error: --set engine.max_num_seqs 64: --set takes KEY=VALUE "
     "(--set engine.max_num_seqs=64) (see servesim run --help)"),
    (["sweep", "s.yaml", "--set", "a=1", "--set", "workload.arrival.rate", "1,2"],
     "servesim: error: --set workload.arrival.rate 1,2: --set takes KEY=VALUE "
     "(--set workload.arrival.rate=1,2) (see servesim sweep --help)"),
    # a flag's value that is no number: what the flag takes, from its help
    (["run", "s.yaml", "--replications", "1e9"],
     "servesim: error: --replications: '1e9' is not a whole number in digits — its help: "
     "override sim.replications (1 to 1000) (see servesim run --help)"),
    (["plan", "s.yaml", "--target-rate", "fast"],
     "servesim: error: --target-rate: 'fast' is not a number — its help: requests/s, "
     "> 0 and at most 1e9 (default plan.target_rate) (see servesim plan --help)"),
    (["validate", "s.yaml", "--saturation-requests", "1.5"],
     "servesim: error: --saturation-requests: '1.5' is not a whole number in digits — "
     "its help: burst size of the saturation run, 5 to 100000 (default 4 × "
     "max_num_seqs) (see servesim validate --help)"),
])
def test_an_unknown_flag_names_its_commands_help(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [expected]


def test_version_is_pyprojects():
    tomllib = pytest.importorskip("tomllib")   # Python >= 3.11

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"servesim {version}"


def test_schema_prints_json_schema():
    code, out, _ = run_cli("schema")
    assert code == 0
    schema = json.loads(out)
    assert "engine" in schema["properties"] and "workload" in schema["properties"]


@pytest.mark.parametrize("command", ["run", "schema"])
def test_a_reader_gone_ends_the_command_with_status_0(scen, tmp_path, command):
    # `servesim run ... | head -1`: the command exits 0 and keeps the warnings after the
    # tables, as plain prints do (rich's console alone would exit 1). The pipe's read end
    # is closed before the command writes, so its first line meets EPIPE.
    read, write = os.pipe()
    os.close(read)
    args = ["run", scen, "--out", tmp_path / "o"] if command == "run" else ["schema"]
    try:
        r = subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    # stderr as a run read to the end says it (its warnings), and nothing else
    code, _, err = run_cli(*args[:2], "--out", tmp_path / "o2") if command == "run" else (
        0, "", "")
    assert (r.returncode, r.stderr) == (0, err) and code == 0
    if command == "run":
        assert "servesim: warning: " in err   # the case this test is for
        assert (tmp_path / "o" / "summary.json").is_file()


def test_run_says_why_rejected_requests_fail_the_slo(tmp_path, capsys):
    # fixed 600-token prompts over max_model_len 512: every request is rejected
    y = tmp_path / "r.yaml"
    y.write_text("""model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 7
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 600}
  output_tokens: {dist: fixed, value: 4}
slo: {ttft_ms: {p99: 500}}
""")
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("7 requests rejected: prompt too long for max_model_len 512; they count as "
            "SLO failures") in out
    assert main(["run", str(y), "--out", str(tmp_path / "one"), "--quiet", "--set",
                 "workload.num_requests=1"]) == 0
    assert ("1 request rejected: prompt too long for max_model_len 512; it counts as an SLO "
            "failure") in " ".join(capsys.readouterr().out.split())
    assert (json.loads((tmp_path / "one" / "diagnosis.json").read_text())["findings"][0]
            ["evidence"].startswith("1 request rejected: prompt too long"))
    md = (tmp_path / "o" / "report.md").read_text()
    assert "No request got a first token: no TTFT to split. Binding limit: **prompts too long" \
        in md and "Queueing is" not in md
    # a default max_model_len capped to the cache: (9 blocks - null block) x 16 = 128 tokens
    y.write_text(y.read_text().replace("max_model_len: 512", "num_gpu_blocks: 9"))
    assert main(["run", str(y), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    default = load_scenario(y).model_shape.max_position_embeddings
    assert (f"7 requests rejected: prompt too long for max_model_len 128 (the default, "
            f"{default}, capped to what the KV cache holds, as vLLM's --max-model-len auto "
            f"does; left unset, vLLM would refuse to start); they count") in out
    # with nothing rejected the cap is said all the same (vLLM would not start unless told)
    y.write_text(y.read_text().replace("value: 600", "value: 100"))
    assert main(["run", str(y), "--out", str(tmp_path / "d"), "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "requests rejected" not in cap.out
    note, tail = cap.err.splitlines()
    assert note == (f"servesim: note: max_model_len 128 (the default, {default}, capped "
                    f"to what the KV cache holds, as vLLM's --max-model-len auto does; "
                    f"left unset, vLLM would refuse to start)")
    # 7 requests: p99 is interpolated between the 2nd and 1st largest (0.99 × 6 = 5.94)
    assert tail.startswith("servesim: warning: the p99 figures rest on 7 requests (their 2 "
                           "slowest set them)")


def test_run_warns_of_more_kv_blocks_than_the_gpu_holds(scen, tmp_path, capsys):
    # llama-3.1-8b on one H100 at 0.92 holds 29122 blocks with max_num_seqs 64 (test_cost_model's
    # by-hand case, where the forward's reserve, 8192 x 2 x 61440 bytes, outgrows the
    # sampler's 64 rows: 8192 x 2 x 4096 + 38.4 x 64 x 128256)
    assert main(["run", str(scen), "--out", str(tmp_path / "o"), "--quiet",
                 "--set", "engine.num_gpu_blocks=60000"]) == 0
    err = capsys.readouterr().err
    assert ("servesim: warning: engine.num_gpu_blocks = 60000 (set with --set "
            "engine.num_gpu_blocks=60000) is more than the 29122 blocks that h100-sxm's "
            "memory holds") in err
    assert "more than the 29122 blocks" in (tmp_path / "o" / "report.md").read_text()


def test_run_counts_outputs_cut_at_max_model_len(tmp_path, capsys):
    # 500-token prompts under max_model_len 512: 12 output tokens fit exactly; 13 are cut
    # to 12 (vLLM's server lowers max_tokens to max_model_len - prompt, as its engine cuts)
    y = tmp_path / "c.yaml"
    text = """model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 4, max_model_len: 512}
workload:
  num_requests: 7
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 500}
  output_tokens: {dist: fixed, value: OUT}
"""
    for out_tokens, capped, above in ((12, 0, 0), (13, 7, 0), (513, 7, 7)):
        y.write_text(text.replace("OUT", str(out_tokens)))
        o = tmp_path / f"o{out_tokens}"
        assert main(["run", str(y), "--out", str(o), "--quiet"]) == 0
        said = " ".join(capsys.readouterr().out.split())
        s = json.loads((o / "summary.json").read_text())
        assert (s["capped"], s["capped_above_max_model_len"], s["completed"],
                s["total_output_tokens"]) == (capped, above, 7, 7 * 12)
        line = "7 requests asked for more output than max_model_len leaves after their prompt"
        assert (line in said) == bool(capped)
        assert (line in (o / "report.md").read_text()) == bool(capped)
        # a max_tokens past max_model_len itself: vLLM's server refuses it (HTTP 400)
        refused = "7 of them asked for more than max_model_len itself"
        assert (refused in said) == bool(above)
        assert (refused in (o / "report.md").read_text()) == bool(above)


POISSON_SCENARIO = """name: p
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
workload:
  num_requests: 20
  arrival: {process: poisson, rate: 50}
  prompt_tokens: {dist: uniform, min: 10, max: 300}
  output_tokens: {dist: fixed, value: 5}
"""

TRACE_SCENARIO = """name: tr
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
workload:
  trace:
    path: t.csv
    format: csv
    columns: {arrival: at, prompt_tokens: p, output_tokens: o}
    time_scale: 1.0
    window_s: [0, 100]
"""


def test_a_warm_up_that_leaves_none_of_a_trace_is_refused(tmp_path, capsys):
    # a trace's request count is known only once it is read: 3 rows, warm-up 3
    (tmp_path / "t.csv").write_text("at,p,o\n0,10,5\n1,20,5\n2,30,5\n")
    (tmp_path / "tr.yaml").write_text(TRACE_SCENARIO)
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "tr.yaml"), "--set", "sim.warmup_requests=3",
                 "--out", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: --set sim.warmup_requests=3: 3 leaves none of the 3 requests of "
        "the trace to measure: must be < 3\n")
    assert not out.exists()
    assert main(["run", str(tmp_path / "tr.yaml"), "--set", "sim.warmup_requests=2",
                 "--out", str(out), "--quiet"]) == 0


def test_a_trace_shorter_than_num_requests_says_so(tmp_path, capsys):
    # 4 rows, window [0, 100) keeps 3 (the one at 150 s is outside), warm-up 1
    (tmp_path / "t.csv").write_text("at,p,o\n0,10,5\n1,20,5\n2,30,5\n150,40,5\n")
    (tmp_path / "tr.yaml").write_text(TRACE_SCENARIO)
    for n, note in ((10, True), (3, False), (2, False)):
        out = tmp_path / f"o{n}"
        assert main(["run", str(tmp_path / "tr.yaml"), "--set", f"workload.num_requests={n}",
                     "--set", "sim.warmup_requests=1", "--out", str(out), "--quiet"]) == 0
        err = capsys.readouterr().err
        # a run of 3 requests is also warned of as too short for a p99: said last, and
        # for a trace (deterministic: replications would repeat it) with its own advice
        assert err.endswith("a longer trace (or a wider workload.trace.window_s) steadies "
                            "them\n")
        err = "".join(x for x in err.splitlines(True) if "p99 figures rest on" not in x)
        md = " ".join((out / "report.md").read_text().split())
        served = min(n, 3)
        assert f"trace t.csv (csv), {served} requests" in md
        text = ("workload.num_requests is 10, but the trace (within workload.trace.window_s) "
                "has only 3 requests: the run takes all of them")
        assert (err == f"servesim: note: {text}\n") == note and (text in md) == note
        assert json.loads((out / "summary.json").read_text())["num_requests"] == served - 1
    # compare serves the first plan's trace through every plan: said there too
    (tmp_path / "b.yaml").write_text("name: b\nmodel: llama-test\nhardware: {step_time: "
                                     "{constant_s: 0.02}}\n")
    assert main(["compare", str(tmp_path / "tr.yaml"), str(tmp_path / "b.yaml"), "--set",
                 "workload.num_requests=10", "--executor", "serial", "--out",
                 str(tmp_path / "c"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("servesim: note: workload.num_requests is 10, but the trace (within "
                       "workload.trace.window_s) has only 3 requests: the run takes all of them")
    # and, as run says it, that 3 requests make no p99
    assert err[:-1] == [next(line for line in err if line.startswith(
        "servesim: warning: every plan: the p99 figures rest on 3 requests"))]


def test_replications_of_a_trace_are_said_to_be_identical(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("at,p,o\n0,10,5\n1,20,5\n2,30,5\n")
    (tmp_path / "tr.yaml").write_text(TRACE_SCENARIO)
    (tmp_path / "p.yaml").write_text(POISSON_SCENARIO)
    for name, same in (("tr", True), ("p", False)):
        o = tmp_path / f"o_{name}"
        assert main(["run", str(tmp_path / f"{name}.yaml"), "--out", str(o), "--quiet",
                     "--replications", "3"]) == 0
        said = " ".join(capsys.readouterr().out.split())
        rep = json.loads((o / "replications.json").read_text())
        lo, hi = rep["e2el_ms"]["p50"]["ci95"]
        assert (lo == hi) == same   # the trace's three runs are one run three times
        text = "Every replication gave the same figures"
        assert (text in said) == same and (text in (o / "report.md").read_text()) == same
    from fnmatch import fnmatch

    from simulator.files import REPORT_FILES
    names = {f.name for f in (tmp_path / "o_p").iterdir()}   # every file a run writes
    assert {"replications.json", "diagnosis.json"} <= names
    assert all(any(fnmatch(n, pat) for pat in REPORT_FILES["run"]) for n in names), names


def test_replications_report_each_slo_statistic_and_how_many_met_them(tmp_path, capsys):
    from simulator.run import simulate

    y = tmp_path / "p.yaml"
    for bound, met_in in (("1000000", 2), ("0.001", 0)):
        y.write_text(POISSON_SCENARIO + f"slo: {{ttft_ms: {{p99.9: {bound}}}}}\n")
        o = tmp_path / f"o{met_in}"
        assert main(["run", str(y), "--out", str(o), "--quiet", "--replications", "2"]) == 0
        said = " ".join(capsys.readouterr().out.split())
        rep = json.loads((o / "replications.json").read_text())
        assert rep["slo_met"] == {"met_in": met_in, "n": 2}
        assert "seed" not in rep and "replication" not in rep   # labels, not figures
        assert f"SLOs met in {met_in} of 2 replications." in said
        assert f"SLOs met in {met_in} of 2 replications." in (o / "report.md").read_text()
    # the statistic's row: the mean over the two replications, each rerun alone here
    sc = load_scenario(y)
    values = [simulate(sc, replication=k).summary["ttft_ms"]["p99.9"] for k in (0, 1)]
    assert rep["slo"]["ttft_ms"]["p99.9"]["value"]["mean"] == pytest.approx(
        sum(values) / 2, rel=1e-5)
    assert "SLO ttft_ms.p99.9 (≤ 0.001)" in said


def _without_read_permission() -> list[str] | None:
    """A command prefix under which a chmod 000 file cannot be read: none for a user, root
    without its file-permission override (setpriv); None when that cannot be had."""
    if os.geteuid() != 0:
        return []
    if not Path("/usr/bin/setpriv").exists():
        return None
    caps = "-dac_override,-dac_read_search"
    return ["/usr/bin/setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("data, workload", [
    ("t.csv", "trace: {path: d, format: csv, columns: {arrival: at, prompt_tokens: p, "
              "output_tokens: o}}"),
    ("t.jsonl", "trace: {path: d, format: jsonl, columns: {arrival: at, prompt_tokens: p, "
                "output_tokens: o}}"),
    ("e.csv", "num_requests: 5\n  arrival: {process: poisson, rate: 5}\n  "
              "prompt_tokens: {dist: empirical, path: d, column: p}\n  "
              "output_tokens: {dist: fixed, value: 4}"),
])
def test_a_data_file_that_cannot_be_read_is_one_error_line(tmp_path, data, workload):
    prefix = _without_read_permission()
    if prefix is None:
        pytest.skip("running as root without setpriv: every file is readable")
    f = tmp_path / data
    f.write_text('{"at": 0, "p": 10, "o": 5}\n' if data.endswith(".jsonl") else
                 "at,p,o\n0,10,5\n")
    f.chmod(0)
    (tmp_path / "s.yaml").write_text("name: s\nmodel: llama-test\nhardware: {step_time: "
                                     "{constant_s: 0.01}}\nworkload:\n  "
                                     + workload.replace("path: d", f"path: {data}") + "\n")
    r = subprocess.run([*prefix, sys.executable, "-m", "simulator.cli", "run", "s.yaml",
                        "--quiet", "--out", "o"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert (r.returncode, r.stderr) == (2, f"servesim: error: {data}: cannot read: "
                                           f"Permission denied\n")
    assert not (tmp_path / "o").exists()


# the data file is named relative to the current folder (tmp_path), as the user types it
@pytest.mark.parametrize("old,new,args,expected", [
    ("path: t.csv", "path: gone.csv", [], "tr.yaml:6: workload.trace.path: gone.csv: "
                                          "file not found"),
    (None, None, ["--set", "workload.trace.path=gone.csv"],
     "--set workload.trace.path=gone.csv: gone.csv: file not found"),
    ("time_scale: 1.0", "time_scale: 1e300", [],
     "tr.yaml:9: workload.trace.time_scale: 1e+300 scales the last arrival of t.csv "
     "(2 s after the first) beyond 4.6e9 s"),
    ("window_s: [0, 100]", "window_s: [50, 100]", [],
     "tr.yaml:10: workload.trace.window_s: [50, 100) keeps no request of t.csv"),
    # the flag the empty window follows from is named beside the file's line
    ("window_s: [0, 100]", "window_s: [50, 100]", ["--set", "workload.trace.time_scale=0.5"],
     "tr.yaml:10 (with --set workload.trace.time_scale=0.5): workload.trace.window_s: "
     "[50, 100) keeps no request"),
    (None, None, ["--set", "workload.trace.window_s=[50, 100]"],
     "--set workload.trace.window_s=[50, 100]: [50, 100) keeps no request"),
])
def test_trace_errors_found_while_loading_name_the_key_line(tmp_path, capsys, monkeypatch,
                                                            old, new, args, expected):
    monkeypatch.chdir(tmp_path)   # where a path typed in a flag is relative to
    (tmp_path / "t.csv").write_text("at,p,o\n0,10,5\n1,20,5\n2,30,5\n")
    p = tmp_path / "tr.yaml"
    p.write_text(TRACE_SCENARIO if old is None else TRACE_SCENARIO.replace(old, new))
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out), "--quiet", *args]) == 2
    msg = capsys.readouterr().err.strip()
    assert msg.startswith("servesim: error: " + expected), msg
    assert not out.exists()


@pytest.mark.parametrize("command,hint", [
    ("run", "servesim run takes one value per key: to run each of 4,8 use servesim sweep"),
    ("plan", "servesim plan takes one value per key: to run each of 4,8 use servesim sweep, "
             "or list them in plan.candidates"),
])
def test_a_comma_list_given_to_run_or_plan_points_to_sweep(scen, tmp_path, capsys, command,
                                                           hint):
    out = tmp_path / "out"
    assert main([command, str(scen), "--set", "workload.arrival.rate=4,8", "--out", str(out),
                 "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "servesim: error: --set workload.arrival.rate=4,8: Input should be a valid number > 0 and "
        f"<= 1000000000 (got '4,8'); {hint}"]
    assert not out.exists()
    # a bracketed list of numbers where one number goes: the same hint, values as sweep
    # writes them
    assert main([command, str(scen), "--set", "workload.arrival.rate=[4, 8.5]", "--out",
                 str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: --set workload.arrival.rate=[4, 8.5]: Input should be a valid "
        f"number > 0 and <= 1000000000 (got [4, 8.5]); {hint.replace('4,8', '4,8.5')}")
    # a mapping where one number goes: the schema's own word, no hint
    assert main([command, str(scen), "--set", "workload.arrival.rate={a: 1}", "--out",
                 str(out), "--quiet"]) == 2
    assert "servesim sweep" not in capsys.readouterr().err
    # a value that is not YAML, commas or not: its own error, no hint
    assert main([command, str(scen), "--set", "workload.arrival.rate=&a [4, *a]", "--out",
                 str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: --set workload.arrival.rate=&a [4, *a]: value is not valid YAML: "
        "the alias *a is inside its own anchor &a: the value would contain itself")


def test_a_bracketed_list_given_to_sweep_is_written_without_brackets(scen, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["sweep", str(scen), "--set", "workload.arrival.rate=[4,8]", "--out",
                 str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: --set workload.arrival.rate=[4,8]: Input should be a valid number "
        "> 0 and <= 1000000000 (got [4, 8]); sweep values are written without brackets: "
        "workload.arrival.rate=4,8")
    assert not out.exists()


@pytest.mark.parametrize("values", ["1.5e3,2", "2,1.5e3"])
def test_a_refused_swept_value_is_named_as_typed(scen, tmp_path, capsys, values):
    # first point (the sweep's base) or a later one: the flag as typed, not 1500.0
    out = tmp_path / "out"
    assert main(["sweep", str(scen), "--set", f"engine.max_num_seqs={values}", "--out",
                 str(out), "--quiet"]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: --set engine.max_num_seqs=1.5e3: Input should be a valid integer "
        ">= 1 and <= 1000000000 (got 1500.0: write 1500, without a point or exponent)")
    assert not out.exists()


def test_a_mapping_a_flag_creates_is_the_flags_in_errors(scen, tmp_path, capsys):
    # the file has no workload.trace: the flag made it, so its missing path is the flag's
    out = tmp_path / "out"
    assert main(["run", str(scen), "--set", "workload.trace.time_scale=2", "--out", str(out),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "servesim: error: --set workload.trace.time_scale=2: workload.trace: required "
        "keys missing: path, format")
    assert err.endswith("format (the file has no workload.trace; this flag makes one)")


@pytest.mark.parametrize("argv,expected", [
    (["--loads", "-0.3,0.6"], ["--loads=-0.3,0.6"]),
    (["--target-rate", "-.5", "--quiet"], ["--target-rate=-.5", "--quiet"]),
    (["--set", "x=-1", "--out", "-o"], ["--set", "x=-1", "--out", "-o"]),   # not numbers
    (["--a=1", "-2"], ["--a=1", "-2"]),
])
def test_a_value_that_starts_with_a_dash_is_attached_to_its_option(argv, expected):
    from simulator.cli import _attach_dash_values
    assert _attach_dash_values(argv) == expected


def test_a_negative_load_list_reaches_validates_own_check(scen, capsys):
    assert main(["validate", "--scenario", str(scen), "--loads", "-0.3,0.6"]) == 2
    assert capsys.readouterr().err.strip() == (
        "servesim: error: --loads: fractions of saturation in [0.01, 1.5], got -0.3,0.6")


def test_unknown_profile_names_a_servesim_profiles_folder_that_does_not_exist(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SERVESIM_PROFILES", str(tmp_path / "no-such-dir"))
    out = tmp_path / "out"
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    assert main(["run", str(scenario), "--set", "hardware.profile=nope", "--out", str(out),
                 "--quiet"]) == 2
    msg = capsys.readouterr().err.strip()
    assert msg.startswith("servesim: error: --set hardware.profile=nope: 'nope' is neither a "
                          "catalog GPU"), msg
    assert msg.endswith(f"; $SERVESIM_PROFILES names folders that do not exist: "
                        f"{tmp_path / 'no-such-dir'}") and "\n" not in msg
    assert not out.exists()


@pytest.mark.parametrize("step_time, words", [
    # 1e10 s is 1e19 ns, past int64; 1e300 s/token overflows float → int
    ("{constant_s: 1e10}", "one engine step was priced at 1e+10 s (inline: constant "),
    ("{per_prefill_token_s: 1e300}", "a step may take at most 3600 s"),
    ("{constant_s: .nan}", "hardware.step_time.constant_s: Input should be a finite number"),
    ("{base_s: .inf}", "hardware.step_time.base_s: Input should be a finite number"),
])
def test_an_absurd_step_time_is_one_error(scen, tmp_path, capsys, step_time, words):
    out = tmp_path / "out"
    assert main(["run", str(scen), "--set", "hardware.profile=null", "--set",
                 f"hardware.step_time={step_time}", "--set", "workload.num_requests=20",
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    # the flag that set the step time is named (the error is the scenario's, not the run's)
    assert err[0].startswith(f"servesim: error: --set hardware.step_time={step_time}: "), err
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["run", "{s}"], ["sweep", "{s}", "--set", "workload.num_requests=10,20"], ["plan", "{s}"],
    ["compare", "{s}", "{t}"], ["validate", "{s}"]])
def test_an_empty_out_is_refused_by_every_command(scen, tmp_path, capsys, monkeypatch, argv):
    # "" would be the current folder: every command refuses it
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.yaml").write_text(scen.read_text().replace("name: small", "name: other"))
    assert main([a.format(s=scen, t=tmp_path / "t.yaml") for a in argv] + ["--out", " "]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("servesim: error: --out: empty path"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml", "t.yaml"]


@pytest.mark.parametrize("argv, folder", [
    (["run", "{s}"], "reports/<name>: it must be one folder name (no '/' or '\\', not '.' "
                     "or '..')"),
    (["sweep", "{s}", "--set", "workload.num_requests=10,20"],
     "reports/<name>-sweep: it must be one folder name (no '/' or '\\')"),
    (["plan", "{s}"], "reports/<name>-plan: it must be one folder name (no '/' or '\\')")])
def test_a_name_with_a_slash_is_refused_only_as_the_default_folder(scen, tmp_path, capsys,
                                                                    monkeypatch, argv, folder):
    # a model id as the name: without --out it would name the folder reports/<name>
    monkeypatch.chdir(tmp_path)
    scen.write_text(scen.read_text().replace("name: small", "name: meta-llama/Llama-3.1-8B"))
    assert main([a.format(s=scen) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"servesim: error: small.yaml:2: name: 'meta-llama/Llama-3.1-8B' cannot "
                   f"name the default output folder {folder}; give --out, or another name"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]
    # with --out the name is the report's title only
    if argv[0] == "run":
        scen.write_text(scen.read_text().replace("num_requests: 300", "num_requests: 20"))
        assert main([a.format(s=scen) for a in argv] + ["--out", "o", "--quiet"]) == 0
        assert "# meta-llama/Llama-3.1-8B" in (tmp_path / "o" / "report.md").read_text()


def test_compare_with_a_bad_step_time_is_one_line_without_its_note(scen, tmp_path, capsys):
    # the runs' error is the one line: no note of the first plan's workload before it
    other = tmp_path / "t.yaml"
    other.write_text(scen.read_text().replace("name: small", "name: other")
                     .replace("num_requests: 300", "num_requests: 30"))
    out = tmp_path / "out"
    assert main(["compare", str(scen), str(other), "--set", "hardware.profile=null", "--set",
                 "hardware.step_time={constant_s: 1e10}", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one engine step was priced at 1e+10 s" in err[0], err
    assert not out.exists()
    # set in one plan's file: that file and line are named
    other.write_text(other.read_text().replace("hardware: {profile: h100-sxm}",
                                               "hardware: {step_time: {constant_s: 1e10}}"))
    assert main(["compare", str(scen), str(other), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["servesim: error: t.yaml:4: hardware.step_time: one engine step was priced "
                   "at 1e+10 s (inline: constant 1e+13 ms/step); a step may take at most "
                   "3600 s: check the step time's coefficients"], err
    assert not out.exists()


def test_a_huge_value_is_cut_in_the_error_line(scen, capsys):
    # a 5,000-digit value is echoed by the flag prefix; the line shows 60 characters of it
    # and its length (5,023 = "workload.arrival.rate=" and the digits), keeping the colon
    flag = "workload.arrival.rate=" + "9" * 5000
    assert main(["run", str(scen), "--set", flag]) == 2
    err = capsys.readouterr().err
    assert err == ("servesim: error: --set " + flag[:60] + "… (5,023 characters): value is "
                   "not valid YAML: an integer of 5000 digits (no setting needs one that "
                   "long)\n")
    with pytest.raises(SystemExit) as e:   # argparse's own errors too
        main(["run", str(scen), "--bogus", "x" * 300])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("servesim: error: unrecognized arguments: --bogus "
                                       + "x" * 60 + "… (300 characters) (see servesim run "
                                       "--help)\n")


@pytest.mark.parametrize("argv,flag", [
    (["run", "S", "--out", "a", "--out", "b"], "--out"),
    (["run", "S", "--out=a", "--out", "b"], "--out"),
    (["run", "S", "--ou", "a", "--out", "b"], "--ou"),   # no abbreviations: unrecognized
    (["sweep", "S", "--set", "engine.max_num_seqs=4,8", "--replications", "2",
      "--replications=3"], "--replications"),
    (["plan", "S", "--target-rate", "5", "--target-rate", "6"], "--target-rate"),
])
def test_a_value_flag_given_twice_is_refused(tmp_path, capsys, argv, flag):
    # argparse would keep the last one silently; --set (a list) may repeat
    (tmp_path / "s.yaml").write_text(POISSON_SCENARIO)
    argv = [str(tmp_path / "s.yaml") if a == "S" else
            str(tmp_path / a) if a in ("a", "b") else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servesim: error: unrecognized arguments: {flag} " if flag == "--ou"
                          else f"servesim: error: {flag} is given 2 times; give it once")
    assert err.count("\n") == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_run_and_sweep_warn_of_a_prefix_that_swallows_the_prompts(tmp_path, capsys):
    # 8-token prompts under a 16-token shared prefix: every prompt is the prefix + 1 token
    y = tmp_path / "p.yaml"
    y.write_text("""model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_model_len: 256}
workload:
  num_requests: 20
  arrival: {process: poisson, rate: 5}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 2}
  prefix: {shared_tokens: 16}
""")
    want = ("servesim: warning: workload.prefix.shared_tokens (16) is as long as the whole "
            "prompt or longer in 100% of the prompt_tokens drawn (they count the prefix too): "
            "those prompts are 17 tokens")
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert capsys.readouterr().err.startswith(want)
    assert main(["sweep", str(y), "--set", "workload.arrival.rate=5,10", "--executor",
                 "serial", "--out", str(tmp_path / "s"), "--quiet"]) == 0
    assert capsys.readouterr().err.startswith(want)


def test_a_run_says_when_it_is_unstable(tmp_path, capsys):
    # one request at a time, each a prefill step and 4 decode steps of 20 ms: 10 req/s
    # served, against 20 offered (gaps of 1/20 s from 0.05 s): the sweep flags the point,
    # and run says so too. From the first finish (0.15 s) to the last arrival
    # (50 s): arrivals 3..1000 (998), and a finish every 0.1 s from 0.15 s (499)
    y = tmp_path / "ov.yaml"
    y.write_text("name: ov\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.02}}\n"
                 "engine: {max_num_seqs: 1}\nworkload:\n  num_requests: 1000\n"
                 "  arrival: {process: constant, rate: 20}\n"
                 "  prompt_tokens: {dist: fixed, value: 10}\n"
                 "  output_tokens: {dist: fixed, value: 5}\n")
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    window = 50.0 - 0.15
    said = (f"servesim: warning: the run is unstable: requests arrive faster than they are "
            f"served ({998 / window:.4g} req/s arrived and {499 / window:.4g} req/s finished "
            f"from the first finish to the last arrival) and the queue grows")
    assert said in capsys.readouterr().err
    assert said.removeprefix("servesim: warning: ") in (tmp_path / "o" / "report.md").read_text()
    assert main(["run", str(y), "--set", "workload.arrival.rate=8", "--out",
                 str(tmp_path / "s"), "--quiet"]) == 0   # 8 of 10 req/s: stable
    assert "unstable" not in capsys.readouterr().err
    # a short run may only be filling its batch: it says so rather than call it overload
    assert main(["run", str(y), "--set", "workload.num_requests=300", "--out",
                 str(tmp_path / "short"), "--quiet"]) == 0
    assert "the run reads as unstable (" in capsys.readouterr().err
    # a client limit sends a request only when one comes back: the engine's rates are equal
    # by construction; the queue is at the client, where 20 req/s arrive (999 gaps of 1/20 s)
    # and one goes out per 0.1 s answer
    assert main(["run", str(y), "--set", "workload.max_concurrency=1", "--out",
                 str(tmp_path / "c"), "--quiet"]) == 0
    assert ("the run is unstable: requests arrive faster than they are served (20 req/s "
            "reached the client and 10 req/s went out past workload.max_concurrency)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("command", [
    ["run"], ["sweep", "--set", "workload.arrival.rate=1,2"], ["plan", "--target-rate", "1"],
    ["compare"]])
def test_out_dash_is_refused_not_made_a_folder_named_dash(scen, tmp_path, capsys,
                                                          monkeypatch, command):
    # "-" reads as standard output: refused, not made a folder named "-"
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(scen.read_text().replace("name: small", "name: other"))
    argv = [command[0], str(scen), *([str(other)] if command == ["compare"] else []),
            *command[1:], "--out", "-", "--quiet"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("servesim: error: --out -: standard output takes no "
                                       "report: give a folder (./- names one called -)\n")
    assert not (tmp_path / "-").exists()
    assert main([*argv[:-2], "./-", "--quiet"]) in (0, 1), capsys.readouterr().err
    assert (tmp_path / "-").is_dir()   # a folder named - when asked for


def test_an_out_folder_reached_through_a_new_folder_is_that_folder(scen, tmp_path, capsys):
    # --out new/../r: the report lands in r (no empty `new` left above it), and a report
    # of another command already there is refused before any run, as for --out r
    assert main(["run", str(scen), "--out", str(tmp_path / "new" / ".." / "r"),
                 "--quiet"]) == 0
    assert (tmp_path / "r" / "summary.json").is_file() and not (tmp_path / "new").exists()
    capsys.readouterr()
    assert main(["sweep", str(scen), "--set", "workload.arrival.rate=1,2", "--out",
                 str(tmp_path / "ghost" / ".." / "r"), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"servesim: error: --out {tmp_path / 'r'}: holds a "
                                       f"run report (summary.json); a sweep report there "
                                       f"would mix with it: give another folder\n")
    assert not (tmp_path / "ghost").exists()


def test_a_run_too_large_for_the_machine_says_so_before_it_starts():
    from simulator.run import BYTES_PER_REQUEST, memory_warning

    sc = load_scenario(Path(__file__).parents[1] / "scenarios" / "chat.yaml",
                       ["workload.num_requests=20000000"])
    # 20M requests × 1400 bytes = 26 GiB: more than 24 GiB, most of 40 GiB, half of 64 GiB fits
    said = memory_warning(sc, physical_bytes=24 * 2**30)
    assert said == ("workload.num_requests 20,000,000 needs about 26 GiB of memory (1.4 KiB "
                    "per request), more than this machine's 24 GiB: the run may be killed "
                    "before it ends; tens of thousands of requests already give steady p99s")
    assert 20_000_000 * BYTES_PER_REQUEST / 2**30 == pytest.approx(26.08, abs=0.01)
    assert "most of this machine's 40 GiB" in memory_warning(sc, physical_bytes=40 * 2**30)
    assert memory_warning(sc, physical_bytes=64 * 2**30) is None
    assert memory_warning(load_scenario(Path(__file__).parents[1] / "scenarios" / "chat.yaml")) \
        is None


#: 8 users, 2 slots, one-token answers in 10 ms steps: at 0 s the burst is served two by
#: two (TTFTs 10, 10, 20, 20, 30, 30, 40, 40 ms); then each user returns 100 ms after its
#: answer to an idle engine (TTFT 10 ms). Of 400, the p99 (index 395.01 of the sorted
#: TTFTs: 394 of 10 ms, then 20, 20, 30, ...) is 20.1 ms, set by the burst; 10 without it.
START_BURST_LOOP = """name: cl
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 2}
workload:
  num_requests: 400
  arrival: {process: closed_loop, concurrency: 8, think_time_s: 0.1}
  prompt_tokens: {dist: fixed, value: 8}
  output_tokens: {dist: fixed, value: 1}
"""


def test_a_closed_loop_says_when_its_start_burst_sets_the_ttft_p99(tmp_path, capsys):
    y = tmp_path / "cl.yaml"   # START_BURST_LOOP: its figures worked out above it
    y.write_text(START_BURST_LOOP)
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    said = ("the closed loop's 8 users all send their first request at 0 s, and that burst's "
            "waits set the TTFT p99 (20.1 ms; 10 ms without it): sim.warmup_requests: 8 leaves "
            "it out of the figures, as a steady state (the SLO verdict and the binding limit "
            "count it too)")
    assert f"servesim: warning: {said}" in capsys.readouterr().err
    assert said in (tmp_path / "o" / "report.md").read_text()
    # with the burst left out (or one user: no burst), nothing to say
    for flag in ("sim.warmup_requests=8", "workload.arrival.concurrency=1"):
        assert main(["run", str(y), "--set", flag, "--out", str(tmp_path / flag),
                     "--quiet"]) == 0
        assert "closed loop" not in capsys.readouterr().err


def test_a_run_says_when_its_steps_go_past_the_profiles_calibration_grid(tmp_path, capsys):
    # the shipped CPU profile measured decode batches up to 32 and chunks up to 768 tokens:
    # 64 sequences at once (or 1024-token chunks) are priced by extrapolation: said
    import json

    import pandas as pd
    root = Path(__file__).resolve().parents[1]
    scenario = root / "scenarios" / "cpu_tiny.yaml"
    csv = pd.read_csv(root / "simulator" / "profiles"
                      / "cpu-llama-tiny-56m-bfloat16.measurements.csv", comment="#")
    batch, chunk = int(csv["num_decodes"].max()), int(csv["prefill_tokens"].max())
    assert (batch, chunk) == (32, 768)
    fast = ["--set", "workload.num_requests=200", "--set", "workload.arrival.rate=40"]
    assert main(["run", str(scenario), *fast, "--set", "engine.max_num_seqs=64",
                 "--out", str(tmp_path / "a"), "--quiet"]) == 0
    err = capsys.readouterr().err
    running = json.loads((tmp_path / "a" / "summary.json").read_text())[
        "concurrency"]["running_max_per_replica"]
    assert running > batch
    assert (f"servesim: warning: profile cpu-llama-tiny-56m-bfloat16 prices steps past its "
            f"calibration grid: {running} sequences running at once (decode batches up to "
            f"{batch} were measured), by extrapolating its fitted form") in err
    # its own limits (32 sequences, 512-token chunks) stay inside it
    assert main(["run", str(scenario), *fast, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert "calibration grid" not in capsys.readouterr().err
    # chunks: up to max_num_batched_tokens, no longer than the longest prompt
    assert main(["run", str(scenario), *fast, "--set", "engine.max_num_batched_tokens=4096",
                 "--out", str(tmp_path / "c"), "--quiet"]) == 0
    longest = int(pd.read_csv(tmp_path / "c" / "requests.csv")["prompt_tokens"].max())
    err = capsys.readouterr().err
    assert (f"prefill chunks of up to {min(4096, longest)} tokens (up to {chunk} were "
            f"measured)" in err) == (longest > chunk)
    # a profile whose measurements CSV is gone cannot tell: it says so
    moved = tmp_path / "p.yaml"
    moved.write_text((root / "simulator" / "profiles" / "cpu-llama-tiny-56m-bfloat16.yaml")
                     .read_text().replace("measurements_csv: cpu-llama-tiny-56m-bfloat16.",
                                          "measurements_csv: gone."))
    assert main(["run", str(scenario), *fast, "--set", f"hardware.profile={moved}",
                 "--out", str(tmp_path / "d"), "--quiet"]) == 0
    assert ("names measurements CSV gone.measurements.csv, which cannot be read "
            "(gone.measurements.csv: file not found): whether steps went past "
            "its calibration grid cannot be told" in capsys.readouterr().err)
    # ... nor one whose CSV holds a row edited past a whole number (it was a traceback)
    src = root / "simulator" / "profiles" / "cpu-llama-tiny-56m-bfloat16.measurements.csv"
    lines = src.read_text().splitlines(keepends=True)
    cols = next(ln for ln in lines if not ln.startswith("#")).rstrip("\n").split(",")
    for i, value in enumerate(("1e400", "nan", "-9", "abc", "2.5", None, b"\xff", "3#4")):
        row = lines[-1].rstrip("\n").split(",")
        col = "num_decodes" if i % 2 else "prefill_tokens"
        if isinstance(value, str):
            row[cols.index(col)] = value
        text = "".join(lines[:-1]) + ",".join(row) + "\n"
        if value is None:   # the column line and comments only
            text = "".join(ln for ln in lines if ln.startswith("#")) + ",".join(cols) + "\n"
        (tmp_path / f"e{i}.measurements.csv").write_bytes(
            text.encode() + (value if isinstance(value, bytes) else b""))
        edited = tmp_path / f"e{i}.yaml"
        edited.write_text(moved.read_text().replace("measurements_csv: gone.",
                                                    f"measurements_csv: e{i}."))
        assert main(["run", str(scenario), *fast, "--set", f"hardware.profile={edited}",
                     "--out", str(tmp_path / f"e{i}"), "--quiet"]) == 0
        # the row is named by its file line (the last one)
        why = (f"e{i}.measurements.csv:{len(lines)}: {col} is {value!r}, not a whole number "
               f">= 0" if isinstance(value, str) else f"e{i}.measurements.csv: holds no "
               f"measured step" if value is None else f"e{i}.measurements.csv:{len(lines) + 1}"
               f": not UTF-8 text (byte 0xff at column 1; save the file as UTF-8)")
        assert (f"names measurements CSV e{i}.measurements.csv, which cannot be read "
                f"({why}): whether steps" in capsys.readouterr().err)
    # a row cut off (its two columns whole) or one field too long; a device or a pipe named
    # as the CSV (read, it would never end)
    last, width = lines[-1].rstrip("\n"), len(cols)
    os.mkfifo(tmp_path / "pipe.csv")
    for k, (csv_name, body, why) in enumerate((
            ("cut.measurements.csv", "".join(lines[:-1]) + last[:last.rindex(",")] + "\n",
             f"cut.measurements.csv:{len(lines)}: {width - 1} fields where the column line "
             f"has {width}"),
            ("long.measurements.csv", "".join(lines[:-1]) + last + ",7\n",
             f"long.measurements.csv:{len(lines)}: {width + 1} fields where the column line "
             f"has {width}"),
            ("empty.measurements.csv", "", "empty.measurements.csv: not a measurements CSV "
                                           "(empty)"),
            ("notes.measurements.csv", "# engine: servesim\n", "notes.measurements.csv: not a "
                                       "measurements CSV (no column line, only # lines)"),
            ("/dev/zero", None, "/dev/zero: not a regular file"),
            (str(tmp_path / "pipe.csv"), None, f"{tmp_path / 'pipe.csv'}: not a regular file"))):
        if body is not None:
            (tmp_path / csv_name).write_text(body)
        edited.write_text(moved.read_text().replace("measurements_csv: gone.measurements.csv",
                                                    f"measurements_csv: {csv_name}"))
        assert main(["run", str(scenario), *fast, "--set", f"hardware.profile={edited}",
                     "--out", str(tmp_path / f"w{k}"), "--quiet"]) == 0
        assert f"which cannot be read ({why}): whether" in capsys.readouterr().err


@pytest.mark.parametrize("args, said", [
    (["run", "{scen}", "--replications", "２"], "--replications: '２' is not a number in the "
                                               "digits 0-9 (write 2)"),
    (["plan", "{scen}", "--target-rate", "４０"], "--target-rate: '４０' is not a number in "
                                                "the digits 0-9 (write 40)"),
    (["plan", "{scen}", "--target-rate", "4_0"], "--target-rate: '4_0' is not a number in "
                                                "the digits 0-9 (write 40)"),
    (["sweep", "{scen}", "--workers", "２", "--set", "workload.arrival.rate=1,2"],
     "--workers: '２' is not a number in the digits 0-9 (write 2)"),
])
def test_a_numeric_flag_takes_the_digits_0_9_as_a_scenario_does(scen, tmp_path, capsys, args,
                                                                 said):
    # Python's int() and float() read full-width digits and underscores; YAML does not, so
    # neither does a flag: 40 planned from ４０ would be accepted on the command line only
    out = tmp_path / "o"
    argv = [a.replace("{scen}", str(scen)) for a in args] + ["--out", str(out)]
    with pytest.raises(SystemExit) as e:   # argparse's error, as for any flag
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"servesim: error: {said}"), err
    assert not out.exists()


def test_replication_means_round_once_from_the_exact_figures(tmp_path, capsys):
    # cpu_tiny at 4 req/s, 3 replications: the goodputs 4.0316139, 4.1388863 and 4.1632497
    # req/s average 4.11124997, 4.1112 at the table's 5 figures; their 6-figure summaries
    # (4.03161, 4.13889, 4.16325) average 4.11125, which run showed as 4.1113. The TTFT
    # p99s' mean is 439.525 ms at 6 figures, 439.526 from the summaries.
    from rounding_helpers import exact_means
    from simulator.metrics import round_sig, t_interval
    from simulator.run import simulate

    path = Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml"
    runs = [simulate(load_scenario(path, ["workload.arrival.rate=4"]), replication=k)
            for k in range(3)]

    goodput, ttft = exact_means(runs)   # a case where rounding twice shows
    out = tmp_path / "r"
    assert main(["run", str(path), "--set", "workload.arrival.rate=4", "--replications", "3",
                 "--out", str(out), "--quiet"]) == 0
    cells = [[c.strip() for c in line.split("│")[1:-1]]
             for line in capsys.readouterr().out.splitlines() if line.count("│") == 5]
    assert ["goodput", "4.1112"] in [c[:2] for c in cells]   # the terminal's table
    assert "| goodput | 4.1112 | [" in (out / "report.md").read_text()
    rep = json.loads((out / "replications.json").read_text())
    assert rep["ttft_ms"]["p99"]["mean"] == round_sig(ttft)
    assert rep["goodput"]["mean"] == round_sig(goodput)
    assert rep["goodput"]["ci95"] == [round_sig(x) for x in
                                      t_interval([r.exact["goodput"] for r in runs])]
