"""Conversations: their steady load, the ramp before it, the stability test, and the end
of a conversation at a rejected turn.

The served cases use a constant 10 ms step and fixed lengths, so a turn's time on the
engine is known by hand: a 16-token prompt is prefilled in one step that yields the first
of 32 output tokens, then 31 decode steps: 32 steps, 0.32 s from its first step to its
last token. A conversation of two turns with a 1 s think time then lasts 0.32 + 1 + 0.32 =
1.64 s of engine time and thinking (waits for a step or a slot left out).
"""

import json
import math

import pandas as pd
import pytest

from simulator.cli import main
from simulator.executors import job_output
from simulator.policy.request import RequestSpec
from simulator.run import simulate
from simulator.scenario import scenario_from_dict
from simulator.session_ramp import RAMP, ramp_warning, session_ramp
from simulator.sweep import stability_label


def spec(rid, sid, after=None):
    return RequestSpec(request_id=rid, arrival_ns=0, prompt=((("user", rid), 8),),
                       max_tokens=4, session_id=sid, after=after)


def test_figures_of_a_hand_made_run():
    # Conversation 0 opens at 0 s: turns 0 (waits 0.5 s for a slot, ends 2 s) and 1 (ends
    # 10 s). Conversation 1 opens at 4 s: turn 2, rejected (no finish: it ends at its
    # arrival). Conversation 2 opens at 8 s: turn 3 ends at 12 s.
    specs = [spec(0, 0), spec(1, 0, after=0), spec(2, 1), spec(3, 2)]
    req = pd.DataFrame({"request_id": [0, 1, 2, 3],
                        "arrival_s": [0.0, 5.0, 4.0, 8.0],
                        "first_scheduled_s": [0.5, 5.0, math.nan, 8.0],
                        "finish_s": [2.0, 10.0, math.nan, 12.0]})
    got = session_ramp(specs, req)
    # lengths less waits: 10 − 0.5, 0, 4 → mean 13.5 / 3 = 4.5 s; W = 8 s < 2 × 4.5
    assert got["conversations"] == 3 and got["opening_s"] == 8.0
    assert got["conversation_s"] == pytest.approx(4.5)
    assert got["mean_turns"] == pytest.approx(4 / 3)
    assert got["steady_request_rate"] == pytest.approx(2 / 8 * 4 / 3)
    assert got["steady_state"] is False and got["stable"] is None
    # W = 2 × 4.5 s at 0.25 conversations/s: 2.25 + 1 conversations of 4/3 turns
    assert got["num_requests_needed"] == math.ceil((RAMP * 4.5 * 0.25 + 1) * 4 / 3)
    # single requests, one conversation, or all opening at once: nothing to say
    assert session_ramp([spec(0, None)], req.iloc[:1]) is None
    assert session_ramp(specs[:2], req.iloc[:2]) is None


#: convs(4.0, 8) as a scenario file, for the commands.
CONVERSATIONS_YAML = """model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_model_len: 2048, max_num_seqs: 4}
workload:
  num_requests: 8
  arrival: {process: constant, rate: 4}
  prompt_tokens: {dist: fixed, value: 16}
  output_tokens: {dist: fixed, value: 32}
  sessions: {turns: 2, think_time_s: 1}
"""


def convs(rate, n, slots=4):
    return scenario_from_dict({
        "name": "s", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 2048, "max_num_seqs": slots},
        "workload": {"seed": 0, "num_requests": n,
                     "arrival": {"process": "constant", "rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 32},
                     "sessions": {"turns": 2, "think_time_s": 1}}})


def test_a_load_the_engine_keeps_up_with_is_stable():
    # 4 conversations/s of 2 turns: 8 req/s of 0.32 s on 4 slots (12.5 req/s at most)
    r = simulate(convs(4.0, 400))
    s = r.summary["sessions"]
    assert s["conversations"] == 200 and s["mean_turns"] == 2
    assert s["opening_s"] == pytest.approx(199 / 4)
    assert s["steady_request_rate"] == pytest.approx(8.0)
    assert s["conversation_s"] == pytest.approx(1.64, abs=1e-6)
    assert s["steady_state"] is True and s["stable"] is True
    out = job_output(r)
    assert out["offered_rate"] == pytest.approx(8.0) and out["stable"] and out["steady"]
    assert ramp_warning(r.summary) is None


def test_an_overload_is_unstable_though_follow_ups_slow_their_own_arrivals():
    # 8 conversations/s: 16 req/s against 12.5: the turns queue for slots without end;
    # arrivals against finishes alone would pass (a follow-up waits for its answer).
    r = simulate(convs(8.0, 800))
    s = r.summary["sessions"]
    assert s["steady_request_rate"] == pytest.approx(16.0)
    assert s["steady_state"] is True and s["stable"] is False
    assert r.summary["ttft_ms"]["p99"] > 1000   # the queue it built
    out = job_output(r)
    assert out["stable"] is False and stability_label(out["stable"], 0, out["steady"]) \
        == "unstable"


def test_a_run_that_ends_in_its_ramp_is_said_so(tmp_path, capsys):
    # 4 conversations opening over 0.75 s, each lasting 1.64 s: never a sustained load
    r = simulate(convs(4.0, 8))
    s = r.summary["sessions"]
    assert s["opening_s"] == pytest.approx(0.75) and s["steady_state"] is False
    assert s["stable"] is None
    assert s["num_requests_needed"] == math.ceil((RAMP * 1.64 * 4 + 1) * 2) == 29
    out = job_output(r)
    assert out["steady"] is False
    assert stability_label(out["stable"], 0, out["steady"]) == "ramp-up only"
    assert stability_label(out["stable"], 2, out["steady"]) == "rejects requests"

    y = tmp_path / "c.yaml"
    y.write_text(CONVERSATIONS_YAML)
    assert main(["run", str(y), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert ("servesim: warning: workload.sessions: the conversations opened over 0.75 s and "
            "last 1.64 s each on average") in err
    assert "(about 8 req/s: the conversation rate × 2 turns)" in err
    assert "raise workload.num_requests to at least 29 " in err
    # the report says it too, and its diagnosis claims no headroom for a load never reached
    md = (tmp_path / "o" / "report.md").read_text()
    assert "**Warning:** workload.sessions: the conversations opened over 0.75 s" in md
    diag = json.loads((tmp_path / "o" / "diagnosis.json").read_text())
    assert diag["binding"] == "session_ramp"
    assert diag["findings"][0]["knob"] == "raise workload.num_requests to at least 29"
    assert diag["counterfactual"] is None


def test_an_overload_shows_in_the_ramp_already():
    # 8 conversations/s (16 req/s against 12.5) opening over 2.4 s, each 1.64 s long: too
    # short to reach the sustained load, yet the queue grows while they open
    r = simulate(convs(8.0, 40))
    s = r.summary["sessions"]
    assert s["opening_s"] == pytest.approx(19 / 8) and s["steady_state"] is False
    assert s["stable"] is False
    out = job_output(r)
    assert stability_label(out["stable"], 0, out["steady"]) == "unstable"
    assert ramp_warning(r.summary).startswith(
        "workload.sessions: requests queued more and more while the conversations opened "
        "(2.375 s)")
    assert "this rate overloads the engine" in ramp_warning(r.summary)


def test_a_closed_loop_of_conversations_has_no_ramp():
    sc = scenario_from_dict({
        "name": "s", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 2048},
        "workload": {"num_requests": 40,
                     "arrival": {"process": "closed_loop", "concurrency": 4},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "fixed", "value": 8},
                     "sessions": {"turns": 2, "think_time_s": 0}}})
    assert "sessions" not in simulate(sc).summary


def rejecting(arrival, n, turns):
    # 100 new tokens per turn, 50 output tokens, max_model_len 256: turn 1 has a 100-token
    # prompt; turn 2 quotes it and its answer, 250 tokens, and is cut to 6 output tokens;
    # turn 3, 400 tokens, is rejected.
    return scenario_from_dict({
        "name": "r", "model": "llama-test", "hardware": {"step_time": {"constant_s": 0.01}},
        "engine": {"max_model_len": 256},
        "workload": {"seed": 0, "num_requests": n, "arrival": arrival,
                     "prompt_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": 50},
                     "sessions": {"turns": turns, "think_time_s": 1}}})


def test_a_rejected_turn_ends_its_conversation():
    # 3 conversations of 5 turns: each serves 2, is refused at its 3rd, never sends 4 and 5
    r = simulate(rejecting({"process": "constant", "rate": 1}, 15, 5))
    s = r.summary
    assert (s["completed"], s["rejected"], s["turns_not_sent"], s["capped"]) == (6, 3, 6, 3)
    assert len(r.requests) == 9
    assert sorted(r.requests["prompt_tokens"]) == [100] * 3 + [250] * 3 + [400] * 3


def test_a_closed_loop_user_starts_a_new_conversation_after_a_rejection():
    # one user, conversations of 4 turns: each serves 2, is refused at its 3rd (its 4th is
    # not sent), and the next conversation opens a think time after the refusal
    r = simulate(rejecting({"process": "closed_loop", "concurrency": 1, "think_time_s": 1},
                           12, 4))
    s = r.summary
    assert (s["completed"], s["rejected"], s["turns_not_sent"]) == (6, 3, 3)
    req = r.requests.sort_values("arrival_s")
    rejected = req[req["finish_reason"] == "rejected"]["arrival_s"].to_list()
    firsts = req[req["prompt_tokens"] == 100]["arrival_s"].to_list()
    assert firsts[1:] == pytest.approx([t + 1 for t in rejected[:2]])


def test_a_sweep_labels_a_ramp_and_gives_the_conversations_load(tmp_path, capsys):
    y = tmp_path / "c.yaml"
    y.write_text(CONVERSATIONS_YAML)
    assert main(["sweep", str(y), "--set", "workload.num_requests=8,400", "--executor",
                 "serial", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert table["stability"].tolist() == ["ramp-up only", "stable"]
    # both offer 4 conversations/s of 2 turns
    assert table["offered_rate"].tolist() == pytest.approx([8.0, 8.0])
    assert "ramp-up: the conversations (open-loop sessions) ended before" in out
    assert "offered req/s (conversations): the request rate the conversations build up" in out
