"""Printing the loop sums that are not one ``tl.dot`` of the step: sums over a dim without
a tile, as loops of their own ([Note: inner loops] and [Note: contractions summed by an
inner loop] in :mod:`flashlight.passes.tiling`), and row sums on the tensor core
([Note: row sums on the tensor core] in :mod:`flashlight.passes.tile_plan`). A part of
the code generator's printer (:class:`flashlight.codegen._Printer`), which provides the
values' emission (``emit``, ``emit_dot``), the plan and the loop's masks.
"""
from __future__ import annotations

from flashlight.codegen_text import TL_DTYPES, TileText
from flashlight.ir import Expr, Reduce
from flashlight.passes.tiling import looped_sum

SUM_DOT_WIDTH = 16  # the narrowest tl.dot: a loop sum's ones column and its accumulator


class SumText(TileText):
    """The printer's loop sums beside the step's dots."""

    def emit_inner_loop(self, expr: Reduce, scope: str) -> tuple[str, tuple]:
        """A sum over a dim without a tile: a loop over its positions adding up its body,
        whose values that read the dim are printed inside the loop ([Note: inner loops]
        in passes/tiling)."""
        return self.emit_inner_loops([expr], scope)[0]

    def emit_inner_loops(self, exprs: list[Reduce], scope: str,
                         into: list[str | None] | None = None) -> list[tuple[str, tuple]]:
        """Sums over the same dim without a tile in one loop over its positions, each
        adding up its body (a ``tl.dot`` where the plan says: [Note: contractions summed
        by an inner loop]) into a new total, or into the accumulator ``into`` names; a
        value that several bodies read at a position is printed once in it."""
        (d,) = exprs[0].dims
        position, outer, body = self.fresh("u"), self.lines(scope), []
        totals = []
        for expr, acc in zip(exprs, into or [None] * len(exprs)):
            layout = self.layouts[expr]
            totals.append(acc or self.assign(
                scope, "red", f"tl.zeros({self.shape(layout)}, tl.float32)" if layout else "0.0"))
        self.positions[d], self.block = position, body
        try:
            for expr, total in zip(exprs, totals):
                if expr.body in self.plan.dots:
                    var, lay = self.emit_dot(expr.body, scope, mask_n=True)
                else:
                    var, lay = self.emit(expr.body, scope)
                body.append(f"{total} = {total} + {self.broadcast(var, lay, self.layouts[expr])}")
        finally:
            del self.positions[d]
            self.block = None
        outer.append(f"for {position} in range(0, {self.size(d)}):")
        outer.extend(f"    {line}" for line in body)
        return [(total, self.layouts[expr]) for expr, total in zip(exprs, totals)]

    def emit_looped_dots(self, loop) -> dict[int, tuple[str, tuple] | None]:
        """The step's parts of the loop sums that are inner loops of ``tl.dot``s, those
        over the same dim in one loop ([Note: contractions summed by an inner loop]);
        None for a sum the loop adds into its accumulator itself."""
        by_dim: dict = {}
        for k, red in enumerate(loop):
            if red.op == "sum" and looped_sum(red.body, self.tiling.inner_loops) and red.body.body in self.plan.dots:
                by_dim.setdefault(red.body.dims[0], []).append(k)
        if self.tiling.outer_loop:  # one repeat per pass: its dot ([Note: the repeats outside the key loop])
            return {k: self.emit_dot(loop[k].body.body, "loop", mask_n=True) for ks in by_dim.values() for k in ks}
        parts = {}
        for ks in by_dim.values():
            # a sum no max rescales adds each position's dot to its accumulator directly
            into = [None if any(not self.lazy(j) for j, _ in loop[k].rescaled_by) else f"acc{k}" for k in ks]
            totals = self.emit_inner_loops([loop[k].body for k in ks], "loop", into)
            parts.update((k, None if acc else total) for k, acc, total in zip(ks, into, totals))
        return parts

    def acc_shape(self, k: int) -> str:
        """The accumulator of loop sum ``k``: its result's tile, or that tile by a dot's
        narrowest width for a sum on the tensor core ([Note: row sums on the tensor core])."""
        shape = self.shape(self.plan.loop_layouts[k])
        return shape if self.plan.sum_dot(k) is None else f"{shape[:-1]}, {SUM_DOT_WIDTH}]"

    def on_acc(self, k: int, factor: str) -> str:
        """A factor over loop sum ``k``'s result tile, broadcast over its accumulator."""
        return factor if self.plan.sum_dot(k) is None else f"({factor})[:, None]"

    def emit_sum_dot(self, k: int, body: Expr) -> str:
        """One step of loop sum ``k`` on the tensor core: its operand, as the partner dot
        takes it (the same masks, so the compiler shares the tile), times the column."""
        dot = self.plan.sum_dot(k)
        var, lay = self.emit(body, "loop")
        var = self.pad_to_zero(self.mask_loop(var, lay, body, "0.0"), lay, "n", body)
        var = f"tl.trans({var})" if lay[0] == "n" else var
        dtype = TL_DTYPES[dot.operand_dtype(self.interpret)]
        return self.assign("loop", "part", self.dot_call(var, f"ones{k}", dtype))
