"""The op vocabulary (:mod:`flashlight.vocabulary`) agrees with the stages that use it."""
from __future__ import annotations

import torch

from flashlight import vocabulary
from flashlight.codegen import TL_DTYPES
from flashlight.lower import LOWERINGS

aten = torch.ops.aten
PRINTED_BY_RULE = {"pow", "cast"} | vocabulary.DIVISION_OPS  # codegen's own rules


def test_every_aten_overload_of_an_op_is_lowered():
    for name, op in vocabulary.OPS.items():
        for overload in op.aten:
            packet, kind = overload.split(".")
            target = getattr(getattr(aten, packet), kind)
            assert target in LOWERINGS, f"{name}: {overload} has no lowering rule"


def test_every_op_prints():
    for name, op in vocabulary.OPS.items():
        assert (op.triton is None) == (name in PRINTED_BY_RULE), name
        if op.triton is not None:
            text = op.triton.format(*(f"a{k}" for k in range(op.arity)))
            assert all(f"a{k}" in text for k in range(op.arity)), f"{name} drops an operand: {text}"


def test_sets_are_consistent():
    assert vocabulary.COMPARISONS <= vocabulary.INTERVAL_OPS <= vocabulary.INTEGER_EXACT
    assert not vocabulary.DIVISION_OPS & vocabulary.INTERVAL_OPS
    assert torch.bool in TL_DTYPES
