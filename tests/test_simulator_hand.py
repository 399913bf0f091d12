"""A hand-computed timeline, end to end through the CLI (trace → simulate → requests.csv).

Step time 10 ms, max_num_batched_tokens 16, prefix caching off. Worked out on paper:

  step 1 [0,10]   A prefill 10 tok → A token 1 @10          (B arrives @5 mid-step)
  step 2 [10,20]  A decode; B chunk 15/20 → A token 2 @20
  step 3 [20,30]  A decode → A token 3, A done @30; B last 5 → B token 1 @30 (C arrives @25)
  step 4 [30,40]  B decode → B token 2, B done @40; C 4 tok → C done @40;
                  D arrives @30 exactly and is seen by the step starting @30 → D done @40
"""

import json

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main

EXPECTED = {  # id: (arrival, first_scheduled, first_token, finish) in ms, output tokens
    0: ((0, 0, 10, 30), 3),
    1: ((5, 10, 30, 40), 2),
    2: ((25, 30, 40, 40), 1),
    3: ((30, 30, 40, 40), 1),
}


@pytest.fixture
def scenario(tmp_path):
    (tmp_path / "trace.csv").write_text(
        "t_ms,prompt,output\n0,10,3\n5,20,2\n25,4,1\n30,2,1\n")
    (tmp_path / "s.yaml").write_text("""
name: hand
model: llama-test
hardware: {step_time: {constant_s: 0.01}}
engine: {max_num_seqs: 8, max_num_batched_tokens: 16, enable_prefix_caching: false,
         max_model_len: 256}
workload:
  trace: {path: trace.csv, format: csv, arrival_unit: ms,
          columns: {arrival: t_ms, prompt_tokens: prompt, output_tokens: output}}
slo: {ttft_ms: {p99: 20}}
""")
    return tmp_path


def test_hand_timeline_in_requests_csv(scenario, capsys):
    out = scenario / "out"
    assert main(["run", str(scenario / "s.yaml"), "--out", str(out), "--quiet"]) == 0
    df = pd.read_csv(out / "requests.csv").set_index("request_id")
    for rid, ((arr, sched, first, fin), n_out) in EXPECTED.items():
        row = df.loc[rid]
        got = [row.arrival_s, row.first_scheduled_s, row.first_token_s, row.finish_s]
        np.testing.assert_allclose(got, [arr / 1e3, sched / 1e3, first / 1e3, fin / 1e3],
                                   atol=1e-9)
        assert row.output_tokens == n_out
        assert row.ttft_ms == pytest.approx(first - arr)
        assert row.e2el_ms == pytest.approx(fin - arr)
    assert df.loc[0].tpot_ms == pytest.approx(10.0)   # (30 - 10) / (3 - 1)
    assert df.loc[1].tpot_ms == pytest.approx(10.0)   # (40 - 30) / (2 - 1)
    assert np.isnan(df.loc[2].tpot_ms)                # one output token: no TPOT
    s = json.loads((out / "summary.json").read_text())
    assert s["itl_tokens"] == 3 and s["itl_ms"]["p50"] == pytest.approx(10.0)
    # TTFTs 10, 25, 15, 10 ms: only B misses the 20 ms SLO; goodput = 3 / 40 ms.
    assert s["good_requests"] == 3
    assert s["goodput"] == pytest.approx(3 / 0.040)
    assert s["slo_met"] is False
    assert "report:" in capsys.readouterr().out
