"""flashlight-fold against careless and hostile input (CPU, tiny model, random weights).

Record ids as file names, unusable output folders, stale and concurrent outputs,
inputs that used to fail late, and noise. Most checks never fold; two shared runs
fold: ``hostile_run`` (stock OpenFold) and ``rerun``, which refolds into a copy of its
output with other options, with Flashlight in Triton's interpreter, and is stopped
with Ctrl-C after its first record.
"""
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("openfold")

from flashlight.structures import cli, fold, outputs  # noqa: E402
from flashlight.structures.inputs import (  # noqa: E402
    MAX_NAME_LENGTH,
    RESIDUE_SUBSTITUTIONS,
    load_inputs,
    safe_name,
)
from flashlight.structures.testing import cli_env, run_cli, write_fasta  # noqa: E402

# The smallest settings of the fold tests: one block, no recycling, one run, tiny MSAs.
SMALL = [
    "--num-blocks", "1", "--recycles", "0", "--repeats", "1", "--warmup", "0",
    "--max-msa-clusters", "4", "--max-extra-msa", "4", "--chunk-size", "none", "--no-plot",
]
LONG_ID = "p" * 300
# id -> sequence of the shared runs; "bom" has an MSA with a byte-order mark, and the
# parent of the alignment folder holds an MSA that ".." must not read.
HOSTILE = {
    "..": "NLYIQWLKDG",
    ".": "MKTAYIAKQR",
    "summary.json": "MKTAYIAK",
    LONG_ID: "GPSSGRPPPS",
    "sub|1": "MKUOBZJXAC",
    "tiny": "MK",
    "bom": "MKTAYIAKQR",
}
SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _main(argv, capsys):
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


class _NoModel:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("the model was built")


@pytest.fixture
def no_model(monkeypatch):
    """Building a model fails loudly: checks that must come first are seen to."""
    monkeypatch.setattr(fold, "Folder", _NoModel)


def _tree(root, skip=None):
    """{relative path: (size, mtime) or "folder"} of every entry under ``root`` but ``skip``."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) != skip]
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            is_folder = name in dirs and not os.path.islink(path)
            found[os.path.relpath(path, root)] = "folder" if is_folder else (st.st_size, st.st_mtime_ns)
    return found


def _hidden(out):
    return sorted(n for n in os.listdir(out) if n.startswith("."))


def _pdb_residues(path):
    """[(residue number, residue name)] of a PDB file's ATOM records."""
    seen = []
    for line in open(path):
        if line.startswith("ATOM"):
            key = (int(line[22:26]), line[17:20])
            if not seen or seen[-1] != key:
                seen.append(key)
    return seen


def _check_one_run(folder):
    """A record folder holds exactly the files its latency.json lists, all of one run."""
    report = json.loads((folder / "latency.json").read_text())
    assert sorted(os.listdir(folder)) == sorted(report["outputs"].values())
    seed = report["options"]["seed"]
    assert (folder / report["outputs"]["pdb"]).read_text().startswith(
        f"REMARK 250 flashlight-fold model_1: RANDOM WEIGHTS seed {seed}"
    )
    if "mmcif" in report["outputs"]:
        assert f"seed {seed}" in (folder / report["outputs"]["mmcif"]).read_text()
    return report


# -- shared folds ---------------------------------------------------------------------


def _hostile_inputs(root):
    aln = root / "aln"
    aln.mkdir()
    (aln / "bom.a3m").write_bytes(
        b"\xef\xbb\xbf>query\nMKTAYIAKQR\n>hit\nMKTAYLAKQ-\n"
    )
    (root / "leak.a3m").write_text(f">q\n{HOSTILE['..']}\n>h\n{HOSTILE['..'][:-1]}A\n")
    return aln


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    aln = _hostile_inputs(root)
    fasta = write_fasta(root / "hostile.fasta", HOSTILE)
    out = root / "out"
    before = _tree(root)
    result = run_cli([fasta, "--alignment-dir", aln, "--out-dir", out, "--mmcif",
                      "--no-flashlight", "--quiet", *SMALL])
    assert result.returncode == 0, result.output
    return root, out, result, before


def _inode(path):
    """``path``'s inode, or None between the two renames that replace a record folder."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


@pytest.fixture(scope="module")
def rerun(hostile_run, tmp_path_factory):
    """The hostile run's folder refolded with other options, Ctrl-C after one record."""
    root, first_out, _, _ = hostile_run
    out = tmp_path_factory.mktemp("rerun") / "out"
    shutil.copytree(first_out, out, symlinks=True)
    first_run = json.loads((first_out / "summary.json").read_text())["run_id"]
    ordered = {"tiny": HOSTILE["tiny"], **{k: v for k, v in HOSTILE.items() if k != "tiny"}}
    fasta = write_fasta(out.parent / "reordered.fasta", ordered)
    env = cli_env(interpret=True)
    del env["PYTHONWARNINGS"]  # the user's default: library warnings are shown
    command = [sys.executable, "-m", "flashlight.structures", str(fasta), "--alignment-dir",
               str(root / "aln"), "--out-dir", str(out), "--seed", "1", "--quiet", *SMALL]
    old_inode = os.stat(out / "tiny").st_ino
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + 300
    while _inode(out / "tiny") in (old_inode, None):  # replaced as a whole
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the rerun ended before its first record: " + proc.communicate()[1])
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # the second record folds in the interpreter: slowly
    stdout, stderr = proc.communicate(timeout=120)
    return out, first_run, proc.returncode, stdout, stderr


# -- 3. paths from record ids ---------------------------------------------------------


@pytest.mark.parametrize(
    "record_id",
    ["..", ".", "...", "../x", "a/../../b", "/etc/passwd", "a\\b", "summary.json",
     "SUMMARY.JSON", ".hidden", "\x00", "é" * 120, LONG_ID, "-", "sp|P1|X"],
)
def test_safe_names_stay_inside_their_folder(record_id):
    name = safe_name(record_id)
    assert name and set(name) <= SAFE and not name.startswith(".")
    assert len(name) <= MAX_NAME_LENGTH
    assert name.lower() != "summary.json"
    assert safe_name(record_id) == name  # stable between runs


@pytest.mark.parametrize(
    "first, second",
    [("Trp", "trp"), ("sp|P1|X", "SP_p1_x"), ("summary.json", "summary.json_"),
     (LONG_ID, LONG_ID.upper()), ("é", "ü"), ("a/b", "a_B")],
)
def test_ids_that_share_a_name_are_one_error_naming_both(tmp_path, capsys, first, second):
    fasta = write_fasta(tmp_path / "ids.fasta", {first: "MKTAYI", second: "MKTAYI"})
    records, problems = load_inputs([str(fasta)])
    assert [r.id for r in records] == [first]
    assert len(problems) == 1 and problems[0].record == second
    assert repr(first) in str(problems[0]) and "ignored" in str(problems[0])
    out = tmp_path / "out"
    code, _, err = _main([fasta, "--out-dir", out], capsys)
    assert code == 2 and repr(first) in err and repr(second) in err
    assert not out.exists()


@pytest.mark.parametrize("record_id", ["..", ".", "../aln", "./bom", "../leak", "aln/../leak"])
def test_alignment_lookup_never_leaves_the_folder(tmp_path, record_id):
    aln = _hostile_inputs(tmp_path)
    (tmp_path / "leak").mkdir()
    (tmp_path / "leak" / "leak.a3m").write_text((tmp_path / "leak.a3m").read_text())
    fasta = write_fasta(tmp_path / "q.fasta", {record_id: HOSTILE[".."], "bom": HOSTILE["bom"]})
    records, problems = load_inputs([str(fasta)], str(aln))
    assert problems == []
    assert records[0].alignment is None
    assert records[1].alignment.paths == [str(aln / "bom.a3m")]


def test_hostile_ids_fold_inside_the_output_folder(hostile_run):
    root, out, result, before = hostile_run
    assert sorted(os.listdir(out)) == sorted(
        {safe_name(i) for i in HOSTILE} | {"summary.json", "flashlight-fold.log"})
    summary = json.loads((out / "summary.json").read_text())
    assert [r["id"] for r in summary["records"]] == list(HOSTILE)
    assert all(r["status"] == "ok" for r in summary["records"])
    for record_id in HOSTILE:
        report = _check_one_run(out / safe_name(record_id))
        assert report["record"]["id"] == record_id
        assert sorted(report["outputs"]) == ["confidence", "latency", "mmcif", "pdb"]
    # nothing else was written, and the MSAs of other folders were not read
    assert _tree(root, skip=str(out)) == before
    for record_id in ("..", "."):
        report = json.loads((out / safe_name(record_id) / "latency.json").read_text())
        assert report["record"]["msa"] is None and report["record"]["msa_depth"] == 1
    assert result.stdout == ""


# -- 4. output folders that cannot be used ----------------------------------------------


def _out_dir_case(tmp_path, kind):
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    if kind == "file":
        return str(afile), "is a file"
    if kind == "under a file":
        return str(afile / "out"), "afile is a file"
    if kind == "deep under a file":
        return str(afile / "a" / "b"), "afile is a file"
    if kind == "broken link":
        os.symlink(tmp_path / "nowhere", tmp_path / "link")
        return str(tmp_path / "link" / "out"), "is a broken link"
    if kind == "empty":
        return "", "--out-dir is empty"
    if kind == "lock is a folder":
        (tmp_path / "out" / outputs.LOCK_NAME).mkdir(parents=True)
        return str(tmp_path / "out"), "not writable"
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        pytest.skip("permissions do not bind this user (root)")
    return str(folder / "out") if kind == "under read-only" else str(folder), "not writable"


@pytest.mark.parametrize(
    "kind", ["file", "under a file", "deep under a file", "broken link", "empty",
             "lock is a folder", "read-only", "under read-only"],
)
def test_unusable_out_dir_is_one_line_before_the_model(tmp_path, capsys, no_model, kind):
    out, expected = _out_dir_case(tmp_path, kind)
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    code, stdout, err = _main([fasta, "--out-dir", out, "--no-flashlight"], capsys)
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith("error: --out-dir")
    assert expected in err and "the model was built" not in err
    assert stdout == ""
    assert (tmp_path / "afile").read_text() == "keep me\n"


# -- 5. stale, mixed and concurrent outputs ---------------------------------------------


def _old_record(out, kind, outside):
    out.mkdir()
    final = out / "rec"
    if kind == "folder":
        final.mkdir()
        (final / "rec.cif").write_text("old")
        (final / "latency.json").write_text("old")
    elif kind == "file":
        final.write_text("old")
    elif kind == "link":
        outside.mkdir()
        (outside / "precious").write_text("old")
        os.symlink(outside, final)
    return final


@pytest.mark.parametrize("old", [None, "folder", "file", "link"])
@pytest.mark.parametrize("ending", ["done", "error", "ctrl-c"])
def test_record_folder_is_replaced_whole_or_not_at_all(tmp_path, old, ending):
    out, outside = tmp_path / "out", tmp_path / "outside"
    final = _old_record(out, old, outside)
    before = _tree(tmp_path)
    raised = {"done": None, "error": OSError("disk full"), "ctrl-c": KeyboardInterrupt()}[ending]
    with pytest.raises(type(raised)) if raised else contextlib.nullcontext():
        with outputs.record_folder(str(out), "rec") as staging:
            outputs.write_atomic(os.path.join(staging, "rec.pdb"), "new")
            if raised:
                raise raised
            outputs.write_json(os.path.join(staging, "latency.json"), {"new": True})
    if raised:
        assert _tree(tmp_path) == before  # the older record untouched, nothing left
    else:
        assert sorted(os.listdir(final)) == ["latency.json", "rec.pdb"]
        assert not final.is_symlink()
        assert sorted(os.listdir(out)) == ["rec"]
    if old == "link":
        assert (outside / "precious").read_text() == "old"


@pytest.mark.parametrize("holder", ["this process", "another process"])
def test_a_second_run_on_one_out_dir_is_refused(tmp_path, capsys, no_model, holder):
    out = tmp_path / "out"
    out.mkdir()
    lock = str(out / outputs.LOCK_NAME)
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    if holder == "this process":
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        release = lambda: os.close(fd)  # noqa: E731
    else:
        code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'pid 4242'); print(1, flush=True); "
                "time.sleep(120)")
        proc = subprocess.Popen([sys.executable, "-c", code, lock], stdout=subprocess.PIPE)
        assert proc.stdout.readline()
        release = lambda: (proc.kill(), proc.wait())  # noqa: E731 - dies holding it
    code, _, err = _main([fasta, "--out-dir", out, "--no-flashlight"], capsys)
    assert code == 2 and err.splitlines() == [err.strip()]
    assert "in use by another flashlight-fold run" in err and "the model was built" not in err
    if holder == "another process":
        assert "pid 4242" in err
    release()
    code, _, err = _main([fasta, "--out-dir", out, "--no-flashlight"], capsys)
    assert code == 2 and "the model was built" in err  # the lock is free again
    assert _hidden(out) == []


def test_leftovers_of_a_killed_run_are_cleared(tmp_path, capsys, no_model):
    out = tmp_path / "out"
    for name in (outputs.STAGING_PREFIX + "rec-x1", outputs.RETIRED_PREFIX + "rec-x2"):
        (out / name).mkdir(parents=True)
        (out / name / "latency.json").write_text("{}")
    (out / outputs.LOCK_NAME).write_text("pid 1 on a dead host\n")
    (out / "keep").mkdir()
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    code, _, err = _main([fasta, "--out-dir", out, "--no-flashlight"], capsys)
    assert code == 2 and "the model was built" in err
    assert sorted(os.listdir(out)) == ["flashlight-fold.log", "keep", "summary.json"]


def test_rerun_interrupted_leaves_no_mixed_folder(rerun):
    out, first_run, code, _, _ = rerun
    assert code == 130
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "Ctrl-C" and summary["run_id"] != first_run
    assert [r["status"] for r in summary["records"]] == ["ok"] + ["not finished"] * 6
    assert summary["not_finished"] == [i for i in HOSTILE if i != "tiny"]
    for record_id in HOSTILE:
        report = _check_one_run(out / safe_name(record_id))
        if record_id == "tiny":  # the rerun's: other seed, no mmCIF, Flashlight on
            assert report["run_id"] == summary["run_id"]
            assert report["options"]["seed"] == 1 and "mmcif" not in report["outputs"]
            assert report["flashlight"]["active"] is True
            assert report["command"][-len(SMALL):] == SMALL
        else:
            assert report["run_id"] == first_run and report["options"]["seed"] == 0
    assert _hidden(out) == []  # no staging folder, no lock file


# -- 6. inputs that used to fail late ---------------------------------------------------

FASTA_CASES = {
    "utf-8 byte-order mark": (b"\xef\xbb\xbf>a\nMKTAYI\n", None),
    "blank lines first": (b"\n  \n>a\nMKTAYI\n", None),
    "windows line ends": (b">a\r\nMKTAYI\r\n", None),
    "text before the header": (b"MKTAYI\n>a\nMKTAYI\n", "line 1 ('MKTAYI') comes before the first '>'"),
    "comment before the header": (b"# notes\n>a\nMK\n", "line 1 ('# notes') comes before"),
    "mark, then no header": (b"\xef\xbb\xbfMKTAYI\n", "line 1 ('MKTAYI') comes before"),
    "utf-16": ("\ufeff>a\nMKTAYI\n".encode("utf-16-le"), "UTF-16 (byte-order mark at byte 0); save it as UTF-8"),
    "one residue": (b">a\nM\n", "record 'a' (#1): too short: 1 residue"),
    "one unusual residue": (b">a\nu\n", "record 'a' (#1): too short: 1 residue"),
}


@pytest.mark.parametrize("case", list(FASTA_CASES))
def test_fasta_problems_are_complete_lines(tmp_path, case):
    data, expected = FASTA_CASES[case]
    path = tmp_path / "in.fasta"
    path.write_bytes(data)
    records, problems = load_inputs([str(path)])
    if expected is None:
        assert problems == [] and [(r.id, r.sequence) for r in records] == [("a", "MKTAYI")]
        return
    assert records == [] and len(problems) == 1
    text = str(problems[0])
    assert text.startswith(str(path)) and expected in text and "\n" not in text


# The record is MKTUYI (folded as MKTCYI).
MSA_CASES = {
    "a3m, byte-order mark": ("q.a3m", b"\xef\xbb\xbf>q\nMKTUYI\n>h\nMKTA-I\n", 2),
    "sto, byte-order mark": ("q.sto", b"\xef\xbb\xbf# STOCKHOLM 1.0\nq MKTUYI\nh MK-AYI\n//\n", 2),
    "query with C for U": ("q.a3m", b">q\nMKTCYI\n>h\nMKTUYI\n", 2),
    "no header": ("q.a3m", b"MKTUYI\nMKTUYI\n", "line 1 ('MKTUYI') comes before the first '>'"),
    "mark and no header": ("q.a3m", b"\xef\xbb\xbfMKTUYI\n", "line 1 ('MKTUYI') comes before"),
    "comment, no header": ("q.a3m", b"# hhblits\nMKTUYI\n", "line 2 ('MKTUYI') comes before"),
    "empty": ("q.a3m", b"", "contains no sequences"),
    "header only": ("q.a3m", b">q\n", "query (first row) has 0 residues"),
    "sto row without sequence": ("q.sto", b"# STOCKHOLM 1.0\nq MKTUYI\nh\n//\n", "line 3 ('h') has 1 field(s)"),
    "sto short row": ("q.sto", b"# STOCKHOLM 1.0\nq MKTUYI\nh MKT\n//\n", "sequence 'h' (line 3) has 3 columns"),
    "utf-16": ("q.a3m", "\ufeff>q\nMKTUYI\n".encode("utf-16-le"), "UTF-16"),
    "nul byte": ("q.a3m", b">q\nMKTUYI\n>h\nMK\x00AYI\n", "NUL byte"),
}


@pytest.mark.parametrize("case", list(MSA_CASES))
def test_msa_problems_are_complete_lines(tmp_path, case):
    name, data, expected = MSA_CASES[case]
    aln = tmp_path / "aln"
    aln.mkdir()
    (aln / name).write_bytes(data)
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTUYI"})
    records, problems = load_inputs([str(fasta)], str(aln))
    if isinstance(expected, int):
        assert problems == [] and records[0].alignment.depth == expected
        assert all(set(row) <= set("ACDEFGHIKLMNPQRSTVWYX-") for row in records[0].alignment.rows)
        return
    assert records == [] and len(problems) == 1
    text = str(problems[0])
    assert text.startswith(f"{fasta}: record 'q' (#1): MSA {aln / name}: ") and expected in text
    assert "\n" not in text


@pytest.mark.parametrize("letter", ["U", "O", "B", "Z", "J", "u", "X"])
def test_featurised_and_written_residues_agree(tmp_path, letter):
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MK" + letter + "A"})
    aln = tmp_path / "aln"
    aln.mkdir()
    (aln / "q.a3m").write_text(f">q\nMK{letter.upper()}A\n>h\nMK{letter.upper()}-\n")
    (record,), problems = load_inputs([str(fasta)], str(aln))
    assert problems == []
    folded = RESIDUE_SUBSTITUTIONS.get(letter.upper(), "X")
    assert record.sequence == "MK" + folded + "A" and record.input_sequence == "MK" + letter.upper() + "A"
    assert record.alignment.rows == [record.sequence, "MK" + folded + "-"]
    note = record.residue_note()
    if folded == "X":
        assert record.unknown_positions == [3] and "position(s) 3 has no atoms" in note
    else:
        assert record.substitutions == [(3, letter.upper(), folded)]
        assert f"{letter.upper()}3->{folded}" in note


def test_unusual_residues_and_short_records_fold(hostile_run):
    _, out, result, _ = hostile_run
    sub = json.loads((out / "sub_1" / "latency.json").read_text())
    assert sub["record"]["sequence"] == "MKCKDELXAC"
    names = ["MET", "LYS", "CYS", "LYS", "ASP", "GLU", "LEU", "ALA", "CYS"]
    assert _pdb_residues(out / "sub_1" / "sub_1.pdb") == list(zip([1, 2, 3, 4, 5, 6, 7, 9, 10], names))
    assert ("warning: record 'sub|1': folded as standard residues: U3->C, O4->K, B5->D, "
            "Z6->E, J7->L; unknown residue X at position(s) 8 has no atoms") in result.stderr
    assert [n for _, n in _pdb_residues(out / "tiny" / "tiny.pdb")] == ["MET", "LYS"]
    bom = json.loads((out / "bom" / "latency.json").read_text())
    assert bom["record"]["msa_depth"] == 2


# -- 8. noise -------------------------------------------------------------------------


def test_quiet_interrupted_rerun_says_one_thing(rerun):
    _, _, code, stdout, stderr = rerun
    assert code == 130 and stdout == ""
    lines = stderr.splitlines()
    others = [i for i in HOSTILE if i != "tiny"]
    assert lines[-1] == (
        f"interrupted (Ctrl-C): 1 of 7 record(s) finished (tiny); not finished: "
        f"{', '.join(repr(i) if ',' in i or not i.isprintable() else i for i in others[:10])}"
        f" (listed in {rerun[0] / 'summary.json'})"
    )
    allowed = re.compile(r"^(WARNING: no --params given|warning: record 'sub\|1': |warning: record .* has no MSA)")
    assert [line for line in lines[:-1] if not allowed.match(line)] == []  # no numpy, no traceback


def test_an_interrupt_swallowed_by_a_finalizer_is_raised_at_the_next_check(monkeypatch):
    """[Note: an interrupt that lands in a finalizer]: the signal arrives while the
    garbage collector runs a weakref callback, which swallows the handler's exception
    (not printed: other unraisable errors still are); the next check (after a recycling
    iteration, before a record) raises it again."""
    import gc
    import weakref

    class Thing:
        pass

    def failing():
        raise ValueError("a finalizer's own error")

    printed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(type(unraisable.exc_value)))
    cli._PENDING.clear()
    with cli._swallowed_interrupts_kept():
        thing, other = Thing(), Thing()
        weakref.finalize(thing, cli._raise_interrupted, signal.SIGTERM, None)  # the handler, mid-callback
        weakref.finalize(other, failing)
        del thing, other
        gc.collect()  # the interrupt did not reach the fold
    assert printed == [ValueError]
    with pytest.raises(cli.Interrupted) as raised:
        cli._check_interrupted()
    assert raised.value.signum == signal.SIGTERM
    cli._PENDING.clear()
    cli._check_interrupted()  # nothing pending: nothing raised


@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_interrupted_before_folding(tmp_path, signum, code, name):
    fasta = write_fasta(tmp_path / "q.fasta", {"a": "MKTAYI", "b": "MKTAYI"})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "flashlight.structures", str(fasta), "--out-dir", str(out),
               "--no-flashlight", *SMALL]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())
    lock, deadline = out / outputs.LOCK_NAME, time.monotonic() + 120
    while not (lock.exists() and lock.read_text()) and proc.poll() is None:
        assert time.monotonic() < deadline, "the output folder was never locked"
        time.sleep(0.01)
    time.sleep(0.2)  # past the lock: building the model
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    # the random-weights warning comes while the model is built: before or after the signal
    lines = [line for line in stderr.splitlines() if not line.startswith("WARNING: no --params")]
    assert lines == [
        f"interrupted ({name}): 0 of 2 record(s) finished; not finished: a, b "
        f"(listed in {out / 'summary.json'})"
    ], stderr
    assert _hidden(out) == []
