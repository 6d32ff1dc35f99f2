"""Resumable flashlight-fold batches, inputs and logging (CPU, tiny model, random weights).

``batch`` folds a directory of FASTA files into a fresh folder; the next run on the
same folder skips the complete records, ``--overwrite`` folds again, and a run killed
(SIGKILL) in the middle of a record leaves nothing that looks complete and is finished
by the next run.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("openfold")

from flashlight.structures import outputs  # noqa: E402
from flashlight.structures.testing import cli_env, run_cli, write_fasta  # noqa: E402

SMALL = [
    "--num-blocks", "1", "--recycles", "0", "--warmup", "0", "--no-flashlight",
    "--max-msa-clusters", "4", "--max-extra-msa", "4", "--chunk-size", "none", "--no-plot",
]
RECORDS = {"one": "MKTAYIAKQR", "two": "NLYIQWLKDG", "three": "GPSSGRPPPS"}


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def _run_ids(out):
    return {n: json.loads((out / n / "latency.json").read_text())["run_id"] for n in RECORDS}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    inputs = root / "inputs"
    inputs.mkdir()
    write_fasta(inputs / "b.fa", {"two": RECORDS["two"]})
    write_fasta(inputs / "a.fasta", {"one": RECORDS["one"]})
    write_fasta(inputs / "c.faa", {"three": RECORDS["three"]})
    (inputs / "notes.txt").write_text("not an input\n")
    out = root / "out"
    first = run_cli([inputs, "--out-dir", out, "--quiet", *SMALL])
    assert first.returncode == 0, first.output
    first_ids, first_summary = _run_ids(out), _summary(out)
    again = run_cli([inputs, "--out-dir", out, *SMALL])
    assert again.returncode == 0, again.output
    again_summary = _summary(out)
    overwrite = run_cli([inputs / "a.fasta", "--out-dir", out, "--overwrite", "--quiet", *SMALL])
    assert overwrite.returncode == 0, overwrite.output
    return root, out, first, first_ids, first_summary, again, again_summary, overwrite


def test_directory_inputs_fold_in_name_order(batch):
    _, out, first, _, summary, *_ = batch
    assert [r["id"] for r in summary["records"]] == ["one", "two", "three"]
    assert all(r["status"] == "ok" and r["worker"] == 0 for r in summary["records"])
    assert all(r["msa"] == "none (single sequence)" for r in summary["records"])
    for name in RECORDS:
        assert f"warning: record {name!r} has no MSA: folded in single-sequence mode" in first.stderr
    assert first.stdout == ""


def test_second_run_skips_complete_records(batch):
    _, out, _, first_ids, _, again, again_summary, _ = batch
    for name in RECORDS:
        assert (f"record {name!r}: outputs complete in {out / name} (run {first_ids[name]}, "
                "same options); skipped (--overwrite folds it again)") in again.stdout
    assert "model:" not in again.stdout  # nothing left to fold: no model built
    assert "RANDOM WEIGHTS" not in again.stderr
    assert [r["id"] for r in again_summary["records"]] == list(RECORDS)
    assert all(r["skipped"] and r["run_id"] == first_ids[r["id"]] for r in again_summary["records"])
    assert "done before" in again.stdout


def test_overwrite_folds_again_and_summary_merges(batch):
    _, out, _, first_ids, _, _, _, _ = batch
    summary = _summary(out)
    ids = _run_ids(out)
    assert ids["one"] == summary["run_id"] != first_ids["one"]
    assert ids["two"] == first_ids["two"] and ids["three"] == first_ids["three"]
    # this run's record first, then the earlier summary's others
    assert [r["id"] for r in summary["records"]] == ["one", "two", "three"]
    assert "skipped" not in summary["records"][0] and summary["records"][1]["skipped"]


def test_changed_options_fold_again(batch, tmp_path):
    _, out, *_ = batch
    from flashlight.structures import resume
    from flashlight.structures.inputs import load_inputs

    (record,), _ = load_inputs([str(write_fasta(tmp_path / "q.fasta", {"one": RECORDS["one"]}))])
    report = json.loads((out / "one" / "latency.json").read_text())
    options = dict(report["options"])
    assert resume.complete_report(str(out), record, options) is not None
    for key, value in (("seed", 7), ("num_blocks", 2), ("mmcif", True), ("relax", True)):
        assert resume.complete_report(str(out), record, {**options, key: value}) is None, key
    for key, value in (("repeats", 5), ("warmup", 2), ("flashlight", True)):
        assert resume.complete_report(str(out), record, {**options, key: value}) is not None, key
    (other,), _ = load_inputs([str(write_fasta(tmp_path / "r.fasta", {"one": RECORDS["two"]}))])
    assert resume.complete_report(str(out), other, options) is None  # another sequence


def test_log_file_has_a_header_per_run_and_timestamps(batch):
    _, out, *_ = batch
    lines = (out / "flashlight-fold.log").read_text().splitlines()
    headers = [line for line in lines if " run " in line and "flashlight-fold " in line]
    assert len(headers) == 3 and "--overwrite" in headers[-1]
    stamped = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) +\[worker 0\] ")
    assert all(stamped.match(line) for line in headers)
    assert any(" WARNING " in line and "has no MSA" in line for line in lines)
    assert any(" INFO " in line and "features in" in line for line in lines)


def test_invalid_run_leaves_the_summary_untouched(batch, tmp_path):
    _, out, *_ = batch
    before = (out / "summary.json").read_bytes()
    bad = write_fasta(tmp_path / "bad.fasta", {"bad": "MK*T"})
    result = run_cli([bad, "--out-dir", out, *SMALL])
    assert result.returncode == 2 and "invalid residue '*'" in result.stderr
    assert (out / "summary.json").read_bytes() == before


def test_require_msa_is_an_input_error(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", {"q": "MKTAYI"})
    result = run_cli([fasta, "--out-dir", tmp_path / "out", "--require-msa", *SMALL])
    assert result.returncode == 2
    assert f"{fasta}: record 'q' (#1): no MSA (--require-msa)" in result.stderr
    assert "RANDOM WEIGHTS" not in result.stderr and not (tmp_path / "out").exists()


def test_empty_input_directory_is_an_input_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_cli([tmp_path / "empty", "--out-dir", tmp_path / "out", *SMALL])
    assert result.returncode == 2 and "directory holds no input files" in result.stderr


def test_killed_run_leaves_no_complete_looking_record(tmp_path):
    fasta = write_fasta(tmp_path / "q.fasta", RECORDS)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "flashlight.structures", str(fasta), "--out-dir", str(out),
               "--quiet", *SMALL]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())
    deadline = time.monotonic() + 300
    while not (out / "one" / "latency.json").exists():  # the first record is done
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the run ended before its first record: " + proc.communicate()[1])
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # in the middle of the second record
    proc.communicate(timeout=60)
    assert not (out / "two").exists() and not (out / "three").exists()
    assert not (out / "summary.json").exists()  # killed: nothing written at the end
    result = run_cli([fasta, "--out-dir", out, *SMALL])
    assert result.returncode == 0, result.output
    assert "record 'one': outputs complete" in result.stdout
    summary = _summary(out)
    assert [(r["id"], r["status"], bool(r.get("skipped"))) for r in summary["records"]] == [
        ("one", "ok", True), ("two", "ok", False), ("three", "ok", False)]
    assert not [n for n in os.listdir(out) if n.startswith(outputs.STAGING_PREFIX)]
