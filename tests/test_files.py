"""The project's file helpers: the YAML reader (duplicate keys refused, YAML 1.2 floats with
an exponent) and the check of an output file before a long run."""

import math
import re

import pytest
import yaml

from simulator.files import load_yaml


@pytest.mark.parametrize("text, value", [
    ("1e30", 1e30), ("1E-3", 0.001), ("+1e5", 100000.0), ("-2e-2", -0.02),
    ("1.5e3", 1500.0), (".5e1", 5.0), ("7.E2", 700.0),
])
def test_exponent_numbers_are_floats_as_in_yaml_1_2(text, value):
    got = load_yaml(f"x: {text}")["x"]
    assert type(got) is float and got == value
    # the same number as JSON (a YAML 1.2 subset) reads it
    assert got == float(text)


@pytest.mark.parametrize("text, value", [
    ("10", 10), ("-3", -3), ("1.5", 1.5), ("1_000", 1000), ("0x10", 16),
    ("1e", "1e"), ("e5", "e5"), ("1e30x", "1e30x"), ("'1e30'", "1e30"), ("1.0e+3", 1000.0),
])
def test_other_scalars_resolve_as_safe_load(text, value):
    got = load_yaml(f"x: {text}")["x"]
    assert got == value and type(got) is type(value)
    assert got == yaml.safe_load(f"x: {text}")["x"]


def test_infinity_and_plain_pyyaml_untouched():
    assert math.isinf(load_yaml("x: .inf")["x"])
    assert yaml.safe_load("x: 1e30")["x"] == "1e30"   # the resolver is ours alone


def test_duplicate_key_names_its_line():
    with pytest.raises(yaml.YAMLError) as e:
        load_yaml("a: 1\nb:\n  c: 2\n  c: 3\n")
    assert "duplicate key 'c'" in str(e.value) and e.value.problem_mark.line + 1 == 4


def test_an_integer_too_long_for_python_names_its_line():
    # int() refuses more than 4300 digits (a YAML error with its line, not int()'s ValueError)
    with pytest.raises(yaml.YAMLError) as e:
        load_yaml("a: 1\nb: " + "9" * 5000 + "\n")
    assert "an integer of 5000 digits" in str(e.value) and e.value.problem_mark.line + 1 == 2
    assert load_yaml("b: " + "9" * 4000)["b"] == int("9" * 4000)


def test_yaml_line_and_depth_of_key_paths():
    from simulator.files import yaml_line, yaml_where
    text = "a:\n  b: 1\n  c: [x, {d: 2}]\ne: {f: 3}\n"
    cases = [  # path, line of the last part held, parts held
        (("a", "b"), 2, 2), (("a", "c", 1, "d"), 3, 4), (("a", "z", "y"), 1, 1),
        (("e", "f"), 4, 2), (("a", "c", 5), 3, 2), (("q",), None, 0), ((), None, 0)]
    for path, line, depth in cases:
        assert yaml_where(text, path) == (line, depth), path
        assert yaml_line(text, path) == line
    assert yaml_where("a: [", ("a",)) == (None, 0)


def test_an_output_folder_holding_another_commands_report_is_refused(tmp_path):
    from simulator.errors import InputError
    from simulator.files import REPORT_MARKERS, check_folder

    (tmp_path / "summary.json").write_text("{}")   # a run's report
    check_folder(tmp_path, "--out", "run")          # the same command writes over it
    check_folder(tmp_path, "--out")                 # no kind: not checked
    check_folder(tmp_path / "new", "--out", "sweep")   # a new folder holds nothing
    for kind in set(REPORT_MARKERS) - {"run"}:
        with pytest.raises(InputError) as e:
            check_folder(tmp_path, "--out", kind)
        assert str(e.value) == (f"--out {tmp_path}: holds a run report (summary.json); a "
                                f"{kind} report there would mix with it: give another folder")
    # through a folder that does not exist yet and back: the same folder, once made, so
    # it is refused before any run
    with pytest.raises(InputError, match="holds a run report"):
        check_folder(tmp_path / "ghost" / "..", "--out", "sweep")



def test_an_output_folder_holding_files_of_no_report_is_refused(tmp_path, capsys):
    # `run --out .` beside a trace named requests.csv is refused (the report would replace it)
    from pathlib import Path

    from simulator.cli import main
    from simulator.errors import InputError
    from simulator.files import check_folder

    (tmp_path / "requests.csv").write_text("arrival_s,prompt_tokens,output_tokens\n")
    (tmp_path / "sc.yaml").write_text("name: x\n")
    for f in ("a.txt", "b.txt"):
        (tmp_path / f).write_text("")
    (tmp_path / "sub").mkdir()
    with pytest.raises(InputError) as e:
        check_folder(tmp_path, "--out", "plan")
    assert str(e.value) == (f"--out {tmp_path}: holds files that are not a plan report "
                            f"(a.txt, b.txt, requests.csv and 1 more); give a new or empty "
                            f"folder, or an earlier plan report's folder to replace it")
    check_folder(tmp_path, "--out")   # no kind (calibrate's profile folder): not checked
    scenario = Path(__file__).parent.parent / "scenarios" / "cpu_tiny.yaml"
    assert main(["run", str(scenario), "--set", "workload.num_requests=10", "--out",
                 str(tmp_path)]) == 2
    assert "holds files that are not a run report" in capsys.readouterr().err
    assert (tmp_path / "requests.csv").read_text().startswith("arrival_s,")
    # hidden files and subfolders alone: an empty folder (a mount point, a .gitkeep)
    empty = tmp_path / "sub"
    (empty / ".gitkeep").write_text("")
    (empty / "older").mkdir()
    check_folder(empty, "--out", "run")
    (empty / "summary.json").write_text("{}")   # a run report: the next run replaces it
    (empty / "report.md").write_text("")
    check_folder(empty, "--out", "run")
    (empty / "notes.txt").write_text("")   # but not beside a file of the user's
    with pytest.raises(InputError) as e:
        check_folder(empty, "--out", "run")
    assert str(e.value) == (f"--out {empty}: holds a run report and files that are not part "
                            f"of it (notes.txt); move them, or give another folder")


@pytest.mark.parametrize("kind, name", [("run", "report.html"), ("run", "timeseries.csv"),
                                        ("sweep", "curves.png"),
                                        ("validate", "cdf_load_0.5.png")])
def test_a_subfolder_named_as_a_report_file_is_refused_before_running(tmp_path, capsys,
                                                                     kind, name):
    # refused before the run: the report's write of that file would fail after it
    from pathlib import Path

    from simulator.cli import main
    from simulator.errors import InputError
    from simulator.files import check_folder

    (tmp_path / name).mkdir()
    with pytest.raises(InputError) as e:
        check_folder(tmp_path, "--out", kind)
    assert str(e.value) == (f"--out {tmp_path}: holds a folder named {name}, a file the "
                            f"{kind} report writes; move it, or give another folder")
    if kind == "run":
        scenario = Path(__file__).parent.parent / "scenarios" / "cpu_tiny.yaml"
        assert main(["run", str(scenario), "--set", "workload.num_requests=10", "--out",
                     str(tmp_path)]) == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == [name]

@pytest.mark.parametrize("kind", [None, "run"])
def test_a_folder_name_too_long_for_the_file_system_is_an_input_error(tmp_path, kind):
    # a 300-byte name exceeds NAME_MAX (255 on Linux file systems): Path.is_file() and
    # Path.exists() raise OSError for it, which is said as one error line
    from simulator.errors import InputError
    from simulator.files import check_folder

    long = tmp_path / ("a" * 300)
    with pytest.raises(InputError) as e:
        check_folder(long / "sub", "--out", kind)
    assert str(e.value) == f"--out {long / 'sub'}: cannot write there (File name too long)"
    # below a folder still to be made the kernel stops at the missing folder ("not found"),
    # yet the long name is refused, and nothing is made
    deep = tmp_path / "new" / ("a" * 300)
    with pytest.raises(InputError, match=r"cannot write there \(File name too long\)$"):
        check_folder(deep, "--out", kind)
    with pytest.raises(InputError, match=r"cannot write there \(File name too long\)$"):
        check_folder(tmp_path / "new" / "/".join(["a"] * 2100), "--out", kind)   # > PATH_MAX
    check_folder(tmp_path / "new" / ("a" * 255), "--out", kind)   # NAME_MAX itself fits
    assert not (tmp_path / "new").exists()


def test_an_input_path_too_long_is_named_so(tmp_path):
    # is_file() raises ENAMETOOLONG: a trace, profile or model path of a 300-byte name (or
    # one below a missing folder, which the kernel reports as not found) is one error line
    from simulator.files import is_regular_file, missing_file, name_too_long

    for p in (tmp_path / ("a" * 300), tmp_path / "nope" / ("a" * 300) / "t.csv"):
        assert name_too_long(p) and not is_regular_file(p)
        assert missing_file(p) == "name too long for the file system"
    ok = tmp_path / ("a" * 255)
    assert not name_too_long(ok) and missing_file(ok) == "file not found"


def test_a_broken_symbolic_link_as_the_output_folder_is_refused_before_running(tmp_path):
    # exists() is False for it, yet the check refuses it before the run (writing the report
    # after it would fail: "cannot write it (Not a directory)")
    from simulator.errors import InputError
    from simulator.files import check_folder

    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "x")
    for target, which in ((link, "it"), (link / "sub", str(link))):
        with pytest.raises(InputError) as e:
            check_folder(target, "--out", "run")
        assert str(e.value) == (f"--out {target}: {which} is a broken symbolic link (to "
                                f"{tmp_path / 'gone' / 'x'})")
    (tmp_path / "gone" / "x").mkdir(parents=True)   # mended: the folder it names is used
    check_folder(link / "sub", "--out", "run")



def test_yaml_nested_past_the_parser_is_a_yaml_error():
    # PyYAML's composer recurses once per level: one YAML error from every loader
    want: list = []
    for _ in range(99):
        want = [want]
    assert load_yaml("x: " + "[" * 100 + "]" * 100) == {"x": want}
    with pytest.raises(yaml.YAMLError, match="^collections nested too deeply$"):
        load_yaml("x: " + "[" * 2000 + "]" * 2000)


def test_an_alias_inside_its_own_anchor_is_a_yaml_error():
    # "&a [1, *a]" (a list holding itself) is refused with its line
    for text, line in (("x: &a [1, *a]\n", 1), ("y: 0\nx: &m\n  k: [2, *m]\n", 3)):
        with pytest.raises(yaml.YAMLError) as e:
            load_yaml(text)
        assert e.value.problem == ("the alias *{0} is inside its own anchor &{0}: the value "
                                   "would contain itself").format(text.split("&")[1][0])
        assert e.value.problem_mark.line + 1 == line
    # an anchor given twice is named with its lines, not PyYAML's bare "second occurrence"
    with pytest.raises(yaml.YAMLError) as e:
        load_yaml("a: &a x\nb: &a y\n")
    assert (e.value.problem, e.value.problem_mark.line + 1) == (
        "the anchor &a is given twice (first on line 1); give each anchor its own name", 2)
    # an alias after its anchor closed, or of another anchor inside one, is fine
    assert load_yaml("a: &a [1]\nb: &b [*a, *a]\nc: *b\n") == {
        "a": [1], "b": [[1], [1]], "c": [[1], [1]]}


def test_aliases_expanding_past_a_million_characters_are_a_yaml_error():
    # nine levels of ten aliases are 10**9 values sharing a few nodes: refused at load,
    # since the repr of a plan candidate's value would exhaust memory; so is one
    # 60,000-character text aliased 20,000 times
    from simulator.files import MAX_ALIAS_EXPANSION, yaml_error_text

    def laughs(levels: int) -> str:
        p = ["&a0 [x,x,x,x,x,x,x,x,x,x]"] + [
            f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
        return "name: s\nx: 1\nlol: [" + ",".join(p) + "]\n"

    # levels 1..5 hold 10 + 100 + ... + 100,000 x's (and 11,111 lists): fine
    assert str(load_yaml(laughs(5))["lol"]).count("x") == 111_110
    text = "\n".join(["name: s", "ok: [&s " + "x" * 999 + ", *s]",   # 1,000 more: fine
                       "big: [&t " + "y" * 60_000 + ", " + ", ".join(["*t"] * 20_000) + "]"])
    for doc, line in ((laughs(9), 3), (text, 3)):
        with pytest.raises(yaml.YAMLError) as e:
            load_yaml(doc)
        assert yaml_error_text("s.yaml", e.value) == (
            f"s.yaml:{line}: YAML error: aliases (*name) expand this value past "
            f"{MAX_ALIAS_EXPANSION:,} characters, each repeating its anchor's whole value; no "
            f"setting needs that much")
    # a long document without aliases is not theirs to refuse
    assert len(load_yaml("x: [" + ",".join(["1"] * 300_000) + "]")["x"]) == 300_000


def test_an_error_echoes_a_long_value_by_its_size():
    # a list of a million values is cut short in the one error line
    from simulator.files import echo

    assert (echo([1, 2]), echo("4"), echo(1e30), echo(None), echo(True)) == (
        "[1, 2]", "'4'", "1e+30", "null", "true")
    # a float from 1e6 up keeps its digits but takes an exponent, as Python's from 1e16
    assert (echo(1e12), echo(-1234567.0), echo(999999.5), echo(2e16)) == (
        "1e+12", "-1.234567e+06", "999999.5", "2e+16")
    assert echo(list(range(200_000))) == "a list of 200,000 values"
    shared = [1]   # as an alias shares it: written out, not as PyYAML's &id001 [1], *id001
    assert echo([shared, shared]) == "[[1], [1]]"
    assert echo({"a": ["z" * 100]}) == "a mapping of 1 key"
    assert echo("y" * 100) == f"a text of 100 characters, {'y' * 40!r}..."


def test_yaml_timestamps_stay_text_as_in_yaml_1_2():
    # dates stay text, 2026-13-01 too (PyYAML's YAML 1.1 resolver makes them dates)
    from simulator.files import load_yaml

    assert load_yaml("a: 2026-12-01\nb: 2026-13-01\nc: 2024-02-30 10:00:00\n") == {
        "a": "2026-12-01", "b": "2026-13-01", "c": "2024-02-30 10:00:00"}


def test_merge_keys_merge_and_base_60_numbers_stay_text():
    # "<<: *base" merges; 1:30 is text, not YAML 1.1's base-60 90
    got = load_yaml("a: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\nt: 1:30\nf: 1:30.5\n")
    assert got == {"a": {"x": 1, "y": 2}, "m": {"x": 1, "y": 3}, "t": "1:30", "f": "1:30.5"}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'y'"):
        load_yaml("m:\n  <<: {y: 1}\n  y: 2\n  y: 3\n")


@pytest.mark.parametrize("text, value", [
    ("010", 10), ("-010", -10), ("0_10", 10), ("0o10", 8), ("0O17", 15), ("0x10", 16),
    ("12", 12), ("1:30", "1:30"),   # YAML 1.1's base 60: text, as in YAML 1.2
    ("1_000", 1000), ("0b11", 3),   # YAML 1.1's, kept (readable; no 1.2 meaning to clash)
])
def test_integers_read_as_yaml_1_2_core_reads_them(text, value):
    # 010 is ten, not YAML 1.1's octal 8 (--set engine.max_num_seqs=010); 0o10 is eight
    got = load_yaml(f"x: {text}")["x"]
    assert got == value and type(got) is type(value)


def test_csv_rows_keep_a_hash_inside_a_field_and_name_each_row_by_its_first_line(tmp_path):
    from simulator.errors import InputError
    from simulator.files import read_csv_rows
    path = tmp_path / "m.csv"
    # line 1 a comment, 2 the columns, 3 blank, 4 a row whose middle field is "a#b", 5-6 one
    # row whose quoted field holds a line break, 7 a comment, 8 a row; LF, CRLF and a bare CR
    path.write_bytes(b'# {"run": 1}\nx,y,z\r\n\n1,a#b,2\n3,"two\nlines",4\r# note\n5,,6\n')
    t = read_csv_rows(path)
    assert (t.columns, t.column_line) == (["x", "y", "z"], 2)
    assert t.rows == [["1", "a#b", "2"], ["3", "two\nlines", "4"], ["5", "", "6"]]
    assert t.lines == [4, 5, 8]
    assert t.width_problem() is None
    assert list(t.frame()["y"]) == ["a#b", "two\nlines", ""]
    path.write_text("x,y\n1,2\n3\n4,5,6\n")
    assert read_csv_rows(path).width_problem() == "3: 1 fields where the column line has 2"
    path.write_text("x,x\n1,2\n")
    with pytest.raises(InputError, match=r"m.csv:1: column 'x' appears twice$"):
        read_csv_rows(path).frame()
    # inside a quoted field a line that begins with '#', or a blank one, is the field's text
    path.write_text('a,b\n"x\n#y\n\nz",1\n2,3\n')
    t = read_csv_rows(path)
    assert (t.rows, t.lines) == ([["x\n#y\n\nz", "1"], ["2", "3"]], [2, 6])
    # a quote never closed is named as such at the line its row starts on (not read on to
    # the end of the file as one field); text after a closing quote is no CSV
    path.write_text('x,y\n1,2\n3,"4\n5,6\n')
    with pytest.raises(InputError, match=r"m.csv:3: a quoted field that starts on this row "
                                         r"is never closed"):
        read_csv_rows(path)
    path.write_text('x,y\n1,"2"3\n')
    with pytest.raises(InputError, match=r"""m.csv:2: not CSV \(',' expected after '"'\)$"""):
        read_csv_rows(path)
    # past the csv module's limit: named by the line its row starts on
    path.write_text('x,y\n1,2\n3,"' + "4" * 100_000 + "\n" + "4" * 100_000 + '"\n')
    with pytest.raises(InputError, match=r"m.csv:3: not CSV \(field larger than field limit"):
        read_csv_rows(path)
    # a byte that is no UTF-8 is placed by line and column with CR, LF or CR LF line ends
    for end in (b"\n", b"\r", b"\r\n"):
        path.write_bytes(b"\xef\xbb\xbfx,y" + end + b"1,2" + end + b"3,\xe94" + end)
        with pytest.raises(InputError, match=r"m.csv:3: not UTF-8 text \(byte 0xe9 at column 3;"):
            read_csv_rows(path)
    path.write_bytes(b"\xef\xbb\xbf\xe9,y\n")   # a byte order mark is no column
    with pytest.raises(InputError, match=r"m.csv:1: not UTF-8 text \(byte 0xe9 at column 1;"):
        read_csv_rows(path)
    path.write_text("# comments only\n\n")
    t = read_csv_rows(path)
    assert (t.columns, t.column_line, t.rows, t.lines) == ([], 0, [], [])


def test_a_file_path_is_checked_by_making_a_file_there(tmp_path):
    # os.access says yes to root anywhere: /proc/x.md passed, and a run failed only at its end
    from simulator.errors import InputError
    from simulator.files import check_file_writable

    check_file_writable(tmp_path / "new.md", "--out")
    (tmp_path / "old.md").write_text("x")
    check_file_writable(tmp_path / "old.md", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.md"]   # nothing left behind
    with pytest.raises(InputError, match=r"^--out: empty path \(give a file path\)$"):
        check_file_writable(" ", "--out")
    for bad in (tmp_path, tmp_path / "no-such" / "x.md", "/proc/x.md", "/dev/null"):
        with pytest.raises(InputError, match=rf"^--out {re.escape(str(bad))}: a file path in a "
                                             r"folder that exists and can be written$"):
            check_file_writable(bad, "--out")
