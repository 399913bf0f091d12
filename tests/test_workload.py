"""Synthetic workloads: distributions, arrival processes, prefixes, sessions, closed loop."""

import math
import re
import warnings

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from simulator.errors import InputError, KeyedInputError, SubkeyError
from simulator.policy import Request, RequestSpec
from simulator.workload import (GammaArrival, WorkloadConfig, arrival_times_ns,
                                build_workload, length_bounds, sample_durations_ns,
                                sample_lengths)
from pydantic import TypeAdapter
from simulator.workload import Arrival, Dist

DIST = TypeAdapter(Dist)
ARRIVAL = TypeAdapter(Arrival)
NS = 1_000_000_000


def rng(seed=1):
    return np.random.default_rng(seed)


def cfg(**over):
    base = dict(seed=0, num_requests=200,
                arrival={"process": "poisson", "rate": 8.0},
                prompt_tokens={"dist": "lognormal", "median": 1020, "p90": 2735},
                output_tokens={"dist": "lognormal", "median": 129, "p90": 424})
    base.update(over)
    return WorkloadConfig.model_validate(base)


# -- length distributions --------------------------------------------------------------

def test_lognormal_quantiles_match_median_and_p90():
    x = sample_lengths(DIST.validate_python(
        {"dist": "lognormal", "median": 1020, "p90": 2735}), 200_000, rng())
    assert x.dtype == np.int64
    assert np.quantile(x, 0.5) == pytest.approx(1020, rel=0.02)
    assert np.quantile(x, 0.9) == pytest.approx(2735, rel=0.02)
    # sigma = ln(p90/median)/z_0.9, so p99 = median * exp(z_0.99 * sigma)
    sigma = math.log(2735 / 1020) / stats.norm.ppf(0.9)
    assert np.quantile(x, 0.99) == pytest.approx(1020 * math.exp(stats.norm.ppf(0.99) * sigma),
                                                 rel=0.03)


def test_lengths_are_clipped_and_at_least_one():
    d = DIST.validate_python({"dist": "normal", "mean": 5, "std": 50, "min": 2, "max": 40})
    x = sample_lengths(d, 50_000, rng())
    assert x.min() == 2 and x.max() == 40
    d = DIST.validate_python({"dist": "normal", "mean": 1, "std": 3})
    assert sample_lengths(d, 10_000, rng()).min() == 1
    # a centre below 1 would clip nearly every sample to 1 (an "n/a" TPOT, SLO met)
    with pytest.raises(ValueError, match="normal mean 0.5 is below 1"):
        length_bounds(DIST.validate_python({"dist": "normal", "mean": 0.5, "std": 3}))
    with pytest.raises(ValueError, match="lognormal median 0.5 is below 1"):
        length_bounds(DIST.validate_python({"dist": "lognormal", "median": 0.5, "p90": 3}))
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        DIST.validate_python({"dist": "normal", "mean": -100, "std": 5})
    d = DIST.validate_python({"dist": "fixed", "value": 1})
    assert set(sample_lengths(d, 10, rng())) == {1}


@pytest.mark.parametrize("d, msg", [
    ({"dist": "lognormal", "median": 96, "p90": 320, "max": 10},
     "max (10) is below the median (96)"),
    ({"dist": "lognormal", "median": 96, "p90": 320, "min": 200},
     "min (200) is above the median (96)"),
    ({"dist": "lognormal", "median": 100, "p90": 1000, "max": 500},   # 19% of draws at 500
     "max (500) is below p90 (1000): over a tenth of the samples would be clipped"),
    ({"dist": "normal", "mean": 500, "std": 50, "max": 100}, "max (100) is below the mean"),
    # refused: every request would get 50 tokens
    ({"dist": "fixed", "value": 100, "max": 50},
     "max (50) is below the value (100): every sample would be clipped to max"),
    ({"dist": "fixed", "value": 100, "min": 200},
     "min (200) is above the value (100): every sample would be clipped to min"),
])
def test_clip_bounds_that_cut_off_the_centre_are_refused(d, msg):
    with pytest.raises(ValidationError, match=re.escape(msg)):
        DIST.validate_python(d)
    DIST.validate_python({**d, "max": None, "min": None})      # without them: fine


def test_uniform_is_integer_and_inclusive():
    x = sample_lengths(DIST.validate_python({"dist": "uniform", "min": 2, "max": 6}),
                       100_000, rng())
    assert set(np.unique(x)) == {2, 3, 4, 5, 6}
    assert x.mean() == pytest.approx(4.0, abs=0.02)


def test_normal_moments():
    x = sample_lengths(DIST.validate_python({"dist": "normal", "mean": 500, "std": 50}),
                       200_000, rng())
    assert x.mean() == pytest.approx(500, rel=0.005)
    # rounding to integers adds variance 1/12
    assert x.std() == pytest.approx(math.sqrt(50 ** 2 + 1 / 12), rel=0.01)


def test_empirical_resamples_a_csv_column(tmp_path):
    (tmp_path / "lens.csv").write_text("a,b\n10,1\n20,2\n30,3\n")
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a"})
    x = sample_lengths(d, 30_000, rng(), base_dir=tmp_path)
    assert set(np.unique(x)) == {10, 20, 30}
    assert np.bincount(x)[[10, 20, 30]] / len(x) == pytest.approx([1 / 3] * 3, abs=0.01)


def test_empirical_bad_file_names_the_line(tmp_path):
    (tmp_path / "lens.csv").write_text("a\n10\nx\n")
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a"})
    with pytest.raises(InputError, match=r"lens\.csv:3: a"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path)
    d = DIST.validate_python({"dist": "empirical", "path": "none.csv", "column": "a"})
    with pytest.raises(InputError, match="not found"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path)
    # a column the file lacks: the header's columns and the key that names it
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "zz"})
    with pytest.raises(InputError, match=r"lens\.csv:1: missing column 'zz' \(columns are "
                                         r"'a'; [a-z_.]+\.column names it\)$"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path)
    # counts are 1 to 1e9, as in traces (0.5 is refused, not clipped to 1); seconds may be 0.5
    (tmp_path / "lens.csv").write_text("a\n10\n0.5\n")
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a"})
    with pytest.raises(InputError, match=r"lens\.csv:3: a: expected a whole count from 1 to "
                                         r"1e\+09, got '0\.5'"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path)
    assert sorted(set(sample_durations_ns(d, 50, rng(), base_dir=tmp_path))) == [
        500_000_000, 10_000_000_000]
    (tmp_path / "lens.csv").write_text("a\n1e30\n")
    with pytest.raises(InputError, match=r"lens\.csv:2: a: expected a whole count from 1 to 1e\+09"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path)


def test_empirical_counts_are_whole_and_clip_bounds_keep_the_centre(tmp_path):
    # 1.5 and 2.5 tokens are refused: rounded half to even, every prompt would be 2 tokens
    (tmp_path / "lens.csv").write_text("a\n100\n1.5\n2.5\n")
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a"})
    with pytest.raises(InputError, match=r"lens\.csv:3: a: expected a whole count from 1 to "
                                         r"1e\+09, got '1\.5'$"):
        sample_lengths(d, 10, rng(), base_dir=tmp_path, key="workload.prompt_tokens")
    assert sorted(set(sample_durations_ns(d, 200, rng(), base_dir=tmp_path))) == [
        1_500_000_000, 2_500_000_000, 100_000_000_000]   # seconds may be fractional
    # values 100, 200, 300 (median 200) clipped at min 500 or max 50 would be one value: refused
    (tmp_path / "lens.csv").write_text("a\n100\n200\n300\n")
    for bound, said in (({"min": 500}, "min (500) is above the median of column 'a' (200): "
                                       "most samples would be clipped to min"),
                        ({"max": 50}, "max (50) is below the median of column 'a' (200): "
                                      "most samples would be clipped to max")):
        d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a",
                                  **bound})
        with pytest.raises(KeyedInputError) as e:
            sample_lengths(d, 10, rng(), base_dir=tmp_path, key="workload.prompt_tokens")
        assert (e.value.key, e.value.detail) == ("workload.prompt_tokens", said)
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a",
                              "min": 150, "max": 250})   # the tails clipped, the centre kept
    assert set(sample_lengths(d, 300, rng(), base_dir=tmp_path)) == {150, 200, 250}


def test_empirical_csv_is_read_as_traces_are(tmp_path):
    # the trace reader's checks: blank lines keep the file's line numbers, surplus
    # fields are refused, and Latin-1 bytes are one error line
    d = DIST.validate_python({"dist": "empirical", "path": "lens.csv", "column": "a"})
    for body, said in (("a\n10\n\nx\n", r"lens\.csv:4: a: expected a whole count"),
                       ("a,b\n10,1\n20,2,3\n", r"lens\.csv:3: expected 2 fields, saw 3"),
                       ("a,a\n1,2\n", r"lens\.csv:1: column 'a' appears twice"),
                       (b"a\n10\n2\xe90\n", r"lens\.csv:3: not UTF-8 text \(byte 0xe9 at "
                                          r"column 2; save the file as UTF-8\)$")):
        f = tmp_path / "lens.csv"
        f.write_bytes(body) if isinstance(body, bytes) else f.write_text(body)
        with pytest.raises(InputError, match=said):
            sample_lengths(d, 10, rng(), base_dir=tmp_path)


def test_think_times_are_fractional_seconds_in_ns():
    d = DIST.validate_python({"dist": "fixed", "value": 0.25})
    assert list(sample_durations_ns(d, 3, rng())) == [250_000_000] * 3
    d = DIST.validate_python({"dist": "uniform", "min": 0, "max": 2})
    x = sample_durations_ns(d, 100_000, rng())
    assert x.mean() == pytest.approx(NS, rel=0.01)
    assert len(np.unique(x)) > 90_000  # continuous, not integer seconds


# -- arrival processes -----------------------------------------------------------------

@pytest.mark.parametrize("k", [0.25, 1.0, 4.0])
def test_gamma_gaps_mean_and_cv(k):
    rate = 8.0
    t = arrival_times_ns(ARRIVAL.validate_python(
        {"process": "gamma", "rate": rate, "burstiness": k}), 200_000, rng())
    assert t.dtype == np.int64 and np.all(np.diff(t) >= 0)
    gaps = np.diff(np.concatenate([[0], t])) / NS
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(k), rel=0.03)


def test_poisson_counts_per_second_are_poisson():
    rate = 8.0
    t = arrival_times_ns(ARRIVAL.validate_python({"process": "poisson", "rate": rate}),
                         200_000, rng())
    seconds = int(t[-1] // NS)
    counts = np.bincount((t // NS).astype(int), minlength=seconds + 1)[:seconds]
    assert counts.mean() == pytest.approx(rate, rel=0.01)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.03)
    pmf = np.bincount(counts, minlength=25)[:25] / len(counts)
    assert np.abs(pmf - stats.poisson.pmf(np.arange(25), rate)).max() < 0.005


def test_constant_arrivals_are_exact():
    t = arrival_times_ns(ARRIVAL.validate_python({"process": "constant", "rate": 4.0}), 5,
                         rng())
    assert list(t) == [250_000_000, 500_000_000, 750_000_000, 1_000_000_000, 1_250_000_000]


def test_normalize_duration_puts_last_arrival_at_n_over_rate():
    a = GammaArrival(process="gamma", rate=5.0, burstiness=0.5, normalize_duration=True)
    t = arrival_times_ns(a, 1000, rng())
    assert t[-1] == 200 * NS


def test_closed_loop_has_no_arrival_times():
    with pytest.raises(ValueError):
        arrival_times_ns(ARRIVAL.validate_python(
            {"process": "closed_loop", "concurrency": 2}), 3, rng())


# -- single requests and prefixes ------------------------------------------------------

def test_single_requests_ids_order_and_content():
    specs = build_workload(cfg(num_requests=500))
    assert [s.request_id for s in specs] == list(range(500))
    arr = [s.arrival_ns for s in specs]
    assert arr == sorted(arr) and all(isinstance(a, int) for a in arr)
    ids = [s.prompt[0][0] for s in specs]
    assert len(set(ids)) == 500  # distinct content gets distinct ids
    assert all(s.after is None and s.max_tokens >= 1 for s in specs)


def test_prefix_segments_and_lengths():
    specs = build_workload(cfg(
        num_requests=20_000, prompt_tokens={"dist": "uniform", "min": 300, "max": 900},
        prefix={"shared_tokens": 512, "groups": 3}))
    for s in specs:
        (pid, plen), (uid, ulen) = s.prompt
        assert pid[0] == "prefix" and pid[1] in (0, 1, 2) and plen == 512
        assert uid == ("user", s.request_id)
    # draws <= 513 keep one own token: P = (513 - 300 + 1) / 601; the rest are uniform
    # on 514..900, so the whole prompt is max(draw, 513)
    own = np.array([s.prompt[1][1] for s in specs])
    assert own.min() == 1 and own.max() == 900 - 512
    assert np.mean(own == 1) == pytest.approx(214 / 601, abs=0.01)
    assert np.mean([s.prompt_tokens for s in specs]) == pytest.approx(
        (214 * 513 + sum(range(514, 901))) / 601, rel=0.005)
    # prompt_tokens counts the prefix: a fixed 1000-token prompt is 512 shared + 488 own
    s = build_workload(cfg(num_requests=1, prompt_tokens={"dist": "fixed", "value": 1000},
                           prefix={"shared_tokens": 512}))[0]
    assert [length for _, length in s.prompt] == [512, 488]


def test_same_prefix_group_shares_blocks_other_groups_do_not():
    specs = build_workload(cfg(num_requests=40, prefix={"shared_tokens": 512, "groups": 4}))
    by_group = {}
    for s in specs:
        by_group.setdefault(s.prompt[0][0], []).append(Request(s))
    a, b = next(g for g in by_group.values() if len(g) >= 2)[:2]
    other = next(g for k, g in by_group.items() if k != a.prompt_segments[0][0])[0]
    assert all(a.block_hash(i, 16) == b.block_hash(i, 16) for i in range(32))
    assert a.block_hash(0, 16) != other.block_hash(0, 16)


def test_zipf_popularity_ranks():
    c = cfg(num_requests=100_000, prompt_tokens={"dist": "fixed", "value": 600},
            prefix={"shared_tokens": 512, "groups": 10, "popularity": "zipf", "zipf_s": 1.1})
    specs = build_workload(c)
    counts = np.bincount([s.prompt[0][0][1] for s in specs], minlength=10)
    expected = 1.0 / np.arange(1, 11) ** 1.1
    expected /= expected.sum()
    assert np.all(np.diff(counts) < 0)  # rank 0 most popular, strictly decreasing
    assert np.abs(counts / counts.sum() - expected).max() < 0.005


def test_uniform_popularity():
    specs = build_workload(cfg(num_requests=40_000, prefix={
        "shared_tokens": 64, "groups": 4, "popularity": "uniform"}))
    counts = np.bincount([s.prompt[0][0][1] for s in specs], minlength=4)
    assert counts / counts.sum() == pytest.approx([0.25] * 4, abs=0.01)


# -- sessions --------------------------------------------------------------------------

def session_cfg(n=300, **over):
    return cfg(num_requests=n, prefix={"shared_tokens": 128, "groups": 2},
               sessions={"turns": {"dist": "uniform", "min": 2, "max": 6},
                         "think_time_s": {"dist": "fixed", "value": 1.5}}, **over)


def test_session_turns_extend_previous_prompt_and_answer():
    specs = build_workload(session_cfg())
    assert len(specs) == 300
    by_id = {s.request_id: s for s in specs}
    assert sorted(by_id) == list(range(300))
    follow = [s for s in specs if s.after is not None]
    firsts = [s for s in specs if s.after is None]
    assert follow and firsts
    # first turns: ids 0..S-1 in arrival order, prefix + new user segment
    assert [s.request_id for s in firsts] == list(range(len(firsts)))
    assert [s.arrival_ns for s in firsts] == sorted(s.arrival_ns for s in firsts)
    for s in follow:
        prev = by_id[s.after]
        assert s.prompt[:len(prev.prompt)] == prev.prompt
        assert s.prompt[len(prev.prompt)] == (("out", prev.request_id), prev.max_tokens)
        assert s.prompt[-1][0] == ("user", s.request_id)
        assert len(s.prompt) == len(prev.prompt) + 2
        assert s.session_id == prev.session_id
        assert s.arrival_ns == 0 and s.think_time_ns == 1_500_000_000
        assert s.request_id >= len(firsts)
    # each session is one chain: every request is `after` at most once
    afters = [s.after for s in follow]
    assert len(afters) == len(set(afters))


def test_session_turn_counts_follow_the_distribution():
    c = cfg(num_requests=2000, sessions={"turns": {"dist": "fixed", "value": 3}})
    specs = build_workload(c)
    sessions = {}
    for s in specs:
        sessions.setdefault(s.session_id, []).append(s)
    sizes = sorted(len(v) for v in sessions.values())
    # 2000 = 666 sessions of 3 + one truncated session of 2
    assert sizes == [2] + [3] * 666
    # a plain integer of turns is that fixed count (as think_time_s takes a number)
    assert build_workload(cfg(num_requests=2000, sessions={"turns": 3})) == specs
    with pytest.raises(ValidationError, match="fixed value 0 is not a whole number >= 1"):
        cfg(sessions={"turns": {"dist": "fixed", "value": 0}})
    for n in (0, 1_000_000_001):
        with pytest.raises(ValidationError, match=r"must be a whole number of turns from 1 to "
                                                  r"1e\+09") as e:
            cfg(sessions={"turns": n})
        assert e.value.errors()[0]["loc"][-1] == "turns"   # not "value": no mapping written
    with pytest.raises(ValidationError, match="expected a whole number of turns >= 1 or a "
                                              "distribution"):
        cfg(sessions={"turns": 2.5})


def test_second_turn_hits_first_turns_prompt_and_answer_blocks():
    specs = build_workload(cfg(num_requests=2, prompt_tokens={"dist": "fixed", "value": 40},
                               output_tokens={"dist": "fixed", "value": 24},
                               sessions={"turns": {"dist": "fixed", "value": 2}}))
    first, second = sorted(specs, key=lambda s: s.request_id)
    assert second.after == first.request_id
    r1, r2 = Request(first), Request(second)
    # turn 1 holds 40 prompt + 24 answer = 64 tokens = 4 full blocks of 16
    assert [r1.block_hash(i, 16) for i in range(4)] == [r2.block_hash(i, 16) for i in range(4)]
    assert r2.num_prompt_tokens == 40 + 24 + 40


# -- closed loop -----------------------------------------------------------------------

def test_closed_loop_chains():
    c = cfg(num_requests=10, arrival={
        "process": "closed_loop", "concurrency": 3,
        "think_time_s": {"dist": "fixed", "value": 0.5}})
    specs = build_workload(c)
    by_id = {s.request_id: s for s in specs}
    assert sorted(by_id) == list(range(10))
    for j in range(3):
        assert by_id[j].after is None and by_id[j].arrival_ns == 0
    for j in range(3, 10):
        assert by_id[j].after == j - 3 and by_id[j].think_time_ns == 500_000_000
        assert by_id[j].arrival_ns == 0
        assert len(by_id[j].prompt) == 1  # no conversation: fresh content
    # users' chains: 0-3-6-9, 1-4-7, 2-5-8
    chains = []
    for head in range(3):
        chain, cur = [head], head
        while (nxt := next((s.request_id for s in specs if s.after == cur), None)) is not None:
            chain.append(nxt)
            cur = nxt
        chains.append(chain)
    assert chains == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_closed_loop_first_free_sends_in_order_through_one_gate():
    # vllm bench serve --request-rate inf --max-concurrency 3: every request is ready at
    # 0 s, no user owns any, the client gate of 3 sends them as slots free
    c = cfg(num_requests=10, arrival={"process": "closed_loop", "concurrency": 3,
                                      "dispatch": "first_free"})
    specs = build_workload(c)
    assert [s.request_id for s in specs] == list(range(10))
    assert all(s.after is None and s.arrival_ns == 0 for s in specs)
    assert c.client_concurrency == 3
    assert cfg(num_requests=10, arrival={"process": "closed_loop",
                                         "concurrency": 3}).client_concurrency is None
    assert cfg(num_requests=10, arrival={"process": "poisson", "rate": 2},
               max_concurrency=5).client_concurrency == 5
    bad = [({"think_time_s": 0.5}, "think_time_s", "must be 0 with dispatch: first_free"),
           ({"dispatch": "any"}, "dispatch", "per_user"),
           ({"dispatch": "first_free", "max": 1}, "max", "")]
    for extra, key, text in bad:
        arr = {"process": "closed_loop", "concurrency": 3, "dispatch": "first_free", **extra}
        with pytest.raises(ValidationError, match=key) as e:
            cfg(num_requests=10, arrival=arr)
        assert text in str(e.value)
    with pytest.raises(ValidationError, match="max_concurrency") as e:
        cfg(num_requests=10, arrival={"process": "closed_loop", "concurrency": 3},
            max_concurrency=2)
    assert "whose concurrency bounds the requests in flight" in str(e.value)
    with pytest.raises(ValidationError, match="sessions"):
        cfg(num_requests=10, arrival={"process": "closed_loop", "concurrency": 3,
                                      "dispatch": "first_free"},
            sessions={"turns": 2})


def test_closed_loop_with_sessions():
    c = cfg(num_requests=12,
            arrival={"process": "closed_loop", "concurrency": 2,
                     "think_time_s": {"dist": "fixed", "value": 3}},
            sessions={"turns": {"dist": "fixed", "value": 2},
                      "think_time_s": {"dist": "fixed", "value": 1}})
    by_id = {s.request_id: s for s in build_workload(c)}
    # user 0 runs requests 0,2,4,...: sessions (0,2), (4,6), (8,10)
    assert by_id[2].after == 0 and by_id[2].prompt[:1] == by_id[0].prompt
    assert by_id[2].think_time_ns == NS
    assert by_id[4].after == 2 and len(by_id[4].prompt) == 1
    assert by_id[4].think_time_ns == 3 * NS
    assert by_id[4].session_id != by_id[2].session_id == by_id[0].session_id


def test_a_plain_number_of_think_seconds_is_a_fixed_distribution():
    # think_time_s: 2 means {dist: fixed, value: 2} in the closed loop and in sessions:
    # the same specs as the mapping form, every follow-up waiting exactly 2 s (or 0.5 s).
    plain = cfg(num_requests=8, arrival={"process": "closed_loop", "concurrency": 2,
                                          "think_time_s": 2},
                sessions={"turns": {"dist": "fixed", "value": 2}, "think_time_s": 0.5})
    mapped = cfg(num_requests=8, arrival={"process": "closed_loop", "concurrency": 2,
                                           "think_time_s": {"dist": "fixed", "value": 2}},
                 sessions={"turns": {"dist": "fixed", "value": 2},
                           "think_time_s": {"dist": "fixed", "value": 0.5}})
    specs = build_workload(plain)
    assert specs == build_workload(mapped)
    by_id = {s.request_id: s for s in specs}
    assert by_id[2].think_time_ns == NS // 2 and by_id[4].think_time_ns == 2 * NS
    loop0 = cfg(arrival={"process": "closed_loop", "concurrency": 8, "think_time_s": 0})
    assert loop0.arrival.think_time_s.value == 0


@pytest.mark.parametrize("value, msg", [
    (-1, "must be a finite number of seconds >= 0 (or a distribution such as"),
    (float("inf"), "must be a finite number of seconds >= 0"),
    (True, "a number of seconds >= 0 or a distribution such as {dist: fixed, value: 0}"),
    ("2", "a number of seconds >= 0 or a distribution"),
])
def test_a_think_time_that_is_not_a_number_or_a_distribution_says_both_forms(value, msg):
    with pytest.raises(ValidationError, match=re.escape(msg)):
        cfg(arrival={"process": "closed_loop", "concurrency": 2, "think_time_s": value})
    with pytest.raises(ValidationError, match=re.escape(msg)):
        cfg(sessions={"turns": {"dist": "fixed", "value": 2}, "think_time_s": value})


def test_think_times_past_the_run_clock_are_refused_at_their_key():
    # A draw past 4.6e9 s is refused: in ns it would overflow int64, and uniform [0, 1e300]
    # would give negative think times.
    huge = cfg(num_requests=20, arrival={"process": "closed_loop", "concurrency": 4,
                                          "think_time_s": {"dist": "uniform", "min": 0,
                                                           "max": 1e300}})
    with pytest.raises(InputError) as e:
        build_workload(huge)
    assert e.value.key == "workload.arrival.think_time_s" and "draws a think time" in str(e.value)
    # Each draw fits, their sum does not: user 0 follows its first request 9 times (20
    # requests, 2 users), 9 × 1e9 s = 9e9 s > 2**62 ns = 4.61e9 s; 4 follow-ups = 4e9 s fit.
    loop = dict(process="closed_loop", concurrency=2, think_time_s=1e9)
    with pytest.raises(InputError) as e:
        build_workload(cfg(num_requests=20, arrival=loop))
    assert e.value.key == "workload.arrival.think_time_s" and "9e+09 s" in str(e.value)
    specs = build_workload(cfg(num_requests=10, arrival=loop))
    assert max(s.think_time_ns for s in specs) == 10**18
    # In sessions the turns' think time is named: 5 turns at 2e9 s add 8e9 s.
    with pytest.raises(InputError) as e:
        build_workload(cfg(num_requests=20, sessions={"turns": 5, "think_time_s": 2e9}))
    assert e.value.key == "workload.sessions.think_time_s" and "8e+09 s" in str(e.value)


def test_concurrency_above_num_requests():
    specs = build_workload(cfg(num_requests=3, arrival={"process": "closed_loop",
                                                         "concurrency": 10}))
    assert [s.after for s in specs] == [None] * 3


# -- determinism and validation --------------------------------------------------------

def test_deterministic_and_seed_sensitive():
    assert build_workload(session_cfg()) == build_workload(session_cfg())
    assert build_workload(session_cfg(seed=1)) != build_workload(session_cfg())


def test_streams_are_independent_per_purpose():
    a = build_workload(cfg(num_requests=100))
    b = build_workload(cfg(num_requests=100, output_tokens={"dist": "fixed", "value": 7}))
    assert [s.arrival_ns for s in a] == [s.arrival_ns for s in b]
    assert [s.prompt for s in a] == [s.prompt for s in b]


def test_result_is_request_specs():
    assert all(type(s) is RequestSpec for s in build_workload(cfg(num_requests=5)))


@pytest.mark.parametrize("bad, where", [
    ({"arrival": None}, "arrival"),
    ({"extra_key": 1}, "extra_key"),
    ({"prompt_tokens": {"dist": "lognormal", "median": 100, "p90": 50}}, "p90"),
    ({"prompt_tokens": {"dist": "uniform", "min": 9, "max": 3}}, "min"),
    ({"prompt_tokens": {"dist": "zeta", "a": 2}}, "zeta"),
    ({"arrival": {"process": "gamma", "rate": 0}}, "rate"),
    ({"output_tokens": {"dist": "normal", "mean": 5, "std": 1, "max": 0}}, "output_tokens"),
    ({"trace": {"path": "t.csv", "format": "azure"}}, "not allowed with trace"),
    # an incomplete arrival beside a trace: the conflict, not the arrival's missing key
    ({"trace": {"path": "t.csv", "format": "azure"}, "arrival": {"rate": 5},
      "prompt_tokens": None, "output_tokens": None},
     r"1 validation error.*\n.*arrival not allowed with trace"),
])
def test_bad_config_is_rejected(bad, where):
    base = dict(seed=0, num_requests=10, arrival={"process": "poisson", "rate": 1.0},
                prompt_tokens={"dist": "fixed", "value": 10},
                output_tokens={"dist": "fixed", "value": 10})
    base.update(bad)
    base = {k: v for k, v in base.items() if v is not None}
    with pytest.raises(ValidationError, match=where):
        WorkloadConfig.model_validate(base)


@pytest.mark.parametrize("field, d, msg", [
    ("output_tokens", {"dist": "uniform", "min": 1.2, "max": 1.8},
     "uniform [1.2, 1.8] holds no integer"),
    ("prompt_tokens", {"dist": "uniform", "min": 0, "max": 0.5}, "max (0.5) holds no integer >= 1"),
    ("output_tokens", {"dist": "fixed", "value": 0}, "fixed value 0 is not a whole number >= 1"),
    # below the schema's >= 0 (which is for times): the message still gives a count's 1
    ("output_tokens", {"dist": "fixed", "value": -1}, "fixed value -1 is not a whole number >= 1"),
    ("prompt_tokens", {"dist": "fixed", "value": 0.5}, "fixed value 0.5 is not a whole number"),
    ("output_tokens", {"dist": "normal", "mean": -5, "std": 1}, "normal mean -5 is below 1"),
    ("prompt_tokens", {"dist": "lognormal", "median": -1, "p90": 5},
     "lognormal median -1 is below 1"),
    ("output_tokens", {"dist": "fixed", "value": 3.5}, "fixed value 3.5 is not a whole number"),
    # uniform's min is a parameter, not a clip: its 0s would double the share of 1
    ("prompt_tokens", {"dist": "uniform", "min": 0, "max": 3}, "uniform min 0 draws 0"),
    # drawn as integers: past int64, refused with its key
    ("prompt_tokens", {"dist": "uniform", "min": 1, "max": 1e30}, "1e+30 is above 1e+09"),
    ("output_tokens", {"dist": "normal", "mean": 5.5, "std": 1, "min": 5.2, "max": 5.8},
     "[min, max] = [5.2, 5.8] holds no integer >= 1"),
])
def test_count_bounds_without_an_integer_are_refused_at_their_key(field, d, msg):
    with pytest.raises(ValidationError) as e:
        cfg(**{field: d})
    (error,) = e.value.errors()
    assert error["loc"] == (field,) and msg in error["msg"]


def test_session_turn_bounds_without_an_integer_are_refused_at_their_key():
    with pytest.raises(ValidationError) as e:
        cfg(sessions={"turns": {"dist": "uniform", "min": 2.1, "max": 2.9}})
    (error,) = e.value.errors()
    assert error["loc"] == ("sessions", "turns")
    assert "uniform [2.1, 2.9] holds no integer" in error["msg"]
    with pytest.raises(ValidationError) as e:
        cfg(sessions={"turns": {"dist": "uniform", "min": 0, "max": 4}})
    (error,) = e.value.errors()
    assert error["loc"] == ("sessions", "turns") and "give min >= 1" in error["msg"]
    with pytest.raises(ValidationError) as e:
        cfg(sessions={"turns": {"dist": "fixed", "value": -2}})
    (error,) = e.value.errors()
    assert error["loc"] == ("sessions", "turns")
    assert "fixed value -2 is not a whole number >= 1" in error["msg"]
    # times keep the schema's own bound (a think time may centre on 0.5 s)
    with pytest.raises(ValidationError) as e:
        cfg(sessions={"turns": {"dist": "fixed", "value": 2},
                      "think_time_s": {"dist": "normal", "mean": -1, "std": 1}})
    (error,) = e.value.errors()
    assert error["loc"] == ("sessions", "think_time_s", "normal", "mean")
    assert "greater than or equal to 0" in error["msg"]


def test_sample_lengths_bounds_error_names_the_key():
    d = DIST.validate_python({"dist": "uniform", "min": 3.2, "max": 3.7})
    with pytest.raises(InputError, match=r"^workload\.output_tokens: uniform \[3\.2, 3\.7\] "
                                         r"holds no integer"):
        sample_lengths(d, 5, rng(), key="workload.output_tokens")
    d = DIST.validate_python({"dist": "uniform", "min": 3, "max": 3.7})   # holds 3
    assert set(sample_lengths(d, 20, rng())) == {3}


@pytest.mark.parametrize("key, value", [("num_requests", True), ("num_requests", "30"),
                                        ("output_tokens", {"dist": "fixed", "value": "3"}),
                                        ("arrival", {"process": "poisson", "rate": "2"})])
def test_no_silent_coercion_of_strings_or_booleans_into_numbers(key, value):
    # as in the rest of the scenario: true is not 1 and "30" is not 30
    with pytest.raises(ValidationError):
        cfg(**{key: value})


@pytest.mark.parametrize("section,key", [
    ("  arrival: {process: poisson, rate: 1.0}\n"
     "  prompt_tokens: {dist: empirical, path: none.csv, column: a}\n",
     "workload.prompt_tokens.path"),
    ("  arrival: {process: closed_loop, concurrency: 2,\n"
     "    think_time_s: {dist: empirical, path: none.csv, column: a}}\n"
     "  prompt_tokens: {dist: fixed, value: 5}\n",
     "workload.arrival.think_time_s.path"),
])
def test_a_missing_empirical_file_names_its_key_and_line(tmp_path, monkeypatch, section, key):
    # the error names the scenario and the key, not only 'none.csv: file not found'
    from simulator.run import simulate
    from simulator.scenario import load_scenario

    y = tmp_path / "w.yaml"
    y.write_text("name: w\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 "workload:\n  num_requests: 4\n" + section
                 + "  output_tokens: {dist: fixed, value: 2}\n")
    line = next(i for i, t in enumerate(y.read_text().splitlines(), 1) if "none.csv" in t)
    with pytest.raises(InputError) as e:
        simulate(load_scenario(y))
    assert str(e.value) == (f"w.yaml:{line}: {key}: {tmp_path / 'none.csv'}: file not "
                            f"found (empirical distribution)")
    y.write_text(y.read_text().replace("none.csv", "lens.csv"))
    monkeypatch.chdir(tmp_path)   # a path typed in a flag is relative to the current folder
    with pytest.raises(InputError) as e:
        simulate(load_scenario(y, [f"{key}=gone.csv"]))
    assert str(e.value) == (f"--set {key}=gone.csv: {tmp_path / 'gone.csv'}: file not "
                            f"found (empirical distribution)")


def test_a_rate_so_low_that_the_arrivals_overflow_the_clock_names_the_rate():
    from simulator.errors import KeyedInputError
    with pytest.raises(KeyedInputError) as e:
        build_workload(cfg(num_requests=3000, arrival={"process": "poisson", "rate": 1e-9}))
    assert e.value.key == "workload.arrival.rate"
    assert e.value.detail == ("1e-09 req/s spreads 3000 arrivals over more than the 4.6e9 s "
                              "a run can hold")
    with warnings.catch_warnings():   # no overflow warning on the way either
        warnings.simplefilter("error")
        with pytest.raises(KeyedInputError):
            build_workload(cfg(num_requests=3000, arrival={"process": "poisson",
                                                           "rate": 1e-300}))
        # the drawn times are checked too (a draw can pass where the mean does not)
        with pytest.raises(KeyedInputError, match="spreads 3000 arrivals"):
            arrival_times_ns(TypeAdapter(Arrival).validate_python(
                {"process": "poisson", "rate": 1e-300}), 3000, np.random.default_rng(0))


def test_run_refuses_arrivals_past_the_clock_before_drawing_them(tmp_path, capsys,
                                                                  monkeypatch):
    # 1e8 requests at 0.01 req/s span 1e10 s, past the 4.6e9 s a run holds: said at once,
    # as one line, without the memory warning or the draws (gigabytes, half a minute)
    import simulator.workload as W
    from simulator.cli import main

    def no_draws(*a, **kw):
        raise AssertionError("drew the workload")
    monkeypatch.setattr(W, "_build_open_loop", no_draws)
    y = tmp_path / "s.yaml"
    y.write_text("name: s\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 "workload:\n  num_requests: 100000000\n  arrival: {process: poisson, "
                 "rate: 0.01}\n  prompt_tokens: {dist: fixed, value: 8}\n"
                 "  output_tokens: {dist: fixed, value: 4}\n")
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        "servesim: error: s.yaml:6: workload.arrival.rate: 0.01 req/s spreads 100000000 "
        "arrivals over more than the 4.6e9 s a run can hold\n")
    assert not (tmp_path / "o").exists()


def test_gamma_burstiness_at_its_extremes():
    from simulator.errors import KeyedInputError
    # shape 1e308: gaps of CV 1e-154, 1/rate each (not a scale of 0 from 1 / (rate × k),
    # which would put every arrival at 0 s)
    t = [r.arrival_ns for r in build_workload(cfg(num_requests=5, arrival={
        "process": "gamma", "rate": 10.0, "burstiness": 1e308}))]
    assert t == [NS // 10 * (i + 1) for i in range(5)]
    # a subnormal shape: the scale itself overflows; the key at fault is burstiness
    with pytest.raises(KeyedInputError) as e:
        build_workload(cfg(num_requests=5, arrival={"process": "gamma", "rate": 8.0,
                                                     "burstiness": 1e-310}))
    assert (e.value.key, e.value.detail) == (
        "workload.arrival.burstiness",
        "1e-310 is too small: the gaps' scale 1 / (rate × burstiness) overflows")


@pytest.mark.parametrize("key", ["min", "max"])
def test_negative_clip_bounds_are_refused_as_negative(key):
    # counts and seconds are never negative: not "below the median" or "holds no integer"
    with pytest.raises(ValidationError, match=re.escape(
            f"lognormal.{key}\n  Input should be greater than or equal to 0")):
        DIST.validate_python({"dist": "lognormal", "median": 96, "p90": 320, key: -1})


@pytest.mark.parametrize("d, key, msg", [
    ({"dist": "fixed", "value": 1e30}, "value", "1e+30 is above 1e+09"),
    ({"dist": "lognormal", "median": 1e30, "p90": 2e30}, "median", "1e+30 is above 1e+09"),
    ({"dist": "normal", "mean": 1e30, "std": 1}, "mean", "1e+30 is above 1e+09"),
    ({"dist": "uniform", "min": 1e30, "max": 2e30}, "min", "1e+30 is above 1e+09"),
    # a clip max past any context bounds nothing: refused as the value and min are
    ({"dist": "lognormal", "median": 100, "p90": 200, "max": 1e12}, "max", "1000000000000 is above"),
    # in full: "1000000001 is above 1e+09", not "1e+09 is above 1e+09"
    ({"dist": "normal", "mean": 100, "std": 5, "max": 1_000_000_001}, "max",
     "1000000001 is above 1e+09"),
    ({"dist": "normal", "mean": 100, "std": 5, "max": 999_999_999_999}, "max",
     "999999999999 is above 1e+09"),
    ({"dist": "normal", "mean": 100, "std": 5, "max": 1_000_000_000.5}, "max",
     "1000000000.5 is above 1e+09"),
])
def test_counts_past_any_context_are_refused(d, key, msg):
    # drawn, they would pass int64 (a traceback, not an error naming the key)
    with pytest.raises(SubkeyError, match=re.escape(msg)) as e:
        length_bounds(DIST.validate_python(d))
    assert e.value.key == key
    with pytest.raises(KeyedInputError) as e:   # drawn directly: the key and its field
        sample_lengths(DIST.validate_python(d), 3, rng(), key="workload.output_tokens")
    assert e.value.key == f"workload.output_tokens.{key}"


def test_a_tail_past_int64_is_clipped_not_wrapped():
    d = DIST.validate_python({"dist": "lognormal", "median": 100, "p90": 1e30})
    x = sample_lengths(d, 1000, rng())
    assert x.min() >= 1 and x.max() == 10**9


def test_a_prefix_that_swallows_prompts_is_warned_of():
    # lognormal prompts median 2600 / p90 3400 (sigma = ln(3400/2600) / 1.2816 = 0.2094)
    # under a 2048-token prefix: P(X <= 2048) = Phi(ln(2048/2600) / 0.2094) = 12.7% become
    # 2049 tokens (whole prompts: the prefix and one token of their own)
    from simulator.workload import prefix_warning

    def cfg(median, p90, **over):
        return WorkloadConfig.model_validate({
            "seed": 0, "num_requests": 3000, "arrival": {"process": "poisson", "rate": 1.0},
            "prompt_tokens": {"dist": "lognormal", "median": median, "p90": p90},
            "output_tokens": {"dist": "fixed", "value": 4},
            "prefix": {"shared_tokens": 2048}, **over})

    expected = stats.norm.cdf(math.log(2048 / 2600) / (math.log(3400 / 2600) / 1.2816))
    said = prefix_warning(cfg(2600, 3400))
    share = int(re.search(r"or longer in (\d+)% of", said)[1]) / 100
    assert abs(share - expected) < 0.015
    assert "those prompts are 2049 tokens, the prefix and one of their own" in said
    assert prefix_warning(cfg(2800, 3300)) is None   # 0.7% below the prefix
    # sessions count new user tokens per turn, on top of the prefix: nothing is swallowed
    assert prefix_warning(cfg(100, 200, sessions={"turns": {"dist": "fixed", "value": 2}})) \
        is None


def test_a_prefix_that_swallows_trace_prompts_is_warned_of(tmp_path):
    # trace prompts of 100, 200 and 50 tokens under a 150-token prefix: 100 and 50 become
    # 151 tokens (the prefix and one of their own), 2 of the 3 rows
    from simulator.workload import prefix_warning
    (tmp_path / "t.csv").write_text("t,p,o\n0,100,10\n0.5,200,20\n1.0,50,5\n")

    def cfg(shared):
        return WorkloadConfig.model_validate({
            "trace": {"path": "t.csv", "format": "csv",
                      "columns": {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}},
            "prefix": {"shared_tokens": shared}})

    lengths = [sum(n for _, n in s.prompt) for s in build_workload(cfg(150), tmp_path)]
    assert lengths == [151, 200, 151]
    assert prefix_warning(cfg(150), tmp_path) == (
        "workload.prefix.shared_tokens (150) is as long as the whole prompt or longer in 67% "
        "of the trace's prompts (t.csv) (they count the prefix too): those prompts are 151 "
        "tokens, the prefix and one of their own (lower shared_tokens: a trace's lengths are "
        "data)")
    assert prefix_warning(cfg(49), tmp_path) is None


def test_counts_piled_onto_the_floor_of_one_are_warned_of():
    # normal mean 100, std 1000: P(X < 0.5) = Phi(-99.5 / 1000) = 46.0% of the outputs
    # become 1 token; lognormal median 2, p90 40: sigma = ln 20 / 1.2816 = 2.3376,
    # P(X < 0.5) = Phi(ln(0.25) / 2.3376) = Phi(-0.5930) = 27.7% of the prompts
    from simulator.workload import floor_warnings

    def cfg(prompt, output, **over):
        return WorkloadConfig.model_validate({
            "num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0},
            "prompt_tokens": prompt, "output_tokens": output, **over})

    said = floor_warnings(cfg({"dist": "lognormal", "median": 2, "p90": 40},
                              {"dist": "normal", "mean": 100, "std": 1000}))
    assert said == [
        "workload.prompt_tokens: 28% of its draws fall below 1 and are raised to 1 token, "
        "a spike the distribution written does not have (narrow it, or give min to make "
        "the floor explicit)",
        "workload.output_tokens: 46% of its draws fall below 1 and are raised to 1 token, "
        "a spike the distribution written does not have (narrow it, or give min to make "
        "the floor explicit)"]
    # the sample agrees: the share of draws clipped to 1
    d = DIST.validate_python({"dist": "normal", "mean": 100, "std": 1000})
    assert np.mean(sample_lengths(d, 100_000, rng()) == 1) == pytest.approx(0.460, abs=0.01)
    # a min below 1 leaves the floor at 1 (and the share raised to it): still said
    assert len(floor_warnings(cfg({"dist": "normal", "mean": 10, "std": 10, "min": 0.4},
                                  {"dist": "fixed", "value": 8}))) == 1
    # an explicit min says the floor is meant; mean 20, std 10: Phi(-1.95) = 2.6%, under 5%
    assert floor_warnings(cfg({"dist": "normal", "mean": 5, "std": 50, "min": 1},
                              {"dist": "normal", "mean": 20, "std": 10})) == []
    turns = floor_warnings(cfg({"dist": "fixed", "value": 8}, {"dist": "fixed", "value": 8},
                               sessions={"turns": {"dist": "normal", "mean": 2, "std": 3}}))
    assert turns == ["workload.sessions.turns: 31% of its draws fall below 1 and are raised "
                     "to 1 turn, a spike the distribution written does not have (narrow "
                     "it, or give min to make the floor explicit)"]   # Phi(-0.5) = 30.9%


def test_arrivals_that_do_not_offer_their_rate_are_warned_of():
    # Gamma gaps of shape k have CV 1/sqrt(k): at k = 1e-3 (CV 31.6) a few gaps hold nearly
    # all the time, so 200 arrivals span far from 200 / rate; the span is the run's own
    # last arrival, and its ratio to 200 / rate is the same at any rate (gaps scale 1/rate).
    from simulator.workload import arrival_warning

    def gamma(k, rate=4.0, n=200, **over):
        return cfg(num_requests=n, arrival={"process": "gamma", "rate": rate,
                                            "burstiness": k, **over})

    said = arrival_warning(gamma(1e-3))
    last_s = build_workload(gamma(1e-3))[-1].arrival_ns / NS
    span = float(re.search(r"drawn span (\S+) s against", said)[1])
    assert span == pytest.approx(last_s, rel=1e-3) and not 25 <= span <= 100
    assert "num_requests / rate = 50 s" in said and "coefficient of variation is 31.6" in said
    factor = re.search(r"offers (\S+) × its rate", said)[1]
    assert factor == f"{50 / last_s:.3g}"
    assert re.search(r"offers (\S+) × its rate", arrival_warning(gamma(1e-3, rate=400)))[1] \
        == factor
    assert "set normalize_duration: true" in said
    # rescaled to 200 / rate, the same draws still come in bursts: a few gaps hold the span
    bursts = arrival_warning(gamma(1e-3, normalize_duration=True))
    assert bursts.startswith(said.split(", so the run")[0] + "; normalize_duration stretches "
                             "them to 50 s, but a few gaps make up most of it")
    t = np.array([r.arrival_ns for r in build_workload(gamma(1e-3, normalize_duration=True))])
    gaps = np.sort(np.diff(t, prepend=0))[::-1]
    assert t[-1] == 50 * NS and gaps[:5].sum() > 0.9 * t[-1]
    assert arrival_warning(gamma(0.5, normalize_duration=True)) is None
    # shape 1e-10: every gap underflows to 0 s, and normalizing cannot spread them
    zero = arrival_warning(gamma(1e-10, normalize_duration=True))
    assert "span 0 s" in zero and zero.endswith(
        "every request at once (normalize_duration cannot stretch a span of 0 s: raise "
        "burstiness)")
    assert arrival_warning(gamma(1e-10)).endswith("every request at once (raise burstiness)")
    # Poisson, 3000 arrivals: the span is Gamma(3000)/rate, within 2x of 3000/rate
    assert arrival_warning(cfg(num_requests=3000)) is None
    assert arrival_warning(gamma(1e-3, n=9)) is None   # too few to judge


def test_a_closed_loop_with_more_users_than_requests_is_warned_of():
    # 20 requests among 1e8 users: users 0..19 send one each at 0 s, the rest never
    from simulator.workload import workload_warnings

    many = cfg(num_requests=20, arrival={"process": "closed_loop", "concurrency": 10**8})
    assert [s.after for s in build_workload(many)] == [None] * 20
    said = workload_warnings(many)
    assert said == ["workload.arrival.concurrency (100000000) is above num_requests "
                    "(20): only 20 users send, one request each, all at 0 s"]
    assert workload_warnings(cfg(num_requests=20, arrival={"process": "closed_loop",
                                                           "concurrency": 20})) == []
