"""Two processes under torchrun share the records round robin; rank 0 merges the reports."""
import json
import os
import sys

import pytest

pytest.importorskip("openfold")

from flashlight.structures.distributed import Group, shard  # noqa: E402
from flashlight.structures.testing import TINY_OPTIONS, run_cli, write_fasta  # noqa: E402


def test_round_robin_shards():
    items = list(range(7))
    assert shard(items, Group(rank=0, world_size=3)) == [0, 3, 6]
    assert shard(items, Group(rank=2, world_size=3)) == [2, 5]
    assert shard(items, Group()) == items


def test_two_process_torchrun(tmp_path):
    fasta = write_fasta(
        tmp_path / "batch.fasta",
        {"p0": "NLYIQWLKDG", "p1": "MKTAYIAKQR", "p2": "GPSSGRPPPS"},
    )
    out = tmp_path / "out"
    launcher = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "flashlight.structures",
    ]
    result = run_cli(
        [str(fasta), "--out-dir", str(out), "--no-flashlight", "--no-plot", "--warmup", "0",
         "--device", "cpu", *TINY_OPTIONS],
        launcher=launcher,
        timeout=300,
    )
    assert result.returncode == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    records = summary["records"]
    assert [r["id"] for r in records] == ["p0", "p1", "p2"]
    assert [r["worker"] for r in records] == [0, 1, 0]
    assert all(r["status"] == "ok" for r in records)
    assert summary["failed"] == [] and summary["worker_errors"] == {}
    for record in ("p0", "p1", "p2"):
        report = json.loads((out / record / "latency.json").read_text())
        assert report["record"]["id"] == record
        assert os.path.exists(out / record / f"{record}.pdb")
    # rank 0 prints the merged table once
    assert result.stdout.count("summary.json") == 1
