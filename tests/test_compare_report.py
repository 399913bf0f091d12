"""``servesim compare``: plans whose max_model_len cuts answers, ties in price, its help and
its warnings, as the terminal, compare.csv and report.md give them."""

import csv

from simulator.cli import main

# 8-token prompts, 5-token answers on one H100 each (every plan costs the same per hour).
PLAN = """name: {name}
model: llama-test
hardware: {{profile: h100-sxm}}
engine: {{max_num_seqs: {seqs}, max_model_len: {max_model_len}}}
workload:
  num_requests: {n}
  arrival: {{process: poisson, rate: 5}}
  prompt_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: 5}}
slo: {{ttft_ms: {{p99: 5000}}}}
"""
N = 40


def plans(tmp_path, *specs):
    """Scenario files of ``(name, max_num_seqs, max_model_len)``."""
    files = []
    for name, seqs, mml in specs:
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(PLAN.format(name=name, seqs=seqs, max_model_len=mml, n=N))
    return [str(f) for f in files]


def compare(tmp_path, files, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *files, "--executor", "serial", "--quiet", "--out",
                 str(out)]) == 0
    got = capsys.readouterr()
    with open(out / "compare.csv", newline="") as f:
        rows = {r["figure"]: r for r in csv.DictReader(f)}
    return got.out, got.err, rows, (out / "report.md").read_text()


def test_a_plan_that_cuts_outputs_is_flagged_and_not_named_cheapest(tmp_path, capsys):
    # max_model_len 12 leaves 12 - 8 = 4 tokens of the 5 each request asks for: all N cut
    files = plans(tmp_path, ("cut", 4, 12), ("whole", 4, 512))
    out, _, rows, md = compare(tmp_path, files, capsys)
    cut = rows["output cut at max_model_len (requests)"]
    assert (cut["cut"], cut["whole"]) == (str(N), "0")
    # every plan meets the SLO at the same price; the first given cuts its answers
    assert (rows["SLO met"]["cut"], rows["SLO met"]["whole"]) == ("True", "True")
    assert rows["cost_per_hour"]["cut"] == rows["cost_per_hour"]["whole"]
    verdict = next(line for line in out.splitlines() if "meeting every SLO" in line)
    assert verdict.startswith("cheapest meeting every SLO: whole (")
    assert "cut meets every SLO only with outputs cut at max_model_len" in verdict
    # the terminal says it as run does, per plan, and shows a column of the count
    assert f"cut: {N} requests asked for more output than max_model_len leaves" in out
    table = {line.split()[0]: line.split() for line in out.splitlines()
             if line.split()[:1] in (["cut"], ["whole"])}
    assert str(N) in table["cut"] and "output" in out.split("plan")[0]
    # report.md: the count, the note, and the SLO verdict qualified
    assert f"| output cut at max_model_len (requests) | {N} | 0 |" in md
    assert "| SLO met | yes (outputs cut) | yes |" in md
    assert f"cut: {N} requests asked for more output than max_model_len" in md


def test_only_plans_that_cut_outputs_meet_the_slos(tmp_path, capsys):
    files = plans(tmp_path, ("cut", 4, 12), ("cut-too", 8, 12))
    out, _, _, _ = compare(tmp_path, files, capsys)
    assert ("no plan meets every SLO with whole outputs: cut, cut-too meet every SLO only "
            "with outputs cut at max_model_len") in out


def test_a_tie_in_price_says_the_first_given_is_named(tmp_path, capsys):
    files = plans(tmp_path, ("four", 4, 512), ("eight", 8, 512))
    out, err, rows, _ = compare(tmp_path, files, capsys)
    assert rows["cost_per_hour"]["four"] == rows["cost_per_hour"]["eight"]
    verdict = next(line for line in out.splitlines() if "meeting every SLO" in line)
    assert verdict.startswith("cheapest meeting every SLO: four (")
    assert "as cheap: eight, the first given is named" in verdict
    # N requests per plan: the p99 warning run gives, once for the plans alike
    p99 = [line for line in err.splitlines() if "p99 figures rest on" in line]
    assert p99 == [line for line in p99 if line.startswith(
        f"servesim: warning: every plan: the p99 figures rest on {N} requests")] and p99


def test_compare_help_gives_the_folder_it_writes_by_default(capsys):
    assert main(["compare", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "output folder (default reports/compare)" in text


def test_a_plan_name_with_a_slash_is_a_title_only(tmp_path, capsys, monkeypatch):
    # a model id as a plan's name: compare writes to reports/compare, no folder of the name
    monkeypatch.chdir(tmp_path)
    files = []
    for i, name in enumerate(["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B"]):
        files.append(tmp_path / f"p{i}.yaml")
        files[-1].write_text(PLAN.format(name=name, seqs=4, max_model_len=512, n=N))
    assert main(["compare", *map(str, files), "--executor", "serial", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "cheapest meeting every SLO: meta-llama/Llama-3.1-8B (" in out
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["compare"]
    with open(tmp_path / "reports" / "compare" / "compare.csv", newline="") as f:
        assert next(csv.reader(f)) == ["figure", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B"]


def test_replication_means_round_once_from_the_exact_figures(tmp_path, capsys):
    # cpu_tiny at 4 req/s, 3 replications: the plan's goodputs average 4.11124997 req/s,
    # 4.1112 at report.md's 5 figures, and its TTFT p99s 439.525 ms at compare.csv's 6;
    # from the 6-figure summaries they were 4.1113 and 439.526
    from pathlib import Path

    from rounding_helpers import exact_means
    from simulator.metrics import round_sig
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    text = (Path(__file__).resolve().parents[1] / "scenarios" / "cpu_tiny.yaml").read_text()
    files = []
    for name, seqs in (("a", 32), ("b", 8)):
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(text.replace("name: cpu-tiny", f"name: {name}")
                             .replace("max_num_seqs: 32", f"max_num_seqs: {seqs}"))
    runs = [simulate(load_scenario(files[0]), replication=k) for k in range(3)]

    goodput, ttft = exact_means(runs)   # a case where rounding twice shows
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, files), "--replications", "3", "--executor", "serial",
                 "--quiet", "--out", str(out)]) == 0
    with open(out / "compare.csv", newline="") as f:
        rows = {r["figure"]: r for r in csv.DictReader(f)}
    assert float(rows["TTFT p99 (ms)"]["a"]) == round_sig(ttft)
    assert float(rows["goodput (req/s)"]["a"]) == round_sig(goodput)
    assert "| goodput (req/s) | 4.1112 [" in (out / "report.md").read_text()
