"""Comparisons of values the kernels compute again: what keeps them agreeing with eager.

A kernel recomputes what it can rather than read it from memory, and computes 16-bit
floats in float32. Neither shows in arithmetic, but an op whose result jumps at a
last-bit difference (a comparison, a rounding) can turn a rounding difference into a
different result. The lowering (:mod:`flashlight.lower`) asks this module which values
every kernel must read from memory, how a 16-bit operand of a comparison is rounded,
and which comparisons it leaves to PyTorch.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from flashlight.indexing import Access, Unsupported
from flashlight.ir import Expr, Pointwise, Reduce, Ref, walk
from flashlight.lower_context import LowerContext
from flashlight.vocabulary import DISCONTINUOUS_ATEN, HALF_DTYPES

# [Note: a value compared with its copy]
# A value needed outside Flashlight (an op with no lowering reads it) is materialized, and
# a kernel that uses it may compute it again in its own loop rather than read it
# (``Graph.recomputed``): scores recomputed tile by tile cost less than reading an
# ``L x L`` tensor. The two copies agree to the last bits their summation orders allow,
# which is enough for every continuous use. It is not where the kernel compares its copy
# with a value computed outside *from the materialized one*: ``s < s.topk(8).values[...,
# -1:]`` keeps exactly the 8 largest scores in eager, but a recomputed score one unit in
# the last place below its materialized twin drops out, and a row keeps 7 (every row of
# a test changed, by 0.2 relative). Such a nest is therefore read from memory: one whose
# Flashlight-computed descendants include a discontinuous op (a comparison, a rounding,
# ``DISCONTINUOUS`` in flashlight.vocabulary) with an operand derived from the nest
# through an op outside Flashlight.


def compared_with_a_copy(gm: fx.GraphModule, env: dict, opaque: dict[str, str],
                         outside: frozenset[str]) -> frozenset[str]:
    """The nests of ``outside`` (needed outside Flashlight) that a kernel must read rather
    than compute again ([Note: a value compared with its copy]). ``env``: each FX node's
    lowered value; ``opaque``: the nodes left outside Flashlight."""
    readers: dict[str, list[fx.Node]] = {}  # nest -> the nodes that are it or a view of it
    for node in gm.graph.nodes:
        found = env.get(node.name)
        if isinstance(found, Access) and found.kind == "nest" and node.name not in opaque:
            readers.setdefault(found.name, []).append(node)
    kept = set()
    for nest in outside:
        inside: set[fx.Node] = set()  # computed from the nest by Flashlight alone
        derived: set[fx.Node] = set()  # computed from it through an op outside Flashlight
        stack = [(node, False) for node in readers.get(nest, ())]
        while stack:
            node, through_outside = stack.pop()
            for user in node.users:
                via = through_outside or user.name in opaque
                reached = derived if via else inside
                if user.op == "call_function" and user not in reached:
                    reached.add(user)
                    stack.append((user, via))
        if any(_aten_name(n) in DISCONTINUOUS_ATEN and any(a in derived for a in n.all_input_nodes)
               for n in inside):
            kept.add(nest)
    return frozenset(kept)


def _aten_name(node: fx.Node) -> str:
    """``aten::packet.overload`` of an ATen node ("" for other targets)."""
    name = getattr(node.target, "name", None)
    return name() if callable(name) else ""


# [Note: a comparison sees 16-bit values rounded]
# A kernel computes a 16-bit float value in float32 and rounds it only where it is stored
# (more precise than eager, which rounds every op's result): for arithmetic that is the
# point. A comparison (or a rounding, ``DISCONTINUOUS``) of such a value with one that
# was stored is different: the bfloat16 row max one kernel stores is a rounded value,
# and another kernel's unrounded scores sit on the other side of a threshold taken from
# it where eager's rounded scores do not (keys within 0.5 of the max: a bfloat16
# output moved by 2 where a key sat at the threshold). A computed 16-bit operand of such
# an op is therefore rounded to its dtype first, as eager holds it; rounding is
# monotone, so the rounded max is the max of the rounded scores. Loaded values are
# already rounded, and float32 values need nothing.


def as_eager_holds(read: Expr) -> Expr:
    """``read`` rounded to its 16-bit float dtype (held as a float32 value), else as it is."""
    if read.dtype not in HALF_DTYPES:
        return read
    return Pointwise("cast", (Pointwise("cast", (read,), torch.float32),), read.dtype)


# [Note: ties between recomputed values]
# Whether ``s == s.amax(-1)`` holds depends on the last bit of ``s``: the max is one of the
# scores exactly only if the kernel comparing them computes each score bit for bit as the
# kernel that took the max. Kernels recompute the scores tile by tile, and a product
# summed in another tile shape or orientation (a backward kernel computes the scores
# transposed) may round differently: under Triton's interpreter (numpy) 18-20% of
# float32 products of width 16 differ in their last bit between two such tilings, and
# a training step's gradient of the values was 0.7 off (rows whose max matched no key);
# in bfloat16, before the rounding above, every row was 0 / 0. Triton does not promise
# bit-identical dots across tile shapes on the GPU either. An exact comparison of two
# computed floats (``==``, ``!=``), or any comparison of a computed float with a
# computed max or min of floats (a selection: ``s >= s.amax(-1)``), is therefore left to
# PyTorch, which compares stored values; the values compared and those a max or min
# selects from are read from memory by every kernel (``LowerContext.tied``), so the
# max is taken from the very values compared. A threshold away from the selected value
# (``s < s.amax(-1) - 0.5``) fuses. Across a forward and its backward the same holds:
# the derivative of ``amax`` (``s - s.amax(-1)`` written by hand, not detached) sends
# the gradient to the keys equal to the forward's saved max and divides by their count;
# a max taken from a forward kernel's own scores matched none of the backward's, the
# count was 0 and every gradient of q and k NaN. Such a max is not saved but computed
# again in the backward, beside the comparison (``flashlight.partition``).


def check_not_a_tie(lw: LowerContext, op: str, operands: list) -> None:
    """Raise ``Unsupported`` for comparison ``op`` of ``operands`` where its result hangs
    on a tie between recomputed floats ([Note: ties between recomputed values])."""
    computed = [v for v in operands if isinstance(v, Access) and v.kind == "nest" and v.dtype.is_floating_point]
    if len(computed) < 2:
        return
    nests = {nest.name: nest for nest in lw.nests}
    selections = [nests[v.name].body for v in computed
                  if isinstance(nests[v.name].body, Reduce) and nests[v.name].body.op in ("max", "min")]
    if op in ("eq", "ne") or selections:
        lw.tied.update(v.name for v in computed)
        lw.tied.update(node.nest for body in selections for node in walk(body) if isinstance(node, Ref))
        raise Unsupported("a tie between floats the kernels would compute again (an exact comparison, "
                          "or a comparison with their max or min)")
