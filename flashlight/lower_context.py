"""The lowering context: what a lowering rule may do while it lowers one FX node.

A rule (in :mod:`flashlight.lower` or :mod:`flashlight.lower_reductions`) is
``rule(lw: LowerContext, node) -> Access``: it reads its operands' lowered values
(:meth:`LowerContext.value`), reads them at the result's axes (:meth:`read`), makes
fresh output axes (:meth:`result_axes`) and adds nests (:meth:`add_nest`). The driver
(:func:`flashlight.lower.lower`) owns everything else: the order of nodes, which nodes
run outside Flashlight, and undoing what a rule built before it gave up.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from flashlight.constants import fold_constants, rounded
from flashlight.indexing import Access, Unsupported, finest, match_axis, meta_val, node_shape
from flashlight.ir import Axis, Const, Dim, Expr, Load, Nest, Pointwise, Ref, SizeValue, axis_dims


class LowerContext:
    """The values lowered so far and the nests built, for the rules to extend."""

    def __init__(self):
        self.env: dict[str, Access | Const] = {}  # FX node name -> its lowered value
        self.nests: list[Nest] = []
        self.inputs: list[str] = []
        self.nest_of_node: dict[str, str] = {}  # FX node name -> the nest computing it
        self.tuple_values: dict[str, tuple[Access | Const, ...]] = {}  # tuple-valued node -> its items
        self.origin = ""  # the FX node being lowered: the origin of the nests added
        self.stored: set[str] = set()  # nests read from memory by a lookup: kept separate
        # nests compared outside Flashlight for a tie, and those a max or min of them reads:
        # every kernel reads them from memory ([Note: ties between recomputed values])
        self.tied: set[str] = set()

    def stored_tensor(self, nest: str) -> str | None:
        """The FX node whose value nest ``nest`` computes, now to be read from memory (at
        computed positions, by a lookup), or None where no node's value is that nest's."""
        node = next((n for n, computed in self.nest_of_node.items() if computed == nest), None)
        if node is not None:
            self.stored.add(nest)
            if node not in self.inputs:
                self.inputs.append(node)
        return node

    # ---- values
    def input_access(self, node: fx.Node) -> Access:
        shape = node_shape(node)
        axes = tuple(() if s == 1 else (Dim.fresh(s, "t"),) for s in shape)
        self.inputs.append(node.name)
        return Access("input", node.name, axes, axes, meta_val(node).dtype)

    def add_nest(self, axes: tuple[Axis, ...], body: Expr, dtype: torch.dtype, hint: str) -> Access | Const:
        """A nest computing ``body`` over ``axes``; a single value computed from constants
        only (a scale ``1 / sqrt(d)`` of a head width) is computed now instead, as eager
        PyTorch computes it, and is a constant of the IR."""
        if not axis_dims(axes):
            folded = fold_constants(body)
            if folded is not None:
                return folded
        name = f"n{len(self.nests)}_{hint}"
        self.nests.append(Nest(name, axes, body, dtype, (self.origin,)))
        return Access("nest", name, axes, axes, dtype)

    def read(self, value: Access | Expr, out_axes: tuple[Axis, ...]) -> Expr:
        """The expression reading ``value`` broadcast (right-aligned) to ``out_axes``; a
        scalar (a constant, a size) is the same everywhere."""
        if not isinstance(value, Access):
            return value
        offset = len(out_axes) - len(value.axes)
        if offset < 0:
            raise Unsupported("operand has more axes than the result")
        mapping: dict[Dim, Axis] = {}
        for k, own in enumerate(value.axes):
            target = out_axes[offset + k]
            if not own:
                continue
            if not target:
                raise Unsupported("cannot broadcast a non-unit axis to a unit axis")
            mapping.update(match_axis(own, target))
        for d in axis_dims(value.index):
            mapping.setdefault(d, ())  # size-1 dims not visible through the view
        index = tuple(tuple(x for d in axis for x in mapping[d]) for axis in value.index)
        if value.kind == "input":
            return Load(value.name, index, value.dtype)
        return Ref(value.name, index, value.dtype)

    def result_axes(self, node: fx.Node, operands: list[Access | Const]) -> tuple[Axis, ...]:
        """Fresh output axes for an elementwise node, factored like its operands' axes."""
        shape = node_shape(node)
        axes: list[Axis] = []
        for k, size in enumerate(shape):
            if size == 1:
                axes.append(())
                continue
            factors = finest([op.axes[k - (len(shape) - len(op.axes))] for op in operands
                              if isinstance(op, Access) and k - (len(shape) - len(op.axes)) >= 0])
            sizes = factors or [size]
            axes.append(tuple(Dim.fresh(s) for s in sizes))
        return tuple(axes)

    def value(self, arg: Any, dtype: torch.dtype) -> Access | Expr:
        """Operand ``arg`` of an op computed in ``dtype``: a tensor's access, or a scalar
        (a constant; a size, cast to a float op's dtype)."""
        if isinstance(arg, fx.Node):
            found = self.env.get(arg.name)
            if found is None:
                raise Unsupported(f"operand {arg.name} has no lowering")
            if isinstance(found, SizeValue) and (dtype.is_floating_point or dtype not in (torch.int64, torch.bool)):
                return Pointwise("cast", (found,), dtype)  # a size in a float op: eager's promotion
            if isinstance(found, Const) and isinstance(arg.meta.get("val"), torch.SymFloat):
                return scalar(found.value, dtype)  # a float of sizes: a Python scalar of the op
            return found
        if isinstance(arg, (bool, int, float)):
            return scalar(arg, dtype)
        raise Unsupported(f"operand {arg!r}")


    # ---- tuple-valued nodes (max(dim), native_layer_norm)
    def set_tuple(self, node: fx.Node, *values: Access | Const) -> None:
        """``node``'s value is a tuple whose first items are ``values`` (those lowered)."""
        self.tuple_values[node.name] = values

    def item_of_tuple(self, node: fx.Node, source: Any, index: int) -> Access | Const | None:
        """Item ``index`` of tuple-valued ``source``, now computed by ``node``; None when
        that item was not lowered."""
        values = self.tuple_values.get(getattr(source, "name", None), ())
        if not 0 <= index < len(values):
            return None
        value = values[index]
        if isinstance(value, Access) and value.kind == "nest":
            self.nest_of_node[node.name] = value.name
        return value


def scalar(value, dtype: torch.dtype) -> Const:
    """A Python scalar as an operand of an op computed in ``dtype``: an integer wraps into
    an integer dtype's range, as PyTorch wraps it ([Note: integer and boolean arithmetic]
    in :mod:`flashlight.lower`)."""
    if isinstance(value, int) and not isinstance(value, bool) and dtype != torch.bool \
            and not dtype.is_floating_point:
        value = rounded(value, dtype)
    return Const(value, dtype)


def compared(value: Access | Const) -> Access | Const:
    """An operand of a comparison: a float scalar compared in a 16-bit float dtype is
    rounded to it first, as PyTorch compares it (arithmetic keeps it whole: PyTorch
    computes 16-bit floats with their scalars in float32)."""
    if isinstance(value, Const) and isinstance(value.value, float) and value.dtype in (torch.float16, torch.bfloat16):
        return Const(rounded(value.value, value.dtype), value.dtype)
    return value
