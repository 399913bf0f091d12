"""Plots of the run, sweep and compare reports: user text drawn as typed, a colour per line
that stays with its plan in every panel, legends that name every plan without covering data."""

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from simulator import report
from simulator.cli import main
from simulator.metrics import MetricsCollector
from simulator.policy import RequestRecord

MS = 1_000_000

# A small plan: 8-token prompts, ``out``-token answers at 7 req/s, one token per 10 ms step.
PLAN = """name: '{name}'
model: llama-test
hardware: {{step_time: {{constant_s: 0.01}}}}
engine: {{max_num_seqs: 4, max_model_len: 512}}
workload:
  num_requests: 40
  arrival: {{process: poisson, rate: 7}}
  prompt_tokens: {{dist: fixed, value: 8}}
  output_tokens: {{dist: fixed, value: {out}}}
"""


def captured(monkeypatch, module=report):
    """The figures ``module._png`` is given, in order (the PNG is still made)."""
    figs = []
    png = module._png

    def keep(fig):
        figs.append(fig)
        return png(fig)
    monkeypatch.setattr(module, "_png", keep)
    return figs


def user_texts(fig) -> list[Text]:
    """Every text of ``fig`` but tick labels and offset texts (matplotlib's own)."""
    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for t in [axis.get_offset_text()] + [
                 label for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                 for label in (tick.label1, tick.label2)]}
    return [t for t in fig.findobj(Text) if id(t) not in ticks]


def one_result(output_tokens: int = 11):
    c = MetricsCollector(num_replicas=1)
    for i in range(6):
        a = i * 20 * MS
        c.record_request(RequestRecord(i, a, a + 5 * MS, a + (40 + i) * MS, a + 140 * MS,
                                       prompt_tokens=100, output_tokens=output_tokens,
                                       replica=0, finish_reason="length"))
        if output_tokens > 1:
            c.record_itl(10 * MS, output_tokens - 1)
    for k in range(24):
        c.record_step(0, k * 10 * MS, (k + 1) * 10 * MS, 50 if k % 4 == 0 else 0, 3, 3, 1,
                      0.2, 0)
    return c.finalize(slo=None)


def test_compare_draws_a_plan_name_with_dollars_as_typed(tmp_path, capsys, monkeypatch):
    # a name validation accepts; matplotlib would read "$x^$" as (broken) mathtext
    names = ["cost$x^$", "a $5 and $10 b"]
    files = []
    for i, name in enumerate(names):
        files.append(tmp_path / f"p{i}.yaml")
        files[-1].write_text(PLAN.format(name=name, out=5))
    figs = captured(monkeypatch)
    assert main(["compare", *map(str, files), "--executor", "serial", "--quiet", "--out",
                 str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "latency_cdf.png").is_file()
    (fig,) = figs
    assert [t.get_text() for t in fig.legends[0].get_texts()] == names
    assert all(not t.get_parse_math() for t in user_texts(fig))


def test_every_report_plot_draws_its_texts_as_typed_but_keeps_log_ticks(monkeypatch):
    from simulator.planner_report import plot_sweep
    from simulator.sweep import SweepResult

    figs = captured(monkeypatch)
    report.plot_latency_cdf(one_result())
    report.plot_timeline(one_result())
    import simulator.planner_report as pr
    sweep_figs = captured(monkeypatch, pr)
    t = pd.DataFrame({"workload.arrival.rate": [1, 2], "hardware.gpu": ["a$b$", "a$b$"],
                      "stability": ["stable"] * 2, "request_throughput": [1.0, 2.0],
                      "ttft_p50_ms": [10.0, 20.0], "ttft_p99_ms": [30.0, 400.0],
                      "tpot_p50_ms": [5.0, 6.0], "tpot_p99_ms": [7.0, 80.0]})
    plot_sweep(SweepResult({"workload.arrival.rate": [1, 2], "hardware.gpu": ["a$b$"]}, t,
                           [], []))
    figs += sweep_figs
    assert len(figs) == 3
    for fig in figs:
        assert user_texts(fig) and all(not x.get_parse_math() for x in user_texts(fig))
    sweep = figs[-1]
    assert sweep.axes[0].get_legend().get_texts()[0].get_text() == "gpu=a$b$"
    # a log axis's ticks are mathtext ($10^{2}$): drawn as math, not as "$\mathdefault..."
    ticks = [x for x in sweep.axes[0].get_yticklabels() if x.get_text()]
    assert ticks and all(x.get_text().startswith("$") and x.get_parse_math() for x in ticks)


def legend_styles(fig):
    (leg,) = fig.legends
    return [(matplotlib.colors.to_rgba(h.get_color()), h.get_linestyle())
            for h in leg.legend_handles]


def test_compare_keeps_each_plans_colour_in_a_panel_it_has_no_samples_in(monkeypatch):
    # the middle plan answers one token: no TPOT or ITL; the third keeps its own colour there
    entries = [{"name": "a", "result": one_result()}, {"name": "one-token",
                                                      "result": one_result(1)},
               {"name": "c", "result": one_result()}]
    figs = captured(monkeypatch)
    report.plot_compare_cdf(entries)
    (fig,) = figs
    tab10 = matplotlib.colormaps["tab10"]
    assert [c for c, _ in legend_styles(fig)] == [tab10(0), tab10(1), tab10(2)]
    for ax in fig.axes:
        drawn = [matplotlib.colors.to_rgba(line.get_color()) for line in ax.get_lines()]
        if ax.get_title() in ("TPOT", "ITL"):
            assert drawn == [tab10(0), tab10(2)]
            assert "no samples: one-token" in [t.get_text() for t in ax.texts]
        else:
            assert drawn == [tab10(0), tab10(1), tab10(2)]


def test_compare_legend_names_many_odd_and_long_plans_apart_from_the_data(monkeypatch):
    long = "plan-" + "x" * 150 + "-max_num_seqs-64"
    names = ["_under"] + [f"plan-{i:02d}" for i in range(22)] + [long, long[:-2] + "32"]
    r = one_result()
    figs = captured(monkeypatch)
    report.plot_compare_cdf([{"name": n, "result": r} for n in names])
    (fig,) = figs
    styles = legend_styles(fig)
    assert len(styles) == len(names) == len(set(styles))      # every plan told apart
    for ax in fig.axes:   # each line drawn as its legend entry
        assert [(matplotlib.colors.to_rgba(x.get_color()), x.get_linestyle())
                for x in ax.get_lines()] == styles
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:3] == ["_under", "plan-00", "plan-01"]        # "_" names shown too
    assert all(len(t) <= report.LEGEND_CHARS + 5 for t in texts)
    # the two long names, cut alike, say which column of the table they are
    assert texts[-2].endswith("seqs-64") and texts[-1].endswith("seqs-32")
    assert texts[-2] != texts[-1]
    fig.canvas.draw()   # (the Agg canvas _png attached)
    box = fig.legends[0].get_window_extent()
    width = fig.get_window_extent().width
    for ax in fig.axes:   # the legend covers no panel, and leaves each a real width
        assert not box.overlaps(ax.get_window_extent())
        assert ax.get_window_extent().width > 0.3 * width


def test_legend_names_shorten_long_names_and_number_the_ones_that_then_read_alike():
    n = report.LEGEND_CHARS
    middle = ["start-" + "m" * 30 + k + "m" * 30 + "-end" for k in "12"]
    got = report.legend_names(["a" * n, "b" * (n + 1), "h" * 40 + "tail-1", *middle])
    assert got[0] == "a" * n                      # at the limit: whole
    assert len(got[1]) == n and got[1].startswith("b") and "…" in got[1]
    assert got[2].startswith("h") and got[2].endswith("tail-1") and len(got[2]) == n
    # names 4 and 5 differ only inside the cut part: numbered by their column
    assert got[3].startswith("start-") and got[3].endswith("-end (4)")
    assert got[4].endswith("-end (5)")


def test_sweep_lines_past_ten_keep_distinct_colours(monkeypatch):
    from simulator.planner_report import MAX_LEGEND, sweep_figure
    from simulator.sweep import SweepResult

    seqs = list(range(2, 26, 2))   # 12 lines: more than 10, fewer than MAX_LEGEND
    assert 10 < len(seqs) <= MAX_LEGEND
    rows = [{"workload.arrival.rate": r, "engine.max_num_seqs": s, "stability": "stable",
             "request_throughput": r * 0.9, "ttft_p50_ms": 10.0 + s, "ttft_p99_ms": 30.0 + s,
             "tpot_p50_ms": 5.0, "tpot_p99_ms": 9.0} for s in seqs for r in (1, 2)]
    fig = sweep_figure(SweepResult({"workload.arrival.rate": [1, 2],
                                    "engine.max_num_seqs": seqs}, pd.DataFrame(rows), [], []))
    leg = fig.axes[0].get_legend()
    colours = [matplotlib.colors.to_rgba(h.get_color()) for h in leg.legend_handles]
    assert len(colours) == len(seqs) == len(set(colours))


@pytest.mark.parametrize("plot", ["compare", "sweep"])
def test_a_changed_plot_is_byte_identical_when_drawn_twice(plot):
    from simulator.planner_report import plot_sweep
    from simulator.sweep import SweepResult

    def draw():
        if plot == "compare":
            return report.plot_compare_cdf([{"name": n, "result": one_result(k)}
                                            for n, k in (("_a", 11), ("b$", 1), ("c", 5))])
        t = pd.DataFrame([{"workload.arrival.rate": r, "engine.max_num_seqs": s,
                           "stability": "stable", "request_throughput": r * 0.9,
                           "ttft_p50_ms": 10.0 + s, "ttft_p99_ms": 30.0 + s,
                           "tpot_p50_ms": 5.0, "tpot_p99_ms": 9.0}
                          for s in range(12) for r in (1, 2)])
        return plot_sweep(SweepResult({"workload.arrival.rate": [1, 2],
                                       "engine.max_num_seqs": list(range(12))}, t, [], []))
    a, b = draw(), draw()
    assert a == b and a[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.frombuffer(a, dtype=np.uint8).size > 1000
