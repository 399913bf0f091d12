"""Differential check of servesim's scheduler against vLLM 0.32's own V1 scheduler.

servesim's :class:`simulator.policy.Scheduler` (with its KV cache manager) is meant to take
exactly the decisions of vLLM's ``vllm.v1.core.sched.scheduler.Scheduler`` with synchronous
scheduling. This benchmark checks that directly: it builds vLLM's real scheduler with no
model and no workers (a one-group full-attention ``KVCacheConfig``; the model directory
is read for its config only), feeds it and servesim's scheduler the same random small
workloads, hands both the same sampled token ids after each step, and compares them at
every step:

* the scheduled rows: request, new tokens, tokens computed before, whether it samples;
* the preempted request ids and the finished request ids;
* the whole free-block queue, block ids in order from head to tail (eviction order);
* ``kv_cache_usage``;
* the step's re-read tokens (:attr:`simulator.policy.StepPlan.reread_tokens`; vLLM's counted
  from its block tables as the vLLM backend counts them,
  :func:`calibration.vllm.core.reread_tokens`);

and at the end of each workload the prefix-cache counters (queries, hits, and the same for
re-admitted preempted requests, in tokens) and each request's cached prompt tokens.

Workloads are drawn per case from a seeded generator and cover: block sizes 1-16, 1-6
running sequences, max_model_len 16-96, small token budgets, roomy and tight KV caches
(tight ones preempt), prefix caching and chunked prefill on or off,
``long_prefill_token_threshold``, ``scheduler_reserve_full_isl``, ``watermark``, two shared
system prompts, staggered arrivals, follow-up turns (the parent's prompt and output plus new
tokens, submitted once the parent finishes) and stop tokens. The sampled ids are a fixed
function of (request, output index), so a run is reproducible from ``--seed`` alone.

``--mutate`` runs a deliberately wrong servesim (it preempts the oldest running request
instead of vLLM's newest) to show that the comparison catches a difference; it is meant to
mismatch.

Run from the repository root with the vLLM peer's Python (``../shared/peers/vllm/setup.sh``
builds it; the working tree's ``simulator`` package is imported, not an installed copy)::

    /tmp/vllm-venv/bin/python benchmarks/vllm_scheduler_diff.py [--cases 380] [--seed 0]
    /tmp/vllm-venv/bin/python benchmarks/vllm_scheduler_diff.py --mutate

Exit status: 0 when every case matches, 1 on any mismatch, 2 when vLLM (or the model
directory) is not available. Not part of the test suite: vLLM is no servesim dependency.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's policy, not an installed servesim

from simulator.policy import Request, Scheduler, SchedulerConfig  # noqa: E402
from calibration.vllm.core import block_tables, reread_tokens  # noqa: E402

STOP_TOKEN = 42
#: Share of sampled tokens that are the stop token in a case with stop tokens.
STOP_SHARE = 0.06
MAX_STEPS = 4000


# -- vLLM side ------------------------------------------------------------------------------

for _k, _v in (("VLLM_NO_USAGE_STATS", "1"), ("HF_HUB_OFFLINE", "1"),  # before vLLM loads
               ("TRANSFORMERS_OFFLINE", "1"),
               ("VLLM_CACHE_ROOT", os.path.join(
                   os.environ.get("VLLM_PEER_CACHE", "/tmp/vllm-peer-cache"), "vllm"))):
    os.environ.setdefault(_k, _v)
try:
    import torch
    from vllm import __version__ as VLLM_VERSION
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.config import SchedulerConfig as VllmSchedulerConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler as VllmV1Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VllmRequest
    from vllm.v1.structured_output import StructuredOutputManager
except ImportError as e:
    VLLM_MISSING: ImportError | None = e
else:
    VLLM_MISSING = None


class VllmScheduler:
    """vLLM's V1 ``Scheduler`` driven through its own API, one engine step per :meth:`step`.

    ``schedule()`` gives the step's ``SchedulerOutput``; a ``ModelRunnerOutput`` with one
    sampled token for each request whose scheduled tokens reach its end is handed to
    ``update_from_output()``, as a worker would.
    """

    def __init__(self, cfg: dict, model_dir: str):
        bs, n = cfg["block_size"], cfg["num_gpu_blocks"]
        mc = ModelConfig(model=model_dir, max_model_len=cfg["max_model_len"], dtype="float32",
                         seed=0, skip_tokenizer_init=True)
        cc = CacheConfig(block_size=bs, enable_prefix_caching=cfg["enable_prefix_caching"])
        cc.num_gpu_blocks = n
        sc = VllmSchedulerConfig(
            max_num_seqs=cfg["max_num_seqs"],
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
            scheduler_reserve_full_isl=cfg["scheduler_reserve_full_isl"],
            watermark=cfg["watermark"], policy="fcfs", async_scheduling=False,
            is_encoder_decoder=False)
        vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc)
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8,
                                 dtype=torch.float32)
        kvc = KVCacheConfig(num_blocks=n, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
        self.s = VllmV1Scheduler(vllm_config=vc, kv_cache_config=kvc,
                                 structured_output_manager=StructuredOutputManager(vc),
                                 block_size=bs, log_stats=True)
        self.block_size = bs
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(bs, sha256)  # sha256 block hashes, as served
        self.prefix_stats = [0, 0, 0, 0]  # queries, hits, preempted queries, preempted hits
        self.cached_tokens: dict[str, int] = {}  # at first admission

    def add_request(self, rid: str, prompt: list[int], max_tokens: int, stop: bool) -> None:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            stop_token_ids=[STOP_TOKEN] if stop else None)
        self.s.add_request(VllmRequest(
            request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp,
            pooling_params=None, arrival_time=0.0, block_hasher=self.hasher))

    def has_unfinished_requests(self) -> bool:
        return self.s.has_unfinished_requests()

    def step(self, token) -> dict:
        """One step; ``token(rid, output_index)`` gives each sampled id. Returns the state
        compared with servesim's (see :func:`servesim_step`)."""
        s = self.s
        out = s.schedule()
        for nr in out.scheduled_new_reqs:  # prefill_stats is handed off once the prompt ends
            ps = s.requests[nr.req_id].prefill_stats
            if ps is not None and ps.num_prompt_tokens > 0:
                self.cached_tokens.setdefault(nr.req_id, ps.num_cached_tokens)
        ids = list(out.num_scheduled_tokens)
        reread = reread_tokens(block_tables(s.kv_cache_manager, ids), self.block_size)
        rows, sampled = [], []
        for rid in ids:
            r, n = s.requests[rid], out.num_scheduled_tokens[rid]
            samples = r.num_computed_tokens >= r.num_tokens  # schedule() already advanced it
            rows.append((rid, n, r.num_computed_tokens - n, samples))
            sampled.append([token(rid, r.num_output_tokens)] if samples else [])
        mro = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
            pooler_output=[])
        finished = []
        for eco in s.update_from_output(out, mro).values():
            finished += [o.request_id for o in eco.outputs if o.finish_reason is not None]
            if eco.scheduler_stats is not None:  # the prefix-cache stats since the last step
                self._add_stats(eco.scheduler_stats.prefix_cache_stats)
        pool = s.kv_cache_manager.block_pool
        return dict(rows=sorted(rows), preempted=sorted(out.preempted_req_ids),
                    finished=sorted(finished),
                    free_queue=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                    usage=round(s.get_kv_cache_usage(), 9), reread=reread)

    def _add_stats(self, p) -> None:
        if p is not None:
            for i, x in enumerate((p.queries, p.hits, p.preempted_queries, p.preempted_hits)):
                self.prefix_stats[i] += x

    def final_prefix_stats(self) -> tuple:
        self._add_stats(self.s.kv_cache_manager.make_prefix_cache_stats())
        return tuple(self.prefix_stats)


# -- servesim side --------------------------------------------------------------------------

def servesim_step(s: Scheduler, token) -> tuple[dict, object]:
    """One servesim step in engine mode, in :meth:`VllmScheduler.step`'s terms; also the plan."""
    plan = s.schedule()
    rows = sorted((str(e.request_id), e.num_new_tokens, e.num_computed_before, e.samples_token)
                  for e in plan.scheduled())
    preempted = sorted(str(r.request_id) for r in plan.preempted)
    sampled = {e.request: token(str(e.request_id), e.request.num_output_tokens)
               for e in plan.scheduled() if e.samples_token}
    finished = sorted(str(r.request_id) for r in s.update(plan, sampled))
    return dict(rows=rows, preempted=preempted, finished=finished,
                free_queue=list(s.kv.pool.free_queue),
                usage=round(s.kv_cache_usage, 9), reread=plan.reread_tokens), plan


class _OldestFirst(dict):
    """``running`` whose ``popitem`` takes the oldest entry (a dict's takes the newest)."""

    def popitem(self):
        k = next(iter(self))
        return k, self.pop(k)


class OldestVictimScheduler(Scheduler):
    """Deliberately wrong servesim for ``--mutate``: preemption takes the oldest running
    request (head) instead of the newest (tail, as vLLM's FCFS ``running.pop()``)."""

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self.running = _OldestFirst()


# -- workloads ------------------------------------------------------------------------------

@dataclass
class Case:
    cfg: dict                 # SchedulerConfig fields, shared by both schedulers
    stop: bool                # sample the stop token now and then
    arrivals: list = field(default_factory=list)   # (step, rid, prompt, max_tokens)
    followups: dict = field(default_factory=dict)  # parent rid -> [(rid, new tokens, max_tokens)]


def gen_case(rng: random.Random) -> Case:
    """A random small workload and scheduler configuration."""
    bs = rng.choice([1, 2, 4, 8, 16])
    seqs = rng.randint(1, 6)
    mml = rng.randint(16, 96)
    chunked = rng.random() < 0.75
    budget = seqs + rng.randint(0, 48)
    if not chunked:
        budget = max(budget, mml)  # vLLM requires it with chunked prefill off
    min_blocks = -(-mml // bs) + 1  # one max_model_len request plus the null block
    tight = rng.random() < 0.4
    threshold = rng.choice([0, 0, 0, 1, 3, 8])
    cfg = dict(block_size=bs, max_num_seqs=seqs, max_model_len=mml,
               max_num_batched_tokens=budget,
               num_gpu_blocks=min_blocks + rng.randint(0, 4 if tight else 20),
               enable_prefix_caching=rng.random() < 0.8, enable_chunked_prefill=chunked,
               long_prefill_token_threshold=threshold if threshold <= mml else 0,
               scheduler_reserve_full_isl=rng.random() < 0.8,
               watermark=rng.choice([0.0, 0.0, 0.1, 0.25]))
    case = Case(cfg, stop=rng.random() < 0.3)
    system = {g: [10000 * g + i for i in range(rng.randint(1, 40))] for g in (1, 2)}
    rids = []
    for i in range(rng.randint(1, 12)):
        rid = f"r{i}"
        if rids and rng.random() < 0.25:  # a follow-up turn of an earlier request
            extra = [77000 + 100 * i + j for j in range(rng.randint(1, 10))]
            case.followups.setdefault(rng.choice(rids), []).append(
                (rid, extra, rng.randint(1, 20)))
        else:
            g = rng.choice([0, 1, 2])  # 0: no shared system prompt
            prompt = system.get(g, []) + [100 * i + j for j in range(rng.randint(1, 40))]
            case.arrivals.append((rng.randint(0, 25), rid, prompt[:mml - 1],
                                  rng.randint(1, 20)))
        rids.append(rid)
    case.arrivals.sort(key=lambda a: a[0])
    return case


def token_fn(stop: bool):
    """Sampled id of output ``i`` of request ``rid``: a fixed function, the same for both."""
    def token(rid: str, i: int) -> int:
        h = zlib.crc32(f"{rid}/{i}".encode()) % 1000
        return STOP_TOKEN if stop and h < STOP_SHARE * 1000 else 50000 + h
    return token


# -- one case -------------------------------------------------------------------------------

@dataclass
class Totals:
    cases: int = 0
    steps: int = 0
    preemptions: int = 0
    cases_with_preemption: int = 0
    admissions_with_hits: int = 0
    steps_with_rereads: int = 0
    resumed_admissions: int = 0
    followups: int = 0
    stop_finishes: int = 0
    mismatches: int = 0


def run_case(case: Case, model_dir: str, totals: Totals,
             sched_cls=Scheduler) -> dict | None:
    """Run one workload on both schedulers; None when they agree throughout, else the
    first difference (step, both states, the last steps before it)."""
    cfg = case.cfg
    s = sched_cls(SchedulerConfig(**cfg))
    vs = VllmScheduler(cfg, model_dir)
    token = token_fn(case.stop)
    reqs: dict[str, Request] = {}
    pending = list(case.arrivals)
    preempted_here = 0
    history = []

    def add(rid, prompt, max_tokens):
        if len(prompt) >= cfg["max_model_len"]:
            return  # both refuse such a prompt (servesim raises RequestRejected)
        reqs[rid] = Request(request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens,
                            stop_token_ids=(STOP_TOKEN,) if case.stop else ())
        s.add_request(reqs[rid])
        vs.add_request(rid, prompt, max_tokens, case.stop)

    next_turns = []
    for t in range(1, MAX_STEPS + 1):
        while pending and pending[0][0] < t:
            _, rid, prompt, mt = pending.pop(0)
            add(rid, prompt, mt)
        for turn in next_turns:
            add(*turn)
        next_turns = []
        if not (pending or s.has_unfinished_requests() or vs.has_unfinished_requests()):
            break
        mine, plan = servesim_step(s, token)
        theirs = vs.step(token)
        if mine != theirs:
            return dict(step=t, differs=[k for k in mine if mine[k] != theirs[k]],
                        servesim=mine, vllm=theirs,
                        previous_steps_rows_preempted_finished=history[-3:])
        history.append((t, mine["rows"], mine["preempted"], mine["finished"]))
        totals.steps += 1
        totals.preemptions += len(mine["preempted"])
        totals.steps_with_rereads += mine["reread"] > 0
        preempted_here += len(mine["preempted"])
        admitted = [e for e in plan.prefills if e.admitted]
        totals.admissions_with_hits += sum(1 for e in admitted if e.num_cached_tokens)
        totals.resumed_admissions += sum(1 for e in admitted if e.request.num_preemptions)
        for rid in mine["finished"]:
            r = reqs[rid]
            if case.stop and r.output_token_ids[-1] == STOP_TOKEN:
                totals.stop_finishes += 1
            for new_rid, extra, mt in case.followups.get(rid, []):
                totals.followups += 1
                next_turns.append((new_rid, r.prompt_token_ids + r.output_token_ids + extra, mt))
    totals.cases_with_preemption += preempted_here > 0

    st = s.stats
    mine = (st.prefix_queries, st.prefix_hits, st.preempted_queries, st.preempted_hits)
    theirs = vs.final_prefix_stats()
    if mine != theirs:
        return dict(step="end", prefix_stats_servesim=mine, prefix_stats_vllm=theirs)
    mine = {rid: r.num_cached_tokens for rid, r in reqs.items()}
    theirs = {rid: vs.cached_tokens.get(rid) for rid in reqs}
    if mine != theirs:
        return dict(step="end", cached_tokens_servesim=mine, cached_tokens_vllm=theirs)
    return None


# -- main -----------------------------------------------------------------------------------

def _runs(tokens: list[int]) -> str:
    """Token ids as runs of consecutive ids: ``10000-10035,900-922``."""
    out = []
    for t in tokens:
        if out and t == out[-1][1] + 1:
            out[-1][1] = t
        else:
            out.append([t, t])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in out)


def _unavailable(why: str) -> int:
    print(f"vllm_scheduler_diff: {why}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    from calibration.cli import positive_int
    from simulator.cli import OneLineParser

    ap = OneLineParser(prog="python benchmarks/vllm_scheduler_diff.py",
                       error_name="benchmarks/vllm_scheduler_diff.py",
                       description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=positive_int, default=380, help="random workloads (default 380)")
    ap.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    ap.add_argument("--mutate", action="store_true",
                    help="self-check: servesim preempts the oldest request; must mismatch")
    ap.add_argument("--model-dir", default=os.environ.get("VLLM_PEER_MODEL",
                                                          "/tmp/vllm-peer-model"),
                    help="any model directory vLLM can read a config from "
                         "(default $VLLM_PEER_MODEL or /tmp/vllm-peer-model)")
    args = ap.parse_args(argv)
    if VLLM_MISSING is not None:
        return _unavailable(f"vLLM is not importable in {sys.executable} ({VLLM_MISSING}); "
                            "run this with the vLLM peer's python "
                            "(../shared/peers/vllm/setup.sh builds one)")
    logging.disable(logging.WARNING)  # vLLM's config warnings, once per case
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        return _unavailable(f"no config.json in {args.model_dir}; pass --model-dir "
                            "(../shared/peers/vllm/setup.sh puts one in /tmp/vllm-peer-model)")
    sched_cls = OldestVictimScheduler if args.mutate else Scheduler
    rng = random.Random(args.seed)
    totals = Totals()
    first = None
    for k in range(args.cases):
        case = gen_case(rng)
        try:
            diff = run_case(case, args.model_dir, totals, sched_cls)
        except Exception:  # a crash on either side is a difference too
            diff = dict(error=traceback.format_exc())
        totals.cases += 1
        if diff is not None:
            totals.mismatches += 1
            if first is None:
                first = (k, case, diff)

    label = " (--mutate: servesim preempts the oldest request)" if args.mutate else ""
    print(f"servesim vs vLLM {VLLM_VERSION} scheduler, seed {args.seed}{label}")
    print(", ".join(f"{k.replace('_', ' ')} {x}" for k, x in vars(totals).items()))
    if first is not None:
        k, case, diff = first
        print(f"first mismatch: case {k}")
        print(f"  config: {case.cfg}, stop tokens: {case.stop}")
        for step, rid, prompt, mt in case.arrivals:
            print(f"  {rid}: arrives before step {step + 1}, prompt {_runs(prompt)}, "
                  f"max_tokens {mt}")
        for parent, turns in case.followups.items():
            for rid, extra, mt in turns:
                print(f"  {rid}: follows {parent} (its prompt and output + {_runs(extra)}), "
                      f"max_tokens {mt}")
        for key, val in diff.items():
            print(f"  {key}: {val}")
    return 1 if totals.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
