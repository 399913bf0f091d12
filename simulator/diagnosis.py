"""What limits a run, and which knob would move it (shown in every run report).

:func:`diagnose` splits TTFT into queueing (arrival → first scheduled) and prefill (first
scheduled → first token: the prompt's chunks, and any wait between them), prices each
request as if served alone on an idle replica (:mod:`simulator.alone`), then checks the
limits a vLLM operator can turn, in this order:

* ``max_model_len``: rejected requests (they fail the SLO whatever else changes).
* ``session_ramp``: conversations that ended before they built up their load
  (:mod:`simulator.session_ramp`): nothing can be said of that load, so this comes first.
* ``client_concurrency``: a client-side ``workload.max_concurrency`` whose sends fall
  behind the arrivals while the engine runs fewer than max_num_seqs: the client, not the
  engine, binds.
* ``prefix_cache``: a workload with shared prefixes whose hit rate is well below the
  shared share of the prompts (under half; under :data:`SCATTERED_HITS` of it behind a
  router that ignores prefixes, which scatters prefix groups and conversations' histories
  over the replicas; ``session_affinity`` is tried for conversations, ``prefix_affinity``
  for other repeats). Caching off, or such a router, is a setting that removes prefill
  work, so it comes before any hardware (while an SLO is missed; with every SLO met it is
  an observation); a cache too small to keep the prefixes comes with the other findings.
* ``router``: waiting (or a waiting SLO missed) behind ``round_robin``, most of it on a
  replica while another kept nobody waiting (:func:`waiting_while_another_admits`): a
  router that looks at load (``least_outstanding``) is a free setting (an observation
  with every SLO met).
* ``max_num_batched_tokens`` / ``latency_floor``: a latency SLO that requests served alone
  would already miss (with the run's prefix-cache hits): no number of replicas meets it.
  When longer prefill chunks would meet it (each step reads the weights once), the step
  budget binds; else only faster steps (a faster GPU, a higher tensor_parallel: the
  smallest whose requests alone meet it, doubled while its run under the load misses).
  Also a miss although no two requests were ever in the system at once (step-cost noise,
  ``cost_noise: empirical``).
* ``kv_capacity``: queueing while ``engine.watermark`` holds admission back (the cache's
  peak within :data:`WATERMARK_NEAR` of the share the watermark leaves), preemptions
  (vLLM V1 preempts the last running request when a block cannot be allocated; with
  ``scheduler_reserve_full_isl`` off, or no watermark, those knobs are named too), or
  queueing while running requests are below ``max_num_seqs`` and the KV cache is nearly
  full, or as many ran at once as it holds at their mean length (a few long requests fill
  it, leaving fewer blocks free than one needs): admission waits for free blocks. The
  change tried is the cache the GPUs hold where a setting keeps it smaller, else twice it:
  a test of the cache alone, which the knob says the GPUs cannot hold and what would
  (:func:`_kv_change`, :func:`_beyond_memory`).
* ``max_num_seqs``: queueing while a replica runs ``max_num_seqs`` requests most of the time,
  or while most of the waiting happens with ``max_num_seqs`` running (bursts), and the
  running sequences the offered load needs (Little's law, :func:`max_num_seqs_needed`; at
  least twice as many, at most what the KV cache holds) would raise decode throughput by
  :data:`MIN_GAIN` or more (else the steps are full: ``compute``). The change tried is
  that many: twice
  them can fall short of the load where more replicas (all resources at once) do not;
  where the cache holds fewer, with the blocks to hold them at their mean context.
* ``max_num_batched_tokens``: queueing while steps carry their whole token budget, where
  twice the budget would raise token throughput by :data:`MIN_GAIN` or more.
* ``compute``: queueing (or an unstable run): every step is full of work; only faster or
  more GPUs help (beside a KV, max_num_seqs or budget limit too: more replicas share the
  load).
  Also without queueing, when a TTFT, queue or E2EL SLO is missed and the TTFT tail is
  mostly waiting (queue p99 at least half the TTFT p99): bursts of arrivals the engine
  drains only after a while (inter-arrival CV of at least :data:`BURSTY_CV`, said so
  however busy the engine: decodes keep a step running nearly all the time at any load),
  or Poisson-like arrivals colliding by chance; or, last, when a latency SLO that requests
  alone would meet is missed and nothing else was found: sharing steps with other
  requests (each added request lengthens the batch) makes the difference. Where requests
  alone already take :data:`NEAR_FLOOR` of the SLO or more, the tail is their own length
  and the knob tried is faster steps, not more replicas.
* ``prefill_interference``: long prefill chunks share steps with decodes, so ITL p99 is
  far above its median (vLLM chunked prefill: ``max_num_batched_tokens`` bounds a chunk).
* ``wake_up``: a TTFT or E2EL SLO missed that the run would meet without the wake-up cost
  of the profile (``idle``: the first step of a replica that idled runs slower, measured by
  ``servesim calibrate``) on the requests that arrived at an idle replica
  (:func:`wake_up_ms`). At a light load most requests wake their replica, and more
  replicas idle longer: the knob is fewer replicas (or none, with one). It binds before
  the other findings when it explains the miss alone (the figure without it is an
  estimate: only each request's own wake-up is taken off); else it is listed after them
  when it moves a missed figure by more than 10%.

Rejections, free prefix-cache settings, the floor and the router come first; then the findings whose
knob moves a missed SLO (:data:`MOVES`: a higher max_num_seqs or budget shortens waits but
lengthen steps, so not TPOT or ITL; shorter chunks lengthen prefills, so not TTFT, and
with TTFT missed they come after compute); with
every SLO met, the queueing limits; with none given, every finding. The first of these
binds (``none`` when there is none; findings are still listed). A latency SLO missed that
no finding explains is the load's (``compute`` above). Where cheap, counterfactual runs
with their knobs turned decide among them (:func:`diagnose`).
"""

from __future__ import annotations

import math

import numpy as np
import yaml

from .alone import FLOOR_METRICS, below_floor, slo_floors, step_plan
from .scenario import MAX_TP
from .errors import InputError
from .files import load_yaml
from .executors import job_output, offered_rate
from .metrics import METRIC_LABELS, served_rows, slo_stat
from .policy.kv_cache import GPU_MEMORY_UTILIZATION, cdiv
from .run import max_model_len_text

# The thresholds below are heuristics, set on the hand-built scenarios of
# tests/test_diagnosis.py: each picks which findings to list and try, and a counterfactual
# run with the finding's knob turned then tests it, so a threshold a few % off changes the
# order knobs are tried in, not whether a knob is shown to move the figure. No published
# source sets them, and no flag or scenario key changes them (module constants).

#: TTFT share of queueing above which queueing counts as significant (a synchronous
#: engine makes every arrival wait for the running step, so some queueing is inherent).
#: Half: waiting then outweighs prefill in the mean TTFT (QUEUE_STEPS rules out the waits
#: of long steps).
QUEUE_SHARE = 0.5
#: Queue p99 in mean step times above which waits exceed the step in flight. A wait for
#: the step in flight lasts under one mean step (a few where prefill steps are longer than
#: the mean); 2 would count those waits as queueing, 8 would miss a queue of a few steps.
QUEUE_STEPS = 4.0
#: Busy fraction above which the engine counts as saturated. An M/G/1 wait grows as
#: 1 / (1 − busy): ×6.7 at 0.85, ×3.3 at 0.7 (capacity to spare); near 1 it would miss an
#: engine saturated in bursts with idle gaps between them.
BUSY = 0.85
#: Mean KV usage above which the cache counts as nearly full. A cache that holds admission
#: back keeps free only less than the next request needs, so its mean stays below 1; 0.8
#: would blame a cache a fifth free. (A few long requests that fill it are caught by their
#: count, ``kv_holds_requests``.)
KV_FULL = 0.9
#: Peak KV usage / (1 − engine.watermark) above which the watermark holds admission back
#: (the margin of :data:`KV_FULL`).
WATERMARK_NEAR = 0.9
#: Mean running requests per replica / max_num_seqs above which the cap binds. The mean
#: counts quiet spells too, so a cap that binds shows below 1; :data:`SEQS_FULL` catches a
#: cap that binds only in bursts, and the run at a higher cap (:data:`MIN_GAIN`) tests
#: both.
SEQS_BUSY = 0.8
#: Share of the waiting done while max_num_seqs sequences run, above which it binds. Half:
#: the cap then holds back most of the waiting; lower would run the max_num_seqs test
#: (:func:`max_num_seqs_gain`) on caps that hold back little, higher miss caps that bind
#: in bursts.
SEQS_FULL = 0.5
#: Decode throughput at 2 × max_num_seqs over that at max_num_seqs below which a higher
#: max_num_seqs adds too little (10%, as a counterfactual that "moves" a figure): each
#: added sequence lengthens the step nearly as much as it adds work (per-sequence cost,
#: e.g. KV reads, dominates), so the steps, not max_num_seqs, are full.
MIN_GAIN = 1.1
#: Mean tokens per step / max_num_batched_tokens above which the steps are full (the
#: margin of :data:`KV_FULL`: steps between bursts carry less); the run at twice the
#: budget (:func:`budget_gain`) then tests it.
TOKENS_FULL = 0.9
#: ITL p99 / p50 above which prefills stall decodes: the slowest 1% of decode steps take
#: three median steps, more than a changing decode batch size alone explains; lower would
#: flag that variation, higher miss prefill chunks that stall decodes but less.
ITL_SPIKE = 3.0
#: Counterfactual runs only for workloads up to this many requests.
MAX_COUNTERFACTUAL_REQUESTS = 20_000
#: Queue p99 / TTFT p99 above which the TTFT tail is waiting (bursts), not prefill. Half:
#: waiting then outweighs prefill in the tail, as :data:`QUEUE_SHARE` in the mean.
TAIL_QUEUE = 0.5
#: Inter-arrival coefficient of variation from which arrivals count as bursts (Poisson: 1;
#: vLLM's gamma arrivals: 1 / sqrt(burstiness), so burstiness 0.5 gives 1.41).
BURSTY_CV = 1.3
#: SLO metrics that waiting for the engine makes miss.
WAIT_METRICS = ("ttft_ms", "queue_ms", "e2el_ms")
#: Floor (requests served alone) / SLO threshold from which a missed SLO is near the floor:
#: more replicas remove only the little that sharing adds, faster steps are tried instead.
#: At 0.9 more replicas can take at most 10% off (the share of a figure that moves it,
#: :func:`_moved`); at 0.5 faster steps would be tried where more replicas would do.
NEAR_FLOOR = 0.9
#: Share of the waiting that happens while another replica holds nobody waiting above which
#: a round-robin router's imbalance is a finding (a load-aware router sends it there).
#: Half: the imbalance then causes most of the waiting; lower would name the router where
#: most waiting is load that every replica shares.
IDLE_ELSEWHERE = 0.5


def _missed(summary: dict, metrics) -> bool:
    """Whether an SLO on one of ``metrics`` is missed."""
    return any(not e.get("met", True) for m in metrics
               for e in ((summary.get("slo") or {}).get(m) or {}).values())


def _stats(x: np.ndarray) -> dict:
    """Mean, p50 and p99 of ``x`` (NaN left out); None each with no samples."""
    x = x[~np.isnan(x)]
    return {st: slo_stat(x, st) for st in ("mean", "p50", "p99")}


def ttft_split(result) -> dict:
    """TTFT of counted, completed requests split into ``queue`` (arrival → first
    scheduled) and ``prefill`` (first scheduled → first token), ms: mean, p50, p99 of
    each, and ``queue_share`` = mean queue / mean TTFT."""
    req = result.requests
    req = req[~req["warmup"]] if len(req) else req
    ttft = req["ttft_ms"].to_numpy(dtype=float) if len(req) else np.array([])
    queue = req["queue_ms"].to_numpy(dtype=float) if len(req) else np.array([])
    ok = ~np.isnan(ttft) & ~np.isnan(queue)
    q, t = queue[ok], ttft[ok]
    out = {"queue_ms": _stats(q), "prefill_ms": _stats(t - q), "ttft_ms": _stats(t)}
    out["queue_share"] = float(q.mean() / t.mean()) if t.size and t.mean() > 0 else 0.0
    return out


def arrival_cv(result) -> float | None:
    """Coefficient of variation (std / mean) of the gaps between counted requests' arrivals
    (warm-up excluded): 1 for Poisson arrivals, above 1 for bursts, 0 for a fixed rate;
    None with fewer than three arrivals or all at one instant."""
    req = result.requests
    if not len(req):
        return None
    t = np.sort(req.loc[~req["warmup"], "arrival_s"].to_numpy(dtype=float))
    gaps = np.diff(t)
    if gaps.size < 2 or gaps.mean() <= 0:
        return None
    return float(gaps.std() / gaps.mean())


def waiting_while_another_admits(reps) -> float | None:
    """Share of the waiting (request-seconds, time series bins of each replica) held back on
    a replica while another replica kept nobody waiting: no request stayed in its queue past
    a scheduling decision in that bin (``waiting_max`` 0), so a router that looks at the
    replicas' load would have had it start there. Only waits past a scheduling decision
    count (a synchronous engine makes every arrival wait for the step in flight). None
    with one replica or no such wait.

    Args:
        reps: per-replica rows of a run's time series (``replica`` != "all").
    """
    if reps is None or not len(reps) or reps["replica"].nunique() < 2:
        return None
    wide = reps.pivot_table(index="time_s", columns="replica",
                            values=["waiting", "waiting_max", "bin_s"], fill_value=0)
    held = wide["waiting_max"].to_numpy() > 0
    w = (wide["waiting"] * wide["bin_s"]).to_numpy() * held
    if w.sum() <= 0:
        return None
    admits = ~held   # nobody left waiting in the bin
    elsewhere = (admits.sum(axis=1, keepdims=True) - admits) > 0
    return float((w * elsewhere).sum() / w.sum())


def max_num_seqs_gain(scenario, result) -> tuple[float, int] | None:
    """What a higher max_num_seqs would give a replica: ``(gain, n2)``. ``n2`` is the
    smallest N · 2^k (k >= 1; N = ``max_num_seqs``) at or above the running sequences the
    offered load needs (:func:`max_num_seqs_needed`), or fewer where the KV cache holds
    fewer sequences at the mean context (blocks of the run / blocks per sequence); ``gain``
    = decode throughput at ``n2`` over that at N (n2 · t(N) / (N · t(n2)), t priced
    noise-free by the run's cost model for a decode-only step at the counted, completed
    requests' mean context, prompt + output / 2 tokens; 1 when no more sequences fit). None
    without such requests.

    Raises:
        InputError: the scenario's cost model cannot be built (as for the run itself).
    """
    from .cost_model import build_cost_model

    req = _served_requests(result)
    if not len(req):
        return None
    ctx = _mean_context(req)
    n = scenario.max_num_seqs
    n2 = _max_num_seqs_to_try(n, max_num_seqs_needed(scenario, result))
    blocks = result.summary.get("num_gpu_blocks")
    if blocks:   # sequences the cache holds at the mean context
        n2 = min(n2, _seqs_held(blocks, ctx, scenario.engine.block_size))
    if n2 <= n:
        return 1.0, n2
    cost = build_cost_model(scenario).step_seconds
    return (n2 * cost(step_plan(num_decodes=n, decode_context=ctx))
            / (n * cost(step_plan(num_decodes=n2, decode_context=ctx)))), n2


def _kv_holds(scenario, result) -> int | None:
    """Requests of the counted, completed requests' mean prompt + output tokens that the
    run's KV cache holds at once (less vLLM's null block); None when the cache is
    unlimited or no such request completed."""
    blocks = result.summary.get("num_gpu_blocks")
    req = _served_requests(result)
    if not blocks or not len(req):
        return None
    tokens = float((req["prompt_tokens"] + req["output_tokens"]).mean())
    return int(_seqs_held(blocks, math.ceil(tokens), scenario.engine.block_size))


def _mean_context(req) -> int:
    """Mean context of requests ``req`` (the counted, completed ones,
    :func:`_served_requests`) while they decode: prompt + half the output, tokens (at
    least 1)."""
    return max(1, round(float((req["prompt_tokens"] + req["output_tokens"] / 2).mean())))


def _seqs_held(blocks: int, tokens: int, block_size: int) -> int:
    """Sequences of ``tokens`` tokens that ``blocks`` KV blocks hold at once, less vLLM's
    null block."""
    return (blocks - 1) // cdiv(tokens, block_size)


def _max_num_seqs_to_try(n: int, need: float | None) -> int:
    """The smallest ``n`` · 2^k (k >= 1) at or above ``need`` running sequences (2n
    without one)."""
    n2 = 2 * n
    while need is not None and n2 < need:
        n2 *= 2
    return n2


def _served_requests(result):
    """The counted requests that completed (not warm-up, rejected or aborted)."""
    req = served_rows(result.requests)
    return req[~req["warmup"]] if len(req) else req


def max_num_seqs_needed(scenario, result) -> float | None:
    """Running sequences a replica needs to serve every offered request without queueing: L +
    3 √L, L = λ · S by Little's law (λ the offered rate per replica, S the mean time a
    counted, completed request spent running, first scheduled → finish, in this run: a
    lower bound, as steps of more sequences take longer), with three standard deviations
    of a Poisson count of L for the peaks; at most the run's requests per replica (a burst
    of them all at once needs no more). None without a rate or such requests."""
    req = _served_requests(result)
    rate = offered_rate(result)
    if not len(req) or not rate:
        return None
    nrep = result.summary.get("replicas") or scenario.cluster.replicas
    load = rate / nrep * float((req["finish_s"] - req["first_scheduled_s"]).mean())
    return min(load + 3.0 * math.sqrt(load), len(result.requests) / nrep)


def budget_gain(scenario) -> float:
    """Token throughput of steps of twice ``max_num_batched_tokens`` over steps of it: 2 ·
    t(B) / t(2B), t priced noise-free by the run's cost model for one prefill chunk of B
    tokens from the start of a prompt.

    Raises:
        InputError: the scenario's cost model cannot be built (as for the run itself).
    """
    from .cost_model import build_cost_model

    cost = build_cost_model(scenario).step_seconds
    b = scenario.max_num_batched_tokens
    return 2 * cost(step_plan((b, 0, False))) / cost(step_plan((2 * b, 0, False)))


def _budget_floor(scenario, result, floor) -> dict | None:
    """A ``max_num_batched_tokens`` finding when requests served alone miss the SLOs in
    ``floor`` (:func:`below_floor` entries) only because their prompts run in chunks: the
    smallest ``max_num_batched_tokens`` × 2^k (up to ``max_model_len``) whose floors meet
    them all, or vLLM's default for the device when larger (the load adds to the floor);
    None when none does (or prompts are not chunked)."""
    b0, top = scenario.max_num_batched_tokens, scenario.max_model_len
    if not any(m in ("ttft_ms", "e2el_ms") for m, *_ in floor):
        return None   # chunks set no TPOT or ITL floor
    b = b0
    while b < top:
        b = min(2 * b, top)
        if not below_floor(result.summary, slo_floors(scenario, result, budget=b)):
            break
    else:
        return None
    b = max(b, min(scenario.serving_defaults()[0], top))
    alone = slo_floors(scenario, result, budget=b)
    return _finding(
        "max_num_batched_tokens", "; ".join(
            f"{METRIC_LABELS[m]} {st} would be {fl:.4g} ms for requests served alone in "
            f"prefill chunks of {b0} tokens, above the SLO's {thr:g} ms (here {value:.4g} "
            f"ms), and {alone[m][st]:.4g} ms in chunks of {b}" for m, st, thr, value, fl in floor),
        "raise max_num_batched_tokens: a prompt in fewer, longer steps (each reads the "
        "weights once); longer chunks stall the decodes that share their steps (ITL)",
        f"engine.max_num_batched_tokens={b}")


def _kv_change(scenario, blocks: int | None) -> str | None:
    """The ``--set`` change that tries a larger KV cache and nothing else: vLLM's default
    ``gpu_memory_utilization`` (0.92) where the scenario uses less of the memory; the blocks
    the GPUs' memory holds where ``engine.num_gpu_blocks`` (vLLM's
    ``--num-gpu-blocks-override``) sets fewer (twice as many could still bind where the
    memory does not); else twice the blocks, a test of the cache alone that the knob text
    says how to realise (a higher tensor_parallel or a GPU with more memory also changes
    the compute, which would hide whether the cache is what binds). None without a block
    count."""
    if scenario.engine.num_gpu_blocks is None and scenario.hardware.step_time is None \
            and scenario.engine.gpu_memory_utilization < GPU_MEMORY_UTILIZATION:
        return f"engine.gpu_memory_utilization={GPU_MEMORY_UTILIZATION:g}"
    held = _memory_blocks(scenario) if scenario.engine.num_gpu_blocks is not None else None
    if held and blocks and held > blocks:
        return f"engine.num_gpu_blocks={held}"
    return f"engine.num_gpu_blocks={2 * blocks}" if blocks else None


def _beyond_memory(scenario, change: str | None) -> str:
    """What the knob text says of a ``change`` (settings joined by commas: twice the
    blocks of :func:`_kv_change`, or a higher max_num_seqs with the blocks to hold them)
    that sets more ``engine.num_gpu_blocks`` than the scenario's GPUs hold at its
    gpu_memory_utilization (:func:`_memory_blocks`): a test of more cache than they hold,
    which vLLM would fail to allocate on them, and what would hold it (twice the
    tensor_parallel, with its blocks, where the model splits that far and they hold as
    many; or a GPU with more memory). "" where the GPUs hold it, or no memory sizes the
    cache (an inline step time)."""
    value = dict(c.partition("=")[::2] for c in (change or "").split(",")).get(
        "engine.num_gpu_blocks")
    held = _memory_blocks(scenario) if value is not None else None
    if held is None or int(value) <= held:
        return ""
    tp = 2 * scenario.hardware.tensor_parallel
    sc = _valid_change(scenario, f"hardware.tensor_parallel={tp}") if tp <= MAX_TP else None
    more = _memory_blocks(sc) if sc is not None else None
    return (f"the try, {value} blocks, is a test of more cache than this replica's "
            f"GPUs hold ({held} at gpu_memory_utilization "
            f"{scenario.engine.gpu_memory_utilization:g}: vLLM would fail to allocate it); "
            + (f"tensor_parallel {tp} ({more} blocks) or a GPU with more memory holds it"
               if more is not None and more >= int(value) else
               "a GPU with more memory holds it"))


def _memory_blocks(scenario) -> int | None:
    """KV blocks the scenario's GPUs hold at its gpu_memory_utilization, without its
    ``engine.num_gpu_blocks`` (None where no memory sizes the cache: an inline step time,
    or a profile that records no KV capacity)."""
    from .cost_model import build_cost_model

    sc = _valid_change(scenario, "engine.num_gpu_blocks=null")
    return build_cost_model(sc).num_gpu_blocks if sc is not None else None


def shareable_share(specs) -> float:
    """Share of prompt tokens that one unbounded prefix cache would hit: the longest
    leading run of each prompt's segments (:class:`simulator.policy.RequestSpec`) that an
    earlier prompt, or an earlier prompt with its answer, began with (a shared system
    prompt, a conversation's history), at most all but the prompt's last token (vLLM
    computes that one). Requests in arrival order, follow-up turns after them in id
    order (each after its previous turn); block alignment is ignored. 0 without prompts."""
    firsts = sorted((s for s in specs if s.after is None),
                    key=lambda s: (s.arrival_ns, str(s.request_id)))
    follow = sorted((s for s in specs if s.after is not None),
                    key=lambda s: (not isinstance(s.request_id, int), s.request_id))
    seen: set = set()
    hit = total = 0
    for s in firsts + follow:
        key, n, best = (), 0, 0
        for seg in s.prompt:
            key += (seg,)
            n += seg[1]
            if key in seen:
                best = n
            seen.add(key)
        out = s.output_content_id if s.output_content_id is not None else ("out", s.request_id)
        seen.add(key + ((out, s.max_tokens),))
        hit += min(best, n - 1)
        total += n
    return hit / total if total else 0.0


def replica_sizer(scenario) -> str:
    """The command that finds the fewest replicas for ``scenario``: ``servesim plan``, which
    searches a request rate, unless the workload has none to search (a trace, a closed loop,
    a client-side max_concurrency, conversations: plan refuses them), where a sweep over the
    replica count does."""
    wl = scenario.workload
    if wl.trace is not None or wl.sessions is not None or wl.max_concurrency is not None or (
            wl.arrival is not None and wl.arrival.process == "closed_loop"):
        return "servesim sweep --set cluster.replicas=1,2,3,..."
    return "servesim plan"


def _finding(limit, evidence, knob, change=None):
    # change: the settings a counterfactual run tries, key=value joined by commas
    return {"limit": limit, "evidence": evidence, "knob": knob, "change": change}


#: Limits that hold requests in the queue.
QUEUEING = ("kv_capacity", "max_num_seqs", "max_num_batched_tokens", "compute")
#: The SLO metrics each finding's knob moves. A higher max_num_seqs (or token budget)
#: shortens the wait but puts more in each step (TPOT and ITL rise); more KV cache ends
#: preemptions (whose recomputation every figure pays); more or faster GPUs move all;
#: shorter prefill chunks smooth the decodes (and lengthen prefills: TTFT is not among
#: them); prefix-cache hits remove prefill work.
ALL_METRICS = (*FLOOR_METRICS, "queue_ms")
MOVES = {"max_num_seqs": WAIT_METRICS, "max_num_batched_tokens": WAIT_METRICS,
         "kv_capacity": ALL_METRICS, "compute": ALL_METRICS,
         "prefill_interference": ("itl_ms", "tpot_ms", "e2el_ms"),
         "prefix_cache": ALL_METRICS, "router": ALL_METRICS,
         "client_concurrency": ALL_METRICS, "wake_up": ("ttft_ms", "e2el_ms")}


def _moves(finding: dict, metrics) -> bool:
    """Whether ``finding``'s knob moves one of ``metrics``."""
    return bool(set(MOVES.get(finding["limit"], ())) & set(metrics))




def _faster(scenario, ttft: bool, result=None, floor=()) -> tuple[str, str | None]:
    """Knob and ``--set`` change for faster steps: a higher tensor_parallel where the cost
    model can price it (not an inline step time, nor a profile measured at one
    tensor_parallel) within one node (:data:`MAX_TP`): the smallest power-of-two multiple
    whose requests alone meet the SLOs in ``floor`` (:func:`below_floor` entries of
    ``result``), else the largest, said to fall short; without ``floor``, ×2."""
    tp = scenario.hardware.tensor_parallel
    change, short = None, ""
    if scenario.hardware.step_time is None:
        k = 2 * tp
        while k <= MAX_TP:
            sc = _valid_change(scenario, f"hardware.tensor_parallel={k}")
            if sc is None:
                break
            change = f"hardware.tensor_parallel={k}"
            if not floor:
                break
            left = below_floor(result.summary, slo_floors(sc, result))
            if not left:
                short = ""
                break
            m, st, thr, _, fl = left[0]
            short = (f" (even tensor_parallel {k} leaves {METRIC_LABELS[m]} {st} of requests "
                     f"alone at {fl:.4g} ms, above {thr:g} ms: a faster GPU too)")
            k *= 2
    knob = ("faster steps: a faster GPU or a higher tensor_parallel" + short if change else
            "faster steps (hardware.step_time)" if scenario.hardware.step_time is not None
            else "faster steps: a faster GPU or device")
    if ttft:
        knob += "; for TTFT also shorter prompts or prefix-cache hits on shared prefixes"
    return knob, change


def _valid_change(scenario, change: str):
    """The scenario with ``change`` when it accepts it and can price its steps (a profile
    measured at one tensor_parallel cannot price another), else None."""
    from .cost_model import build_cost_model
    from .scenario import scenario_from_dict

    raw = scenario.model_dump(mode="python", exclude_none=True)
    try:
        sc = scenario_from_dict(raw, scenario.base_dir, source=scenario.source,
                                overrides=[change])
        build_cost_model(sc)
    except InputError:
        return None
    return sc


def wake_up_ms(idle, requests) -> np.ndarray:
    """The wake-up cost (ms) each row of ``requests`` (:data:`simulator.metrics.
    REQUEST_COLUMNS`) paid in its first step for arriving at an idle replica, shape (n,):
    0 for a row that found its replica busy (or was rejected, which wakes nothing).
    ``idle``: the run's :class:`simulator.cost_model.IdleInfo` (its cost model's ``idle``).

    A replica idles from the end of the step that finished the last of its requests (from 0
    at the start) until an arrival wakes it; that arrival's first step pays
    ``idle.seconds`` of the time idle (:mod:`simulator.replica`). A row unfinished at the
    end of the run keeps its replica busy.
    """
    r = requests
    if not len(r):
        return np.zeros(0)
    rejected = (r["finish_reason"] == "rejected").to_numpy()
    fin = r["finish_s"].to_numpy(dtype=float).copy()
    fin[np.isnan(fin)] = np.inf
    fin[rejected] = -np.inf
    arrival = r["arrival_s"].to_numpy(dtype=float)
    idle_from = np.zeros(len(r))   # each row: when its replica last went idle before it
    for _, rows in r.groupby("replica", sort=False).indices.items():
        rows = rows[np.argsort(arrival[rows], kind="stable")]
        before = np.maximum.accumulate(fin[rows])
        idle_from[rows[1:]] = np.maximum(before[:-1], 0.0)
    gap = arrival - idle_from
    woke = (gap >= 0) & ~rejected
    return np.where(woke, idle.seconds(np.where(woke, gap, 0.0)) * 1e3, 0.0)


def _wake_up(scenario, result, missed, nrep: int):
    """``(figures, finding or None, explains)`` for :func:`find_limits`: what the wake-up
    after idle (:func:`wake_up_ms`) added to the run, and, for the missed TTFT / E2EL SLO
    entries ``missed`` (``(metric, stat, threshold, value)``), the figures without it."""
    from .alone import CLOCK_MS
    from .cost_model import build_cost_model

    idle = getattr(build_cost_model(scenario), "idle", None)
    if idle is None:
        return None, None, False
    r = result.requests
    extra = wake_up_ms(idle, r)
    counted = r.index.isin(_served_requests(result).index)   # the rows the figures count
    woke = extra[counted] > 0
    if not woke.any():
        return {"woke_share": 0.0}, None, False
    figures = {"woke_share": float(woke.mean()),
               "extra_ms_mean": float(extra[counted][woke].mean()), "without_ms": {}}
    rows = []
    for m, st, thr, value in missed:
        if m not in MOVES["wake_up"]:
            continue
        x = r[m].to_numpy(dtype=float)[counted] - extra[counted]
        v = slo_stat(x, st)
        figures["without_ms"].setdefault(m, {})[st] = v
        rows.append((m, st, thr, value, v))
    met = [x for x in rows if x[4] <= x[2] + CLOCK_MS]
    moved = [x for x in rows if _moved(x[3], x[4], True)]
    shown = met or moved
    if not shown:
        return figures, None, False
    fewer = nrep > 1
    finding = _finding(
        "wake_up", f"{figures['woke_share']:.0%} of the requests arrived at an idle replica, "
        f"whose first step the profile prices {figures['extra_ms_mean']:.3g} ms slower on "
        f"average (its idle table: {idle.describe()}): without it "
        + "; ".join(f"{METRIC_LABELS[m]} {st} would be about {v:.4g} ms against the SLO's "
                    f"{thr:g} ms (here {value:.4g} ms)" for m, st, thr, value, v in shown)
        + ("" if fewer else "; more replicas would idle longer and pay more"),
        ("fewer replicas for this load, so that each idles less (the wake-up is the "
         "device's: its caches, or a GPU's clocks, cool while the engine waits)" if fewer else
         "a replica that idles less (more load per replica; more replicas idle longer): the "
         "wake-up is the device's (its caches, or a GPU's clocks, cool while the engine "
         "waits; on a shared host, other work evicts them), so a dedicated host pays less"),
        f"cluster.replicas={nrep - 1}" if fewer else None)
    return figures, finding, bool(met)


def find_limits(scenario, result) -> dict:
    """The figures and findings of :func:`diagnose`, without a counterfactual run, and
    ``eligible``: how many of the findings (the first ones) could bind."""
    s = result.summary
    e = scenario.engine
    nrep = s.get("replicas") or scenario.cluster.replicas
    split = ttft_split(result)
    offered = offered_rate(result)
    achieved = s.get("request_throughput")
    stable = job_output(result)["stable"]   # the planner's stability test
    conc = s.get("concurrency") or {}
    running = (conc.get("running_mean") or 0.0) / nrep
    running_max = conc.get("running_max_per_replica") or 0
    kv = s.get("kv_cache_usage") or {}
    kv_mean = kv.get("mean") or 0.0
    pre = s.get("preemptions") or 0
    ts = result.timeseries
    reps = ts[ts["replica"] != "all"] if ts is not None and len(ts) else None   # per replica
    busy = None
    if ts is not None and len(ts):
        all_rows = ts[ts["replica"] == "all"]
        if len(all_rows):
            busy = float(np.average(all_rows["busy"], weights=all_rows["bin_s"]))
    # A synchronous engine makes every arrival wait for the step in flight, so a queue
    # share alone says little when steps are long; queueing counts when waits are also
    # several steps long (or the run is unstable).
    steps = s.get("engine_steps") or 0
    dur = s.get("duration_s") or 0.0
    step_ms = 1e3 * dur * (busy if busy is not None else 1.0) * nrep / steps if steps else 0.0
    q_p99 = split["queue_ms"]["p99"] or 0.0
    # With nothing completed (every prompt rejected) nothing queued: the run is "unstable"
    # only because nothing was served, and the rejections are the finding.
    waits = split["queue_share"] >= QUEUE_SHARE and q_p99 >= QUEUE_STEPS * step_ms
    queued = (waits or not stable) and (s.get("completed") or 0) > 0
    # what holds requests back, as the evidence says it: waits, or a backlog that grows
    # (an unstable run whose requests have not waited long yet)
    held = ("requests queue" if waits or not (achieved and offered) else
            f"the backlog grows ({achieved:.3g} of {offered:.3g} req/s offered are served)")
    figures = {"offered_rate": offered, "achieved_rate": achieved, "stable": stable,
               "running_per_replica_mean": running, "running_per_replica_max": running_max,
               "max_num_seqs": scenario.max_num_seqs, "kv_cache_usage_mean": kv_mean,
               "preemptions": pre, "busy_fraction": busy, "mean_step_ms": step_ms,
               "num_gpu_blocks": s.get("num_gpu_blocks"), "arrival_cv": arrival_cv(result)}
    missed = [(m, st, e["threshold"], e["value"])
              for m, entries in (s.get("slo") or {}).items() if m in FLOOR_METRICS
              for st, e in entries.items() if not e["met"] and e["value"] is not None]
    figures["alone_ms"] = slo_floors(scenario, result, ("p50", "p99"))
    floor = below_floor(s, figures["alone_ms"])
    head = []   # findings that come first: free knobs that remove work, then floors
    found = []
    # twice the replicas is a test of the knob, not a sizing: plan finds the fewest
    more = (f"more replicas ({replica_sizer(scenario)} finds the fewest that meet the SLOs), "
            "faster "
            "hardware or a higher tensor_parallel",
            f"cluster.replicas={2 * nrep}")
    blocks = s.get("num_gpu_blocks")
    kv_change = _kv_change(scenario, blocks)
    wl = scenario.workload
    if (wl.prefix is not None or wl.sessions is not None or wl.trace is not None) \
            and s.get("total_prompt_tokens"):
        from .run import workload_specs

        expected = shareable_share(workload_specs(scenario, s.get("replication") or 0))
        figures["shareable_prompt_share"] = expected
        hit = s.get("prefix_cache_hit_rate") or 0.0
        # a conversation's history is on the replica of its last turn: sticky sessions
        # keep every turn there (multi_turn at 4 replicas, 8000 requests: 0.81 of the prompt
        # tokens hit, 0.80 with prefix_affinity, whose load bound sends some away)
        affine = "session_affinity" if wl.sessions is not None else "prefix_affinity"
        scatters = nrep > 1 and scenario.cluster.router not in (affine, "prefix_affinity") \
            and e.enable_prefix_caching
        if hit < 0.5 * expected or (scatters and hit < SCATTERED_HITS * expected):
            # Caching off or a router that scatters the groups: a setting removes the
            # shared prefill work, before any hardware (it also lowers the floor below).
            free = True
            if not e.enable_prefix_caching:
                knob, change = "enable_prefix_caching", "engine.enable_prefix_caching=true"
            elif nrep > 1 and scenario.cluster.router not in (affine, "prefix_affinity"):
                knob, change = f"router {affine}", f"cluster.router={affine}"
            else:
                knob, change, free = "more KV cache to keep prefixes resident", kv_change, False
            # with every SLO met, a free setting is an observation, not what binds
            (head if free and s.get("slo_met") is not True else found).append(_finding(
                "prefix_cache", f"prefix-cache hit rate {hit:.0%} while {expected:.0%} of the "
                f"prompt tokens repeat an earlier prompt (a shared prefix or a conversation's "
                f"history)", knob, change))
    hits = bool(s.get("total_cached_tokens"))
    chunked = _budget_floor(scenario, result, floor) if floor else None
    if chunked is not None:   # longer prefill chunks would meet it on these GPUs
        head.append(chunked)
    elif floor:
        # Served alone the request already misses: only faster steps move it.
        head.append(_finding(
            "latency_floor", "; ".join(
                f"{METRIC_LABELS[m]} {st} would be {fl:.4g} ms for requests served alone on an "
                f"idle replica, above the SLO's {thr:g} ms (here {value:.4g} ms)"
                for m, st, thr, value, fl in floor) + ": no number of replicas meets it"
            + (" (with this run's prefix-cache hits)" if hits else "")
            + ("; more prefix-cache hits would lower it" if head else ""),
            *_faster(scenario, any(m == "ttft_ms" for m, *_ in floor), result, floor)))
    # Round robin sends requests in turn whatever each replica holds: waits on one
    # replica while another admits every request at once are the router's (a free setting;
    # after a floor, which no router moves).
    elsewhere = figures["waiting_while_another_admits"] = \
        waiting_while_another_admits(reps) if nrep > 1 else None
    waiting = queued or (_missed(s, WAIT_METRICS) and q_p99 >= QUEUE_STEPS * step_ms)
    if scenario.cluster.router == "round_robin" and waiting \
            and (elsewhere or 0.0) >= IDLE_ELSEWHERE:
        # with every SLO met, a free setting is an observation, not what binds
        (head if s.get("slo_met") is not True else found).append(_finding(
            "router", f"{elsewhere:.0%} of the waiting happens on a replica while another "
            f"keeps nobody waiting: round_robin sends requests in turn, whatever each "
            f"replica holds", "router least_outstanding (each request to the replica with "
            "the fewest queued and running requests)", "cluster.router=least_outstanding"))
    # Missed SLOs that a request alone would meet: what the load (or noise) adds.
    loaded = [x for x in missed if not any(x[:2] == f[:2] for f in floor)]
    # ... of which requests served alone already nearly reach the SLO: sharing steps and
    # waiting add little there, and the tail is the requests' own length, not a queue
    near = [x for x in loaded
            if (figures["alone_ms"].get(x[0]) or {}).get(x[1]) is not None
            and figures["alone_ms"][x[0]][x[1]] >= NEAR_FLOOR * x[2]]

    # A fixed engine.num_gpu_blocks ignores memory: only it (or removing it) moves the cache.
    kv_knob = ("more KV cache: raise engine.num_gpu_blocks (or remove it to size the cache "
               "from gpu_memory_utilization); or lower max_num_seqs so fewer requests share "
               "it" if scenario.engine.num_gpu_blocks is not None else
               "more KV cache: raise gpu_memory_utilization, or a higher tensor_parallel or "
               "a GPU with more memory (more compute too); or lower max_num_seqs so "
               "fewer requests share it")
    # Requests of the mean length (prompt + output) the cache holds at once: a cache of a few
    # long requests is full at their count, though blocks (less than one request's) are free.
    holds = figures["kv_holds_requests"] = _kv_holds(scenario, result)
    # vLLM's watermark keeps a share of the blocks free at admission while others run:
    # requests wait with the cache that far from full, the held-back blocks "free"
    kv_max = kv.get("max") or 0.0
    held_back = figures["watermark_holds_admission"] = bool(
        queued and e.watermark and kv_max >= WATERMARK_NEAR * (1 - e.watermark))
    if held_back:
        found.append(_finding(
            "kv_capacity", f"{held} while the KV cache is at most {kv_max:.0%} full: "
            f"engine.watermark {e.watermark:g} keeps {e.watermark:.0%} of its blocks free "
            f"when a request is admitted while others run",
            "lower engine.watermark (vLLM's default is 0; it trades waiting for fewer "
            "preemptions), or more KV cache", "engine.watermark=0"))
    elif pre > 0:
        if not e.scheduler_reserve_full_isl:   # admitted on a first chunk, later preempted
            kv_knob += ("; or engine.scheduler_reserve_full_isl=true (vLLM's default: admit "
                        "a request only when its whole prompt fits in the free blocks)")
        if not e.watermark:
            kv_knob += ("; or engine.watermark (vllm serve --watermark: a share of the blocks "
                        "kept free when admitting while others run, so they grow without "
                        "preemption; fewer run at once)")
        found.append(_finding("kv_capacity", f"{pre} preemptions (KV blocks ran out; "
                              f"mean KV usage {kv_mean:.0%})", kv_knob, kv_change))
    elif queued and running_max < scenario.max_num_seqs and (
            kv_mean >= KV_FULL or (holds is not None and running_max >= holds)):
        found.append(_finding("kv_capacity", f"{held} while the KV cache is "
                              f"{kv_mean:.0%} full"
                              + (f" (it holds about {holds} requests at their mean length, "
                                 f"and {running_max} ran at once)" if holds is not None
                                 and running_max >= holds else "")
                              + f" and {running:.1f} sequences run on average, of "
                              f"max_num_seqs {scenario.max_num_seqs}", kv_knob, kv_change))
    # The share of the waiting (request-seconds) that happens while every sequence slot of
    # the replica is taken: bursts fill the slots although the mean running count is low.
    at_cap = None
    if reps is not None:
        w = reps["waiting"] * reps["bin_s"]
        if w.sum() > 0:
            at_cap = float((w * (reps["running_max"] >= scenario.max_num_seqs)).sum()
                           / w.sum())
    figures["waiting_at_max_num_seqs"] = at_cap
    slots_full = (queued and not found and running_max >= scenario.max_num_seqs
                  and (running >= SEQS_BUSY * scenario.max_num_seqs
                       or (at_cap or 0.0) >= SEQS_FULL))
    sg = max_num_seqs_gain(scenario, result) if slots_full else None
    gain, n2 = sg if sg is not None else (None, None)
    figures["max_num_seqs_gain"] = gain
    need = figures["max_num_seqs_needed"] = (max_num_seqs_needed(scenario, result)
                                             if slots_full else None)
    n = scenario.max_num_seqs
    all_slots = f"{held} while a replica runs all {n} sequences"
    if gain is not None and n2 <= n:
        # Every slot is taken and the cache holds no more such requests: more slots need
        # more KV cache first.
        found.append(_finding(
            "kv_capacity", f"{all_slots}, and its KV cache holds about {n2} at their mean "
            f"context: a higher max_num_seqs needs more KV cache", kv_knob, kv_change))
    elif gain is not None and gain < MIN_GAIN:
        # The slots are taken, but steps of more sequences would take nearly as much
        # longer: the replica's compute, not its slot count, holds requests back.
        found.append(_finding(
            "compute", f"{all_slots}, but a decode step of {n2} would take "
            f"×{n2 / n / gain:.2f} as long (decode throughput ×{gain:.2f}): each step is "
            f"full of work", *more))
    elif gain is not None:
        # The slots the load wants; where the cache holds fewer, with the KV change (the
        # slots it holds alone fall short of the load: 41 of 56 leave a 10x miss that 64
        # slots with a cache to hold them meet)
        want = _max_num_seqs_to_try(n, need)
        capped = n2 < want
        slots = want if capped else n2
        change = f"engine.max_num_seqs={slots}"
        if scenario.max_num_batched_tokens < slots:
            change += f",engine.max_num_batched_tokens={slots}"
        if capped:   # blocks for that many at the mean context, and vLLM's null block
            per_seq = cdiv(_mean_context(_served_requests(result)),
                           scenario.engine.block_size)
            change += f",engine.num_gpu_blocks={slots * per_seq + 1}"
        found.append(_finding(
            "max_num_seqs", f"{all_slots} (max_num_seqs): "
            + (f"{at_cap:.0%} of the waiting happens with all of them running, "
               if at_cap is not None else "")
            + f"{running:.1f} running on average"
            + (f"; the offered load needs max_num_seqs of about {need:.0f} (Little's law, "
               f"with three standard deviations for the peaks)" if need is not None else "")
            + (f"; the KV cache holds about {n2} at their mean context"
               if n2 < want else ""),
            "raise max_num_seqs" + (
                ", with a KV cache that holds them ("
                + ("raise engine.num_gpu_blocks" if scenario.engine.num_gpu_blocks is not None
                   else "gpu_memory_utilization, a higher tensor_parallel or a GPU with "
                        "more memory") + ")" if capped
                else " (as long as the KV cache holds the extra requests)"), change))
    # Steps that carry their whole token budget while requests wait: a larger budget
    # serves more tokens per second where a step's cost is mostly fixed (weight reads).
    tokens = None
    if reps is not None:
        n_steps = reps["steps"].sum()
        if n_steps:
            tokens = float((reps["prefill_tokens"] + reps["decode_tokens"]).sum() / n_steps)
    figures["tokens_per_step_mean"] = tokens
    budget = scenario.max_num_batched_tokens
    tokens_full = (queued and not found and tokens is not None
                   and tokens >= TOKENS_FULL * budget)
    bgain = figures["max_num_batched_tokens_gain"] = budget_gain(scenario) if tokens_full \
        else None
    if tokens_full and bgain >= MIN_GAIN:
        found.append(_finding(
            "max_num_batched_tokens", f"{held} while steps carry their full "
            f"max_num_batched_tokens of {budget} ({tokens:.0f} on average): steps of "
            f"{2 * budget} would take "
            f"×{2 / bgain:.2f} as long (token throughput ×{bgain:.2f})",
            "raise max_num_batched_tokens (longer prefill chunks stall the decodes that share "
            "their steps: ITL)", f"engine.max_num_batched_tokens={2 * budget}"))
    compute = None
    busy_text = f"the engine is busy {busy:.0%} of the time" if busy is not None else ""
    cv = figures["arrival_cv"]
    cv_text = f"inter-arrival CV {cv:.2f}, Poisson 1" if cv is not None else ""
    # bursts are the arrivals' (a stable run's): decodes keep a step running nearly all
    # the time at any load, so a busy engine says nothing of them
    bursty = stable and cv is not None and cv >= BURSTY_CV
    if queued and not found and (busy is None or busy >= BUSY or not stable):
        if bursty:
            compute = (f"requests queue in bursts ({cv_text}) although fewer than max_num_seqs "
                       f"run and KV blocks are free: the engine drains a burst only after a "
                       f"while")
        else:
            compute = (f"{held} although fewer than max_num_seqs run and KV blocks are free"
                       + (f": {busy_text}" if busy_text else ""))
    elif not found and not near and _missed(s, WAIT_METRICS) \
            and q_p99 >= QUEUE_STEPS * step_ms \
            and q_p99 >= TAIL_QUEUE * (split["ttft_ms"]["p99"] or math.inf):
        # A stable engine, yet the tail of TTFT is waiting: capacity for the peaks. Below
        # saturation the peaks are bursts when arrivals cluster more than Poisson ones;
        # Poisson arrivals collide by chance (an M/G/1 wait grows as 1 / (1 - busy)).
        tail = (f"the p99 wait for the engine is {q_p99:.0f} ms, most of the p99 TTFT "
                f"({split['ttft_ms']['p99']:.0f} ms)")
        if bursty:
            compute = (f"requests queue in bursts: {tail}"
                       + (f", while it is busy {busy:.0%} of the time on average"
                          if busy is not None and busy < BUSY else "") + f" ({cv_text})")
        elif busy is not None and busy < BUSY:
            compute = (f"the TTFT tail is waiting: {tail}; arrivals are no burstier than "
                       f"Poisson ({cv_text}) but at {busy:.0%} busy random arrivals "
                       f"still collide")
        else:
            # busy is not full: a busy engine of small batches has throughput to spare
            # (its steps' fixed cost keeps it busy), which the batch size shows
            compute = (f"the TTFT tail is waiting: {tail}"
                       + (f", with the engine busy {busy:.0%} of the time on batches of "
                          f"{running:.3g} requests on average (max_num_seqs "
                          f"{scenario.max_num_seqs})" if busy is not None else ""))
    if compute:
        found.append(_finding("compute", compute, *more))
    itl = s.get("itl_ms") or {}
    if itl.get("p50") and itl.get("p99") and itl["p99"] > ITL_SPIKE * itl["p50"] \
            and (s.get("total_prompt_tokens") or 0) > 0:
        # 512-token chunks: a common vLLM setting when ITL matters more than prefill speed
        # (at least max_num_seqs where it is set; vLLM's default caps itself at the budget)
        chunk = max(min(scenario.max_num_batched_tokens // 2, 512),
                    scenario.engine.max_num_seqs or 1)
        whole = not scenario.engine.enable_chunked_prefill   # prompts run whole: chunk them
        change = (f"engine.max_num_batched_tokens={chunk}"
                  if chunk < scenario.max_num_batched_tokens else None)
        found.append(_finding(
            "prefill_interference", f"ITL p99 {itl['p99']:.3g} ms is "
            f"{itl['p99'] / itl['p50']:.1f}× its median: "
            + ("whole prompts stall decodes (chunked prefill is off)" if whole
               else "prefill chunks stall decodes"),
            ("enable chunked prefill with a lower max_num_batched_tokens (shorter prefill "
             "chunks per step)" if whole else
             "lower max_num_batched_tokens (shorter prefill chunks per step)"),
            f"engine.enable_chunked_prefill=true,{change}" if whole and change else change))
    # The wake-up after idle (a profile's ``idle``): first when the misses are its alone
    # (more replicas, the compute knob, would only make them idle longer), else last.
    figures["wake_up"], wake, wake_explains = _wake_up(scenario, result, loaded, nrep)
    if wake_explains:
        found.insert(0, wake)
    missed_metrics = {m for m, *_ in missed} | (
        {"queue_ms"} if _missed(s, ("queue_ms",)) else set())
    unexplained = [x for x in loaded
                   if not any(_moves(f, {x[0]}) for f in found)]
    overlapped = ((s.get("concurrency") or {}).get("requests_max") or 0) > 1
    if not unexplained and overlapped and not wake_explains \
            and not any(f["limit"] == "compute" for f in found):
        # explained by a setting, yet more replicas are the knob to try when it falls short
        unexplained = loaded
    if unexplained:
        m, st, thr, value = next((x for x in unexplained if x in near), unexplained[0])
        fl = figures["alone_ms"].get(m, {}).get(st)
        alone = f", and {fl:.4g} ms for requests served alone" if fl is not None else ""
        if not overlapped:
            # Nothing overlapped: what lifts the figure above the floor is the variation of
            # the step cost (cost_noise), not the load.
            head.append(_finding(
                "latency_floor", f"{METRIC_LABELS[m]} {st} is {value:.4g} ms against the "
                f"SLO's {thr:g} ms{alone} (noise-free steps), although no two requests were in "
                f"the system at once: the step-cost variation makes up the rest",
                *_faster(scenario, m == "ttft_ms")))
        else:
            # Sharing steps with other requests (and waiting for them) adds the rest; where
            # requests alone nearly reach the SLO, more replicas leave little to remove:
            # faster steps make the headroom.
            close = (m, st, thr, value) in near
            found.append(_finding(
                "compute", f"{METRIC_LABELS[m]} {st} is {value:.4g} ms against the SLO's "
                f"{thr:g} ms{alone}: sharing steps with other requests and waiting for them adds "
                f"the rest" + (f" ({busy_text})" if busy_text else "")
                + (f"; requests alone already take {fl / thr:.0%} of the SLO: faster steps "
                   f"make the headroom" if close else ""),
                *(_faster(scenario, m == "ttft_ms") if close else more)))
    if queued and (busy is None or busy >= BUSY or not stable) \
            and not any(f["limit"] == "compute" for f in found):
        # Beside a KV or slot limit: more replicas also take load off each replica (the
        # counterfactual runs tell which knob moves the figure).
        found.append(_finding("compute", (f"{held} while {busy_text}" if busy_text else held)
                              + ": more replicas would share the load", *more))
    if wake is not None and not wake_explains:   # part of a miss that the rest explains
        without = figures["wake_up"]["without_ms"]
        part = next((f"{METRIC_LABELS[m]} {st}: about {value - without[m][st]:.3g} ms of "
                     f"{value:.4g}" for m, st, _, value in loaded
                     if st in without.get(m, {})), None)
        for f in found:
            if f["limit"] == "compute" and part:
                f["evidence"] += f"; the wake-up after idle is part of it ({part}; below)"
        found.append(wake)
    ramp = s.get("sessions") or {}
    if ramp and not ramp.get("steady_state") and ramp.get("stable") is None:
        # nothing said of a load the run never reached (simulator.session_ramp)
        head.insert(0, _finding(
            "session_ramp", f"the conversations opened over {ramp['opening_s']:.4g} s and "
            f"last {ramp['conversation_s']:.4g} s each: the run ended before they built up "
            f"their load (about {ramp['steady_request_rate']:.4g} req/s)",
            f"raise workload.num_requests to at least {ramp['num_requests_needed']}"))
    client = s.get("client") or {}
    if (client.get("held_requests") and client.get("offered_rate") and not stable
            and running_max < scenario.max_num_seqs):
        # the client's limit, not the engine, falls behind: slots stand free while it holds
        n = client["max_concurrency"]
        head.insert(0, _finding(
            "client_concurrency", f"workload.max_concurrency {n} held "
            f"{client['held_requests']} requests at the client (waits up to "
            f"{client['wait_max_s']:.3g} s): {achieved or 0:.3g} of "
            f"{client['offered_rate']:.3g} req/s served while at most {running_max} of "
            f"max_num_seqs {scenario.max_num_seqs} ran per replica",
            "raise workload.max_concurrency (the client sends too few at once)",
            f"workload.max_concurrency={2 * n}"))
    rejected = s.get("rejected") or 0
    if rejected:   # they fail the SLO whatever else happens: the first thing to fix
        capped = s.get("max_model_len", scenario.max_model_len) != scenario.max_model_len
        head.insert(0, _finding(
            "max_model_len", f"{rejected} request{'s' if rejected != 1 else ''} "
            f"rejected: prompt too long for "
            f"max_model_len {max_model_len_text(scenario, s)}",
            "give the KV cache more memory (gpu_memory_utilization, a GPU with more memory, "
            "tensor_parallel) or cap prompts upstream" if capped else
            "raise max_model_len (the KV cache must hold one such request) or cap prompts "
            "upstream", None))
    chunks = next((f for f in found if f["limit"] == "prefill_interference"), None)
    last = max((i for i, f in enumerate(found) if f["limit"] == "compute"), default=-1)
    if "ttft_ms" in missed_metrics and chunks is not None and found.index(chunks) < last:
        # shorter chunks lengthen every prefill: with TTFT missed, more replicas (which move
        # TTFT too) are tried first (512-token chunks make a TTFT miss 6x worse)
        found.remove(chunks)
        found.insert(last, chunks)
    found = head + found
    for f in found:   # a cache the memory already sizes, tried larger, tests the cache
        test = _beyond_memory(scenario, f["change"])   # alone: said, with what holds it
        if test:
            f["knob"] += f"; {test}"
            f["beyond_memory"] = True   # said beside the try wherever shown (the terminal)
    # Rejections and the floor bind first; then the first finding whose knob moves a
    # missed SLO (:data:`MOVES`); with every SLO met, a queueing limit (what caps the rate);
    # with none given, the first finding. Those that could bind lead the list, the binding
    # one first (``eligible``: how many; :func:`diagnose` tries their knobs in turn).
    slo_met = s.get("slo_met")
    eligible = [f for f in found if f in head or slo_met is None
                or (slo_met and f["limit"] in QUEUEING)
                or (slo_met is False and _moves(f, missed_metrics))]
    found = eligible + [f for f in found if not any(f is g for g in eligible)]
    return {"ttft_split": split, "figures": figures, "findings": found,
            "sizer": replica_sizer(scenario),
            "binding": eligible[0]["limit"] if eligible else "none", "queued": queued,
            "eligible": len(eligible)}


#: Share of the repeated prompt tokens hit below which a router that ignores prefixes is
#: taken to scatter them over the replicas (a conversation's history is on the replica
#: that served its last turn: round robin over 4 replicas hit 49% where 82% repeat, and
#: prefix_affinity 77%, Llama-3.1-8B multi-turn chat on H100s); a single replica's cache
#: is suspected only below half.
SCATTERED_HITS = 0.8

#: The figure counterfactuals compare when SLOs are given (:func:`_headline`).
SLO_FIGURE = "worst SLO value / threshold"


def _headline(scenario, summary: dict, limit: str,
              unstable: bool = False) -> tuple[str, float | None, bool]:
    """The figure a counterfactual should move, and whether lower is better: for an
    ``unstable`` run (arrivals outpace service), the request throughput, SLOs given or not
    (one scale for every knob tried; its waits, and so its TTFT tail and SLO ratio, grow
    with the run's length, so two such runs' ratios compare arbitrarily); else the worst
    SLO ratio when SLOs are given (one scale too); else the hit rate for prefix-cache
    findings, TTFT p99 for queueing limits and ITL p99 for interference."""
    from .search import slo_ratio

    if unstable:
        return "requests/s served", summary.get("request_throughput"), False
    if summary.get("slo"):
        # Rejected requests make the ratio infinite: no finite figure to compare then.
        ratio = slo_ratio(summary)
        return SLO_FIGURE, (ratio if math.isfinite(ratio) else None), True
    if limit == "prefix_cache":
        return "prefix-cache hit rate", summary.get("prefix_cache_hit_rate"), False
    key = "itl_ms" if limit == "prefill_interference" else "ttft_ms"
    return f"{METRIC_LABELS[key]} p99 (ms)", (summary.get(key) or {}).get("p99"), True


def _moved(before, after, lower_better: bool) -> bool:
    """Whether ``after`` is better than ``before`` by more than 10%."""
    if before is None or after is None:
        return False
    return after < 0.9 * before if lower_better else after > 1.1 * before + 0.01


def _worse(before, after, lower_better: bool) -> bool:
    """Whether ``after`` is worse than ``before`` by more than 10%."""
    return _moved(after, before, lower_better)


def _breaks(before: dict, after: dict) -> list[dict]:
    """SLO entries met in summary ``before`` and missed in ``after``: ``[{metric, stat,
    threshold, before, after}]`` (ms), in the SLO's order."""
    out = []
    for m, entries in (before.get("slo") or {}).items():
        for st, e in entries.items():
            a = ((after.get("slo") or {}).get(m) or {}).get(st) or {}
            if e.get("met") and a.get("met") is False:
                out.append({"metric": m, "stat": st, "threshold": e["threshold"],
                            "before": e["value"], "after": a.get("value")})
    return out


def _counterfactual(scenario, result, finding: dict, unstable: bool = False) -> dict:
    """Replication ``result`` ran again with ``finding``'s change: ``{limit, change, figure,
    before, after, slo_met_before, slo_met_after, moved, worse, breaks}`` (the figure:
    :func:`_headline`), and ``beyond_memory`` (True) where the finding's is a KV cache its
    GPUs cannot hold (:func:`_beyond_memory`)."""
    from .run import simulate
    from .scenario import scenario_from_dict

    raw = scenario.model_dump(mode="python", exclude_none=True)
    sc = scenario_from_dict(raw, scenario.base_dir, source=scenario.source,
                            overrides=finding["change"].split(","))
    alt = simulate(sc, replication=result.summary.get("replication") or 0).summary
    name, before, lower = _headline(scenario, result.summary, finding["limit"], unstable)
    _, after, _ = _headline(scenario, alt, finding["limit"], unstable)
    out = {"limit": finding["limit"], "change": finding["change"], "figure": name,
           "lower_better": lower, "before": before, "after": after,
           "slo_met_before": result.summary.get("slo_met"),
           "slo_met_after": alt.get("slo_met"), "moved": _moved(before, after, lower),
           "worse": _worse(before, after, lower), "breaks": _breaks(result.summary, alt),
           **suggested_flags(scenario, finding["change"]),
           **({"beyond_memory": True} if finding.get("beyond_memory") else {})}
    if name == SLO_FIGURE:   # which SLO is worst, before and after: the ratio alone is abstract
        out["worst_before"], out["worst_after"] = (_worst_entry(result.summary),
                                                   _worst_entry(alt))
    elif unstable and alt.get("slo"):   # tries that each keep up tie on throughput (_winner)
        from .search import slo_ratio
        out["slo_ratio_after"] = slo_ratio(alt)
    return out


def suggested_flags(scenario, change: str | None) -> dict:
    """The ``--set`` flags that make a finding's ``change`` in the run's own command:
    ``{"flags": ["key=value", ...], "replaces": [the run's flags they take the place of]}``
    (both empty without a change). A setting whose key a flag of the run gave is that
    flag's replacement (servesim refuses a key given twice); one below a mapping a flag
    gave (``cluster={replicas: 1, router: round_robin}``) is merged into that mapping, so
    the flag's other settings stay (``cluster={replicas: 2, router: round_robin}``), as they
    did in the counterfactual run."""
    flags, replaces, merged = [], [], {}
    for setting in change.split(",") if change else []:
        key, value = setting.split("=", 1)
        flag = scenario.set_by(key)
        if flag is None:
            flags.append(setting)
            continue
        if flag not in replaces:
            replaces.append(flag)
        top, given = (x.strip() for x in flag.split("=", 1))   # as split_override reads it
        tree = merged.get(flag)
        if tree is None and top != key:
            tree = load_yaml(given)   # as the scenario read it (YAML 1.2 numbers)
            if tree is None:   # --set engine=null: the section's defaults, set inside
                tree = {}
            if isinstance(tree, dict):
                merged[flag] = tree
                flags.append(flag)   # its place in the list; rewritten below
        if not isinstance(tree, dict) or top == key:
            flags.append(setting)
            continue
        *path, last = key[len(top) + 1:].split(".")
        for part in path:
            tree = tree.setdefault(part, {})
        tree[last] = load_yaml(value)
    out = [f"{f.split('=', 1)[0]}="
           + yaml.safe_dump(merged[f], default_flow_style=True, sort_keys=False,
                            width=math.inf).strip() if f in merged else f for f in flags]
    return {"flags": out, "replaces": replaces}


def _worst_entry(summary: dict) -> dict | None:
    """:func:`simulator.search.worst_slo` without its ratio (the figure holds it)."""
    from .search import worst_slo

    w = worst_slo(summary)
    return None if w is None else {k: w[k] for k in ("metric", "stat", "value", "threshold")}


#: Keys whose change costs no hardware: a finding that sets only these is a free setting.
FREE_KEYS = ("engine.enable_prefix_caching", "cluster.router", "workload.max_concurrency")


def _free(finding: dict) -> bool:
    """Whether ``finding``'s change sets only :data:`FREE_KEYS`."""
    change = finding.get("change")
    return bool(change) and all(c.split("=", 1)[0] in FREE_KEYS for c in change.split(","))


#: Most counterfactual runs per diagnosis: the binding finding's, then the next candidates'.
MAX_COUNTERFACTUALS = 3
#: Most extra runs, each at twice the tensor_parallel of one that still missed an SLO
#: (:func:`_raise_tensor_parallel`; the floor of requests alone leaves out what the load adds).
MAX_TP_STEPS = 2


def _helps(cf: dict) -> int:
    """2 when counterfactual ``cf`` meets every SLO, 1 when it moves its figure, else 0."""
    return 2 if cf["slo_met_after"] else 1 if cf["moved"] else 0


def _gain(cf: dict) -> float:
    """How far counterfactual ``cf`` moves its figure: before / after where lower is
    better, else after / before (0 without both)."""
    b, a = cf["before"], cf["after"]
    return (b / a if cf["lower_better"] else a / b) if a and b else 0.0


def _winner(pool: list, unstable: bool):
    """The ``(finding, counterfactual)`` of ``pool`` that binds, or None: among those that
    help most (:func:`_helps`), the one that moves its figure most (:func:`_gain`), the
    first of equals. An ``unstable`` run's figure is its throughput, and every try that
    makes it keep up serves about the offered rate: those within
    :data:`~simulator.executors.CAPACITY_TOLERANCE` of the most tie, and of them the one
    nearest its SLOs binds (``slo_ratio_after``; without SLOs the first)."""
    from .executors import CAPACITY_TOLERANCE

    best = max((_helps(cf) for _, cf in pool), default=0)
    top = [(f, cf) for f, cf in pool if best and _helps(cf) == best]
    if not top:
        return None
    most = max(_gain(cf) for _, cf in top)
    if unstable:
        ties = [x for x in top if _gain(x[1]) >= most * (1 - CAPACITY_TOLERANCE)]
        return min(ties, key=lambda x: x[1].get("slo_ratio_after", 0.0))
    return next(x for x in top if _gain(x[1]) == most)


def _raise_tensor_parallel(scenario, result, finding: dict, cf: dict,
                           unstable: bool) -> tuple[dict, list[dict]]:
    """Where ``finding``'s change is a higher tensor_parallel k (:func:`_faster`; with a
    floor, the smallest whose requests alone meet the SLOs) and its run ``cf`` still misses
    one (the load adds to that floor: TPOT p99 6.2 ms at tensor_parallel 2, whose requests
    alone take 4.7, against 6), runs at 2k, 4k, ... (at most :data:`MAX_TP_STEPS` more,
    within :data:`MAX_TP` and what the model splits into, :func:`_valid_change`) until one
    meets every SLO. ``finding`` then tries the first that does, else the one that moves
    the figure most (its change and flags updated), and its knob says which missed under
    the load. Returns the counterfactual of the change kept and those of the others run."""
    key, _, value = (finding["change"] or "").partition("=")
    if cf["slo_met_after"] or key != "hardware.tensor_parallel":
        return cf, []
    runs, k = [(int(value), cf)], int(value)
    while len(runs) <= MAX_TP_STEPS and not runs[-1][1]["slo_met_after"]:
        k *= 2
        if k > MAX_TP or _valid_change(scenario, f"hardware.tensor_parallel={k}") is None:
            break
        runs.append((k, _counterfactual(scenario, result, {
            **finding, "change": f"hardware.tensor_parallel={k}"}, unstable)))
    kept = next((x for x in runs if x[1]["slo_met_after"]), None) \
        or max(runs, key=lambda x: _gain(x[1]))   # the first of equals
    met = kept[1]["slo_met_after"]
    short = [k for k, c in runs if not c["slo_met_after"]]
    k_shown, shown = runs[runs.index(kept) - 1] if met else kept   # the miss nearest it
    finding["knob"] += (f"; under this load tensor_parallel {' and '.join(map(str, short))} "
                        f"still miss{'es' if len(short) == 1 else ''} the SLOs ("
                        + (f"at {k_shown}: " if len(short) > 1 else "") + _short_of(shown)
                        + (f"): {kept[0]} meets them" if met else "): none tried meets them"))
    finding["change"] = f"hardware.tensor_parallel={kept[0]}"
    finding.update(suggested_flags(scenario, finding["change"]))
    return kept[1], [c for _, c in runs if c is not kept[1]]


def _short_of(cf: dict) -> str:
    """Counterfactual ``cf``'s worst SLO entry after, as text: ``"TPOT p99 6.185 ms against
    6 ms"``; its figure (``"requests/s served 9.5"``) where it records no latency entry."""
    w = cf.get("worst_after")
    if w and w["metric"] in METRIC_LABELS and w["value"] is not None:
        return (f"{METRIC_LABELS[w['metric']]} {w['stat']} {w['value']:.4g} ms against "
                f"{w['threshold']:g} ms")
    return f"{cf['figure']} {cf['after']:.4g}" if cf.get("after") is not None else "no figure"


#: Findings that nothing after them can get past: rejected prompts, a latency floor, a run
#: of conversations too short to judge.
FACTS = ("max_model_len", "latency_floor", "session_ramp")


def diagnose(scenario, result, *, counterfactual: bool = True) -> dict:
    """Diagnose one run.

    The findings that could bind are tried in order, each by one counterfactual run with
    its knob turned (at most :data:`MAX_COUNTERFACTUALS`, none past a finding in
    :data:`FACTS`; a change already tried is not run again; a higher tensor_parallel whose
    run still misses is doubled, :func:`_raise_tensor_parallel`), until one meets every SLO:
    that one binds, else the one that moves the figure most (by more than 10%) where all
    share one figure (an unstable run's throughput, SLOs given or not, where the tries
    that keep up tie and the one nearest its SLOs binds, :func:`_winner`; else the worst
    SLO ratio), else the first that moves its own. A free setting (:func:`_free`: a router, prefix
    caching, the client's concurrency) that moves the figure binds before any other knob,
    even one that meets every SLO (listed after it). An SLO that was met and a run misses is
    reported with it (``breaks``). When none moves it, the first stays binding.

    Args:
        scenario: the scenario that produced ``result``.
        result: its :class:`~simulator.metrics.RunResult`.
        counterfactual: rerun replication 0 with knobs turned (only for workloads of at
            most :data:`MAX_COUNTERFACTUAL_REQUESTS` requests).

    Returns:
        ``{"ttft_split": {queue_ms, prefill_ms, ttft_ms: {mean, p50, p99}, queue_share},
        "figures": {...}, "findings": [{limit, evidence, knob, change, flags, replaces}],
        "sizer" (the command that finds the fewest replicas, :func:`replica_sizer`),
        "binding": limit name or "none", "queued": bool, "counterfactual": None or {limit, change,
        figure, lower_better, before, after, slo_met_before, slo_met_after, moved, worse, breaks,
        flags, replaces},
        "other_counterfactuals": [the same, for candidates tried that did not bind]}``
        (``moved``: better by more than 10%, ``worse``: worse by as much, ``breaks``:
        SLOs met before and missed after, ``[{metric, stat, threshold, before, after}]``;
        with SLOs also ``worst_before`` / ``worst_after``: the worst entry of each run,
        ``{metric, stat, value, threshold}`` or None, or for an unstable run
        ``slo_ratio_after``: the worst SLO value / threshold of the run with the change),
        floats to 6 significant digits. ``change`` is a ``--set`` override
        (comma-separated when it needs two); ``flags`` the ``--set`` flags that make it in
        the run's command and ``replaces`` the run's own flags they take the place of
        (:func:`suggested_flags`).
    """
    from .metrics import jsonable

    d = find_limits(scenario, result)
    for f in d["findings"]:
        f.update(suggested_flags(scenario, f["change"]))
    eligible = d.pop("eligible")
    d["counterfactual"], d["other_counterfactuals"] = None, []
    n = scenario.workload.num_requests or 0
    if not counterfactual or n > MAX_COUNTERFACTUAL_REQUESTS:
        return jsonable(d)

    unstable = not d["figures"]["stable"]
    # one figure for every knob (an unstable run's throughput, else the SLO ratio): the one
    # that moves it most binds; else each its own, and the first that moves binds
    common = bool(result.summary.get("slo")) or unstable
    tried, stepped = [], []   # stepped: lower tensor_parallels that missed under the load
    for f in d["findings"][:eligible]:
        if len(tried) == MAX_COUNTERFACTUALS:
            break
        if f["change"] and all(f["change"] != g["change"] for g, _ in tried):
            cf, missed = _raise_tensor_parallel(
                scenario, result, f, _counterfactual(scenario, result, f, unstable), unstable)
            tried.append((f, cf))
            stepped += missed
            if _helps(cf) == 2 or (not common and _helps(cf)):
                break
        if f["limit"] in FACTS:
            break
    # a free setting that moves the figure binds before hardware that meets the SLOs
    # (which is listed after it): settings before any GPU
    pool = [(f, cf) for f, cf in tried if _free(f) and _helps(cf)] or tried
    won = _winner(pool, unstable)
    if won is not None:   # the knob that moves it binds (first in the list)
        d["findings"].remove(won[0])
        d["findings"].insert(0, won[0])
        d["binding"] = won[0]["limit"]
    first = d["findings"][0] if d["findings"] else None
    for f, cf in tried:
        if f is first:
            d["counterfactual"] = cf
        else:
            d["other_counterfactuals"].append(cf)
    d["other_counterfactuals"] += stepped
    return jsonable(d)   # figures as summary.json has them (6 significant digits)


__all__ = ["arrival_cv", "budget_gain", "diagnose", "find_limits", "suggested_flags",
           "max_num_seqs_gain", "shareable_share", "ttft_split",
           "waiting_while_another_admits", "wake_up_ms"]
