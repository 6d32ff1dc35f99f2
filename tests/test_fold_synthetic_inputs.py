"""The synthetic timing inputs: deterministic, valid for ``flashlight-fold``, deep enough."""
from __future__ import annotations

from flashlight.structures.examples import make_synthetic
from flashlight.structures.inputs import load_inputs


def test_synthetic_record_and_alignment_load_and_repeat(tmp_path):
    fasta, a3m = make_synthetic.write(str(tmp_path / "a"), length=48, depth=64, seed=7)
    again = make_synthetic.write(str(tmp_path / "b"), length=48, depth=64, seed=7)
    assert [open(p).read() for p in (fasta, a3m)] == [open(p).read() for p in again]
    records, problems = load_inputs([fasta], str(tmp_path / "a"))
    assert not problems, problems
    record = records[0]
    assert record.length == 48 and record.alignment is not None
    rows = record.alignment.rows
    assert len(rows) == 64 == len(set(rows)) and rows[0] == record.sequence
    assert all(len(row) == 48 for row in rows)  # insertions dropped, columns kept
    identity = [sum(a == b for a, b in zip(row, rows[0])) / 48 for row in rows[1:]]
    assert 0.2 < min(identity) and max(identity) < 1.0
    assert any("-" in row for row in rows[1:])
