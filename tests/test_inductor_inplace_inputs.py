"""Inputs the graph overwrites hold its elementwise results ([Note: writing into an input
the graph overwrites] in ``flashlight/inductor.py``).

The pass runs on functionalized ATen graphs (the form AOTAutograd hands the backend, with
the input mutations kept as ``copy_`` at the end); each rewritten graph must compute what
the function computes, its input mutations included, on fresh random inputs. Then one
in-place residual update with attention inside is compiled end to end (Inductor's C++
around an interpreted Flashlight kernel) and checked against float64 eager.
"""
from __future__ import annotations

import unittest.mock

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import flashlight.inductor
from flashlight import settings
from flashlight.backend import make_backend
from tests.helpers import rand

COPY = torch.ops.aten.copy_.default


def _graph(fn, *args):
    """``fn`` functionalized (input mutations as ``copy_`` at the end) and traced on fake
    copies of ``args``: the graph the backend receives."""
    functional = torch.func.functionalize(fn, remove="mutations_and_views")
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(a) for a in args]
        return make_fx(functional)(*fakes)


def _check(fn, args, writes: int):
    """The pass rewrites ``writes`` nodes of ``fn``'s graph, and the rewritten graph gives
    ``fn``'s outputs and leaves its inputs as ``fn`` does."""
    gm = _graph(fn, *args)
    assert flashlight.inductor.write_into_overwritten_inputs(gm) == writes
    want_args = [a.clone() for a in args]
    want = fn(*want_args)
    got_args = [a.clone() for a in args]
    got = gm(*got_args)
    pairs = zip(want, got) if isinstance(want, tuple) else [(want, got)]
    for w, g in pairs:
        assert not g.isnan().any()
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    for w, g in zip(want_args, got_args):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    return gm


def residual_stream(x, w1, w2):
    """Two pre-norm residual updates of ``x`` [S, R, C] in place (OpenFold's ``m += ...``)."""
    x += torch.sigmoid(F.layer_norm(x, x.shape[-1:]) @ w1)
    x += torch.relu(F.layer_norm(x, x.shape[-1:]) @ w2) @ w2.t()
    return x


def test_a_residual_chain_is_stored_in_the_input_it_overwrites():
    args = [rand(5, 7, 8, seed=1), rand(8, 8, seed=2), rand(8, 16, seed=3)]
    gm = _check(residual_stream, args, writes=2)
    copies = [n for n in gm.graph.nodes if n.target is COPY]
    assert len(copies) == 2  # one per update; the final copy onto itself is gone
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert all(c.args[0] is placeholder for c in copies)


def old_value_read_late(x, a):
    """The input's old value is read (through a transposed view) after the update is
    computed: storing the update in the input would change what that read sees."""
    t = x.transpose(0, 1)
    y = x + a
    out = t * 3.0
    x.copy_(y)
    return out


def reads_itself_transposed(x):
    """An update that reads other elements of the input than the one it writes."""
    x.copy_(x + x.transpose(0, 1))
    return x.sum()


def returns_the_first_update(x, a):
    """The first update is returned, the input ends with another value: the update must
    not live in the input's buffer."""
    y = x + a
    x.copy_(y * 2.0)
    return y


def test_no_rewrite_where_the_old_value_is_still_read():
    _check(old_value_read_late, [rand(6, 6, seed=4), rand(6, 6, seed=5)], writes=0)
    _check(reads_itself_transposed, [rand(6, 6, seed=6)], writes=0)


def test_no_rewrite_where_the_update_is_read_after_the_final_copy():
    """``x + a`` is the last read of ``x`` but is returned, and the final copy writes
    another value into ``x``: storing it there would change the returned tensor. (The
    functional ``aten.copy`` of the traced graph, which reads ``x`` last, is taken out.)"""
    args = [rand(6, 6, seed=13), rand(6, 6, seed=14)]
    gm = _graph(returns_the_first_update, *args)
    functional_copy = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.copy.default)
    functional_copy.replace_all_uses_with(functional_copy.args[1])
    gm.graph.erase_node(functional_copy)
    gm.recompile()
    assert flashlight.inductor.write_into_overwritten_inputs(gm) == 0
    x = args[0].clone()
    torch.testing.assert_close(gm(x, args[1]), args[0] + args[1], rtol=0, atol=0)
    torch.testing.assert_close(x, (args[0] + args[1]) * 2.0, rtol=0, atol=0)


def not_mutated(x, a):
    """A function that does not write its input: the caller's tensor must stay as it was."""
    return torch.sigmoid(x + a) * x


def broadcast_update(x, a):
    """An update to a different shape than the input's cannot live in its buffer."""
    y = x + a  # [4, 6] + [3, 1, 6] -> [3, 4, 6]
    x.mul_(2.0)
    return y


def test_inputs_not_overwritten_or_of_another_shape_are_left_alone():
    _check(not_mutated, [rand(4, 6, seed=7), rand(4, 6, seed=8)], writes=0)
    gm = _check(broadcast_update, [rand(4, 6, seed=9), rand(3, 1, 6, seed=10)], writes=1)
    # the doubling is the write; the broadcast sum has its own buffer
    assert sum(n.target is COPY for n in gm.graph.nodes) == 1


def attention_update(x, wq, wk, wv, wo):
    """``x`` [B, L, D] += a softmax attention over its layer norm, projected, in place."""
    h = F.layer_norm(x, x.shape[-1:])
    q, k, v = h @ wq, h @ wk, h @ wv
    x += (torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v) @ wo
    return x


def test_an_in_place_update_compiled_through_inductor_matches_float64():
    """End to end: Flashlight's kernel for the attention, Inductor for the rest, the sum
    stored in the caller's tensor, which is returned (as eager's ``+=`` does)."""
    args = [rand(2, 11, 16, seed=11)] + [rand(16, 16, seed=12 + i) / 4 for i in range(4)]
    torch.compiler.reset()
    written = []
    real = flashlight.inductor.write_into_overwritten_inputs
    spy = unittest.mock.patch.object(flashlight.inductor, "write_into_overwritten_inputs",
                                     side_effect=lambda gm: written.append(real(gm)) or written[-1])
    fn = torch.compile(attention_update, backend=make_backend(remainder="inductor"))
    x = args[0].clone()
    with settings.override(on_error="raise"), torch.no_grad(), spy:
        out = fn(x, *args[1:])
    torch.compiler.reset()
    assert written == [1]  # the sum, stored in x
    assert out is x  # the caller's tensor, updated
    want = attention_update(*[a.double() for a in args])
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def cached_attention(q, k_cache, v_cache, k_new, v_new, position: int):
    """A decoding step: the new key and value written into the caches (inputs mutated
    through a slice), then attention over the filled part. q [B, 1, D], caches [B, T, D]."""
    k_cache[:, position] = k_new
    v_cache[:, position] = v_new
    k, v = k_cache[:, : position + 1], v_cache[:, : position + 1]
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_inputs_written_through_a_slice_are_updated_as_in_eager():
    """A mutation through a view is a scatter, not an elementwise write: it is left to
    Inductor, and the caches hold what eager writes."""
    B, T, D = 2, 9, 16
    q, kc, vc = rand(B, 1, D, seed=20), rand(B, T, D, seed=21), rand(B, T, D, seed=22)
    kn, vn = rand(B, D, seed=23), rand(B, D, seed=24)
    torch.compiler.reset()
    fn = torch.compile(cached_attention, backend=make_backend(remainder="inductor"))
    got_k, got_v = kc.clone(), vc.clone()
    with settings.override(on_error="raise"), torch.no_grad():
        out = fn(q, got_k, got_v, kn, vn, 5)
    torch.compiler.reset()
    want_k, want_v = kc.double(), vc.double()
    want = cached_attention(q.double(), want_k, want_v, kn.double(), vn.double(), 5)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k.double(), want_k, rtol=0, atol=0)
    torch.testing.assert_close(got_v.double(), want_v, rtol=0, atol=0)
