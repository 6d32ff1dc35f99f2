"""The online loop over whole key tiles runs without bounds checks along the keys; the
last, partial tile runs with them (``codegen.py``), in kernels whose dots run on tensor
cores (here TF32; the interpreter's source has the GPU's loops, its tiles 16 keys)."""
from __future__ import annotations

import pytest
import torch

import flashlight
from flashlight import settings


@pytest.fixture(autouse=True)
def tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def _attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v


def _loops(source: str) -> list[str]:
    """The text of each key loop of a kernel source (from its header to the next loop)."""
    return ["for start_n in range(" + part for part in source.split("for start_n in range(")[1:]]


def test_whole_key_tiles_are_read_and_reduced_without_bounds_checks(gen):
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    (kernel,) = flashlight.explain(_attention, q, k, v).kernels
    torch.compiler.reset()
    whole, last = _loops(kernel.source)
    assert whole.startswith("for start_n in range(0, N_FULL, BLOCK_N)")
    assert "< N_SIZE" not in whole and "(offs_n[:, None] < 40)" not in whole
    assert last.startswith("for start_n in range(N_FULL, N_SIZE, BLOCK_N)")
    assert "< N_SIZE" in last and "(offs_n[:, None] < 40)" in last


def test_ieee_float32_kernels_keep_one_loop(gen):
    """Float32 dots on the CUDA cores (TF32 off, ``FLASHLIGHT_FP32_DOTS=ieee``) keep
    their operand tiles in registers: one loop. As three TF32 products (the default with
    TF32 off) they run on the tensor cores, with the whole tiles' loop apart."""
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen) for _ in range(3))
    with settings.override(fp32_dots="ieee"):
        (kernel,) = flashlight.explain(_attention, q, k, v).kernels
    torch.compiler.reset()
    (loop,) = _loops(kernel.source)
    assert loop.startswith("for start_n in range(0, N_SIZE, BLOCK_N)")
    assert 'input_precision="ieee"' in loop
    (kernel,) = flashlight.explain(_attention, q, k, v).kernels
    torch.compiler.reset()
    whole, last = _loops(kernel.source)
    assert whole.startswith("for start_n in range(0, N_FULL, BLOCK_N)")
    assert 'input_precision="tf32x3"' in whole and 'input_precision="tf32x3"' in last


def test_lengths_with_and_without_a_partial_tile_match_float64(gen):
    fn = flashlight.compile(_attention)
    for L in (40, 48, 17, 16):  # 40, 17: a partial last tile; 48, 16: none (the last loop is empty)
        q, k, v = (torch.randn(2, 3, L, 16, generator=gen) for _ in range(3))
        out = fn(q, k, v)  # after the first length, one kernel with the length as an argument
        ref = _attention(q.double(), k.double(), v.double())
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
