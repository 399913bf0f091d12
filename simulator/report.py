"""Run outputs: summary.json, CSV tables, PNG plots, report.md and a self-contained report.html.

:func:`write_run_outputs` builds every file in a temporary directory beside the output
directory and only then moves them in, so a failure never leaves a half-written set.
Plots use matplotlib's object API (``Figure`` with the Agg canvas), not ``pyplot``: no
global backend state, safe in worker processes.

The report reads these optional summary keys that the caller passes through ``extra`` of
:meth:`simulator.metrics.MetricsCollector.finalize`: ``cost_kind`` ("measured" or
"projected"; ``cost_label`` also accepted), ``cost_model`` (what the step costs come from;
``cost_source`` also accepted), ``kv_note`` and ``prefix_cache_hit_rate``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .errors import InputError
from .files import check_folder, commit_outputs
from .metrics import (METRIC_LABELS, METRICS, RunResult, exact_figures, jsonable, round_sig,
                      summary_at)

FILES = {
    "summary": "summary.json",
    "requests": "requests.csv",
    "timeseries": "timeseries.csv",
    "itl_runs": "itl_runs.csv",
    "latency_cdf": "latency_cdf.png",
    "timeline": "timeline.png",
    "batch": "batch.png",
    "report_md": "report.md",
    "report_html": "report.html",
}
_LABELS = METRIC_LABELS
_ECDF_POINTS = 2000   # points drawn per CDF; the figures themselves use every value
# vLLM's engine cuts such an output at max_model_len; its OpenAI server (0.32) does the same
# by lowering max_tokens to max_model_len - prompt (get_max_tokens in
# entrypoints/serve/utils/api_utils.py), and refuses only a max_tokens above max_model_len
# itself (renderers/params.py). A client whose turn vLLM's server refused (HTTP 400: a prompt
# of max_model_len tokens or more) has no answer to follow up on.
NOT_SENT_TEXT = ("{n} later turns were not sent: a turn rejected for max_model_len ends its "
                 "conversation, as a client that gets an error from vLLM's server (HTTP 400) "
                 "has no answer to follow up on.")
CAPPED_TEXT = ("{n} requests asked for more output than max_model_len leaves after their "
               "prompt (prompt + max_tokens > max_model_len): they were served with the "
               "output cut at max_model_len (finish 'length'), as vLLM's engine and its "
               "OpenAI server (which lowers max_tokens to max_model_len − prompt) do.")
CAPPED_ABOVE_TEXT = (" {m} of them asked for more than max_model_len itself (max_tokens > "
                     "max_model_len), which that server refuses (HTTP 400): a `vllm bench "
                     "serve` run through it counts them as failed requests, and its "
                     "throughput and goodput leave them out.")


def capped_text(s: dict) -> str | None:
    """What the report and the terminal say of a summary's ``capped`` requests (None when
    there are none): :data:`CAPPED_TEXT`, and :data:`CAPPED_ABOVE_TEXT` for those vLLM's
    server would have refused."""
    if not s.get("capped"):
        return None
    m = s.get("capped_above_max_model_len")
    return CAPPED_TEXT.format(n=_fmt(s["capped"])) + (
        CAPPED_ABOVE_TEXT.format(m=_fmt(m)) if m else "")

DEFINITIONS = [
    ("TTFT", "time to first token: first token time − arrival time; includes queueing "
             "and prefill (as `vllm bench serve`). Arrival is when the request reaches the "
             "engine's queue: HTTP, tokenization and streaming, which `vllm bench serve` "
             "also times from its client, are not modelled (E2EL likewise)."),
    ("TPOT", "time per output token: (E2EL − TTFT) / (output tokens − 1) per request; "
             "requests with ≤ 1 output token are excluded (as `vllm bench serve`). "
             "GuideLLM's \"TPOT\" includes the first token, so it is not this figure; "
             "genai-perf's \"inter-token latency\" is this TPOT."),
    ("ITL", "inter-token latency: every gap between consecutive tokens of a request, "
            "pooled over all requests (as `vllm bench serve`); not genai-perf's ITL. "
            "Warm-up requests' gaps are left out, as their other figures."),
    ("E2EL", "end-to-end latency: last token (finish) time − arrival time."),
    ("Queue", "queue time: first scheduled − arrival time."),
    ("Goodput", "completed requests whose every per-request SLO metric (TTFT, TPOT, E2EL, "
                "queue) is ≤ its threshold, per second (as `vllm bench serve --goodput`). "
                "A metric given several thresholds (p50 and p99) is checked against the "
                "smallest; a request with ≤ 1 output token has no TPOT and passes that "
                "check; ITL SLOs are judged on the run statistic only."),
    ("Percentiles", "`numpy.percentile`, linear interpolation."),
    ("Peak output token throughput", "as `vllm bench serve`: output tokens counted per "
                                     "second from the first served request's arrival, the "
                                     "most in one second; n/a with warm-up (the steps also "
                                     "carry the warm-up requests' tokens)."),
    ("Window", "throughputs and time-weighted means run from the start of the run (as "
               "`vllm bench serve`'s duration, which includes the first arrival gap) to the "
               "last finish (or a later rejected request's arrival: the duration waits for "
               "failed requests too); with warm-up, from the first counted arrival, and the "
               "first warm-up requests by arrival, which load the engine beside the counted "
               "ones, are left out of every request figure (`vllm bench serve "
               "--num-warmups` instead finishes its warm-ups before its run starts)."),
    ("Concurrency", "requests in system: mean = Σ E2EL / duration (Little's law; SGLang "
                    "`bench_serving`'s concurrency), max of overlapping [arrival, finish); "
                    "peak concurrent requests as `vllm bench serve` counts them: seconds from "
                    "the first served request's arrival, a request counted in every second "
                    "it is in the system for any part of, the most in one second (at least "
                    "the max). Running requests and KV usage are time-weighted over engine "
                    "steps (idle time counts as 0); KV usage "
                    "is the fraction of usable blocks, averaged over replicas."),
]


# -- content model: blocks rendered to markdown and html --------------------------------
def fmt_number(x: float, sig: int = 5) -> str:
    """``x`` to ``sig`` significant figures in positional notation, as report and terminal
    cells show numbers: ``16657``, ``9.8033``, ``0.0123`` (``f"{x:.{sig}g}"`` would print
    ``1.6657e+04`` from 16657 at 4 figures or 123456 at 5). Integer digits beyond ``sig``
    are kept (``123457``); trailing zeros dropped. Magnitudes below 1e-4 keep the exponent
    (``1.5e-07``), where positional notation would be a row of zeros; inf and nan print as
    Python does.
    """
    if not math.isfinite(x) or x == 0:
        return f"{x:g}"
    if abs(x) < 1e-4:
        return f"{x:.{sig}g}"
    decimals = max(sig - 1 - math.floor(math.log10(abs(x))), 0)
    text = f"{x:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def shown_summary(result: RunResult) -> dict:
    """``result.summary`` as report and terminal cells show it: each float exact where
    that rounds to it (:func:`simulator.metrics.exact_figures`), so that a cell rounds
    once."""
    return exact_figures(result.summary, result.exact)


def _fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return fmt_number(x)
    return str(x)


def _slo_metric(metric: str) -> tuple[str, str]:
    """(name, unit) of an SLO entry's metric: ``("TTFT", " ms")`` for a latency, and
    ``("rejected requests", "")`` for the count of requests rejected (each fails the SLO)."""
    return (_LABELS.get(metric, metric.replace("_", " ")),
            " ms" if metric in _LABELS else "")


def _slo_value(entry: dict, unit: str = "") -> str:
    """An SLO entry's run value with ``unit``; ``n/a (no samples)`` for a statistic over
    no samples."""
    if entry.get("value") is None and entry.get("samples") == 0:
        return "n/a (no samples)"
    v = entry.get("value")
    return _fmt(v) + (unit if v is not None else "")


def _basis(summary: dict) -> tuple[str, str]:
    """(label for titles, label with source) of the step costs, e.g. ("projected",
    "projected (...)"); figures simulated from measured step costs are titled "measured costs"."""
    label = summary.get("cost_kind") or summary.get("cost_label") or "unlabelled"
    source = summary.get("cost_model") or summary.get("cost_source")
    label = str(label)
    if not source:
        return _SIMULATED.get(label, label), label
    source = str(source)
    return (_SIMULATED.get(label, label),
            source if source.lower().startswith(label.lower()) else f"{label} ({source})")


def cost_sources(summaries) -> list[str]:
    """The distinct step-cost sources of run summaries, in their order, each in full as a
    run's report states it (:func:`_basis`: a profile's held-out step-cost MAPE included)."""
    return list(dict.fromkeys(_basis(s)[1] for s in summaries))


#: How the section titles name figures simulated from measured step costs: "(measured)"
#: alone would suggest that the latencies themselves were measured.
_SIMULATED = {"measured": "measured costs"}


def _blocks(result: RunResult, title: str, meta: dict, replications: dict | None,
            diagnosis: dict | None = None, warnings: list[str] | None = None) -> list:
    s = shown_summary(result)
    label, basis = _basis(s)
    b: list = [("h1", title)]
    if meta:
        b.append(("table", "Run", ["key", "value"],
                  [[str(k), _fmt(v)] for k, v in meta.items()]))
    for w in warnings or ():   # terminal text, paths and names in it: shown as typed
        b.append(("p", f"**Warning:** {md_literal(w, cell=True)}"))
    b.append(("p", f"Step costs: **{basis}**. Every latency, throughput and load figure "
                   f"below is simulated with these costs."))
    if s.get("kv_note"):
        b.append(("p", f"KV cache: {s['kv_note']}"))

    rows = [
        ["requests counted", _fmt(s.get("num_requests"))],
        ["warm-up requests excluded", _fmt(s.get("warmup_requests"))],
        ["completed", _fmt(s.get("completed"))],
        ["rejected", _fmt(s.get("rejected"))],
        *([["later turns not sent (conversation ended by a rejection)",
            _fmt(s["turns_not_sent"])]] if s.get("turns_not_sent") else []),
        ["output cut at max_model_len", _fmt(s.get("capped"))],
        *([["of them, max_tokens above max_model_len (vLLM's server refuses)",
            _fmt(s["capped_above_max_model_len"])]] if s.get("capped_above_max_model_len")
          else []),
        ["aborted", _fmt(s.get("aborted"))],
        ["duration (s)", _fmt(s.get("duration_s"))],
        ["request throughput (req/s)", _fmt(s.get("request_throughput"))],
        ["output throughput (tok/s)", _fmt(s.get("output_throughput"))],
        ["total token throughput (tok/s)", _fmt(s.get("total_token_throughput"))],
        ["peak output token throughput (tok/s)", _fmt(s.get("max_output_tokens_per_s"))],
        ["goodput (req/s)", _fmt(s.get("goodput"))],
    ]
    b.append(("h2", f"Throughput ({label})"))
    b.append(("table", None, ["figure", "value"], rows))
    if s.get("turns_not_sent"):
        b.append(("p", NOT_SENT_TEXT.format(n=_fmt(s["turns_not_sent"]))))
    if s.get("capped"):
        b.append(("p", capped_text(s)))

    b.append(("h2", f"Latency, ms ({label})"))
    stats = ["mean", "p50", "p90", "p95", "p99", "max"]
    lat = [[_LABELS[m]] + [_fmt((s.get(m) or {}).get(k)) for k in stats] for m in METRICS]
    b.append(("table", None, ["metric"] + stats, lat))

    conc = s.get("concurrency") or {}
    kv = s.get("kv_cache_usage") or {}
    load = [
        ["requests in system, mean", _fmt(conc.get("requests_mean"))],
        ["requests in system, max", _fmt(conc.get("requests_max"))],
        ["peak concurrent requests (active in any one second, as vllm bench serve: "
         "at least the max in system)",
         _fmt(s.get("max_concurrent_requests"))],
        ["running requests, mean (all replicas)", _fmt(conc.get("running_mean"))],
        ["running requests, max (one replica)", _fmt(conc.get("running_max_per_replica"))],
        ["KV cache usage, mean (share of blocks)", _fmt(kv.get("mean"))],
        ["KV cache usage, max (share of blocks)", _fmt(kv.get("max"))],
        ["prefix cache hit rate", _fmt(s.get("prefix_cache_hit_rate"))],
        ["preemptions", _fmt(s.get("preemptions"))],
        ["preempted requests", _fmt(s.get("preempted_requests"))],
    ]
    b.append(("h2", f"Load ({label})"))
    b.append(("table", None, ["figure", "value"], load))

    b.append(("h2", "Service-level objectives"))
    slo = s.get("slo") or {}
    if slo:
        rows = [[name, st, _fmt(e.get("threshold")) + unit, _slo_value(e, unit),
                 _fmt(e.get("met"))] for m, entries in slo.items()
                for name, unit in [_slo_metric(m)] for st, e in entries.items()]
        b.append(("table", None, ["metric", "statistic", "threshold",
                                  f"run value ({label})", "met"], rows))
        b.append(("p", f"All SLOs met: **{_fmt(s.get('slo_met'))}**; goodput "
                       f"{_fmt(s.get('goodput'))} req/s ({_fmt(s.get('good_requests'))} "
                       f"good requests)."))
    else:
        b.append(("p", "No SLO given."))

    if replications:
        b.append(("h2", f"Across replications ({label})"))
        b.append(("table", None, ["figure", "mean", "95% CI", "n"],
                  _replication_rows(replications)))
        if _slo_met_text(replications):
            b.append(("p", _slo_met_text(replications)))
        if _replications_identical(replications):
            b.append(("p", IDENTICAL_TEXT))

    if diagnosis is not None:
        b.extend(diagnosis_blocks(diagnosis, label))

    b.append(("h2", "Plots"))
    b.append(("img", "latency_cdf", "Latency CDFs: TTFT, TPOT, ITL, E2EL"))
    b.append(("img", "timeline", "Queue length, running requests and KV usage over time"))
    b.append(("img", "batch", "Prefill vs decode tokens per second over time"))

    b.append(("h2", "Definitions"))
    b.append(("list", [f"**{k}**: {v}" for k, v in DEFINITIONS]))
    return b


_LIMITS = {"max_model_len": "prompts too long for max_model_len (rejected)",
           "latency_floor": "latency of a request served alone",
           "kv_capacity": "KV-cache capacity", "max_num_seqs": "max_num_seqs",
           "max_num_batched_tokens": "max_num_batched_tokens (tokens per step)",
           "compute": "compute capacity", "prefill_interference":
           "long prefills stalling decodes", "prefix_cache": "prefix-cache misses",
           "router": "router (round_robin ignores the replicas' load)",
           "session_ramp": "not known: the run ended in its conversations' ramp-up",
           "client_concurrency": "the client's max_concurrency (requests held back)",
           "wake_up": "wake-up after idle (the first step of an idle replica; the "
                      "profile's idle table)",
           "none": "none: headroom at this load"}


def diagnosis_line(diag: dict) -> str:
    """The diagnosis in one line for the terminal: the binding limit, the knob the
    counterfactual run turned and what it did (or the knob to try); with nothing binding,
    the first observation's evidence (a finding the report lists, such as prefill chunks
    stalling decodes)."""
    binding = diag.get("binding")
    line = f"Binding limit: {_LIMITS.get(binding, binding)}"
    cf = diag.get("counterfactual")
    found = diag.get("findings") or []
    if binding != "none" and cf:
        line += (f"; with {set_flags(cf)}{_beyond(cf)}: {cf['figure']} "
                 f"{_side(cf, 'before')} → "
                 f"{_side(cf, 'after')}" + _effect(cf)
                 + f", SLOs met {_fmt(cf.get('slo_met_before'))} → "
                 f"{_fmt(cf.get('slo_met_after'))}" + _breaks_text(cf)
                 # twice the replicas tests the knob; it is not the count needed
                 + (f"; {diag.get('sizer') or 'servesim plan'} finds the fewest replicas"
                    if str(cf["change"]).startswith("cluster.replicas=")
                    and cf.get("limit") != "wake_up" else ""))
    elif binding != "none" and found and found[0].get("change"):
        line += f"; try {set_flags(found[0])}{_beyond(found[0])}"
    elif binding == "none" and found:   # observations: the report lists them, say the first
        noted = [f["evidence"] for f in found if f.get("evidence")]
        if noted:
            line += f"; observed: {noted[0]}" + (f" (and {len(noted) - 1} more)"
                                                 if len(noted) > 1 else "")
    others = [f"{set_flags(o)}{_beyond(o)}: {_side(o, 'before')} → {_side(o, 'after')}"
              + _breaks_text(o) for o in diag.get("other_counterfactuals") or []]
    if others:
        line += f" (also tried {'; '.join(others)})"
    return line + " (details: the report's Diagnosis)."


def _beyond(item: dict) -> str:
    """Said after a KV-cache try its GPUs cannot hold (``beyond_memory``): a test."""
    return (" (a test: more KV cache than the GPUs hold; see the report)"
            if item.get("beyond_memory") else "")


def set_flags(item: dict, code: bool = False) -> str:
    """A diagnosis finding's or counterfactual's ``change`` as the ``--set`` flags that make
    it in the run's command (its ``flags``; else ``change``, ``key=value`` settings joined by
    ``,``): ``"--set a=1 --set b=2"``, and the run's own flags they take the place of (its
    ``replaces``; servesim refuses a key given twice): ``"--set a=1 (in place of --set
    a=4)"``; each quoted for a POSIX shell where it needs it; ``code``: each group of
    flags as a Markdown code span."""
    def shown(settings) -> str:
        flags = " ".join(f"--set {shlex.quote(c)}" for c in settings)   # as a shell takes it
        return f"`{flags}`" if code else flags

    replaces = item.get("replaces")
    return shown(item.get("flags") or item["change"].split(",")) + (
        f" (in place of {shown(replaces)})" if replaces else "")


def _side(cf: dict, side: str) -> str:
    """A counterfactual's figure ``side`` ("before" / "after"), naming the worst SLO entry
    when the figure is the worst SLO ratio: ``"1.2 (TTFT p99 600 ms, SLO 500 ms)"``."""
    text = _fmt(cf.get(side))
    w = cf.get(f"worst_{side}")
    if w and w.get("value") is not None:
        name, unit = _slo_metric(w["metric"])
        stat = "" if w["stat"] == "count" else f" {w['stat']}"
        text += f" ({name}{stat} {_fmt(w['value'])}{unit}, SLO {_fmt(w['threshold'])}{unit})"
    return text


def _breaks_text(cf: dict) -> str:
    """``"; breaks TPOT p99 (14.6 → 23.7 ms, SLO 15 ms)"`` for SLOs a counterfactual run
    missed that the run met, else ``""``."""
    br = cf.get("breaks") or []
    return ("; breaks " + ", ".join(
        f"{_LABELS[b['metric']]} {b['stat']} ({_fmt(b['before'])} → {_fmt(b['after'])} ms, "
        f"SLO {_fmt(b['threshold'])} ms)" for b in br)) if br else ""


def _effect(cf: dict) -> str:
    """What the terminal line adds after a counterfactual's figures: ``" (worse)"``, or
    ``" (does not move it much)"`` (:func:`_verdict`) when it neither moves the figure nor
    meets the SLOs; nothing when it helps."""
    if cf.get("worse"):
        return " (worse)"
    return "" if cf.get("moved") or cf.get("slo_met_after") else f" ({_verdict(cf)})"


def _verdict(cf: dict) -> str:
    return ("moves it" if cf.get("moved") else "makes it worse" if cf.get("worse")
            else "does not move it much")


def diagnosis_blocks(diag: dict, label: str = "") -> list:
    """Report blocks for :func:`simulator.diagnosis.diagnose`: TTFT split into queueing
    and prefill, the binding limit, every finding with its knob, the counterfactual."""
    b: list = [("h2", f"Diagnosis ({label})" if label else "Diagnosis")]
    sp = diag.get("ttft_split") or {}
    rows = [[name] + [_fmt((sp.get(key) or {}).get(st)) for st in ("mean", "p50", "p99")]
            for name, key in (("TTFT", "ttft_ms"), ("queueing (arrival → first scheduled)",
                                                     "queue_ms"),
                              ("prefill (first scheduled → first token)", "prefill_ms"))]
    b.append(("table", "TTFT split, ms", ["part", "mean", "p50", "p99"], rows))
    share = sp.get("queue_share") if (sp.get("ttft_ms") or {}).get("mean") else None
    b.append(("p", (f"Queueing is {share:.0%} of mean TTFT. " if share is not None else
                    "No request got a first token: no TTFT to split. ")
              + f"Binding limit: **{_LIMITS.get(diag.get('binding'), diag.get('binding'))}**."))
    alone = (diag.get("figures") or {}).get("alone_ms") or {}
    parts = [f"{_LABELS[m]} " + " / ".join(f"{st} {_fmt(v)}" for st, v in stats.items())
             for m, stats in alone.items() if any(v is not None for v in stats.values())]
    if parts:   # the floor no number of replicas lowers
        # the floor leaves out the wake-up after idle: a replica busy until the request
        # came would not pay it, and more replicas do not remove it
        wakes = (diag.get("figures") or {}).get("wake_up") is not None
        b.append(("p", "Served alone on an idle replica (same prompt and output lengths and "
                       "prefix-cache hits, steps back to back, noise-free"
                  + (", without the profile's wake-up after idle" if wakes else "") + "), ms: "
                  + "; ".join(parts) + "."))
    found = diag.get("findings") or []
    if found and diag.get("binding") == "none":   # the table would read as advice
        b.append(("p", "Nothing binds at this load. The findings below are observations "
                       "of this run (a knob that moves them is worth it only for tighter "
                       "SLOs or more load)."))
    if found:
        b.append(("table", None, ["limit", "evidence", "knob", "try"],
                  [[_LIMITS.get(f["limit"], f["limit"]), f["evidence"], f["knob"],
                    set_flags(f) if f.get("change") else "n/a"] for f in found]))
    cf = diag.get("counterfactual")
    if cf:
        b.append(("p", f"Counterfactual run with {set_flags(cf, code=True)}: {cf['figure']} "
                       f"{_side(cf, 'before')} → {_side(cf, 'after')} ({_verdict(cf)}); "
                       f"SLOs met {_fmt(cf.get('slo_met_before'))} → "
                       f"{_fmt(cf.get('slo_met_after'))}{_breaks_text(cf)}."))
    for o in diag.get("other_counterfactuals") or []:
        b.append(("p", f"Also tried for {_LIMITS.get(o['limit'], o['limit'])}: "
                       f"{set_flags(o, code=True)}: {o['figure']} {_side(o, 'before')} → "
                       f"{_side(o, 'after')} ({_verdict(o)}){_breaks_text(o)}."))
    return b


def _replicated(rep: dict) -> list:
    """``(label, {mean, ci95, n})`` of the figures the replication tables show: the
    headline figures, then each SLO statistic against its bound."""
    keys = [("request_throughput",), ("output_throughput",), ("goodput",)]
    keys += [(m, st) for m in METRICS for st in ("mean", "p50", "p99")]
    keys += [("concurrency", "running_mean"), ("kv_cache_usage", "mean")]
    out = [(".".join(path), summary_at(rep, path)) for path in keys]
    for m, entries in (rep.get("slo") or {}).items():
        for st, e in (entries.items() if m in METRICS else ()):
            bound = summary_at(e, ("threshold", "mean"))
            out.append((f"SLO {m}.{st} (≤ {_fmt(bound)})", e.get("value")))
    return [(label, node) for label, node in out if isinstance(node, dict) and "mean" in node]


def _replication_rows(rep: dict) -> list:
    rows = []
    for label, node in _replicated(rep):
        ci = node.get("ci95")
        ci_txt = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "n/a"
        rows.append([label, _fmt(node["mean"]), ci_txt, _fmt(node.get("n"))])
    return rows


def _slo_met_text(rep: dict) -> str | None:
    """"SLOs met in k of n replications", when the run had SLOs."""
    met = rep.get("slo_met")
    if not isinstance(met, dict):
        return None
    return f"SLOs met in {met['met_in']} of {met['n']} replications."


# A trace fixes arrivals and lengths; with noiseless step costs and a deterministic router
# nothing is left for the seed to change.
IDENTICAL_TEXT = ("Every replication gave the same figures: nothing in this scenario "
                  "depends on the seed (a trace, or fixed arrivals and lengths, served at "
                  "step costs without noise), so the intervals have zero width and one "
                  "replication says as much.")


def _replications_identical(rep: dict) -> bool:
    figs = _replicated(rep)
    return bool(figs) and all(n.get("ci95") and n["ci95"][0] == n["ci95"][1]
                              for _, n in figs)


def md_literal(text: str, cell: bool = False) -> str:
    """``text`` (a name, a path: user text) escaped so that markdown shows it as typed:
    no HTML tag or entity, no emphasis, code, link or maths (``$…$`` in viewers that
    render it). ``cell``: a table cell or list
    item of figures, which keep the ``_`` inside a word and brackets (``ttft_ms.p99``,
    ``[1.2, 3.4]``), which form no markup, unescaped."""
    # ">" alone forms no markup inside a line ("> plan.max_replicas" reads as typed)
    specials = "\\`*<&|$" + ("" if cell else "_[]#!")
    text = "".join(f"\\{c}" if c in specials else c for c in text)
    if not cell:
        return text
    text = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", text)
    return text.replace("](", "]\\(")


def render_markdown(blocks: list) -> str:
    """Markdown for report blocks; images link to the PNG files beside report.md. The
    title (``h1``: a scenario's name) and table cells are user text, escaped
    (:func:`md_literal`); paragraphs and lists are markdown."""
    out = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h1":
            out.append(f"# {md_literal(blk[1])}\n")
        elif kind == "h2":
            out.append(f"## {blk[1]}\n")
        elif kind == "p":
            out.append(f"{blk[1]}\n")
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in blk[1]) + "\n")
        elif kind == "img":
            out.append(f"![{blk[2]}]({FILES.get(blk[1], blk[1])})\n")
        elif kind == "table":
            _, caption, head, rows = blk
            lines = [f"**{caption}**\n"] if caption else []
            lines.append("| " + " | ".join(md_literal(h, cell=True) for h in head) + " |")
            lines.append("|" + "|".join("---" for _ in head) + "|")
            lines += ["| " + " | ".join(md_literal(c, cell=True) for c in r) + " |"
                      for r in rows]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _inline_html(text: str) -> str:
    """Escape text and turn **bold** and `code` into tags; a character escaped for
    markdown (:func:`md_literal`: ``\\*``) outside code is shown as itself."""
    out, bold = [], False
    for tok in re.split(r"(`[^`]*`|\\[!-/:-@\[-`{-~]|\*\*)", text):
        if len(tok) > 1 and tok[0] == tok[-1] == "`":
            out.append(f"<code>{html.escape(tok[1:-1])}</code>")
        elif tok == "**":
            out.append("</strong>" if bold else "<strong>")
            bold = not bold
        else:
            out.append(html.escape(tok[1] if len(tok) == 2 and tok[0] == "\\" else tok))
    return "".join(out) + ("</strong>" if bold else "")


_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;
padding:0 1rem;color:#222}table{border-collapse:collapse;margin:.5rem 0 1rem}
td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}
img{max-width:100%;border:1px solid #eee}code{background:#f5f5f5;padding:0 .2rem}"""


def render_html(blocks: list, title: str, images: dict) -> str:
    """Self-contained HTML: inline CSS, plots embedded as base64 PNG, no external links.

    Args:
        images: plot key -> PNG bytes.
    """
    body = []
    for blk in blocks:
        kind = blk[0]
        if kind == "h1":   # a scenario's name, as typed
            body.append(f"<h1>{html.escape(blk[1])}</h1>")
        elif kind == "h2":
            body.append(f"<h2>{_inline_html(blk[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{_inline_html(blk[1])}</p>")
        elif kind == "list":
            items = "".join(f"<li>{_inline_html(i)}</li>" for i in blk[1])
            body.append(f"<ul>{items}</ul>")
        elif kind == "img":
            data = base64.b64encode(images[blk[1]]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(blk[2])}" '
                        f'src="data:image/png;base64,{data}"><figcaption>'
                        f"{html.escape(blk[2])}</figcaption></figure>")
        elif kind == "table":
            _, caption, head, rows = blk
            cap = f"<caption>{_inline_html(caption)}</caption>" if caption else ""
            th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
            trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r)
                          + "</tr>" for r in rows)
            body.append(f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{trs}"
                        "</tbody></table>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# -- plots ------------------------------------------------------------------------------
def literal_text(fig) -> None:
    """Draw every text of ``fig`` as typed, not as mathtext: titles, axis labels, legend
    entries, annotations. A name (a plan's, a swept value, a profile's) may hold ``$``:
    ``a $5 and $10 b`` would be set as math and ``cost$x^$`` would not draw at all. Tick
    labels and an axis's offset text keep mathtext: matplotlib writes a log axis's ticks
    as ``$10^{2}$``, and none of them is user text."""
    from matplotlib.axis import Axis
    from matplotlib.text import Text

    def walk(artist) -> None:
        for child in artist.get_children():
            if isinstance(child, Axis):   # its label only: ticks are re-made when drawn
                child.label.set_parse_math(False)
            elif isinstance(child, Text):
                child.set_parse_math(False)
            else:
                walk(child)
    walk(fig)


def _png(fig: Figure) -> bytes:
    literal_text(fig)
    buf = io.BytesIO()
    # No "Software" tag: the bytes then depend only on the data.
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _ecdf_points(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most _ECDF_POINTS evenly spaced points of a step CDF (x ascending)."""
    if x.size > _ECDF_POINTS:
        idx = np.unique(np.linspace(0, x.size - 1, _ECDF_POINTS).round().astype(int))
        return x[idx], p[idx]
    return x, p


def _cdf(result: RunResult, metric: str, counted=None) -> tuple[np.ndarray, np.ndarray]:
    """``(x ascending, fraction ≤ x)`` of a latency ``metric`` (ms) over the counted
    requests (``counted``: the request rows left after warm-up, found when not given), ITL
    from the pooled runs; two empty arrays without samples."""
    if metric == "itl_ms":
        runs = result.itl_runs
        x = runs["gap_ns"].to_numpy() / 1e6
        c = runs["count"].to_numpy()
        return x, (np.cumsum(c) / c.sum() if c.size else c)
    if counted is None:
        req = result.requests
        counted = req[~req["warmup"]] if len(req) else req
    x = np.sort(counted[metric].dropna().to_numpy()) if len(counted) else np.array([])
    return x, (np.arange(1, x.size + 1) / x.size if x.size else x)


def step_cdf(ax, x: np.ndarray, p: np.ndarray | None = None, **kw) -> None:
    """Draw the step CDF of ``x`` (ascending; ``p`` its fractions ≤ x, by default
    1/n … 1) on ``ax`` from (min, 0), so that a one-valued CDF still shows its jump, over
    at most :data:`_ECDF_POINTS` points (``kw`` as ``step`` takes them)."""
    if p is None:
        p = np.arange(1, x.size + 1) / x.size
    xs, ps = _ecdf_points(x, p)
    ax.step(np.r_[xs[0], xs], np.r_[0.0, ps], where="post", **kw)


def line_styles(n: int) -> list[tuple]:
    """A ``(colour, line style)`` for each of ``n`` lines, told apart by colour alone up
    to 20: tab10's colours (matplotlib's default cycle) up to 10 lines, tab20's up to 20;
    past 20, tab20's colours again, dashed, then dotted, then dash-dot."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    dashes = ("-", "--", ":", "-.")
    return [(cmap(i % cmap.N), dashes[i // cmap.N % len(dashes)]) for i in range(n)]


#: Longest name a plot's legend shows; a longer one ends in "…" (the tables give it whole).
LEGEND_CHARS = 40


def legend_names(names: list[str]) -> list[str]:
    """Legend labels for ``names``: each longer than :data:`LEGEND_CHARS` shortened to its
    start and its last 12 characters around "…" (names of one family often differ only
    at the end: ``…max_num_seqs-64``); where shortened names would read alike, each of
    those is followed by its position (1 for the first name: its column in the report's
    table)."""
    head = LEGEND_CHARS - 13
    short = [n if len(n) <= LEGEND_CHARS else f"{n[:head]}…{n[-12:]}" for n in names]
    return [f"{s} ({i})" if s != n and short.count(s) > 1 else s
            for i, (s, n) in enumerate(zip(short, names), 1)]


def set_legend(fig_or_ax, handles: list, labels: list[str], **kw):
    """A legend of ``handles`` with ``labels`` drawn as given: matplotlib leaves an entry
    whose label starts with "_" out of a legend, so the texts are set after it is made
    (``kw`` as ``legend`` takes them)."""
    leg = fig_or_ax.legend(handles, [f"{i}" for i in range(len(labels))], **kw)
    for text, label in zip(leg.get_texts(), labels):
        text.set_text(label)
    return leg


def plot_latency_cdf(result: RunResult) -> bytes:
    """PNG: CDFs of TTFT, TPOT, ITL (from the pooled runs) and E2EL of counted requests."""
    req = result.requests
    counted = req[~req["warmup"]] if len(req) else req
    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    for ax, m in zip(axes, ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")):
        x, p = _cdf(result, m, counted)
        if x.size:
            step_cdf(ax, x, p)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(_LABELS[m])
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    return _png(fig)


def _series(result: RunResult):
    """``(all-replica rows, [(replica, its rows)])`` of the timeseries; ``(None, [])``
    without steps. One pass (groupby): thousands of replicas are one filter each."""
    ts = result.timeseries
    if ts is None or len(ts) == 0:
        return None, []
    is_all = ts["replica"] == "all"
    return ts[is_all], list(ts[~is_all].groupby("replica", sort=False))


def plot_timeline(result: RunResult) -> bytes:
    """PNG: queue length, running requests and KV usage over time (time-weighted bins)."""
    fig = Figure(figsize=(10, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    total, reps = _series(result)
    panels = (("waiting", "queue length (waiting)"), ("running", "running requests"),
              ("kv_cache_usage", "KV cache usage"))
    for ax, (col, name) in zip(axes, panels):
        if total is None:
            ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
        else:
            if 1 < len(reps) <= 8:
                for rep, df in reps:
                    ax.step(df["time_s"], df[col], where="post", lw=0.7, alpha=0.6,
                            label=f"replica {rep}")
            ax.step(total["time_s"], total[col], where="post", lw=1.4, color="k",
                    label=("mean over replicas" if col == "kv_cache_usage"
                           else "all replicas"))
            if 1 < len(reps) <= 8:
                ax.legend(fontsize="small", ncols=3)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("time (s)")
    return _png(fig)


def plot_batch(result: RunResult) -> bytes:
    """PNG: prefill and decode tokens per second over time, stacked, all replicas."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax = fig.subplots()
    total, _ = _series(result)
    if total is None:
        ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
    else:
        t = total["time_s"].to_numpy()
        dec = total["decode_tok_s"].to_numpy()
        pre = total["prefill_tok_s"].to_numpy()
        ax.fill_between(t, 0, dec, step="post", alpha=0.7, label="decode tokens/s")
        ax.fill_between(t, dec, dec + pre, step="post", alpha=0.7, label="prefill tokens/s")
        ax.legend()
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tokens / s")
    ax.grid(alpha=0.3)
    return _png(fig)


# -- writing ----------------------------------------------------------------------------
def _contents(result: RunResult, title: str, meta: dict, replications: dict | None,
              diagnosis: dict | None = None, warnings: list[str] | None = None) -> dict:
    """File name -> bytes for every output."""
    images = {"latency_cdf": plot_latency_cdf(result), "timeline": plot_timeline(result),
              "batch": plot_batch(result)}
    blocks = _blocks(result, title, meta or {}, replications, diagnosis, warnings)
    files = {
        FILES["summary"]: _json_bytes(result.summary),
        FILES["requests"]: result.requests.to_csv(index=False, float_format="%.9f",
                                                  lineterminator="\n").encode(),
        FILES["timeseries"]: result.timeseries.to_csv(index=False, float_format="%.9f",
                                                      lineterminator="\n").encode(),
        FILES["itl_runs"]: result.itl_runs.to_csv(index=False,
                                                  lineterminator="\n").encode(),
        FILES["report_md"]: render_markdown(blocks).encode(),
        FILES["report_html"]: render_html(blocks, title, images).encode(),
    }
    for key, png in images.items():
        files[FILES[key]] = png
    if replications is not None:
        files["replications.json"] = _json_bytes(jsonable(replications))   # rounded once
    if diagnosis is not None:
        files["diagnosis.json"] = _json_bytes(diagnosis)
    return files


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=2, allow_nan=False) + "\n").encode()


def write_files(out_dir, contents: dict, flag: str = "--out",
                stale: tuple = ()) -> dict[str, Path]:
    """Write ``{file name: bytes}`` into ``out_dir`` atomically (the scheme of
    :func:`write_run_outputs`); returns file name -> path.

    Args:
        flag: the option that named ``out_dir``, for error messages.
        stale: names of files this command writes only sometimes: removed from an
            existing ``out_dir`` when not in ``contents``, so that no file of an earlier
            run is left beside this run's.

    Raises:
        InputError: ``out_dir`` or a folder above it is a file
            (:func:`simulator.files.check_folder`), or it cannot be written.
    """
    out = Path(out_dir)
    check_folder(out, flag)
    # Staged where the files end up, so every rename stays on one filesystem (an existing
    # out_dir may be a mount point: a volume, a tmpfs).
    existing = out.is_dir()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp",
                                    dir=out if existing else out.parent))
    except OSError as e:
        raise InputError(f"{flag} {out}: cannot write there ({e.strerror})") from e
    try:
        for name, data in contents.items():
            (tmp / name).write_bytes(data)
        commit_outputs()   # from here on the outputs are whole: see files.on_commit
        if existing:
            for name in contents:
                os.replace(tmp / name, out / name)
            for name in stale:
                if name not in contents:
                    (out / name).unlink(missing_ok=True)
        else:
            os.chmod(tmp, 0o755)
            os.rename(tmp, out)   # a new out_dir appears complete in one step
    except OSError as e:
        raise InputError(f"{flag} {out}: cannot write it ({e.strerror})") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return {name: out / name for name in contents}


def write_run_outputs(out_dir, result: RunResult, *, title: str, meta: dict,
                      replications: dict | None = None,
                      diagnosis: dict | None = None,
                      warnings: list[str] | None = None) -> dict[str, Path]:
    """Write a run's outputs into ``out_dir`` atomically.

    Files: ``summary.json`` (sorted keys, indent 2: byte-identical for identical input),
    ``requests.csv`` and ``timeseries.csv`` (seconds with 9 decimals), ``itl_runs.csv``,
    ``latency_cdf.png``, ``timeline.png``, ``batch.png``, ``report.md``, a self-contained
    ``report.html``, and ``replications.json`` when ``replications`` (from
    :func:`simulator.metrics.combine_replications`, rounded or not: each figure written
    or shown rounds once) is given.

    Everything is built in a temporary directory beside a new ``out_dir``, which is then
    renamed into place in one step, or inside an existing one (so that a mount point
    works), whose files are then each replaced by an atomic rename; a
    ``replications.json`` or ``diagnosis.json`` of an earlier run that this one does not
    write is removed. On any error the temporary directory is removed and nothing
    half-written is left.

    Args:
        out_dir: output directory (created with its parents if missing).
        result: from :meth:`simulator.metrics.MetricsCollector.finalize`.
        title: report title. meta: run facts shown at the top of the report (scenario,
            seed, model, hardware, ...); not written to summary.json.
        diagnosis: from :func:`simulator.diagnosis.diagnose`; adds a Diagnosis section
            and ``diagnosis.json``.
        warnings: lines the run printed as warnings, repeated under the run facts.

    Returns:
        file name -> path of each file written (e.g. ``paths["report.html"]``).

    Raises:
        InputError: ``out_dir`` exists and is not a directory, or cannot be written.
    """
    return write_files(out_dir, _contents(result, title, meta, replications, diagnosis,
                                          warnings),
                       stale=("replications.json", "diagnosis.json"))


def print_summary(result: RunResult, console=None, *, replications: dict | None = None,
                  max_model_len: str | None = None, diagnosis: dict | None = None) -> None:
    """Print the key figures as a rich table (TTFT/TPOT/ITL/E2EL, throughput, goodput, SLO).

    Args:
        console: a ``rich.console.Console``; by default a new
            :class:`simulator.terminal.Terminal` on stdout.
        replications: from :func:`simulator.metrics.combine_replications`; adds a table of
            key figures' means and 95% confidence intervals.
        max_model_len: how the rejection line names the limit
            (:func:`simulator.run.max_model_len_text`: says when a default was capped);
            the summary's number by default.
        diagnosis: from :func:`simulator.diagnosis.diagnose`; adds
            :func:`diagnosis_line` under the tables.
    """
    from rich.table import Table

    from .terminal import Terminal

    console = console or Terminal()
    s = shown_summary(result)
    label, basis = _basis(s)
    # The source in full on its own line: in a table title it wraps to the table's width.
    console.print(f"Step costs {basis}", highlight=False, markup=False)
    lat = Table(title=f"Latency, ms ({label})")
    lat.add_column("metric")
    for st in ("mean", "p50", "p99"):
        lat.add_column(st, justify="right")
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        d = s.get(m) or {}
        lat.add_row(_LABELS[m], *(_fmt(d.get(st)) for st in ("mean", "p50", "p99")))
    thr = Table(title=f"Throughput ({label})")
    thr.add_column("figure")
    thr.add_column("value", justify="right")
    for name, key in (("completed / rejected", None), ("duration (s)", "duration_s"),
                      ("requests/s", "request_throughput"),
                      ("output tokens/s", "output_throughput"),
                      ("total tokens/s", "total_token_throughput"),
                      ("goodput (req/s)", "goodput"), ("SLO met", "slo_met")):
        if key is None:
            thr.add_row(name, f"{_fmt(s.get('completed'))} / {_fmt(s.get('rejected'))}")
        else:
            thr.add_row(name, _fmt(s.get(key)))
    console.print(lat)
    console.print(thr)
    if s.get("rejected"):
        limit = max_model_len or s.get("max_model_len")
        limit = f" {limit}" if limit else ""
        n = s["rejected"]   # a mean over replications may be fractional: 0.5 requests
        they = ("it counts as an SLO failure and is" if n == 1 else
                "they count as SLO failures and are")
        console.print(f"{_fmt(n)} request{'' if n == 1 else 's'} rejected: prompt too long "
                      f"for max_model_len{limit}; {they} not in the latency figures.")
    if s.get("turns_not_sent"):
        console.print(NOT_SENT_TEXT.format(n=_fmt(s["turns_not_sent"])))
    if s.get("capped"):
        console.print(capped_text(s))
    if diagnosis:
        console.print(diagnosis_line(diagnosis), highlight=False, markup=False)
    if replications:
        n = max(((v.get("n") or 0) for v in replications.values()
                 if isinstance(v, dict) and "n" in v), default=0)
        console.print("The tables above are replication 1" + (f" of {n}" if n else "")
                      + "; means and 95% confidence intervals over all of them follow.",
                      style="dim")
        rep = Table(title=f"Across replications ({label})")
        for col in ("figure", "mean", "95% CI", "n"):
            rep.add_column(col, justify="left" if col == "figure" else "right")
        for row in _replication_rows(replications):
            rep.add_row(*row)
        console.print(rep)
        if _slo_met_text(replications):
            console.print(_slo_met_text(replications))
        if _replications_identical(replications):
            console.print(IDENTICAL_TEXT, style="dim")
    console.print("TTFT, TPOT, ITL and E2EL as defined by vllm bench serve, timed from "
                  "the engine's queue (no HTTP, tokenization or streaming); TPOT excludes "
                  "the first token (genai-perf's ITL is this TPOT).", style="dim")


# -- comparison of plans ------------------------------------------------------------------
_COMPARE_FIGURES = [
    ("request throughput (req/s)", ("request_throughput",)),
    ("output throughput (tok/s)", ("output_throughput",)),
    ("goodput (req/s)", ("goodput",)),
    ("SLO met", ("slo_met",)),
    ("rejected requests", ("rejected",)),
    ("output cut at max_model_len (requests)", ("capped",)),
    ("of them, max_tokens above max_model_len (vLLM's server refuses)",
     ("capped_above_max_model_len",)),
] + [(f"{_LABELS[m]} {st} (ms)", (m, st)) for m in METRICS for st in ("mean", "p50", "p99")] + [
    ("running requests, mean (all replicas)", ("concurrency", "running_mean")),
    ("KV cache usage, mean (share of blocks, mean over replicas)",
     ("kv_cache_usage", "mean")),
    ("preemptions", ("preemptions",)),
    ("prefix cache hit rate", ("prefix_cache_hit_rate",)),
    ("step costs", ("cost_model",)),
]


def plan_figure(entry: dict, path: tuple, shown: bool = False):
    """A compared plan's figure at ``path`` (keys into a run summary): with replications
    the mean over them (its 95% CI is ``replications[...]["ci95"]``) and, for ``slo_met``,
    whether every replication met the SLOs (``entry["slo_met"]``); else its run's value.
    Rounded to 6 significant digits, as summary.json has them; ``shown``: unrounded where
    known, for a cell that rounds it once (:func:`shown_summary`; the replications' means
    as :func:`simulator.planner.compare` leaves them, unrounded)."""
    if entry.get("replications"):
        if path == ("slo_met",):
            return entry.get("slo_met")
        mean = summary_at(entry["replications"], path + ("mean",))
        if mean is not None:
            return mean if shown else round_sig(mean)
    res = entry["result"]
    return summary_at(shown_summary(res) if shown else res.summary, path)


def plan_capped(entry: dict) -> dict:
    """A compared plan's requests whose output max_model_len cut (:func:`plan_figure`:
    means over replications), as :func:`capped_text` reads them: ``capped`` and
    ``capped_above_max_model_len``."""
    return {k: plan_figure(entry, (k,)) for k in ("capped", "capped_above_max_model_len")}


def plot_compare_cdf(entries: list[dict]) -> bytes:
    """PNG: TTFT, TPOT, ITL and E2EL CDFs of every plan, overlaid: each plan keeps one
    colour and line style (:func:`line_styles`, in plan order) in every panel, named in
    one legend below the panels (:func:`legend_names`); a panel names the plans it has no
    samples of (TPOT of plans whose every answer is one token)."""
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(10, 7.5), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    styles = line_styles(len(entries))
    labels = legend_names([e["name"] for e in entries])
    for ax, m in zip(axes, ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")):
        missing = []
        for e, (colour, dash), label in zip(entries, styles, labels):
            x, p = _cdf(e["result"], m)
            if x.size:
                step_cdf(ax, x, p, color=colour, ls=dash)
            else:
                missing.append(label)
        if len(missing) == len(entries):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif missing:   # bottom right: a CDF reaches it last
            ax.text(0.98, 0.03, "no samples: " + (", ".join(missing) if len(missing) <= 3
                                                   else f"{len(missing)} plans"),
                    ha="right", va="bottom", fontsize="small", transform=ax.transAxes)
        ax.set_title(_LABELS[m])
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    widest = max(len(label) for label in labels)
    set_legend(fig, [Line2D([], [], color=c, ls=d) for c, d in styles], labels,
               loc="outside lower center", fontsize="small",
               ncols=max(1, min(len(labels), 96 // (widest + 8))))
    return _png(fig)


def write_compare_report(out_dir, entries: list[dict], *, title: str = "Plan comparison",
                         note: str = "") -> dict[str, Path]:
    """Side-by-side report of several plans serving the same workload.

    Args:
        entries: per plan ``{"name", "result": RunResult, "replications": combined or
            None, "binding": limit name (optional), "stability" (optional),
            "cost_per_hour": USD for its replicas (optional), "scenario" (optional: its
            replicas and tensor_parallel are shown, as ``deployment``, and the first's SLOs
            add each statistic they name)}``.
        note: a paragraph under the title (e.g. where the shared workload comes from).

    Figures are :func:`plan_figure`'s (means over replications where a plan ran several).
    Files (atomic, :func:`write_files`): ``compare.csv`` (figure × plan; with replications
    also ``<plan> ci95 lo`` / ``hi`` columns), ``latency_cdf.png``
    (overlaid CDFs), ``report.md`` and a self-contained ``report.html``.
    """
    import pandas as pd

    names = [e["name"] for e in entries]
    with_ci = any(e.get("replications") for e in entries)
    rows, csv_rows = [], []
    # and each statistic the SLOs name (TTFT p90, Queue p95): what "SLO met" rests on
    slo = entries[0]["scenario"].slo if "scenario" in entries[0] else None
    named = [(f"{_LABELS[m]} {st} (ms)", (m, st)) for m, st, _ in (slo.targets() if slo else [])]
    for label, path in _COMPARE_FIGURES + [f for f in named if f not in _COMPARE_FIGURES]:
        cells, csv_row = [], {"figure": label}
        for n, e in zip(names, entries):
            v = plan_figure(e, path)
            ci = summary_at(e.get("replications") or {}, path + ("ci95",))
            cells.append(_fmt(plan_figure(e, path, shown=True))
                         + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
                         # its SLOs were met on answers cut short: not the same work
                         + (" (outputs cut)" if path == ("slo_met",) and v
                            and plan_capped(e)["capped"] else ""))
            csv_row[n] = v
            if with_ci:
                csv_row[f"{n} ci95 lo"], csv_row[f"{n} ci95 hi"] = \
                    [round_sig(x) for x in ci] if ci else (None, None)
        rows.append([label] + cells)
        csv_rows.append(csv_row)
    if any("binding" in e for e in entries):
        rows.append(["binding limit (rules)"] + [_LIMITS.get(e.get("binding"),
                                                             str(e.get("binding")))
                                         for e in entries])
        csv_rows.append({"figure": "binding limit",   # the diagnosis's name, as in sweep.csv
                         **{n: e.get("binding") for n, e in zip(names, entries)}})
    if all("scenario" in e for e in entries):   # what each plan's cost pays for
        deployed = [(e["scenario"].cluster.replicas, e["scenario"].hardware.tensor_parallel,
                     e["scenario"].hardware.profile) for e in entries]
        rows.append(["deployment"] + [f"{r} replica{'s' if r > 1 else ''} × {tp} "
                                      + (hw or f"GPU{'s' if tp > 1 else ''} (inline step time)")
                                      for r, tp, hw in deployed])
        for i, figure in enumerate(("replicas", "tensor_parallel")):
            csv_rows.append({"figure": figure, **{n: d[i] for n, d in zip(names, deployed)}})
    if any(e.get("cost_per_hour") is not None for e in entries):
        rows.append(["cost (USD/h)"] + [_fmt(e.get("cost_per_hour")) for e in entries])
        csv_rows.append({"figure": "cost_per_hour",
                         **{n: e.get("cost_per_hour") for n, e in zip(names, entries)}})
    if any("stability" in e for e in entries):   # as sweep's: an overloaded plan says so
        rows.append(["stability"] + [str(e.get("stability")) for e in entries])
        csv_rows.append({"figure": "stability",
                         **{n: e.get("stability") for n, e in zip(names, entries)}})
    b: list = [("h1", title)]
    if note:
        b.append(("p", note))
    # in the plans' column order, each once
    kinds = cost_sources(e["result"].summary for e in entries)
    b.append(("p", "Step costs: " + "; ".join(f"**{k}**" for k in kinds)
                   + " (per plan in the last rows)."
                   + (" A plan run with replications shows the mean over them, its 95% "
                      "confidence interval in brackets (SLO met: in every replication)."
                      if with_ci else "")))
    b.append(("table", None, ["figure"] + names, rows))
    for n, e in zip(names, entries):   # as a run's report says it
        if text := capped_text(plan_capped(e)):
            b.append(("p", f"{md_literal(n)}: {text}"))
    b.append(("img", "latency_cdf", "Latency CDFs of every plan: TTFT, TPOT, ITL, E2EL"))
    b.append(("h2", "Definitions"))
    b.append(("list", [f"**{k}**: {v}" for k, v in DEFINITIONS]))
    images = {"latency_cdf": plot_compare_cdf(entries)}
    files = {
        "compare.csv": pd.DataFrame(csv_rows).to_csv(index=False, lineterminator="\n").encode(),
        FILES["latency_cdf"]: images["latency_cdf"],
        FILES["report_md"]: render_markdown(b).encode(),
        FILES["report_html"]: render_html(b, title, images).encode(),
    }
    return write_files(out_dir, files)
