"""flashlight.integrations.openfold_compat: OpenFold's in-place softmax extension on CPU."""
import math

import pytest
import torch

pytest.importorskip("openfold")
ext = pytest.importorskip("attn_core_inplace_cuda")

from flashlight.integrations.openfold_compat import (  # noqa: E402
    cpu_compat,
    is_active,
    softmax_inplace_backward_,
    softmax_inplace_forward_,
)


def _rows(t):
    return math.prod(t.shape[:-1]), t.shape[-1]


def test_stub_raises_on_cpu_outside_the_block_and_is_restored():
    logits = torch.randn(2, 3, 4)
    with pytest.raises(RuntimeError):
        ext.forward_(logits, *_rows(logits))
    stub_forward, stub_backward = ext.forward_, ext.backward_
    with cpu_compat():
        assert is_active()
        ext.forward_(logits, *_rows(logits))
    assert not is_active()
    assert ext.forward_ is stub_forward and ext.backward_ is stub_backward
    with pytest.raises(RuntimeError):
        ext.forward_(logits, *_rows(logits))


def test_nested_blocks_keep_the_patch_until_the_outermost_exits():
    stub_forward = ext.forward_
    with cpu_compat():
        with cpu_compat():
            assert is_active()
        assert is_active()
    assert ext.forward_ is stub_forward


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (2, 3, 4, 33), (2, 1, 8, 64)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_forward_matches_softmax(shape, dtype, tol):
    torch.manual_seed(0)
    logits = (torch.randn(shape) * 20).to(dtype)
    # a masked column, as OpenFold's mask bias writes it: inf * (mask - 1) with inf = 1e9
    if shape[-1] > 1:
        logits[..., -1] = -1e9
    expected = torch.softmax(logits.float(), dim=-1)
    data = logits.clone()
    with cpu_compat():
        ext.forward_(data, *_rows(data))
    assert data.dtype == dtype
    torch.testing.assert_close(data.float(), expected, atol=tol, rtol=0)
    torch.testing.assert_close(data.float().sum(-1), torch.ones(shape[:-1]), atol=tol * 8, rtol=0)


def test_direct_functions_match_autograd_of_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    values = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    d_out = torch.randn(2, 3, 6, 4, dtype=torch.float64)
    probs = torch.softmax(logits, dim=-1)
    (probs @ values).backward(d_out)

    buf = logits.detach().clone()
    softmax_inplace_forward_(buf, 2 * 3 * 6, 5)
    torch.testing.assert_close(buf, probs.detach())
    softmax_inplace_backward_(buf, d_out, values, 2 * 3 * 6, 5, 4)
    torch.testing.assert_close(buf, logits.grad)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError):
        softmax_inplace_forward_(torch.zeros(2, 3), 2, 4)


def _reference_attention(q, k, v, b1, b2):
    a = torch.softmax(q @ k.transpose(-1, -2) + b1 + b2, dim=-1)
    return a @ v


def test_openfold_attention_core_forward_and_backward():
    """OpenFold's memory-efficient attention (extra-MSA row attention) against autograd."""
    from openfold.utils.kernel.attention_core import attention_core

    torch.manual_seed(2)
    # [*, H, Q, C] with a mask bias [*, 1, 1, K] and a pair bias [1, H, Q, K]
    q = torch.randn(3, 4, 9, 8, requires_grad=True)
    k = torch.randn(3, 4, 9, 8, requires_grad=True)
    v = torch.randn(3, 4, 9, 8, requires_grad=True)
    mask = (torch.rand(3, 1, 1, 9) > 0.3).float()
    mask[..., 0] = 1.0
    b1 = (1e9 * (mask - 1)).requires_grad_(False)
    b2 = torch.randn(1, 4, 9, 9, requires_grad=True)
    grad = torch.randn(3, 4, 9, 8)

    expected = _reference_attention(q, k, v, b1, b2)
    expected.backward(grad)
    ref_grads = [t.grad.clone() for t in (q, k, v, b2)]
    for t in (q, k, v, b2):
        t.grad = None

    with cpu_compat():
        out = attention_core(q, k, v, b1, b2)
        out.backward(grad)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for name, t, ref in zip("qkvb", (q, k, v, b2), ref_grads):
        torch.testing.assert_close(t.grad, ref, atol=1e-4, rtol=1e-4, msg=f"grad of {name}")


def test_invariant_point_attention_in_place_path_matches_the_plain_path():
    """IPA's in-place softmax (inference under no_grad) gives what its nn.Softmax path gives."""
    from openfold.model.structure_module import InvariantPointAttention
    from openfold.utils.rigid_utils import Rigid, Rotation

    torch.manual_seed(3)
    n_res, c_s, c_z = 11, 16, 8
    ipa = InvariantPointAttention(c_s, c_z, c_hidden=8, no_heads=4, no_qk_points=4, no_v_points=8)
    with torch.no_grad():
        for p in ipa.parameters():  # OpenFold zero-initialises some layers
            p.normal_(0.0, 0.3)
    s = torch.randn(1, n_res, c_s)
    z = torch.randn(1, n_res, n_res, c_z)
    rot, _ = torch.linalg.qr(torch.randn(1, n_res, 3, 3))
    frames = Rigid(Rotation(rot_mats=rot), torch.randn(1, n_res, 3) * 5)
    mask = torch.ones(1, n_res)
    mask[0, -2:] = 0

    with torch.no_grad():
        plain = ipa(s, z, frames, mask, inplace_safe=False)
        with pytest.raises(RuntimeError):
            ipa(s, z, frames, mask, inplace_safe=True)
        with cpu_compat():
            in_place = ipa(s, z, frames, mask, inplace_safe=True)
    torch.testing.assert_close(in_place, plain, atol=1e-5, rtol=1e-5)
