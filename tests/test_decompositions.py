"""Operations rewritten before lowering (flashlight/decompositions.py): every overload of
``var`` and ``std`` as a mean and a sum of squared deviations, matching float64 eager.
Over one dim they become kernels; over several, the sums run in PyTorch (a kernel's loop
reduces one dim), but no ``var`` / ``std`` is left whole."""
from __future__ import annotations

import pytest
import torch

import flashlight

pytest.importorskip("triton")

CASES = {  # name: (function, whether it must become Flashlight kernels)
    "var_over_two_dims": (lambda x: torch.exp(x - x.var((-2, -1), keepdim=True)), False),
    "std_of_everything": (lambda x: x / x.std(), False),
    "var_without_keepdim": (lambda x: x.var(0) + 1, True),
    "std_biased": (lambda x: torch.std(x, 1, unbiased=False), True),
    "var_correction_2": (lambda x: torch.var(x, -1, correction=2), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_variance_overloads_match_float64_and_leave_no_variance_op_to_pytorch(name):
    fn, fuses = CASES[name]
    x = torch.randn(2, 3, 17, 11, generator=torch.Generator().manual_seed(3)) * 2 + 0.5  # [B, H, L, D]
    report = flashlight.explain(fn, x)
    torch.compiler.reset()
    assert report.kernels or not fuses, str(report)
    assert not [op for op in report.fallback_ops if op.name.startswith(("var", "std"))], str(report)
    out = flashlight.compile(fn)(x)
    torch.compiler.reset()
    ref = fn(x.double())
    assert out.shape == ref.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
