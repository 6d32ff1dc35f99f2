"""Printing the IR for people: graphs, kernels and tiled kernels as text.

A value used in more than one place (the scores ``Q Kᵀ`` read by a softmax's max,
its exponent and its sum) is printed once, as a numbered binding ``$k = ...`` before
the line that first needs it, and read as ``$k`` everywhere. Dims print by name; the
lowering names them per compile (:func:`flashlight.ir.dim_names`), so printing the
same graph twice gives the same text.
"""
from __future__ import annotations

from flashlight.ir import (
    Axis,
    Const,
    Expr,
    Gather,
    Graph,
    Iota,
    Kernel,
    Load,
    LoopResult,
    Pointwise,
    Reduce,
    Ref,
    RunningMax,
    SizeValue,
    TiledKernel,
)


def fmt_axis(axis: Axis) -> str:
    return "*".join(d.name for d in axis) if axis else "0"


def fmt_index(index: tuple[Axis, ...]) -> str:
    return ", ".join(fmt_axis(a) for a in index)


class Printer:
    """Prints expressions of one unit (a nest, a kernel) with shared values bound once.

    ``roots`` are every expression the unit will print; a compound node (pointwise or
    reduction) reached from two parents, or twice from the roots, gets a binding.
    """

    def __init__(self, roots):
        uses: dict[Expr, int] = {}
        seen: set[Expr] = set()
        stack = list(roots)
        for root in roots:
            uses[root] = uses.get(root, 0) + 1
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            for child in node.children():
                uses[child] = uses.get(child, 0) + 1
                stack.append(child)
        self.shared = {e for e, n in uses.items() if n > 1 and isinstance(e, (Pointwise, Reduce))}
        self.names: dict[Expr, str] = {}
        self.pending: list[str] = []  # bindings printed since the last ``take``

    def take(self) -> list[str]:
        """The binding lines made since the last call (to print before the current line)."""
        lines, self.pending = self.pending, []
        return lines

    def expr(self, expr: Expr) -> str:
        """``expr`` as text; a shared value as its binding's name."""
        if expr not in self.shared:
            return self._plain(expr)
        if expr not in self.names:
            text = self._plain(expr)
            self.names[expr] = f"${len(self.names) + 1}"
            self.pending.append(f"{self.names[expr]} = {text}")
        return self.names[expr]

    def _plain(self, expr: Expr) -> str:
        sub = self.expr
        if isinstance(expr, Load):
            return f"{expr.base}[{fmt_index(expr.index)}]"
        if isinstance(expr, Ref):
            return f"%{expr.nest}[{fmt_index(expr.index)}]"
        if isinstance(expr, Gather):
            return f"{expr.base}@[{', '.join(sub(p) for p in expr.positions)}]"
        if isinstance(expr, Iota):
            return f"iota({fmt_axis(expr.axis)})"
        if isinstance(expr, Const):
            return repr(expr.value)
        if isinstance(expr, SizeValue):
            return f"size({expr.size})"
        if isinstance(expr, Pointwise):
            return f"{expr.op}({', '.join(sub(a) for a in expr.args)})"
        if isinstance(expr, Reduce):
            dims = ",".join(d.name for d in expr.dims)
            return f"{expr.op}[{dims}]({sub(expr.body)})"
        if isinstance(expr, LoopResult):
            return f"loop{expr.index}"
        if isinstance(expr, RunningMax):
            return f"running_max{expr.index}"
        return repr(expr)

    def line(self, lines: list[str], indent: str, text_of) -> None:
        """Append ``text_of()`` (which prints through this printer) after its bindings."""
        text = text_of()
        lines.extend(indent + binding for binding in self.take())
        lines.append(indent + text)


def format_expr(expr: Expr) -> str:
    """One expression; shared sub-values are printed as bindings first, one per line."""
    p = Printer([expr])
    text = p.expr(expr)
    return "\n".join([*p.take(), text])


def format_graph(graph: Graph) -> str:
    lines = [f"inputs: {', '.join(graph.inputs)}"]
    for nest in graph.nests:
        mark = "*" if nest.name in graph.materialized else " "
        axes = ", ".join(fmt_axis(a) for a in nest.axes)
        p = Printer([nest.body])
        text = p.expr(nest.body)
        lines.extend("    " + b for b in p.take())
        lines.append(f"{mark}{nest.name}[{axes}] = {text}")
    return "\n".join(lines)


def kernel_roots(kernel: Kernel) -> list[Expr]:
    """Every expression :func:`format_kernel` prints, in order."""
    roots = [e for red in kernel.loop for e in red.exprs()] + [*kernel.epilogues()]
    roots += [e for e in (kernel.live, kernel.full) if e is not None]
    return roots + [red.body for red in kernel.unmasked or ()]


def format_kernel(kernel: Kernel, p: Printer | None = None) -> str:
    p = p or Printer(kernel_roots(kernel))
    lines = [f"kernel {kernel.name}[{', '.join(fmt_axis(a) for a in kernel.axes)}]"]
    for k, red in enumerate(kernel.loop):
        def loop_line(k=k, red=red):
            scale = f" rescaled by {list(red.rescaled_by)}" if red.rescaled_by else ""
            scale += f" from {p.expr(red.init)}" if red.init is not None else ""
            scale += _base2_text(red.base2) if red.base2 is not None else ""
            return f"loop{k} = {red.op}[{red.dim.name}]({p.expr(red.body)}){scale}"
        p.line(lines, "  ", loop_line)
    p.line(lines, "  ", lambda: f"out = {p.expr(kernel.epilogue)}")
    for k, out in enumerate(kernel.extra_outputs, start=1):
        axes = ", ".join(fmt_axis(a) for a in out.axes)
        p.line(lines, "  ", lambda k=k, out=out, axes=axes: f"out{k} {out.name}[{axes}] = {p.expr(out.epilogue)}")
    if kernel.live is not None:
        p.line(lines, "  ", lambda: f"live = {p.expr(kernel.live)}")
    if kernel.full is not None:
        p.line(lines, "  ", lambda: f"full = {p.expr(kernel.full)}")
        for k, red in enumerate(kernel.unmasked):
            p.line(lines, "  ", lambda k=k, red=red: f"loop{k} on full tiles = {red.op}[{red.dim.name}]({p.expr(red.body)})")
    return "\n".join(lines)


def _base2_text(base2) -> str:
    text = f" in base 2 scaled by {base2.log2_scale!r}"
    if base2.threshold is not None:
        text += f", lazily above {base2.threshold!r}" + (", settled" if base2.settle else "")
    return text


def format_tiled(tiled: TiledKernel) -> str:
    """The tiling of a kernel and what it decided: roles, dots, inputs, hoisting."""
    tiling, plan = tiled.tiling, tiled.plan
    padded = dict(tiling.padded)
    roles = ", ".join(f"{d.name}={r}" + (f"({padded[d]})" if d in padded else "") for d, r in plan.roles)
    lines = [f"tiled {tiled.kernel.name}: {roles}; grid [{', '.join(d.name for d in tiling.grid)}]"
             + (f"; scan {tiling.scan_tiles} tiles" if tiling.scan_tiles > 1 else "")
             + (f"; serial loop, column {tiling.column.name}" if tiling.serial else "")
             + (f"; inner loop over {', '.join(d.name for d in tiling.inner_loops)}"
                + (" around the key loop" if tiling.outer_loop else "") if tiling.inner_loops else "")]
    p = Printer(list(plan.dots))
    for body, dot in plan.dots.items():
        a, b = (plan.layouts[x] for x in body.args)
        dtype = str(dot.dtype).replace("torch.", "")
        if dot.swap:
            a, b = b, a
        p.line(lines, "  ", lambda: f"dot over {dot.reduced}: {list(a)} x {list(b)} -> {list(dot.out)} "
                                    f"as {dtype}: {p.expr(body)}")
    stores = ", ".join(str(list(lay)) for lay in plan.store_layouts)
    lines.append(f"  accumulators {[list(lay) for lay in plan.loop_layouts]}, store {stores}")
    lines.append(f"  inputs {', '.join(f'{n}/{r}' for n, r in plan.inputs)}"
                 + (f"; relayout {', '.join(f'{n} axis {a}' for n, a in plan.relayouts)}" if plan.relayouts else ""))
    hoisted = sum(1 for e in plan.layouts if e not in plan.in_loop and not isinstance(e, (Const, LoopResult)))
    lines.append(f"  {len(plan.layouts)} values, {hoisted} of them before the loop or after it")
    return "\n".join(lines)
