"""bench/module_spans.py: the graphed modules' calls of one fold, timed by global hooks."""
from __future__ import annotations

import json

from bench import module_spans
from flashlight.structures.testing import TINY_OPTIONS


def test_every_call_of_the_stacks_and_structure_module_is_timed(tmp_path):
    """A stock fold on the CPU with one recycling iteration: each of the three modules
    is called twice, eagerly (no graphs off the GPU), with a host span and no device span."""
    out, fasta = tmp_path / "spans.json", tmp_path / "one.fasta"
    fasta.write_text(">trp_cage\nNLYIQWLKDGGPSSGRPPPS\n")
    options = [o if o != "0" or TINY_OPTIONS[k - 1] != "--recycles" else "1" for k, o in enumerate(TINY_OPTIONS)]
    fold = [str(fasta), "--device", "cpu", "--no-flashlight", "--out-dir", str(tmp_path / "out"), *options]
    assert module_spans.main(["--out", str(out), "--", *fold]) == 0
    data = json.loads(out.read_text())
    calls = data["calls"]
    assert sorted(c["module"] for c in calls) == sorted(module_spans.MODULES * 2), calls
    assert all(c["path"] == "eager" and c["host_ms"] > 0 and c["device_ms"] is None for c in calls)
    assert data["exit"] == 0 and data["sum_device_ms"] is None
    # the hooks are gone afterwards: another module's call is not timed
    spans = module_spans.Spans()
    spans.close()
    assert spans.rows() == []


def test_calls_are_labelled_by_what_the_graphed_forward_counted():
    """A call during which the module's graphed forward recorded is ``record``, one during
    which it replayed is ``replay``, one with neither ``eager``."""
    import torch

    class Counting:
        def __init__(self, sequence):
            self.recordings = self.replays = 0
            self.sequence = iter(sequence)

        def __call__(self, x):
            step = next(self.sequence)
            self.recordings += step == "record"
            self.replays += step in ("record", "replay")
            return x

    class EvoformerStack(torch.nn.Module):  # named as a graphed class
        pass

    module = EvoformerStack()
    module.forward = Counting(["eager", "record", "replay"])
    spans = module_spans.Spans()
    try:
        for _ in range(3):
            module(torch.ones(2))
        torch.nn.Linear(2, 2)(torch.ones(2))  # not a graphed class: not timed
    finally:
        spans.close()
    assert [r["path"] for r in spans.rows()] == ["eager", "record", "replay"]
