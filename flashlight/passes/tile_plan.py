"""Recording the tiling's decisions per value: the tiled IR's :class:`TilePlan`.

:func:`flashlight.passes.tiling.tile` picks the roles of a kernel's dims; this module
writes down, for every value the code generator will print, what follows from them:
its tile layout, whether it is computed inside the loop or hoisted before it, which
products are ``tl.dot`` (with their operands' orientation and dtype per target), the
kernel's inputs in argument order, and the inputs the launcher should re-lay out. The
code generator then only prints.

The values are visited in the order the generator prints them (the loop's initial
values, one loop step, the step on full tiles, the epilogue, then the liveness
predicates), so "first read" means the same to both.

[Note: row sums on the tensor core]
Attention's online loop sums each row's probabilities, ``l_i = sum_j p_ij``, beside the
contraction ``sum_j p_ij v_jc`` whose left operand is the same ``p`` tile. Summed on the
CUDA cores, that is an add per score and a reduction across the lanes that hold a row,
in a loop bound by instruction issue, not by the tensor cores (the bf16 Evoformer core
runs its tensor cores at about a quarter of their rate; bench/results/core_terms). The
sum is a contraction too: ``l = p @ e`` with ``e`` the column ``[1, 0, ..., 0]`` of a
``[BLOCK_N, 16]`` tile (a dot's narrowest), accumulated as a ``[BLOCK_M, 16]`` tile whose
other columns stay 0 and summed over its columns once after the loop, exactly. The
tensor core then adds ``p`` as the contraction's operand: rounded to the operand's
16-bit dtype, as the numerator's terms are, so the normalisation divides by the sum of
the very weights it averaged with (the float32 sum's terms differ from them by the
rounding of ``p``, up to 2 ** -8 relative in bf16). The plan records it only where
the partner dot takes 16-bit operands: with float32 ones the products would go through
TF32 or the CUDA cores' FMA loop, and the float32 path keeps its exact sum. Counted
in sm_90 builds (Triton's compiler, no GPU) of the generated bf16 Evoformer core, head
width 32: 479 -> 448 instructions per key step at 128 x 32 tiles, 783 -> 727 at 128 x 64,
454 -> 430 at 128 x 64 with 8 warps; a hand-written kernel changed in this one place
alike (``bench/results/core_terms/hypotheses/tensor_core_sums.py``). Timed on an H100
(every tile configuration, ``bench/results/core_terms/README.md``), the fewer
instructions did not pay: the generated core was 1-10% slower with the extra 16-wide
dot. Off by default (``FLASHLIGHT_SUM_DOTS``).
"""
from __future__ import annotations

import torch

from flashlight import settings
from flashlight.ir import (
    DotPlan,
    Expr,
    Gather,
    Iota,
    Kernel,
    Load,
    Pointwise,
    Reduce,
    RunningMax,
    TiledKernel,
    TilePlan,
    Tiling,
    canonical,
    walk,
)
from flashlight.ir_check import InvariantError
from flashlight.vocabulary import HALF_DTYPES


class _Recorder:
    def __init__(self, kernel: Kernel, tiling: Tiling, layouts):
        self.kernel = kernel
        self.tiling = tiling
        self.of = layouts.of
        self.is_dot = layouts.is_dot
        self.roles = layouts.roles
        self.looped_dots = layouts.looped_dots
        # a value that reads an inner loop's dim is computed in that loop, in the key loop
        # ([Note: inner loops]); one that runs around the key loop changes only between
        # its passes ([Note: the repeats outside the key loop] in passes/tiling)
        inner = frozenset() if tiling.outer_loop else frozenset(tiling.inner_loops)
        self.loop_dims = frozenset(red.dim for red in kernel.loop) | inner
        self.layouts: dict[Expr, tuple] = {}
        self.in_loop: dict[Expr, bool] = {}
        self.dots: dict[Expr, DotPlan] = {}
        self.transposed: dict[Expr, DotPlan] = {}  # dots whose result is transposed, as written
        self.inputs: dict[str, int] = {}  # name -> rank, in first-read order
        self.relayouts: dict[str, int] = {}

    # ---------------------------------------------------------------- values
    def value(self, expr: Expr) -> None:
        """Record ``expr`` and everything it reads, as codegen prints it."""
        if expr in self.layouts:
            return
        layout = self.of(expr)
        self.layouts[expr] = layout
        if isinstance(expr, Load):
            self.load(expr, layout)
        elif isinstance(expr, Gather):
            self.inputs.setdefault(expr.base, len(expr.positions))
            for position in expr.positions:
                self.value(position)
        elif isinstance(expr, Reduce):
            role = self.roles.get(expr.dims[0])  # None: an inner loop ([Note: inner loops])
            if role is not None and self.is_dot(expr.body, role):
                self.dot(expr.body, role)
            else:
                self.value(expr.body)
        elif isinstance(expr, Pointwise):
            for arg in expr.args:
                self.value(arg)

    def dot(self, body: Pointwise, reduced: str) -> None:
        for arg in body.args:
            self.value(arg)
        la, lb = (self.layouts[arg] for arg in body.args)
        x = [r for r in la if r != reduced][0]
        y = [r for r in lb if r != reduced][0]
        out = canonical((x, y))
        dtype = body.dtype if body.dtype in HALF_DTYPES else torch.float32
        as_written = DotPlan(reduced, la != (x, reduced), lb != (reduced, y), out, out != (x, y), dtype)
        self.dots[body] = as_written
        if out != (x, y):  # [Note: the order of a dot's operands]
            self.transposed[body] = as_written
            if _swappable(*body.args):
                self.dots[body] = DotPlan(reduced, lb != (y, reduced), la != (reduced, x), out, False, dtype,
                                          swap=True)

    def swapped_or_transposed(self) -> None:
        """Every dot whose result is transposed swaps its factors instead, or none does
        ([Note: the order of a dot's operands])."""
        if not all(self.dots[body].swap for body in self.transposed):
            self.dots.update(self.transposed)

    def load(self, load: Load, layout) -> None:
        """Register the input, and note which axis should be contiguous for a tile re-read
        across the grid (a pair bias read for every MSA row): the first read with a tile
        decides, and only when the tensor is broadcast over some grid dim."""
        self.inputs.setdefault(load.base, len(load.index))
        if not layout or load.base in self.relayouts:
            return
        used = {d for axis in load.index for d in axis}
        if all(d in used for d in self.tiling.grid):
            return
        for a, axis in enumerate(load.index):
            if axis and self.roles.get(axis[-1]) == layout[-1]:
                self.relayouts[load.base] = a

    def loop_value(self, expr: Expr) -> bool:
        """Whether ``expr`` changes along the loop (reads the loop dim or a running max)."""
        known = self.in_loop.get(expr)
        if known is None:
            if isinstance(expr, RunningMax):
                known = True
            elif isinstance(expr, (Load, Iota)):
                axes = expr.index if isinstance(expr, Load) else (expr.axis,)
                known = any(d in self.loop_dims for axis in axes for d in axis)
            else:
                known = any(self.loop_value(c) for c in expr.children())
            self.in_loop[expr] = known
        return known

    # ---------------------------------------------------------------- kernel
    def loop_step(self, loop) -> None:
        for red in loop:
            if red.op == "max":
                self.value(red.body)
        for red in loop:
            if red.op == "sum":
                if not self.tiling.serial and self.is_dot(red.body, "n"):
                    if red.body in self.looped_dots:  # [Note: contractions summed by an inner loop]
                        self.layouts[red.body] = self.of(red.body)
                        self.dot(red.body.body, "n")
                    else:
                        self.dot(red.body, "n")
                else:
                    self.value(red.body)

    def record(self, loop_layouts) -> TilePlan:
        kernel = self.kernel
        for red in kernel.loop:
            if red.op == "max" and red.init is not None:
                self.value(red.init)
        self.loop_step(kernel.loop)
        if kernel.unmasked is not None:
            self.loop_step(kernel.unmasked)
        for epilogue in kernel.epilogues():
            self.value(epilogue)
        for predicate in (kernel.live, kernel.full):
            if predicate is not None:
                self.predicate(predicate, set())
        for expr in list(self.layouts):
            self.loop_value(expr)
        self.swapped_or_transposed()
        in_loop = frozenset(e for e, yes in self.in_loop.items() if yes)
        roles = tuple(self.roles.items())
        store, *extra = (canonical(self.roles[d] for d in out.dims if d in self.roles) for out in kernel.outputs())
        return TilePlan(roles, self.layouts, in_loop, self.dots, tuple(loop_layouts), store,
                        tuple(self.inputs.items()), tuple(self.relayouts.items()), tuple(extra),
                        self.sum_dots(loop_layouts))

    def sum_dots(self, loop_layouts) -> tuple:
        """The loop sums that run on the tensor core ([Note: row sums on the tensor core]):
        a sum over the loop role of a 16-bit dot's operand, in every loop step."""
        if self.tiling.serial or not settings.get("sum_dots"):
            return ()
        loops = [self.kernel.loop] + ([self.kernel.unmasked] if self.kernel.unmasked is not None else [])
        found = []
        for k, layout in enumerate(loop_layouts):
            partners = [self.partner(loop, k, layout) for loop in loops]
            if all(p is not None for p in partners):
                found.append((k, partners[0]))
        return tuple(found)

    def partner(self, loop, k: int, layout):
        """The 16-bit dot of ``loop`` with ``loop[k]``'s body as the operand that spans
        the loop role and ``layout``, if ``loop[k]`` is a sum that is not a dot itself."""
        red = loop[k]
        if red.op != "sum" or red.body in self.dots or len(layout) != 1:
            return None
        if self.layouts.get(red.body) != canonical((layout[0], "n")):
            return None
        for other in loop:
            dot = self.dots.get(other.body) if other.op == "sum" else None
            if dot is not None and dot.reduced == "n" and dot.dtype in HALF_DTYPES and red.body in other.body.args:
                return dot
        return None

    def predicate(self, expr: Expr, seen: set) -> None:
        """A liveness predicate: the scan bounds its loads' tiles ([Note: tile skipping])."""
        if expr in seen:
            return
        seen.add(expr)
        if isinstance(expr, Load):
            layout = self.layouts.setdefault(expr, self.of(expr))
            self.load(expr, layout)
        for child in expr.children():
            self.predicate(child, seen)
        self.loop_value(expr)


# [Note: the order of a dot's operands]
# ``tl.dot(A, B)`` gives ``[x, y]``; where the result's canonical tile order is ``[y, x]``
# (the backward's ``dk = dS q``, written ``q * dS`` summed over the queries), the dot can
# run as ``B^T A^T`` and give ``[y, x]`` itself, or as written and be transposed after:
# a layout change of the result's size every step, through shared memory, and an
# accumulator the dot cannot add into in place. Swapping moves the first factor into
# the place of ``B``, which Hopper's tensor-core instruction reads from shared memory
# (``A`` may come from registers): a loaded tile goes there as loaded, a computed one
# must be written there first. And a transpose is free where every result it meets is
# transposed too (a layout, not a move); a kernel mixing both forms converts one.
# So a kernel swaps the factors of all its transposed dots when none of them moves a
# computed value into ``B`` where a loaded one was, and of none otherwise. sm_90 builds,
# bf16: the causal backward's ``dk``/``dv`` kernel at head width 128 (scores, ``dp`` and
# ``dk`` transposed, all swappable) spills 8 / 352 / 232 B per thread swapped against
# 80 / 944 / 1,384 transposed, at 64x32x4x3 / 64x64x4x2 / 128x64x8x2; the Evoformer
# mask bias gradient (its scores' first factor computed) 336 / 0 transposed, 1,056 /
# 144 with only its ``dp`` swapped, at 64x64x4x2 / 128x64x8x2.
def _swappable(first: Expr, second: Expr) -> bool:
    """Whether a dot of ``first * second`` may take ``second`` as ``A`` and ``first`` as
    ``B`` ([Note: the order of a dot's operands])."""
    return _loaded(first) or not _loaded(second)


def _loaded(expr: Expr) -> bool:
    """A tile as loaded from memory (possibly converted), not computed in the kernel."""
    while isinstance(expr, Pointwise) and expr.op == "cast":
        expr = expr.args[0]
    return isinstance(expr, Load)


def record_plan(kernel: Kernel, tiling: Tiling, layouts) -> TilePlan:
    """The :class:`TilePlan` of ``kernel`` under ``tiling``, from the tiling's
    :class:`flashlight.passes.tiling.Layouts` of it."""
    return _Recorder(kernel, tiling, layouts).record(layouts.loop_layouts)



def check_plan(tiled: TiledKernel) -> None:
    """The tiled IR's invariants: roles match the tiling, layouts are tiles of rank two
    at most over known roles, dots contract a role of both operands, and every input
    the plan names (and only those) is loaded by the kernel."""
    kernel, tiling, plan = tiled.kernel, tiled.tiling, tiled.plan
    name, roles = kernel.name, dict(plan.roles)
    expected = {d: f"e{k}" for k, d in enumerate(tiling.eliminated)}
    expected.update({d: r for d, r in ((tiling.row, "m"), (tiling.feature, "f")) if d is not None})
    # the dim BLOCK_N tiles: the loop's, or the column of a serial loop ([Note: serial loops])
    expected.update({tiling.tiled_by_block_n(red.dim): "n" for red in kernel.loop})
    if roles != expected:
        raise InvariantError(f"{name}: plan roles {roles} differ from the tiling's {expected}")
    if set(tiling.inner_loops) & (set(roles) | set(tiling.grid) | set(kernel.dims)):
        raise InvariantError(f"{name}: an inner loop's dim is also a tile, a grid or an output dim")
    if tiling.outer_loop and (len(tiling.inner_loops) != 1 or any(red.op != "sum" for red in kernel.loop)):
        raise InvariantError(f"{name}: a loop around the key loop needs one inner loop and loop sums only")
    if set(tiling.grid) & set(roles) or not set(kernel.dims) <= set(tiling.grid) | set(roles) \
            or (tiling.serial and (tiling.column not in kernel.dims or kernel.loop[0].dim in roles)):
        raise InvariantError(f"{name}: the grid and the tile roles do not partition the output dims")
    known = set(roles.values())
    layouts = [*plan.layouts.values(), *plan.loop_layouts, *plan.store_layouts, *(d.out for d in plan.dots.values())]
    if len(plan.store_layouts) != len(kernel.outputs()):
        raise InvariantError(f"{name}: {len(plan.store_layouts)} store layouts for {len(kernel.outputs())} outputs")
    for layout in layouts:
        if len(layout) > 2 or not set(layout) <= known or tuple(layout) != canonical(layout):
            raise InvariantError(f"{name}: layout {layout} is not a canonical tile over roles {sorted(known)}")
    if len(plan.loop_layouts) != len(kernel.loop) or (
            not tiling.serial and any("n" in lay for lay in plan.loop_layouts)):
        raise InvariantError(f"{name}: loop accumulators must not span the loop role")
    for body, dot in plan.dots.items():
        sides = [plan.layouts.get(arg) for arg in body.args]
        if any(side is None or dot.reduced not in side or len(side) != 2 for side in sides) or dot.reduced in dot.out:
            raise InvariantError(f"{name}: a dot whose operands do not both span its contracted role")
    loaded = {node.base for e in kernel_exprs(kernel) for node in walk(e) if isinstance(node, (Load, Gather))}
    inputs = {base for base, _ in plan.inputs}
    if inputs != loaded or not {base for base, _ in plan.relayouts} <= inputs:
        raise InvariantError(f"{name}: plan inputs {sorted(inputs)} differ from the loads {sorted(loaded)}")


def kernel_exprs(kernel: Kernel) -> list[Expr]:
    """Every expression of ``kernel`` that codegen prints."""
    exprs = [e for red in (*kernel.loop, *(kernel.unmasked or ())) for e in red.exprs()]
    return exprs + [*kernel.epilogues()] + [e for e in (kernel.live, kernel.full) if e is not None]
