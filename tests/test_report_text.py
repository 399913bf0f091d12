"""Text of the reports: figures rounded once, the SLO table's units, user text shown as typed
in report.md and report.html, and the validation report's numbers and plots."""

import html
import json
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
from markdown_it import MarkdownIt

from simulator import report
from simulator.metrics import MetricsCollector
from simulator.policy import RequestRecord
from simulator.report import print_summary, write_compare_report, write_run_outputs

MS = 1_000_000


def five_figures(exact: str) -> str:
    """``exact`` (decimal text) to 5 significant figures, half up, trailing zeros dropped."""
    d = Decimal(exact)
    places = 4 - d.adjusted()
    text = str(d.quantize(Decimal(1).scaleb(-max(places, 0)), rounding=ROUND_HALF_UP))
    return text.rstrip("0").rstrip(".") if "." in text else text


def one_request(e2el_ns: int, slo=None, rejected: bool = False):
    """A run of one request whose E2EL is ``e2el_ns`` (first token at 7 ms), and with
    ``rejected`` a second one refused."""
    c = MetricsCollector(num_replicas=1)
    c.record_request(RequestRecord(0, 0, 1 * MS, 7 * MS, e2el_ns, prompt_tokens=10,
                                   output_tokens=2, replica=0, finish_reason="length"))
    c.record_itl(e2el_ns - 7 * MS, 1)
    if rejected:
        c.record_request(RequestRecord(1, 2 * MS, finish_ns=2 * MS, prompt_tokens=10 ** 6,
                                       finish_reason="rejected"))
    c.record_step(0, 0, e2el_ns, 10, 2, 1, 1, 0.1, 0)
    return c.finalize(slo=slo)


def md_html(md: str) -> str:
    """report.md as a CommonMark renderer that passes HTML through shows it."""
    return MarkdownIt("commonmark").enable("table").render(md)


def as_text(text: str) -> str:
    """``text`` as that renderer writes plain text (``"`` as ``&quot;``, ``'`` kept)."""
    return html.escape(text, quote=False).replace('"', "&quot;")


def test_a_cell_rounds_the_exact_figure_once(tmp_path):
    # E2EL 371.0054 ms: summary.json keeps 371.005 (6 figures); 5 figures of that would
    # read 371 (371.005 is 371.00499... in binary), of the exact figure 371.01
    r = one_request(371_005_400)
    want = five_figures("371.0054")
    assert want == "371.01"
    paths = write_run_outputs(tmp_path / "r", r, title="t", meta={})
    assert json.loads(paths["summary.json"].read_text())["e2el_ms"]["mean"] == 371.005
    row = next(line for line in paths["report.md"].read_text().splitlines()
               if line.startswith("| E2EL |"))
    assert row.split(" | ")[1] == want                      # the mean
    from rich.console import Console
    con = Console(record=True, width=200)
    print_summary(r, con)
    e2el = next(line for line in con.export_text().splitlines() if "E2EL" in line)
    assert [c.strip() for c in e2el.split("│")][1:4] == ["E2EL", want, five_figures(
        "371.0054")]   # mean, p50 (one request)
    # and compare's cells, which read the same figures
    cmp = write_compare_report(tmp_path / "c", [{"name": "a", "result": r},
                                                {"name": "b", "result": r}])
    row = next(line for line in cmp["report.md"].read_text().splitlines()
               if line.startswith("| E2EL mean (ms) |"))
    assert row == f"| E2EL mean (ms) | {want} | {want} |"
    # compare.csv keeps summary.json's figure
    assert "E2EL mean (ms),371.005,371.005" in cmp["compare.csv"].read_text()


def test_the_slo_table_gives_each_row_its_unit_and_names_the_rejected_count(tmp_path):
    r = one_request(50 * MS, slo={"ttft_ms": {"p99": 100}}, rejected=True)
    md = write_run_outputs(tmp_path / "r", r, title="t", meta={})["report.md"].read_text()
    head, _, *rows = md.split("## Service-level objectives\n")[1].strip().splitlines()[:4]
    assert head == "| metric | statistic | threshold | run value (unlabelled) | met |"
    assert sorted(rows) == ["| TTFT | p99 | 100 ms | 7 ms | yes |",
                            "| rejected requests | count | 0 | 1 | no |"]


TITLE = ("<script>alert(\"x&y\")</script> 'q' **bold** `code` | pipe &amp; [l](http://x) "
         "<img src=x onerror=alert(1)> _u_ #")


def test_a_scenario_name_is_shown_as_typed_in_report_md_and_report_html(tmp_path):
    r = one_request(50 * MS)
    paths = write_run_outputs(tmp_path / "r", r, title=TITLE, meta={"scenario": TITLE})
    shown = md_html(paths["report.md"].read_text())
    # a markdown viewer shows the heading and the table cell as the text typed, no tag
    assert f"<h1>{as_text(TITLE)}</h1>" in shown
    assert f"<td>{as_text(TITLE)}</td>" in shown
    assert "<script>" not in shown and "<img src=x" not in shown
    assert "<strong>bold" not in shown and "<code>code" not in shown and "<em>u" not in shown
    page = paths["report.html"].read_text()
    assert f"<h1>{html.escape(TITLE)}</h1>" in page and "<title>" + html.escape(TITLE) in page


def test_a_plan_name_is_shown_as_typed_in_compares_table(tmp_path):
    r = one_request(50 * MS)
    names = ["a**b**", "<i>c</i>|d"]
    paths = write_compare_report(tmp_path / "c", [{"name": n, "result": r} for n in names])
    shown = md_html(paths["report.md"].read_text())
    for n in names:
        assert f"<th>{as_text(n)}</th>" in shown
    assert "<strong>b</strong>" not in shown and "<i>" not in shown


def test_report_html_keeps_its_own_markup_and_shows_escaped_markdown_as_typed():
    text = "**bold** `a*b` " + report.md_literal("x **y** `z` <w> a_b_")
    assert report._inline_html(text) == (
        "<strong>bold</strong> <code>a*b</code> x **y** `z` &lt;w&gt; a_b_")


def validation(big: float):
    cell = {"mean": big, "min": 9870.0, "max": 21000.0, "n": 2}
    rng = np.random.default_rng(0)
    cdf = {"load": 0.5, **{f"{side}_{m}": sorted(rng.uniform(10, 20, 5).tolist())
                           for side in ("measured", "predicted")
                           for m in ("ttft_ms", "tpot_ms", "e2el_ms")}}
    return {"saturation": {"requests": 20, "measured_rps": 2.0, "predicted_rps": 2.1,
                           "error": 0.05},
            "loads": [{"load": 0.5, "rate": 1.0, "num_requests": 10, "timing": [], "table": [
                {"figure": "E2EL p50", "measured": cell, "predicted": cell,
                 "error": {"mean": 0.0, "min": 0.0, "max": 0.0, "n": 2}}]}],
            "meta": {"scenario": "s", "tokens": 12345.6}, "cdf": [cdf]}


def test_validation_numbers_are_positional_and_its_cdfs_start_at_zero(tmp_path, monkeypatch):
    import calibration.validate_report as VR

    figs = []
    png = report._png
    monkeypatch.setattr(report, "_png", lambda fig: figs.append(fig) or png(fig))
    res = validation(12345.6)
    VR.write_outputs(res, tmp_path / "v")
    md = (tmp_path / "v" / "validation.md").read_text()
    row = next(line for line in md.splitlines() if "| E2EL p50 |" in line)
    # 4 significant figures, as the table's other cells, never an exponent
    assert "| 12346 [9870, 21000] |" in row and "e+" not in md
    assert "- tokens: 12346\n" in md
    (fig,) = figs
    assert [ax.get_xlabel() for ax in fig.axes] == ["TTFT (ms)", "TPOT (ms)", "E2EL (ms)"]
    for ax, m in zip(fig.axes, ("ttft_ms", "tpot_ms", "e2el_ms")):
        for line, side in zip(ax.get_lines(), ("measured", "predicted")):
            x, y = line.get_data()
            assert (x[0], y[0]) == (min(res["cdf"][0][f"{side}_{m}"]), 0.0)
            assert y[-1] == 1.0
        assert ax.get_ylim()[0] == 0
    assert (tmp_path / "v" / "cdf_load_0.5.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("x, text", [(12345.6, "12346"), (0.0123456, "0.01235"),
                                     (21000.0, "21000"), (1.5, "1.5")])
def test_validation_cells_read_as_the_run_reports(x, text):
    import calibration.validate_report as VR
    assert VR._fmt(x) == text


@pytest.mark.parametrize("cell", [False, True])
def test_a_dollar_is_escaped_for_viewers_that_render_math(cell):
    # GitHub and other viewers with maths read $…$ as a formula; an escaped \$ is a dollar
    # there, and in CommonMark (which has no maths) a backslash before punctuation shows
    # only the punctuation
    text = report.md_literal("cost$x^$ a $5 and $10 b", cell=cell)
    assert "$" not in text.replace("\\$", "")
    assert md_html(text) == f"<p>{as_text('cost$x^$ a $5 and $10 b')}</p>\n"


def test_a_warning_is_shown_as_typed_in_report_md(tmp_path):
    # warnings are terminal text that quotes paths and names (a trace at <dir>/*x*.csv)
    r = one_request(50 * MS)
    w = "workload.trace: <dir>/*x*.csv has `3` requests $5 & more"
    paths = write_run_outputs(tmp_path / "r", r, title="t", meta={}, warnings=[w])
    shown = md_html(paths["report.md"].read_text())
    assert f"<p><strong>Warning:</strong> {as_text(w)}</p>" in shown
    page = paths["report.html"].read_text()
    assert f"<p><strong>Warning:</strong> {html.escape(w)}</p>" in page
