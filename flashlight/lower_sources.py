"""Lowering rules for values made from no tensor: fills (``full``, ``ones``, ``zeros``
and their ``_like``/``new_`` forms), ``scalar_tensor``, ``arange``, and the random values
of ``flashlight.uniform`` ([Note: dropout inside a kernel] in
:mod:`flashlight.random_ops`), which read only a seed."""
from __future__ import annotations

import torch
import torch.fx as fx

import flashlight.random_ops  # noqa: F401 - defines torch.ops.flashlight.uniform
from flashlight.indexing import Access, Unsupported, meta_val, node_shape
from flashlight.ir import Const, Dim, Expr, Iota, Pointwise, axis_dims
from flashlight.lower_context import LowerContext

aten = torch.ops.aten


def _full(lw: LowerContext, node: fx.Node) -> Access:
    dtype = meta_val(node).dtype
    shape = node_shape(node)
    axes = tuple(() if s == 1 else (Dim.fresh(s),) for s in shape)
    if node.target in (aten.full.default, aten.full_like.default):
        fill = node.args[1]
    elif node.target is aten.new_full.default:
        fill = node.args[2]
    else:
        fill = 1 if node.target in (aten.ones.default, aten.ones_like.default, aten.new_ones.default) else 0
    if not isinstance(fill, (int, float, bool)):
        raise Unsupported("a fill value that is not a number")
    return lw.add_nest(axes, Const(fill, dtype), dtype, "full")


def _scalar_tensor(lw: LowerContext, node: fx.Node) -> Access | Const:
    dtype = meta_val(node).dtype
    value = lw.value(node.args[0], dtype)
    if isinstance(value, Access):
        raise Unsupported("a scalar tensor of a tensor")
    if isinstance(value, Const):
        value = Const(value.value, dtype)
    return lw.add_nest((), value, dtype, "scalar")  # a number, or a size ([Note: sizes used as values])


def _arange(lw: LowerContext, node: fx.Node) -> Access:
    dtype = meta_val(node).dtype
    (n,) = node_shape(node)
    start = node.args[0] if node.target is aten.arange.start and len(node.args) > 1 else 0
    step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
    if not isinstance(start, int) or step != 1:
        raise Unsupported("arange with a non-integer start or a step")
    axis = (Dim.fresh(n),) if n != 1 else ()  # a unit axis, like every size-1 axis here
    body: Expr = Iota(axis) if axis else Const(0, torch.int64)
    if start:
        body = Pointwise("add", (body, Const(start, torch.int64)), torch.int64)
    if dtype != torch.int64:
        body = Pointwise("cast", (body,), dtype)
    return lw.add_nest((axis,), body, dtype, "arange")


def _uniform(lw: LowerContext, node: fx.Node) -> Access:
    """``flashlight.uniform(seed, shape)``: Philox of the seed and each element's
    counters, the position within the last two dims and over the dims before them
    ([Note: dropout inside a kernel] in :mod:`flashlight.random_ops`)."""
    axes = tuple(() if s == 1 else (Dim.fresh(s),) for s in node_shape(node))
    seed = lw.value(node.args[0], torch.int64)
    if not isinstance(seed, Access) or seed.axes:
        raise Unsupported("a seed that is not one int64 value")
    lead, trail = axis_dims(axes[:-2]), axis_dims(axes[-2:])
    c0 = Iota(trail) if trail else Const(0, torch.int64)
    c1 = Iota(lead) if lead else Const(0, torch.int64)
    body = Pointwise("uniform", (lw.read(seed, ()), c0, c1), torch.float32)
    return lw.add_nest(axes, body, torch.float32, "uniform")


SOURCE_LOWERINGS = {
    aten.full.default: _full,
    aten.ones.default: _full,
    aten.zeros.default: _full,
    aten.full_like.default: _full,
    aten.ones_like.default: _full,
    aten.zeros_like.default: _full,
    aten.new_full.default: _full,
    aten.new_ones.default: _full,
    aten.new_zeros.default: _full,
    aten.scalar_tensor.default: _scalar_tensor,
    aten.arange.default: _arange,
    aten.arange.start: _arange,
    aten.arange.start_step: _arange,
    torch.ops.flashlight.uniform.default: _uniform,
}
