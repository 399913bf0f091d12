"""Run a scenario: workload → cluster of simulated replicas → metrics.

``simulate(scenario)`` is the one entry point that the CLI, the planner and the tests use.
Replication ``k`` draws its workload and cost noise from
``numpy.random.SeedSequence([seed, k, ...])`` (replication 0 uses the scenario's seed as
given), so replications are independent and any one of them can be rerun alone.
"""

from __future__ import annotations

import numpy as np
import simpy

from .cluster import Cluster
from .cost_model import build_cost_model
from .errors import InputError, KeyedInputError
from .metrics import (MetricsCollector, RunResult, combine_replications, exact_figures,
                      round_sig)
from .policy import NS_PER_S
from .policy.kv_cache import cdiv
from .session_ramp import session_ramp
from .workload import build_workload


def _replication_seed(seed: int, replication: int) -> int:
    if replication == 0:
        return seed
    return int(np.random.SeedSequence([seed, replication]).generate_state(1)[0])


def workload_specs(scenario, replication: int = 0) -> list:
    """The request list (:func:`simulator.workload.build_workload`) that replication
    ``replication`` of ``scenario`` serves (its seed: the workload's, spawned per
    replication).

    Raises:
        InputError: the workload cannot be built, naming the scenario's key or file line.
    """
    seed = _replication_seed(scenario.workload.seed, replication)
    wl = scenario.workload.model_copy(update={"seed": seed})
    owner = scenario.workload_owner   # compare: the first plan's file gave the workload
    try:
        return build_workload(wl, base_dir=owner.base_dir)
    except KeyedInputError as e:   # the key's line in the file, or its --set flag
        raise owner.error(e.key, e.detail, depends=e.depends) from None
    except InputError as e:   # name the scenario unless a data file's line is named
        msg = str(e)
        if msg.split(":")[0].endswith((".csv", ".jsonl", ".json", ".yaml", ".yml")):
            raise
        raise InputError(f"{owner.source}: {msg}") from None


def check_workload_span(scenario) -> None:
    """:func:`simulator.workload.check_arrival_span` of ``scenario``'s workload, said as
    the scenario's error (its key's line or --set flag), before a run warns or draws.

    Raises:
        InputError: naming ``workload.arrival.rate``.
    """
    from .workload import check_arrival_span

    owner = scenario.workload_owner
    try:
        check_arrival_span(scenario.workload)
    except KeyedInputError as e:
        raise owner.error(e.key, e.detail, depends=e.depends) from None


def simulate(scenario, replication: int = 0, specs=None, progress=None,
             cost_models=None) -> RunResult:
    """Simulate one replication of ``scenario``.

    Args:
        scenario: a validated :class:`simulator.scenario.Scenario`.
        replication: replication index (0 = the scenario's own seed).
        specs: a prepared ``RequestSpec`` list to serve instead of building the workload
            (validation replays the exact requests an engine served).
        progress: optional callback ``(done, total)`` called as requests finish.
        cost_models: one step pricer per replica to use instead of the scenario's (each
            with ``step_time_ns(plan)``, ``num_gpu_blocks``, ``label`` and ``kv_note``, as
            :class:`simulator.cost_model.CostModel`); validation uses it to replay an
            engine's recorded step durations or to scale the profile's costs.

    Returns:
        The :class:`RunResult` (summary, per-request table, time series, ITL runs); for
        open-loop conversations the summary's ``sessions`` holds their ramp figures
        (:func:`simulator.session_ramp.session_ramp`).

    Raises:
        InputError: naming the scenario's key: sim.warmup_requests that leaves none of a
            trace's requests, a step priced past the longest a step may take, a KV cache
            that holds no request (:class:`~simulator.errors.DoesNotFit`, from
            :meth:`~simulator.scenario.Scenario.scheduler_config` or the cost model), and
            the cost model's and workload's own errors.
        ValueError: ``cost_models`` not one per replica.
    """
    seed = _replication_seed(scenario.workload.seed, replication)
    if specs is None:
        specs = workload_specs(scenario, replication)
        warm = scenario.sim.warmup_requests
        if warm and warm >= len(specs):   # a trace: its count is known only once read
            raise scenario.error("sim.warmup_requests", (
                f"{warm} leaves none of the {len(specs)} requests of the trace to measure: "
                f"must be < {len(specs)}"), depends=("workload.trace",))
    n_rep = scenario.cluster.replicas
    if cost_models is None:
        base = build_cost_model(scenario)
        cost_models = [base.with_rng(np.random.default_rng(
            np.random.SeedSequence([seed, replication, 1, i]))) for i in range(n_rep)]
    elif len(cost_models) != n_rep:
        raise ValueError(f"cost_models: {len(cost_models)} given for {n_rep} replicas")
    cost = cost_models[0]
    config = scenario.scheduler_config(cost.num_gpu_blocks)
    env = simpy.Environment()
    metrics = MetricsCollector(warmup_requests=scenario.sim.warmup_requests,
                               num_replicas=n_rep)
    total = len(specs)
    done_cb = None
    if progress is not None:
        step = max(total // 200, 1)

        def done_cb(n):
            if n % step == 0 or n == total:
                progress(n, total)
    cluster = Cluster(env, n_rep, config, cost_models, metrics, router=scenario.cluster.router,
                      on_request_done=done_cb, exact_steps=scenario.sim.exact_steps,
                      max_concurrency=scenario.workload.client_concurrency)
    try:
        cluster.run(specs)
    except KeyedInputError as e:   # a step priced past MAX_STEP_S: name the scenario's key
        raise scenario.error(e.key, e.detail, depends=e.depends) from None
    stats = [rep.scheduler.stats for rep in cluster.replicas]
    queries = sum(s.prefix_queries for s in stats)
    hits = sum(s.prefix_hits for s in stats)
    p_queries = sum(s.preempted_queries for s in stats)
    extra = {
        "scenario": scenario.name,
        "replication": replication,
        "seed": seed,
        "replicas": n_rep,
        "router": scenario.cluster.router,
        "cost_model": cost.label,
        "cost_kind": cost.label.split(":", 1)[0],  # measured | projected | inline
        "kv_note": cost.kv_note,
        "num_gpu_blocks": config.num_gpu_blocks,
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,   # a default one capped to the KV cache
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefix_cache_queried_tokens": queries,
        "prefix_cache_hit_tokens": hits,
        "preempted_prefix_hit_rate": (sum(s.preempted_hits for s in stats) / p_queries
                                      if p_queries else 0.0),
        "engine_steps": sum(s.num_steps for s in stats),
        "turns_not_sent": cluster.turns_not_sent,
    }
    if scenario.workload.client_concurrency is not None:
        extra["client"] = client_figures(cluster, scenario.workload.client_concurrency)
    result = metrics.finalize(slo=scenario.slo.model_dump(exclude_none=True), extra=extra)
    if scenario.sim.warmup_requests and scenario.engine.enable_prefix_caching:
        # The schedulers counted every admission; the figures leave warm-up requests out,
        # as every request figure does: their first admissions' prompt and hit tokens are
        # the rows' (equal to the schedulers' counts without warm-up). Preempted requests'
        # re-admissions are counted per scheduler only: that rate keeps the whole run.
        rq = result.requests
        own = ~rq["warmup"].to_numpy() & (rq["finish_reason"] != "rejected").to_numpy()
        q = int(rq["prompt_tokens"].to_numpy()[own].sum())
        h = int(rq["cached_tokens"].to_numpy()[own].sum())
        result.summary.update(prefix_cache_hit_rate=round_sig(h / q) if q else 0.0,
                              prefix_cache_queried_tokens=q, prefix_cache_hit_tokens=h)
    wl = scenario.workload
    if wl.sessions is not None and wl.arrival is not None \
            and wl.arrival.process != "closed_loop":   # a closed loop has no ramp
        ramp = session_ramp(specs, result.requests)
        if ramp is not None:
            result.summary["sessions"] = {k: round_sig(v) for k, v in ramp.items()}
    return result


#: Memory a run holds per request (its spec, live state, record and metrics rows): 1.4 KiB
#: measured (chat.yaml at 100k and 300k requests: 337 and 612 MB peak RSS).
BYTES_PER_REQUEST = 1400


def host_memory_bytes() -> int:
    """This machine's physical memory, bytes (``os.sysconf``).

    Raises:
        ValueError, OSError, AttributeError: where the OS does not tell.
    """
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def client_figures(cluster, limit: int) -> dict:
    """The client side of a run with a concurrency limit: ``{max_concurrency, held_requests,
    wait_mean_s, wait_max_s, offered_rate}``; waits of the held requests, and the rate
    at which requests reached the client (req/s over the span of those times; None for
    fewer than two or a burst at one instant), the load the engine is offered before the
    limit holds any back."""
    waits = np.asarray(cluster.held_waits, dtype=np.float64) / NS_PER_S
    t = cluster.client_arrivals
    span = (max(t) - min(t)) / NS_PER_S if len(t) > 1 else 0.0
    return {"max_concurrency": limit, "held_requests": int(waits.size),
            "wait_mean_s": float(waits.mean()) if waits.size else 0.0,
            "wait_max_s": float(waits.max()) if waits.size else 0.0,
            "offered_rate": (len(t) - 1) / span if span > 0 else None}


def client_warning(summary: dict) -> str | None:
    """What a client-side limit that held requests leaves out of the figures (None when
    it held none, or had no arrival rate to hold them against: a first_free closed loop)."""
    c = summary.get("client")
    if not c or not c["held_requests"] or c["offered_rate"] is None:
        return None
    return (f"workload.max_concurrency {c['max_concurrency']} held {c['held_requests']} "
            f"requests at the client (waits: mean {c['wait_mean_s']:.3g} s, max "
            f"{c['wait_max_s']:.3g} s); TTFT and E2EL count from the send, as vllm bench "
            f"serve times them, and leave those waits out. Requests reached the client at "
            f"{c['offered_rate']:.3g} req/s; served: "
            f"{summary.get('request_throughput') or 0:.3g} req/s")


def unstable_warning(result: RunResult, diagnosis: dict) -> str | None:
    """What an unstable run's figures are (None for a stable one): the stability test of
    a sweep point and of a plan's search (:func:`simulator.executors.job_output`, in
    ``diagnosis["figures"]`` of :func:`simulator.diagnosis.diagnose`), said because a
    single run's latencies then grow with its length. The rates are the test's: arrivals
    and finishes from the first finish to the last arrival
    (:func:`simulator.executors.window_rates`); with a client limit
    (workload.max_concurrency), the rate requests reached the client and the rate they
    went out (the engine's own rates are equal there by construction). A run of fewer than
    :data:`MIN_TAIL_REQUESTS` counted requests may end while its batch still fills up
    (answers of many seconds), which the test cannot tell from a queue that grows: said."""
    from .executors import _arrival_rate, window_rates

    if (diagnosis.get("figures") or {}).get("stable") is not False:
        return None
    client = (result.summary.get("client") or {}).get("offered_rate")
    sent = _arrival_rate(result.requests) if client and len(result.requests) else None
    rates = window_rates(result)
    if sent:   # a client limit sends no faster than answers come back: the queue is its own
        said = (f" ({client:.4g} req/s reached the client and {sent:.4g} req/s went out "
                f"past workload.max_concurrency)")
    else:
        said = (f" ({rates[0]:.4g} req/s arrived and {rates[1]:.4g} req/s finished from the "
                f"first finish to the last arrival)" if rates else "")
    n = result.summary.get("num_requests") or 0
    if n < MIN_TAIL_REQUESTS:
        return (f"the run reads as unstable{said}, as a sweep would flag it, but at {n} "
                f"requests it may have ended while its batch still filled up (answers of "
                f"many seconds), which reads the same: a longer run (workload.num_requests) "
                f"tells them apart; if it is overloaded, its latencies grow with the run's "
                f"length")
    return (f"the run is unstable: requests arrive faster than they are served{said} and "
            f"the queue grows over the run, so its latencies grow with its length (a longer "
            f"run reports higher ones; none is a steady-state figure): sweep the rate, or "
            f"plan, to find the rate it sustains")


def memory_warning(scenario, physical_bytes: int | None = None) -> str | None:
    """Why a run may be killed for memory before it ends (None when it fits): the
    workload's ``num_requests`` × :data:`BYTES_PER_REQUEST` over half the machine's memory
    (``physical_bytes``, default :func:`host_memory_bytes`), said before the run starts."""
    n = scenario.workload.num_requests
    if physical_bytes is None:
        try:
            physical_bytes = host_memory_bytes()
        except (ValueError, OSError, AttributeError):
            return None
    need = (n or 0) * BYTES_PER_REQUEST
    if need <= physical_bytes / 2:
        return None
    gib = 2 ** 30
    return (f"workload.num_requests {n:,} needs about {need / gib:.0f} GiB of memory "
            f"({BYTES_PER_REQUEST / 1024:.1f} KiB per request), "
            f"{'more than' if need > physical_bytes else 'most of'} this machine's "
            f"{physical_bytes / gib:.0f} GiB: the run may be killed before it ends; tens of "
            f"thousands of requests already give steady p99s")


#: Counted requests below which a single run's p99 rests on a handful of them (vllm bench
#: serve sends 1000 prompts unless told otherwise).
MIN_TAIL_REQUESTS = 1000


def start_burst_warning(scenario, result: RunResult) -> str | None:
    """What a closed loop's start does to its TTFT p99 (None when nothing): its
    ``concurrency`` users all send their first request at 0 s, a burst no steady state
    has; said when the counted requests of that burst (those ``sim.warmup_requests`` does
    not leave out) are at least half of those at or above the TTFT p99, which the burst's
    queue then sets."""
    arrival = scenario.workload.arrival
    users = getattr(arrival, "concurrency", 0) if arrival is not None else 0
    if getattr(arrival, "process", None) != "closed_loop" or users < 2 \
            or scenario.sim.warmup_requests >= users:
        return None
    req = result.requests
    req = req[~req["warmup"] & req["ttft_ms"].notna()]
    if len(req) < 2:
        return None
    ttft = req["ttft_ms"].to_numpy(dtype=float)
    burst = req["arrival_s"].to_numpy(dtype=float) == 0.0
    p99 = float(np.percentile(ttft, 99))
    top = ttft >= p99
    if burst.all() or (top & burst).sum() * 2 < top.sum():
        return None
    rest = float(np.percentile(ttft[~burst], 99))
    return (f"the closed loop's {users} users all send their first request at 0 s, and that "
            f"burst's waits set the TTFT p99 ({p99:.4g} ms; {rest:.4g} ms without it): "
            f"sim.warmup_requests: {users} leaves it out of the figures, as a steady state "
            f"(the SLO verdict and the binding limit count it too)")


def tail_warning(scenario, summary: dict) -> str | None:
    """Why a single run's p99 figures are not to be trusted (None when they are): fewer
    than :data:`MIN_TAIL_REQUESTS` counted requests (``summary["completed"]``, warm-up
    left out) and no replications to show their spread (a trace's would be identical).
    The p99 of n values interpolates between the ⌈n/100⌉ + 1 largest (numpy's linear
    method, as vllm bench serve): the 2 largest up to 100 requests."""
    n = summary.get("completed") or 0
    trace = scenario.workload.trace is not None
    if (scenario.sim.replications > 1 and not trace) or n == 0 or n >= MIN_TAIL_REQUESTS:
        return None
    who = ("one request sets them" if n == 1 else
           f"their {cdiv(n, 100) + 1} slowest set them")
    head = (f"the p99 figures rest on {n} request{'s' if n > 1 else ''} ({who}), and a run "
            f"this short may end before queues reach their steady length")
    if trace:
        return head + ": a longer trace (or a wider workload.trace.window_s) steadies them"
    warm = scenario.sim.warmup_requests
    return (head + f": another seed or a longer run can move them far; run at least "
            f"{MIN_TAIL_REQUESTS + warm} (workload.num_requests"
            + (f", {warm} of them warm-up" if warm else "")
            + "), or --replications 3 to see their spread")


def max_model_len_text(scenario, summary: dict | None = None) -> str:
    """The max_model_len a run served with (``summary["max_model_len"]``, else the
    scenario's), saying so when the default was capped to what the KV cache holds."""
    used = (summary or {}).get("max_model_len") or scenario.max_model_len
    if used != scenario.max_model_len:
        return (f"{used} (the default, {scenario.max_model_len}, capped to what the KV cache "
                f"holds, as vLLM's --max-model-len auto does; left unset, vLLM would refuse "
                f"to start)")
    return str(used)


def _trace_requests(summary: dict | None) -> int | None:
    """Requests a run served, warm-up included (a trace's rows used)."""
    if not summary or summary.get("num_requests") is None:
        return None
    return summary["num_requests"] + (summary.get("warmup_requests") or 0)


def trace_shortfall(scenario, summary: dict | None) -> str | None:
    """Why a trace run served fewer requests than ``workload.num_requests`` asks for (the
    trace, after ``window_s``, has no more rows), or None."""
    wl = scenario.workload
    asked, served = wl.num_requests, _trace_requests(summary)
    if wl.trace is None or asked is None or served is None or served >= asked:
        return None
    return (f"workload.num_requests is {asked}, but the trace"
            + (" (within workload.trace.window_s)" if wl.trace.window_s is not None else "")
            + f" has only {served} requests: the run takes all of them")


def report_meta(scenario, summary: dict | None = None) -> dict:
    """Run facts shown at the top of a report (not part of summary.json); ``summary``
    (a run's) gives the max_model_len it served with."""
    hw = scenario.hardware
    e = scenario.engine
    wl = scenario.workload
    shape = scenario.model_shape
    meta = {
        "scenario": scenario.source,
        "model": f"{shape.name} ({scenario.dtype})",
        "hardware": (f"{hw.profile} × tensor_parallel {hw.tensor_parallel}" if hw.profile
                     else f"inline step time ({hw.step_time.form})"),
        # Resolved values, not the file's unset ones (vLLM's defaults and derivations).
        "engine": ", ".join(f"{k}={v}" for k, v in {
            **e.model_dump(), "max_num_seqs": scenario.max_num_seqs,
            "max_num_batched_tokens": scenario.max_num_batched_tokens,
            "max_model_len": max_model_len_text(scenario, summary),
            "num_gpu_blocks": ("from the KV cache memory (see KV cache)"
                               if e.num_gpu_blocks is None else e.num_gpu_blocks)}.items()),
        "cluster": f"{scenario.cluster.replicas} replica(s), router {scenario.cluster.router}",
        "workload": (f"trace {wl.trace.path} ({wl.trace.format})"
                     + (f", {_trace_requests(summary)} requests" if summary else "")
                     + (f"; {short}" if (short := trace_shortfall(scenario, summary)) else "")
                     if wl.trace else
                     f"{wl.num_requests} requests, arrival {wl.arrival.process}")
                    + (f"; at most {wl.client_concurrency} in flight, client side (held "
                       f"requests timed from when they are sent)"
                       if wl.client_concurrency else ""),
        "seed": wl.seed,
        "replications": scenario.sim.replications,
        "scheduling": "vLLM V1 semantics, synchronous scheduling (async_scheduling=False)",
    }
    return meta


def simulate_replications(scenario, progress=None) -> tuple[list[RunResult], dict | None]:
    """Run ``scenario.sim.replications`` replications.

    Returns:
        (results, combined) where ``combined`` holds the mean and 95% confidence interval
        of every summary figure across replications (``None`` for a single replication),
        and with SLOs ``slo_met``: ``{"met_in": replications meeting every SLO, "n"}``;
        unrounded, from the runs' exact figures (:func:`exact_figures`): each shown
        figure, and replications.json, rounds once.
    """
    n = scenario.sim.replications
    results = []
    for k in range(n):
        cb = None
        if progress is not None:
            def cb(done, total, k=k):
                progress(k * total + done, n * total)
        results.append(simulate(scenario, replication=k, progress=cb))
    # a replication's index and seed are labels, not figures to average
    labels = ("replication", "seed")
    exact = [exact_figures(r.summary, r.exact) for r in results]
    combined = combine_replications([{k: v for k, v in s.items() if k not in labels}
                                     for s in exact], rounded=False) if n > 1 else None
    met = [r.summary.get("slo_met") for r in results]
    if combined is not None and None not in met:   # a bool has no mean: counted apart
        combined["slo_met"] = {"met_in": sum(met), "n": n}
    return results, combined
