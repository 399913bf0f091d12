"""Run outputs: byte-identical summary, atomic writes, self-contained HTML, CLI table."""

import io
import json
import re

import pytest
from rich.console import Console

from simulator import report
from simulator.errors import InputError
from simulator.metrics import MetricsCollector, combine_replications
from simulator.policy import RequestRecord
from simulator.report import FILES, print_summary, write_run_outputs

MS = 1_000_000
EXTRA = {"cost_kind": "projected", "cost_model": "h100-sxm spec sheet",
         "kv_note": "40,000 blocks at gpu_memory_utilization 0.9",
         "prefix_cache_hit_rate": 0.25}


def make_result():
    c = MetricsCollector(num_replicas=2)
    for i in range(6):
        a = i * 20 * MS
        c.record_request(RequestRecord(i, a, a + 5 * MS, a + 40 * MS, a + 140 * MS,
                                       prompt_tokens=100, output_tokens=11, replica=i % 2,
                                       finish_reason="length"))
        c.record_itl(10 * MS, 10)
    c.record_request(RequestRecord(6, 30 * MS, finish_ns=30 * MS, prompt_tokens=10**6,
                                   finish_reason="rejected"))
    for rep in (0, 1):
        for k in range(24):
            c.record_step(rep, k * 10 * MS, (k + 1) * 10 * MS, 50 if k % 4 == 0 else 0,
                          3, 3, 1, 0.2 + 0.01 * k, 0)
    return c.finalize(slo={"ttft_ms": {"p99": 100}, "tpot_ms": {"mean": 5}}, extra=EXTRA)


@pytest.fixture(scope="module")
def result():
    return make_result()


def test_writes_every_file_and_summary_is_byte_identical(tmp_path, result):
    a = write_run_outputs(tmp_path / "a", result, title="t", meta={"seed": 0})
    b = write_run_outputs(tmp_path / "b", make_result(), title="t", meta={"seed": 0})
    assert set(a) == set(FILES.values())
    for name, path in a.items():
        assert path == tmp_path / "a" / name
        assert path.is_file() and path.stat().st_size > 0
    for name in ("summary.json", "requests.csv", "timeseries.csv", "itl_runs.csv",
                 "report.md"):
        assert a[name].read_bytes() == b[name].read_bytes(), name
    text = a["summary.json"].read_text()
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert json.loads(text)["cost_kind"] == "projected"
    # Rewriting into an existing directory replaces the files with the same bytes.
    before = a["summary.json"].read_bytes()
    write_run_outputs(tmp_path / "a", result, title="t", meta={"seed": 0})
    assert a["summary.json"].read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_requests_csv_has_seconds_with_nine_decimals(tmp_path, result):
    paths = write_run_outputs(tmp_path / "o", result, title="t", meta={})
    lines = paths["requests.csv"].read_text().splitlines()
    head = lines[0].split(",")
    assert head[:6] == ["request_id", "arrival_s", "first_scheduled_s", "first_token_s",
                        "finish_s", "prompt_tokens"]
    row = dict(zip(head, lines[2].split(",")))     # request 1, arrival 20 ms
    assert row["arrival_s"] == "0.020000000"
    assert row["finish_s"] == "0.160000000"
    assert float(row["ttft_ms"]) == 40.0


def test_out_dir_that_is_a_file_fails_and_leaves_nothing(tmp_path, result):
    target = tmp_path / "out"
    target.write_text("not a directory")
    # the one folder check (files.check_folder) speaks for every output folder
    with pytest.raises(InputError, match=f"^--out {target}: it is a file, not a folder$"):
        write_run_outputs(target, result, title="t", meta={})
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert target.read_text() == "not a directory"
    with pytest.raises(InputError, match=f"^--out {target}/sub: {target} is a file, not a "
                                         f"folder$"):
        write_run_outputs(target / "sub", result, title="t", meta={})


def test_failure_while_building_leaves_nothing_half_written(tmp_path, result, monkeypatch):
    def broken(_result):
        raise RuntimeError("plot failed")
    monkeypatch.setattr(report, "plot_batch", broken)
    with pytest.raises(RuntimeError):
        write_run_outputs(tmp_path / "new", result, title="t", meta={})
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "summary.json").write_text("previous run")
    with pytest.raises(RuntimeError):
        write_run_outputs(old, result, title="t", meta={})
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert [p.name for p in old.iterdir()] == ["summary.json"]
    assert (old / "summary.json").read_text() == "previous run"


def test_html_is_self_contained_with_embedded_plots(tmp_path, result):
    reps = combine_replications([result.summary, make_result().summary])
    paths = write_run_outputs(tmp_path / "o", result, title="chat <test>",
                              meta={"scenario": "chat"}, replications=reps)
    page = paths["report.html"].read_text()
    assert page.count('src="data:image/png;base64,') == 3
    assert re.findall(r'src="(?!data:)', page) == []
    for external in ("http://", "https://", "<link", "<script", "url("):
        assert external not in page
    assert "chat &lt;test&gt;" in page
    for needed in ("GuideLLM", "genai-perf", "projected", "h100-sxm spec sheet",
                   "40,000 blocks", "95% CI"):
        assert needed in page
    assert json.loads(paths["replications.json"].read_text())["completed"]["n"] == 2


def test_markdown_links_plots_and_labels_figures(tmp_path, result):
    md = write_run_outputs(tmp_path / "o", result, title="t",
                           meta={})["report.md"].read_text()
    for name in ("latency_cdf.png", "timeline.png", "batch.png"):
        assert f"]({name})" in md
    assert "## Latency, ms (projected)" in md
    assert "## Throughput (projected)" in md
    # simulated from a calibration profile: the latencies were not measured, their costs were
    import dataclasses
    measured = dataclasses.replace(result, summary={
        **result.summary, "cost_kind": "measured", "cost_model": "measured: profile p (torch)"})
    md = write_run_outputs(tmp_path / "m", measured, title="t",
                           meta={})["report.md"].read_text()
    assert "## Latency, ms (measured costs)" in md and "(measured)" not in md
    assert "Step costs: **measured: profile p (torch)**" in md
    # SLO table: TTFT p99 = 40 ms met; TPOT mean = 10 ms misses 5 ms.
    assert "| TTFT | p99 | 100 ms | 40 ms | yes |" in md
    assert "| TPOT | mean | 5 ms | 10 ms | no |" in md
    assert "GuideLLM" in md and "genai-perf" in md


def test_print_summary_table(result):
    buf = io.StringIO()
    reps = combine_replications([result.summary, result.summary])
    print_summary(result, console=Console(file=buf, width=120, color_system=None),
                  replications=reps)
    out = buf.getvalue()
    for needed in ("TTFT", "TPOT", "ITL", "E2EL", "goodput", "SLO met", "projected",
                   "Across replications"):
        assert needed in out
    assert "6 / 1" in out          # completed / rejected


@pytest.mark.parametrize("x, sig, text", [
    (16657.3, 5, "16657"), (123456.7, 5, "123457"),   # .5g: 1.2346e+05
    (1871.0, 3, "1871"), (1234.5, 3, "1234"),         # .3g: 1.87e+03, 1.23e+03
    (9.80333, 5, "9.8033"), (0.0123456, 3, "0.0123"), (2.0, 3, "2"), (-2500.0, 3, "-2500"),
    (0.99999999, 3, "1"), (0.0, 3, "0"), (1.5e-7, 3, "1.5e-07"), (float("inf"), 3, "inf"),
])
def test_numbers_print_in_positional_notation(x, sig, text):
    assert report.fmt_number(x, sig) == text


def test_print_summary_names_the_step_cost_source_on_one_line(result):
    buf = io.StringIO()
    s = {**result.summary, "output_throughput": 123456.7,
         "cost_model": "projected: roofline h100-sxm, tensor_parallel=1, default efficiencies "
                       "(MBU 0.7, MFU 0.5)"}
    print_summary(type(result)(**{**vars(result), "summary": s}),
                  console=Console(file=buf, width=120, color_system=None))
    out = buf.getvalue()
    assert out.splitlines()[0] == ("Step costs projected: roofline h100-sxm, tensor_parallel=1, "
                                   "default efficiencies (MBU 0.7, MFU 0.5)")
    assert "Latency, ms (projected)" in out and "123457" in out and "e+" not in out


def test_a_rerun_into_the_same_folder_leaves_no_file_of_the_earlier_run(tmp_path, result):
    out = tmp_path / "out"
    reps = combine_replications([result.summary, result.summary])
    first = write_run_outputs(out, result, title="t", meta={}, replications=reps,
                              diagnosis={"limit": "kv"})
    assert {"replications.json", "diagnosis.json"} <= set(first)
    (out / "notes.txt").write_text("the user's own file")
    second = write_run_outputs(out, result, title="t", meta={})
    assert sorted(p.name for p in out.iterdir()) == sorted([*second, "notes.txt"])
    assert not (out / "replications.json").exists() and not (out / "diagnosis.json").exists()


def test_report_meta_shows_resolved_engine_knobs():
    from simulator.catalog import load_model
    from simulator.run import report_meta
    from simulator.scenario import scenario_from_dict
    sc = scenario_from_dict({"name": "t", "model": "llama-3.1-8b",
                             "hardware": {"profile": "h100-sxm"},
                             "workload": {"num_requests": 2,
                                          "arrival": {"process": "poisson", "rate": 1},
                                          "prompt_tokens": {"dist": "fixed", "value": 8},
                                          "output_tokens": {"dist": "fixed", "value": 2}}})
    engine = report_meta(sc)["engine"]
    # unset in the file: vLLM derives max_model_len from the model, blocks from memory
    assert f"max_model_len={load_model('llama-3.1-8b').max_position_embeddings}" in engine
    assert "num_gpu_blocks=from the KV cache memory" in engine and "None" not in engine


def test_an_existing_out_dir_on_another_filesystem_is_written(tmp_path, result, monkeypatch):
    # A mount point (a volume, a tmpfs) at out: a rename between it and its parent fails
    # with EXDEV, so the files must be staged inside it.
    import errno
    import os
    out = tmp_path / "mnt"
    out.mkdir()

    def inside(p):
        p = os.path.abspath(p)
        return p == str(out) or p.startswith(str(out) + os.sep)

    for name in ("rename", "replace"):
        real = getattr(os, name)

        def move(src, dst, _real=real):
            if inside(src) != inside(dst):
                raise OSError(errno.EXDEV, "Invalid cross-device link")
            return _real(src, dst)
        monkeypatch.setattr(report.os, name, move)
    paths = write_run_outputs(out, result, title="t", meta={})
    assert sorted(p.name for p in out.iterdir()) == sorted(paths)
    assert "summary.json" in paths and "report.html" in paths


def test_a_folder_that_takes_no_file_is_refused_before_any_work(tmp_path, result,
                                                                 monkeypatch):
    from simulator import files

    def read_only(*args, **kwargs):   # root ignores permission bits: say it outright
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr(files.tempfile, "TemporaryFile", read_only)
    with pytest.raises(InputError, match=f"^--out {tmp_path}/new: cannot write there "
                                         r"\(Read-only file system\)$"):
        files.check_folder(tmp_path / "new", "--out")
    with pytest.raises(InputError, match="cannot write there"):
        write_run_outputs(tmp_path / "new", result, title="t", meta={})
    assert list(tmp_path.iterdir()) == []


def test_the_diagnosis_line_names_an_observation_when_nothing_binds():
    # chat.yaml: the terminal names the prefill chunks stalling decodes, as diagnosis.json
    # and the report do, not "none: headroom at this load"
    from simulator.report import diagnosis_line
    stall = {"limit": "prefill_interference", "change": "engine.max_num_batched_tokens=512",
             "evidence": "ITL p99 149 ms is 13.6× its median: prefill chunks stall decodes"}
    bias = {"limit": "router", "evidence": "replica 1 served 60% of the requests"}
    assert diagnosis_line({"binding": "none", "findings": [stall]}) == (
        "Binding limit: none: headroom at this load; observed: ITL p99 149 ms is 13.6× its "
        "median: prefill chunks stall decodes (details: the report's Diagnosis).")
    assert diagnosis_line({"binding": "none", "findings": [stall, bias]}).endswith(
        "prefill chunks stall decodes (and 1 more) (details: the report's Diagnosis).")
    assert diagnosis_line({"binding": "none", "findings": []}) == (
        "Binding limit: none: headroom at this load (details: the report's Diagnosis).")
