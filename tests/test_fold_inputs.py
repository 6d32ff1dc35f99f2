"""Bad input: every problem is found before folding and named by file, record and position."""
import json
import os

import pytest

pytest.importorskip("openfold")

from flashlight.structures.inputs import load_inputs, safe_name  # noqa: E402
from flashlight.structures.testing import TINY_OPTIONS, run_cli, write_fasta  # noqa: E402

GOOD = "NLYIQWLKDGGPSSGRPPPS"


def _only_problem(paths, alignment_dir=None):
    records, problems = load_inputs([str(p) for p in paths], alignment_dir and str(alignment_dir))
    assert len(problems) == 1, [str(p) for p in problems]
    return records, problems[0]


def test_valid_inputs_have_no_problems(tmp_path):
    fasta = write_fasta(tmp_path / "ok.fasta", {"a": GOOD, "b": "mkta yixb".replace(" ", "")})
    records, problems = load_inputs([str(fasta)])
    assert problems == []
    assert [r.id for r in records] == ["a", "b"]
    assert records[1].input_sequence == "MKTAYIXB"  # lower case accepted, upper-cased
    assert records[1].sequence == "MKTAYIXD"  # B (Asx) is folded as D
    assert [r.order for r in records] == [0, 1]


def test_invalid_residue_names_file_record_and_position(tmp_path):
    fasta = write_fasta(tmp_path / "bad.fasta", {"ok": GOOD, "stop": "MKTAY*IA"})
    records, problem = _only_problem([fasta])
    assert [r.id for r in records] == ["ok"]
    assert (problem.file, problem.record, problem.index, problem.position) == (str(fasta), "stop", 2, 6)
    assert str(problem) == (
        f"{fasta}: record 'stop' (#2): invalid residue '*' at position 6 "
        "(accepted: ACDEFGHIKLMNPQRSTVWY and X, B, Z, J, U, O)"
    )


@pytest.mark.parametrize("letter", ["1", "-", "."])
def test_other_invalid_letters(tmp_path, letter):
    fasta = write_fasta(tmp_path / "bad.fasta", {"p": "MK" + letter + "TA"})
    _, problem = _only_problem([fasta])
    assert problem.position == 3 and f"{letter!r}" in problem.message


def test_empty_record(tmp_path):
    fasta = tmp_path / "empty.fasta"
    fasta.write_text(f">empty nothing here\n>full\n{GOOD}\n")
    records, problem = _only_problem([fasta])
    assert [r.id for r in records] == ["full"]
    assert problem.record == "empty" and "empty record" in str(problem)


def test_duplicate_ids_across_files(tmp_path):
    first = write_fasta(tmp_path / "one.fasta", {"same": GOOD})
    second = write_fasta(tmp_path / "two.fasta", {"other": GOOD, "same": GOOD})
    records, problem = _only_problem([first, second])
    assert [r.id for r in records] == ["same", "other"]
    assert problem.file == str(second) and problem.index == 2
    assert f"duplicate id: already used by record #1 of {first}" in str(problem)


def test_ids_that_share_an_output_folder(tmp_path):
    fasta = write_fasta(tmp_path / "ids.fasta", {"sp|P1|X": GOOD, "sp_P1_X": GOOD})
    _, problem = _only_problem([fasta])
    assert safe_name("sp|P1|X") == "sp_P1_X"
    assert "output folder 'sp_P1_X'" in str(problem)


def test_unreadable_files(tmp_path):
    missing = tmp_path / "missing.fasta"
    binary = tmp_path / "binary.fasta"
    binary.write_bytes(b"\x00\xff\xfe>x\n")
    text = tmp_path / "notes.txt"
    text.write_text("just some notes\nACDE\n")
    blank = tmp_path / "blank.fasta"
    blank.write_text("")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("a directory of inputs without any\n")
    records, problems = load_inputs([str(missing), str(binary), str(text), str(blank), str(empty)])
    assert records == []
    messages = {p.file: p.message for p in problems}
    assert messages[str(missing)] == "file does not exist"
    assert messages[str(binary)].startswith("unreadable: not a text FASTA file")
    assert messages[str(text)].startswith("not a FASTA file")
    assert "no FASTA records" in messages[str(blank)]
    assert "directory holds no input files (*.fasta, *.fa, *.faa, *.a3m)" in messages[str(empty)]


def test_msa_query_mismatch(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": GOOD})
    msa_dir = tmp_path / "msas"
    msa_dir.mkdir()
    (msa_dir / "trp.a3m").write_text(">query\n" + GOOD[:4] + "W" + GOOD[5:] + "\n>hit\n" + GOOD + "\n")
    records, problem = _only_problem([fasta], msa_dir)
    assert records == []
    assert problem.record == "trp" and problem.position == 5
    assert str(msa_dir / "trp.a3m") in str(problem)
    assert "'W' instead of 'Q' at position 5" in str(problem)


def test_msa_query_of_other_length(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": GOOD})
    msa_dir = tmp_path / "msas"
    msa_dir.mkdir()
    (msa_dir / "trp.sto").write_text(
        "# STOCKHOLM 1.0\n\ntrp " + GOOD[:-2] + "\nhit " + GOOD[:-2] + "\n//\n"
    )
    _, problem = _only_problem([fasta], msa_dir)
    assert "query (first row) has 18 residues, the record has 20" in str(problem)


def test_msa_row_with_bad_character(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": GOOD})
    msa_dir = tmp_path / "msas"
    msa_dir.mkdir()
    (msa_dir / "trp.a3m").write_text(f">q\n{GOOD}\n>hit\n{GOOD[:3]}.{GOOD[4:]}\n")
    _, problem = _only_problem([fasta], msa_dir)
    assert "row 2: invalid character '.' at position 4" in str(problem)


def test_stockholm_and_a3m_folder_layout_are_read(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": GOOD})
    folder = tmp_path / "msas" / "trp"
    folder.mkdir(parents=True)
    (folder / "uniref.a3m").write_text(f">q\n{GOOD}\n>hit\n--{GOOD[2:]}\n")
    (folder / "bfd.sto").write_text(f"# STOCKHOLM 1.0\ntrp {GOOD}\nhit {GOOD[:-1]}-\n//\n")
    records, problems = load_inputs([str(fasta)], str(tmp_path / "msas"))
    assert problems == []
    assert records[0].alignment.depth == 4
    assert [os.path.basename(p) for p in records[0].alignment.paths] == ["bfd.sto", "uniref.a3m"]


def _bad_batch(tmp_path):
    good = write_fasta(tmp_path / "good.fasta", {"trp": GOOD, "dup": GOOD[:12]})
    bad = tmp_path / "bad.fasta"
    bad.write_text(f">dup\n{GOOD}\n>bad_letter\nMKT1AY\n>hollow\n")
    return [str(good), str(bad), str(tmp_path / "missing.fasta")]


def test_cli_stops_before_folding_and_names_everything(tmp_path):
    out = tmp_path / "out"
    result = run_cli([*_bad_batch(tmp_path), "--out-dir", str(out), *TINY_OPTIONS], timeout=120)
    assert result.returncode == 2
    err = result.stderr
    assert "4 invalid input(s)" in err
    assert "bad.fasta: record 'dup' (#1): duplicate id" in err
    assert "bad.fasta: record 'bad_letter' (#2): invalid residue '1' at position 4" in err
    assert "bad.fasta: record 'hollow' (#3): empty record" in err
    assert "missing.fasta: file does not exist" in err
    assert "nothing was folded" in err and "--skip-invalid" in err
    assert not out.exists() or os.listdir(out) == []


def test_cli_skip_invalid_folds_the_rest_and_lists_the_others(tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        [*_bad_batch(tmp_path), "--out-dir", str(out), "--skip-invalid", "--no-flashlight",
         "--no-plot", "--warmup", "0", *TINY_OPTIONS]
    )
    assert result.returncode == 0, result.output
    assert "4 invalid input(s) (skipped)" in result.stderr
    assert sorted(os.listdir(out)) == ["dup", "flashlight-fold.log", "summary.json", "trp"]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["id"] for r in summary["records"]] == ["trp", "dup"]
    assert len(summary["invalid"]) == 4
    assert {p["record"] for p in summary["invalid"]} == {"dup", "bad_letter", "hollow", None}
    assert any(p["position"] == 4 for p in summary["invalid"])


def test_cli_missing_params_file(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": GOOD})
    result = run_cli([str(fasta), "--out-dir", str(tmp_path), "--params", str(tmp_path / "nope.npz")], timeout=120)
    assert result.returncode == 2
    assert "nope.npz: no such file" in result.stderr
