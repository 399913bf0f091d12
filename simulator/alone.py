"""The latency each request would have served alone on an idle replica: the floor that no
number of replicas lowers, only faster steps (hardware, tensor_parallel) do. It is priced
with the run's prefix-cache hits: at a lighter load, or on fewer replicas with warmer
caches, a request may hit more and its floor be lower.

A request alone runs its prompt in chunks of ``max_num_batched_tokens`` (vLLM chunked
prefill; its prefix-cache hits as in the run), the last chunk sampling the first token,
then one decode step per further output token. Steps are priced noise-free by the run's
cost model, back to back (a synchronous engine with nothing else to do).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .cost_model import build_cost_model
from .metrics import interval_counts, served_rows, slo_stat, slo_stat_rank

#: The simulator's clock resolution (1 ns) in ms: floors priced in floating point within it
#: of a threshold are at it (a run steps in whole ns).
CLOCK_MS = 1e-6
#: Metrics with a floor (queue_ms has none: a request alone never waits).
FLOOR_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def step_plan(prefill=None, num_decodes=0, decode_context=0):
    """A step in the shape the cost model prices (``step_features``): at most one prefill
    chunk ``(num_new_tokens, num_computed_before, samples_token)`` and ``num_decodes``
    decodes attending to ``decode_context`` tokens each."""
    chunks = [SimpleNamespace(num_new_tokens=n, num_computed_before=c, samples_token=s)
              for n, c, s in ([prefill] if prefill else [])]
    return SimpleNamespace(prefills=chunks, num_decodes=num_decodes,
                           decode_context_tokens=num_decodes * decode_context,
                           reread_tokens=0)   # alone: no other request shares its blocks


class AloneLatency:
    """Per-request latency floors of a run's counted, completed requests, in ms.

    Attributes:
        ttft_ms, e2el_ms: shape (n,), one per request.
        tpot_ms: shape (m,), requests with two or more output tokens.
        itl_values_ms, itl_counts: the token gaps of every request as runs (value, count):
            a lone decode step's cost is linear in its context in every cost form
            (roofline, linear, constant), so gaps are priced per context length.

    Args:
        scenario: the run's scenario (its cost model and ``max_num_batched_tokens``).
        requests: the run's request table (:data:`simulator.metrics.REQUEST_COLUMNS`);
            rows not completed (rejected, aborted) are left out, and rows marked ``warmup``
            from all but the ITL gaps, as the run's statistics leave them out.
        budget: tokens per prefill chunk instead of ``max_num_batched_tokens`` (what a
            larger step budget would give).

    Raises:
        InputError: the scenario's cost model cannot be built (as for the run itself).
    """

    def __init__(self, scenario, requests, budget: int | None = None):
        cost = build_cost_model(scenario).step_seconds
        budget = budget or scenario.max_num_batched_tokens
        served = served_rows(requests)

        def column(rows, name):
            return rows[name].to_numpy(dtype=np.int64) if len(rows) else np.zeros(0, np.int64)

        req = served[~served["warmup"]] if len(served) else served
        prompt, cached, out = (column(req, c) for c in
                               ("prompt_tokens", "cached_tokens", "output_tokens"))

        memo: dict = {}   # (prompt, cached) -> seconds: workloads repeat lengths

        def prefill_s(p: int, c: int) -> float:
            if (p, c) not in memo:
                t, done = 0.0, c
                while done < p:
                    n = min(budget, p - done)
                    t += cost(step_plan((n, done, done + n == p)))
                    done += n
                memo[(p, c)] = t
            return memo[(p, c)]

        ttft = np.array([prefill_s(p, c) for p, c in zip(prompt.tolist(), cached.tolist())],
                        dtype=float)
        d0 = cost(step_plan(num_decodes=1, decode_context=1))
        d1 = cost(step_plan(num_decodes=1, decode_context=2)) - d0   # s per context token
        # Decode k (k = 1 .. O-1) attends to prompt + k tokens.
        gap = lambda ctx: (d0 + d1 * (np.asarray(ctx, dtype=float) - 1)) * 1e3   # noqa: E731
        mean_ctx = prompt + out / 2.0                    # mean of prompt+1 .. prompt+O-1
        many = out >= 2
        self.ttft_ms = ttft * 1e3
        self.tpot_ms = gap(mean_ctx[many])
        self.e2el_ms = self.ttft_ms + np.where(many, (out - 1) * gap(mean_ctx), 0.0)
        # Contexts prompt+1 .. prompt+O-1 of every request, counted per context length;
        # warm-up requests too, as the run's pooled ITL keeps their gaps.
        p_all, o_all = column(served, "prompt_tokens"), column(served, "output_tokens")
        two = o_all >= 2
        counts = (interval_counts(p_all[two] + 1, p_all[two] + o_all[two] - 1) if two.any()
                  else np.zeros(1, np.int64))
        ctx = np.nonzero(counts)[0]
        self.itl_values_ms, self.itl_counts = gap(ctx), counts[ctx]

    def stat(self, metric: str, stat: str) -> float | None:
        """``stat`` (``mean`` or ``pNN``) of ``metric``'s floors in ms, as the run computes
        it (numpy's linear percentiles; ITL over token gaps); None with no samples.

        Raises:
            ValueError: a metric without a floor (queue_ms) or an unknown statistic.
        """
        if metric not in FLOOR_METRICS:
            raise ValueError(f"no floor for {metric}; metrics with one: {FLOOR_METRICS}")
        if metric == "itl_ms":
            return slo_stat(self.itl_values_ms, stat, self.itl_counts)
        return slo_stat(getattr(self, metric), stat)


def slo_floors(scenario, result, stats=(), budget: int | None = None) -> dict:
    """``{metric: {stat: floor ms or None}}`` of a run for every floor metric with an SLO
    (its SLO statistics) plus ``stats`` for every floor metric (e.g. ``("p50", "p99")``);
    ``{}`` when there is nothing to compute. ``budget``: as :class:`AloneLatency`'s."""
    slo = result.summary.get("slo") or {}
    # mean first, then percentiles in order (p50, p90, p99), as the run's figures read
    want = {m: sorted(dict.fromkeys([*stats, *(slo.get(m) or {})]), key=slo_stat_rank)
            for m in FLOOR_METRICS}
    want = {m: sts for m, sts in want.items() if sts}
    if not want:
        return {}
    alone = AloneLatency(scenario, result.requests, budget)
    return {m: {st: alone.stat(m, st) for st in sts} for m, sts in want.items()}


def below_floor(summary: dict, floors: dict) -> list[tuple]:
    """Missed SLO entries that requests served alone would miss too: ``(metric, stat,
    threshold, value, floor)`` for each missed entry whose floor (:func:`slo_floors`) is
    above its threshold (a value equal to it meets it), in the summary's SLO order."""
    return [(m, st, e["threshold"], e["value"], floors[m][st])
            for m, entries in (summary.get("slo") or {}).items() if m in floors
            for st, e in entries.items()
            if not e["met"] and e["value"] is not None and floors[m].get(st) is not None
            and floors[m][st] > e["threshold"] + CLOCK_MS]


__all__ = ["AloneLatency", "FLOOR_METRICS", "below_floor", "slo_floors", "step_plan"]
