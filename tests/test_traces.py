"""Trace readers: real public traces (when present) and small malformed files."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from simulator.errors import InputError
from simulator.traces import TraceConfig, read_trace, ties_warning
from simulator.workload import WorkloadConfig, build_workload

TRACES = Path(__file__).parents[2] / "shared" / "traces"
AZURE_CONV = TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
VIDUR_CONV = TRACES / "vidur" / "splitwise_conv.csv"
VIDUR_COLUMNS = {"arrival": "arrived_at", "prompt_tokens": "num_prefill_tokens",
                 "output_tokens": "num_decode_tokens"}


def need(path):
    if not path.is_file():
        pytest.skip(f"{path} not present")
    return path


def trace(**kw):
    return TraceConfig.model_validate(kw)


# -- real traces -----------------------------------------------------------------------

@pytest.mark.parametrize("path", [AZURE_CONV, AZURE_CODE])
def test_azure_counts_times_and_lengths_preserved_exactly(path):
    need(path)
    df = pd.read_csv(path)
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601").dt.as_unit("ns")
    expected = (ts - ts.iloc[0]).dt.total_seconds()  # float s, for a second opinion
    expected_ns = (ts - ts.iloc[0]).to_numpy().astype("timedelta64[ns]").astype(np.int64)
    specs = read_trace(trace(path=str(path), format="azure"))
    assert len(specs) == len(df)
    got = np.array([s.arrival_ns for s in specs])
    assert np.array_equal(got, expected_ns)
    assert np.allclose(got / 1e9, expected.to_numpy(), atol=1e-6)
    # sub-second precision kept: the first gap of the conv trace is 4.3145790 s
    if path == AZURE_CONV:
        assert specs[1].arrival_ns == 4_314_579_000
    assert [s.prompt_tokens for s in specs] == df["ContextTokens"].tolist()
    assert [s.max_tokens for s in specs] == df["GeneratedTokens"].tolist()
    assert [s.request_id for s in specs] == list(range(len(df)))
    assert len({s.prompt[0][0] for s in specs}) == len(df)


def test_vidur_csv_agrees_with_azure():
    azure = read_trace(trace(path=str(need(AZURE_CONV)), format="azure"))
    vidur = read_trace(trace(path=str(need(VIDUR_CONV)), format="csv", columns=VIDUR_COLUMNS))
    assert len(azure) == len(vidur)
    a = np.array([s.arrival_ns for s in azure])
    v = np.array([s.arrival_ns for s in vidur])
    assert np.abs(a - v).max() <= 1000  # vidur keeps 6 decimals of seconds
    assert [s.prompt_tokens for s in azure] == [s.prompt_tokens for s in vidur]


def test_mooncake_segments_and_times():
    path = need(MOONCAKE)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    specs = read_trace(trace(path=str(path), format="mooncake"))
    assert len(specs) == len(rows) == 12031
    order = np.argsort([r["timestamp"] for r in rows], kind="stable")
    for spec, i in zip(specs, order):
        row = rows[i]
        assert spec.arrival_ns == (row["timestamp"] - rows[0]["timestamp"]) * 1_000_000
        assert spec.prompt_tokens == row["input_length"]
        assert sum(n for _, n in spec.prompt) == row["input_length"]
        assert [cid for cid, _ in spec.prompt] == [("mc", h) for h in row["hash_ids"]]
        assert all(n == 512 for _, n in spec.prompt[:-1]) and 1 <= spec.prompt[-1][1] <= 512
        assert spec.max_tokens == row["output_length"]


def test_num_requests_time_scale_and_window():
    path = str(need(AZURE_CONV))
    full = read_trace(trace(path=path, format="azure"))
    assert read_trace(trace(path=path, format="azure"), num_requests=10) == full[:10]
    half = read_trace(trace(path=path, format="azure", time_scale=0.5))
    assert [s.arrival_ns for s in half] == [round(s.arrival_ns * 0.5) for s in full]
    win = read_trace(trace(path=path, format="azure", window_s=[60, 120]))
    kept = [s for s in full if 60e9 <= s.arrival_ns < 120e9]
    assert len(win) == len(kept) > 0
    assert [s.arrival_ns for s in win] == [s.arrival_ns - 60_000_000_000 for s in kept]
    assert [s.prompt_tokens for s in win] == [s.prompt_tokens for s in kept]
    assert [s.request_id for s in win] == list(range(len(win)))


def test_spread_ties_spaces_each_timestamp_group_over_one_step(tmp_path):
    # Timestamps in ms: three at 0, one at 3000, two at 6000, then a quiet gap, four at
    # 60000 — a step of 3000 ms (median of the gaps 3000, 3000, 54000). A group spreads
    # over min(step, gap to the next): the last one, with no next, over the step.
    f = tmp_path / "t.csv"
    f.write_text("t,p,o\n" + "".join(f"{t},10,5\n" for t in
                                      (0, 0, 0, 3000, 6000, 6000, 60000, 60000, 60000, 60000)))
    cols = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}
    base = dict(path=str(f), format="csv", columns=cols, arrival_unit="ms")
    got = [s.arrival_ns for s in read_trace(trace(**base, spread_ties=True))]
    ms = [0, 1000, 2000, 3000, 6000, 7500, 60000, 60750, 61500, 62250]
    assert got == [m * 1_000_000 for m in ms]
    # a column the file lacks: the header's columns and the key that names them
    with pytest.raises(InputError, match=r"t\.csv:1: missing column 'q' \(columns are 't', "
                                         r"'p', 'o'; workload.trace.columns names them\)$"):
        read_trace(trace(**{**base, "columns": {**cols, "prompt_tokens": "q"}}))
    # spread before time_scale: the same instants, halved
    half = [s.arrival_ns for s in read_trace(trace(**base, spread_ties=True, time_scale=0.5))]
    assert half == [m * 500_000 for m in ms]
    # off by default: the groups arrive at once, and a run says so
    assert [s.arrival_ns for s in read_trace(trace(**base))][:3] == [0, 0, 0]
    said = ties_warning(trace(**base))
    assert said.startswith("workload.trace: 60% of the arrivals share their timestamp with "
                           "another (up to 4 at one instant; timestamps come in steps of 3 s")
    assert "spread_ties: true" in said
    assert ties_warning(trace(**base, spread_ties=True)) is None
    # one tie in eleven requests (9% share their timestamp): no bursts to speak of
    g = tmp_path / "g.csv"
    g.write_text("t,p,o\n" + "".join(f"{t},10,5\n" for t in (0, 0, *range(1, 10))))
    assert ties_warning(trace(**{**base, "path": str(g)})) is None
    # all at one instant: no step to spread over, spread_ties or not
    h = tmp_path / "h.csv"
    h.write_text("t,p,o\n" + "5,10,5\n" * 3)
    for spread in (False, True):
        one = trace(**{**base, "path": str(h)}, spread_ties=spread)
        assert [s.arrival_ns for s in read_trace(one)] == [0, 0, 0]
        assert ties_warning(one) == (
            "workload.trace: all 3 arrivals share one timestamp and replay as one burst "
            "(spread_ties spreads the requests of a timestamp over the trace's step between "
            "timestamps, and it has one timestamp)")


def test_trace_workload_with_prefix_and_relative_path():
    need(AZURE_CONV)
    cfg = WorkloadConfig.model_validate({
        "num_requests": 100, "prefix": {"shared_tokens": 256, "groups": 5},
        "trace": {"path": "azure2023/AzureLLMInferenceTrace_conv.csv", "format": "azure"}})
    specs = build_workload(cfg, base_dir=TRACES)
    plain = read_trace(cfg.trace, base_dir=TRACES, num_requests=100)
    assert len(specs) == 100
    for s, p in zip(specs, plain):
        assert s.arrival_ns == p.arrival_ns and s.max_tokens == p.max_tokens
        assert s.prompt[0][0][0] == "prefix" and s.prompt[0][1] == 256
        assert s.prompt_tokens == max(p.prompt_tokens, 257)


# -- generic formats -------------------------------------------------------------------

def test_generic_csv_units_ties_and_iso(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("ts,in,out\n1000,20,4\n1000,30,5\n2500,10,3\n")
    specs = read_trace(trace(path=str(f), format="csv", arrival_unit="ms",
                             columns={"arrival": "ts", "prompt_tokens": "in",
                                      "output_tokens": "out"}))
    # re-based to the first arrival; equal timestamps keep file order
    assert [(s.request_id, s.arrival_ns, s.prompt_tokens, s.max_tokens) for s in specs] == [
        (0, 0, 20, 4), (1, 0, 30, 5), (2, 1_500_000_000, 10, 3)]
    f.write_text("ts,in,out\n2024-01-01T00:00:00.5,10,3\n2024-01-01T00:00:02.25,20,4\n")
    specs = read_trace(trace(path=str(f), format="csv", arrival_unit="iso",
                             columns={"arrival": "ts", "prompt_tokens": "in",
                                      "output_tokens": "out"}))
    assert [s.arrival_ns for s in specs] == [0, 1_750_000_000]



def test_iso_timestamps_in_several_zones_are_one_clock(tmp_path):
    # zones that differ are one clock in UTC (pandas alone refuses to mix them)
    f = tmp_path / "t.csv"
    cols = {"arrival": "ts", "prompt_tokens": "in", "output_tokens": "out"}
    # 23:00:00 UTC, then 23:00:01.5 UTC written in another zone, then Z
    f.write_text("ts,in,out\n2024-01-01T01:00:00+02:00,10,3\n"
                 "2024-01-01T00:00:01.5+01:00,20,4\n2023-12-31T23:00:03Z,5,1\n")
    specs = read_trace(trace(path=str(f), format="csv", arrival_unit="iso", columns=cols))
    assert [s.arrival_ns for s in specs] == [0, 1_500_000_000, 3_000_000_000]
    # with and without a zone: not one known clock, named at the first that differs
    for rows, line, what in (("2024-01-01T00:00:00,1,1\n2024-01-01T00:00:01Z,1,1\n", 3,
                              "'2024-01-01T00:00:01Z' has a time zone and the one on line 2 "
                              "has none"),
                             ("2024-01-01T00:00:00Z,1,1\n2024-01-01T00:00:01+00:00,1,1\n"
                              "2024-01-01T00:00:02,1,1\n", 4,
                              "'2024-01-01T00:00:02' has no time zone and the one on line 2 "
                              "has one")):
        f.write_text("ts,in,out\n" + rows)
        with pytest.raises(InputError) as e:
            read_trace(trace(path=str(f), format="csv", arrival_unit="iso", columns=cols))
        assert str(e.value) == (f"{f}:{line}: ts: {what}: give every timestamp a zone (Z, "
                                f"+02:00) or none")
    # a row that is no timestamp at all is said so, not blamed on its zone
    f.write_text("ts,in,out\n2024-01-01T00:00:00Z,1,1\nsoon,1,1\n2024-01-01T00:00:02,1,1\n")
    with pytest.raises(InputError, match=rf"^{f}:3: ts: not a timestamp: 'soon'"):
        read_trace(trace(path=str(f), format="csv", arrival_unit="iso", columns=cols))

COLS = {"arrival": "ts", "prompt_tokens": "in", "output_tokens": "out"}


@pytest.mark.parametrize("fmt, unit, text, line, earlier", [
    # the blank line 3 still counts: the error names line 5, the row before line 4
    ("csv", "s", "ts,in,out\n1.0,10,3\n\n2.0,20,4\n1.5,30,5\n3.0,40,6\n", 5, "'1.5'"),
    ("csv", "iso", "ts,in,out\n2024-01-01T00:00:01,10,3\n2024-01-01T00:00:00.9,20,4\n",
     3, "'2024-01-01T00:00:00.9'"),
    ("jsonl", "ms", '{"ts": 5, "in": 1, "out": 1}\n\n{"ts": 4, "in": 1, "out": 1}\n', 3, "'4'"),
])
def test_out_of_order_arrivals_name_the_first_late_line(tmp_path, fmt, unit, text, line,
                                                         earlier):
    f = tmp_path / f"t.{fmt}"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        read_trace(trace(path=str(f), format=fmt, arrival_unit=unit, columns=COLS))
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}: ts: {earlier} is earlier than ")
    assert "\n" not in msg and "arrival order" in msg


def test_an_arrival_beyond_the_clock_names_its_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("ts,in,out\n0,10,3\n1e300,20,4\n")
    with pytest.raises(InputError, match=rf"^{f}:3: ts: '1e300' ms is beyond the 4\.6e9 s a "
                                         r"run can hold$"):
        read_trace(trace(path=str(f), format="csv", arrival_unit="ms", columns=COLS))


def test_out_of_order_mooncake_and_azure(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"timestamp": 10, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                 '{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [2]}\n')
    with pytest.raises(InputError, match=rf"^{m}:2: timestamp: '9' is earlier than '10' "
                                         r"on line 1 "):
        read_trace(trace(path=str(m), format="mooncake"))
    a = tmp_path / "a.csv"
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,10,2\n2023-11-16 18:15:46.6805899,10,2\n")
    with pytest.raises(InputError, match=rf"^{a}:3: TIMESTAMP: .* on line 2 "):
        read_trace(trace(path=str(a), format="azure"))


def test_generic_jsonl(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"t": 0.5, "p": 7, "o": 2}\n\n{"t": 1.25, "p": 9, "o": 1}\n')
    specs = read_trace(trace(path=str(f), format="jsonl",
                             columns={"arrival": "t", "prompt_tokens": "p",
                                      "output_tokens": "o"}))
    assert [(s.arrival_ns, s.prompt_tokens, s.max_tokens) for s in specs] == [
        (0, 7, 2), (750_000_000, 9, 1)]
    # JSON has numbers: one written as a string is refused, as the strict scenario does;
    # ISO timestamps are strings
    f.write_text('{"t": 0.5, "p": 7, "o": 2}\n{"t": 1.25, "p": "9", "o": 1}\n')
    with pytest.raises(InputError, match=rf'^{f}:2: p: expected a number, got "9"$'):
        read_trace(trace(path=str(f), format="jsonl",
                         columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}))
    # a number too long for Python's int(), and one too large for the clock: one line each
    f.write_text('{"t": 0.5, "p": 7, "o": 2}\n{"t": 1.25, "p": ' + "9" * 5000 + ', "o": 1}\n')
    with pytest.raises(InputError, match=rf"^{f}:2: a number with more digits than any"):
        read_trace(trace(path=str(f), format="jsonl",
                         columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}))
    f.write_text('{"t": 0.5, "p": 7, "o": 2}\n{"t": 1e300, "p": 9, "o": 1}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no overflow warning printed before the error
        with pytest.raises(InputError, match=rf"^{f}:2: t: '1e\+300' s is beyond the 4\.6e9 s"):
            read_trace(trace(path=str(f), format="jsonl",
                             columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}))
    f.write_text('{"t": "2024-01-01T00:00:01", "p": 7, "o": 2}\n'
                 '{"t": "2024-01-01T00:00:02.5", "p": 9, "o": 1}\n')
    specs = read_trace(trace(path=str(f), format="jsonl", arrival_unit="iso",
                             columns={"arrival": "t", "prompt_tokens": "p",
                                      "output_tokens": "o"}))
    assert [s.arrival_ns for s in specs] == [0, 1_500_000_000]


def test_azure_keeps_sub_microsecond_digits(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.0000000,3,1\n2023-11-16 18:15:46.0000001,3,1\n"
                 "2023-11-16 18:15:47.9999999,3,1\n")
    specs = read_trace(trace(path=str(f), format="azure"))
    assert [s.arrival_ns for s in specs] == [0, 100, 1_999_999_900]


# -- malformed input -------------------------------------------------------------------

AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK_ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize("body, match", [
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,abc,5\n", r":3: ContextTokens: not a number"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,1e400,5\n",
     r":3: ContextTokens: not a finite number: '1e400'"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,1\xe9,5\n",   # written as Latin-1 below
     r":3: not UTF-8 text \(byte 0xe9 at column 24; save the file as UTF-8\)$"),
    (AZ_HEADER + OK_ROW + OK_ROW + "2023-11-16 18:15:47.0,-4,5\n",
     r":4: ContextTokens: -4 is below 1 \(a length must be >= 1\)$"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,10\n", r":3: GeneratedTokens: missing"),
    (AZ_HEADER + OK_ROW + "yesterday,10,5\n", r":3: TIMESTAMP: not a timestamp"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,10,0\n",
     r":3: GeneratedTokens: 0 is below 1 \(a length must be >= 1\)$"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,10.5,3\n", r":3: ContextTokens: not an int"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,1,2,3\n", r":3: expected 3 fields, saw 4"),
    # on the first row pandas would take the surplus field as an index
    (AZ_HEADER + "2023-11-16 18:15:46.6805900,100,10,5\n", r":2: expected 3 fields, saw 4$"),
    (AZ_HEADER + OK_ROW + "2023-11-16 18:15:47.0,10,99999999999999999999\n",
     r":3: GeneratedTokens: 99999999999999999999 is above 1e\+09 \(a count of tokens\)$"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n" + OK_ROW,
     r":1: column 'ContextTokens' appears twice in the header$"),
    (AZ_HEADER + OK_ROW + "\n2023-11-16 18:15:47.0,x,2\n", r":4: ContextTokens"),
    # a blank line is skipped, a row of empty fields is refused
    (AZ_HEADER + OK_ROW + "\n,,\n" + OK_ROW, r":4: every field is empty \(give the row's "
                                              r"values, or leave the line blank\)$"),
    # a line of spaces or a tab is blank too; fields of spaces are empty fields
    (AZ_HEADER + OK_ROW + "   \n\t\n , ,  \n" + OK_ROW, r":5: every field is empty"),
    ("TIMESTAMP,Context,GeneratedTokens\n" + OK_ROW,
     r":1: missing column 'ContextTokens' \(columns are 'TIMESTAMP', 'Context', "
     r"'GeneratedTokens'; workload.trace.format azure reads TIMESTAMP, ContextTokens, "
     r"GeneratedTokens\)$"),
    ("", r":1: empty file"),
    (AZ_HEADER, r":2: no requests"),
    # a quote never closed: named at the line its row starts on (pandas counts rows from 0)
    (AZ_HEADER + OK_ROW + OK_ROW + '2023-11-16 18:15:47.0,"10,5\n' + OK_ROW,
     r":4: a quoted field that starts on this row is never closed"),
])
def test_bad_azure_rows_name_file_and_line(tmp_path, body, match):
    f = tmp_path / "bad.csv"
    f.write_text(body, encoding="latin-1")   # UTF-8 for every row but the é one
    with pytest.raises(InputError, match=r"bad\.csv" + match):
        read_trace(trace(path=str(f), format="azure"))


def test_a_trace_error_names_the_file_as_typed_from_the_current_folder(tmp_path, monkeypatch):
    # a path given on the command line is made absolute (relative to the shell's folder),
    # yet the error names it as typed: data/bad.csv:2 for `--set workload.trace.path=...`
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bad.csv").write_text(AZ_HEADER + "2023-11-16 18:15:46.0,x,2\n")
    monkeypatch.chdir(tmp_path)
    for path in (tmp_path / "data" / "bad.csv", "data/bad.csv"):
        with pytest.raises(InputError) as e:
            read_trace(trace(path=str(path), format="azure"))
        assert str(e.value).startswith("data/bad.csv:2: ContextTokens")
    elsewhere = tmp_path.parent   # outside the current folder: the path as given
    with pytest.raises(InputError) as e:
        read_trace(trace(path=str(tmp_path / "data" / "bad.csv"), format="azure"),
                   base_dir=elsewhere)
    assert str(e.value).startswith("data/bad.csv:2:")
    monkeypatch.chdir(elsewhere)
    with pytest.raises(InputError) as e:
        read_trace(trace(path=str(tmp_path / "data" / "bad.csv"), format="azure"))
    assert str(e.value).startswith(f"{tmp_path.name}/data/bad.csv:2:")


def mc(ts, n, out, ids):
    return json.dumps({"timestamp": ts, "input_length": n, "output_length": out,
                       "hash_ids": ids}) + "\n"


@pytest.mark.parametrize("body, match", [
    (mc(0, 600, 5, [0, 1]) + mc(0, 600, 5, [0]), r":2: hash_ids has 1 ids but input_length "
                                                 r"600 needs ceil"),
    # a line cut short: its end is named (json reports the newline as column 1 of line 2)
    (mc(0, 600, 5, [0, 1]) + '{"timestamp": 1, "input_length": 5\n',
     r":2: bad JSON \(Expecting ',' delimiter at the end of the line: is it cut short\?; "
     r"workload.trace.format mooncake reads one JSON object per line\)$"),
    # a CSV file given as mooncake: the format that wanted JSON lines is named
    ("t,p,o\n0,1,2\n", r":1: bad JSON \(Expecting value at column 1; workload.trace.format "
                        r"mooncake reads one JSON object per line\)$"),
    (mc(0, 600, 5, [0, 1]) + '{"timestamp": 1, "input_length" 5}\n',
     r":2: bad JSON \(Expecting ':' delimiter at column 33; workload.trace.format mooncake "
     r"reads one JSON object per line\)$"),
    (mc(0, 600, 5, [0, 1]) + '{"timestamp": 1, "input_length": 5, "hash_ids": [0]}\n',
     r":2: missing key 'output_length'"),
    (mc(0, 600, 5, [0, 1]) + mc("soon", 10, 5, [0]), r':2: timestamp: expected a number, '
                                                      r'got "soon"'),
    (mc(0, 600, 5, [0, 1]) + mc(-3, 10, 5, [0]),
     r":2: timestamp: -3 is below 0 \(an arrival time must be >= 0\)$"),
    (mc(0, 600, 5, [0, 1]) + mc(1, 10, 5, "abc"), r":2: hash_ids: expected a list"),
    (mc(0, 600, 5, [0, 1]) + "[1, 2]\n", r":2: expected a JSON object"),
    # json keeps the last of two equal keys silently; a scenario refuses them, so does this
    (mc(0, 600, 5, [0, 1]) + mc(1, 10, 5, [0])[:-2] + ', "timestamp": 9}\n',
     r":2: key 'timestamp' given twice in one object$"),
    (mc(0, 600, 5, [0, 1]) + mc(1, 10, 5, [0]).replace('"timestamp": 1', '"timestamp": 1e400'),
     r":2: timestamp: expected a finite number, got inf \(JSON's NaN or Infinity, or a number "
     r"past 1\.8e308\)$"),
    (mc(0, 600, 5, [0, 1]) + mc(1, 10, 5, [0]).replace("10", "NaN"),
     r":2: input_length: expected a finite number, got nan"),
    ("\n", r":1: empty file"),
])
def test_bad_mooncake_rows_name_file_and_line(tmp_path, body, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(InputError, match=r"bad\.jsonl" + match):
        read_trace(trace(path=str(f), format="mooncake"))


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path):
    # some Windows editors start UTF-8 files with U+FEFF; CSV (pandas) and JSONL read alike
    f = tmp_path / "m.jsonl"
    f.write_text("\ufeff" + mc(0, 16, 5, [7]) + mc(2, 16, 5, [7]), encoding="utf-8")
    assert [r.arrival_ns for r in read_trace(trace(path=str(f), format="mooncake"))] \
        == [0, 2_000_000]


def test_mooncake_last_segment_length(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(mc(0, 1025, 5, [7, 8, 9]) + mc(3000, 512, 5, [7]))
    a, b = read_trace(trace(path=str(f), format="mooncake"))
    assert a.prompt == ((("mc", 7), 512), (("mc", 8), 512), (("mc", 9), 1))
    assert b.prompt == ((("mc", 7), 512),) and b.arrival_ns == 3_000_000_000


def test_huge_window_end_keeps_all_and_huge_time_scale_is_refused(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(AZ_HEADER + OK_ROW + "2023-11-16 18:15:50.6805900,10,5\n")
    whole = read_trace(trace(path=str(f), format="azure"))
    wide = read_trace(trace(path=str(f), format="azure", window_s=[0, 1e308]))
    assert [r.arrival_ns for r in wide] == [r.arrival_ns for r in whole] == [0, 4 * 10 ** 9]
    # the second arrival is 4 s after the first: x 1e10 is 4e10 s > 2^62 ns (4.6e9 s)
    with pytest.raises(InputError, match=r"workload\.trace\.time_scale: 1e\+10 scales the "
                                         r"last arrival .* beyond 4\.6e9 s"):
        read_trace(trace(path=str(f), format="azure", time_scale=1e10))


def test_missing_file_and_empty_window(tmp_path):
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        read_trace(trace(path="nope.csv", format="azure"), base_dir=tmp_path)
    with pytest.raises(InputError, match=r"is a folder, not a file"):
        read_trace(trace(path=".", format="azure"), base_dir=tmp_path)
    with pytest.raises(InputError, match=r"path: /dev/null: not a regular file$"):   # exists
        read_trace(trace(path="/dev/null", format="azure"), base_dir=tmp_path)
    with pytest.raises(InputError, match=r"path: .*a{20}: name too long for the file system$"):
        read_trace(trace(path="a" * 300, format="azure"), base_dir=tmp_path)
    f = tmp_path / "t.csv"
    f.write_text(AZ_HEADER + OK_ROW + "2023-11-16 18:15:50.6805900,10,5\n")
    with pytest.raises(InputError, match=r"workload\.trace\.window_s: \[10, 20\) keeps no"):
        read_trace(trace(path=str(f), format="azure", window_s=[10, 20]))


@pytest.mark.parametrize("kw, match", [
    ({"format": "csv"}, "columns is required"),
    ({"format": "azure", "columns": VIDUR_COLUMNS}, "columns is only allowed"),
    ({"format": "mooncake", "arrival_unit": "s"}, "arrival_unit is only allowed"),
    ({"format": "azure", "window_s": [5, 1]}, "window_s"),
    ({"format": "azure", "time_scale": 0}, "time_scale"),
    ({"format": "parquet"}, "format"),
    # strict: a string or a boolean is not a number
    ({"format": "azure", "window_s": ["0", 60]}, "window_s.0"),
    ({"format": "azure", "window_s": [True, 60]}, "window_s.0"),
    ({"format": "azure", "time_scale": "1"}, "time_scale"),
    # infinities: arrivals would become NaN casts (scale) or an int overflow (window)
    ({"format": "azure", "time_scale": float("inf")}, "time_scale"),
    ({"format": "azure", "window_s": [0, float("inf")]}, "finite numbers of seconds"),
    ({"format": "azure", "window_s": [float("-inf"), 5]}, "finite numbers of seconds"),
])
def test_bad_trace_config(kw, match):
    with pytest.raises(ValidationError, match=match):
        TraceConfig.model_validate({"path": "x", **kw})
    # the same keys with proper values (a YAML list for the window) are accepted
    assert TraceConfig.model_validate({"path": "x", "format": "azure", "window_s": [0, 60],
                                       "time_scale": 1}).window_s == (0, 60)


def test_prefix_not_allowed_with_mooncake():
    with pytest.raises(ValidationError, match="prefix not allowed with a mooncake"):
        WorkloadConfig.model_validate({"prefix": {"shared_tokens": 10},
                                       "trace": {"path": "x", "format": "mooncake"}})


def _window_error(tmp_path, window) -> str:
    """The one-line error of a scenario whose trace has ``window_s: <window>`` (line 8)."""
    from simulator.scenario import load_scenario

    y = tmp_path / "t.yaml"
    y.write_text("name: t\nmodel: llama-test\nhardware: {step_time: {constant_s: 0.01}}\n"
                 f"workload:\n  trace:\n    path: x.csv\n    format: azure\n"
                 f"    window_s: {window}\n")
    with pytest.raises(InputError) as e:
        load_scenario(y)
    return str(e.value)


@pytest.mark.parametrize("window", ["[5]", "[1, 2, 3]", "5"])
def test_a_window_that_is_not_a_pair_says_what_it_must_be(tmp_path, window):
    assert _window_error(tmp_path, window) == (
        f"t.yaml:8: workload.trace.window_s: must be a [start, end] pair of seconds (arrivals "
        f"kept in [start, end)), got {window}")


@pytest.mark.parametrize("window", ["[5, 2]", "[3, 3]", "[-1, 2.5]"])
def test_a_window_out_of_order_names_window_s_and_its_line(tmp_path, window):
    assert _window_error(tmp_path, window) == (
        f"t.yaml:8: workload.trace.window_s: must be [start, end) with 0 <= start < end, "
        f"got {window}")


@pytest.mark.parametrize("cols, said", [
    ({"arrival": "t", "prompt_tokens": "t", "output_tokens": "o"},
     "arrival and prompt_tokens both name column 't'"),
    ({"arrival": "t", "prompt_tokens": "p", "output_tokens": "p"},
     "prompt_tokens and output_tokens both name column 'p'"),
])
def test_a_column_named_for_two_fields_is_refused(cols, said):
    # one column for arrival and lengths is refused (each request would get its arrival
    # time as its prompt and output lengths)
    with pytest.raises(ValidationError, match=said + ": each reads a column of its own"):
        TraceConfig.model_validate({"path": "t.csv", "format": "csv", "columns": cols})
