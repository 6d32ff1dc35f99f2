"""Triton code generation: prints a tiled kernel as Triton source.

Every decision (which dims are tiles, which loop, what is a ``tl.dot`` and in which
dtype, what is hoisted before the loop, which inputs the launcher re-lays out) was made
by the passes and recorded in the tiled kernel's :class:`flashlight.ir.TilePlan`; this
module only spells it out. It imports nothing from ``passes/``. The printed
kernel has a fixed shape:

1. decode the logical grid from ``tl.program_id(0)`` (row blocks innermost, so
   programs that share keys and values run together);
2. loop-invariant values (the query tile, row biases) before the loop;
3. one loop over the ``n`` tiles updating the online reductions
   ([Note: online reduction] in :mod:`flashlight.passes.online`), printed twice: over
   the tiles before the last, which are whole, without bounds checks along the loop,
   then over the last, partial tile with them (with a liveness predicate, the ranges the
   scan finds instead, see :mod:`flashlight.codegen_live`);
4. the epilogue and one masked store.

[Note: 64-bit offsets]
Offsets into a tensor are computed from the program's coordinates, the tile ranges
(``tl.arange``) and the strides. Triton computes them in the type of those values:
32-bit integers for program ids, ranges and strides below 2**31, so an offset past
2**31 - 1 elements wraps around and the load reads outside the tensor. A tensor need not
hold 2**31 elements for that: the fused projections of a patched OpenFold module
(``integrations/openfold_forward.py``) hand the kernel q, k, v and the gate as views of
one ``[..., 4 * H * c]`` tensor, whose rows are four times longer, and the extra-MSA
stack at 2048 residues (5120 rows of 2048 positions of ``4 * 64`` values) reaches
offsets of 2.7e9. So every offset derives from ``pid`` and ``index0`` (zero in the
type of ``pid``), and the constant ``INDEX_BITS`` (32 by default) makes them 64-bit
where the launcher finds that some tensor of the launch reaches past 2**31 - 1
(:func:`flashlight.launch_sizes.index_kwargs`; such a launch compiles where it runs,
not in the background). The 32-bit build is the one every smaller launch
runs: adding ``index0`` (a constant zero there) costs nothing, and 64-bit address
arithmetic, which would cost instructions in every tile's loads, is only paid where
it is needed.

[Note: bfloat16 rounding under the interpreter]
A GPU build rounds a float32 value cast to bfloat16 to the nearest even bfloat16, as
PyTorch does. Triton's interpreter (3.9) casts by dropping the low 16 bits: toward zero,
up to a whole unit in the last place off and always toward zero, so CPU tests of a
bfloat16 output measured the interpreter, not the kernel (a fused gate and output
projection whose every step runs in float32 tested 1.35x stock's error against float64
on average, its only coarse step being that cast). Under the interpreter the printer
therefore rounds first, on the bits: adding ``0x7FFF`` plus the lowest kept bit and
clearing the low half rounds to nearest, ties to even (a carry moves into the exponent
as it should; NaN is kept as is), after which dropping the bits is exact. A GPU build
prints the plain cast. Float16 needs nothing: the interpreter casts it with NumPy, which
rounds to nearest even.

[Note: widening bfloat16 on the bits]
A bfloat16 is the high half of the float32 of the same value, so widening one is exact as
a 16-bit shift of its bits, NaN payloads and signs included. Triton's ``.to(tl.float32)``
gives the same values but ``ptxas`` (sm_90) spends two instructions on every other
element: the tile is loaded two values to a 32-bit register, and the upper one is moved
down (``PRMT``) before it is shifted back up. Printed on the bits instead (``uint16``,
widened to ``uint32``, ``<< 16``, reinterpreted), the upper one is one mask (``LOP3``) of
the register as loaded. In the bf16 Evoformer core's loop (128 x 32 tiles, the pair bias
widened per score) that is 479 -> 458 instructions per thread and step, 783 -> 742 at
128 x 64, registers unchanged (sm_90 builds: ``python -m bench.build_times --variants
evoformer_core --dtype bf16 --shape '{"N": 2, "H": 8, "L": 256, "c": 32}' --configs
128,32,4,3 128,64,4,3 --sass``). Timed on an H100 at the same configurations, the core
ran 0-3.8% faster and the language-model kernels the same
(``bench/results/h100_2026-12-06b``). Every bfloat16 tile a kernel computes on is widened
so, under the interpreter too (the same bits).
"""
from __future__ import annotations

import dataclasses
import hashlib

import torch

from flashlight import settings
from flashlight.codegen_live import LiveScan, rounding_division
from flashlight.codegen_sums import SUM_DOT_WIDTH, SumText
from flashlight.codegen_text import TL_DTYPES, literal
from flashlight.ir import (
    Const,
    Expr,
    Gather,
    Iota,
    Load,
    LoopResult,
    Pointwise,
    Reduce,
    RunningMax,
    SizeValue,
    TiledKernel,
    free_dims,
    spans_extent,
)
from flashlight.vocabulary import BOOLEAN_OPS, DIVISION_OPS, OPS

NARROW_BITS, WIDE_BITS = 32, 64  # INDEX_BITS of a launch ([Note: 64-bit offsets])


def widened(stored: str, dtype: torch.dtype) -> str:
    """A loaded 16-bit float tile ``stored`` as float32 ([Note: widening bfloat16 on the bits])."""
    if dtype == torch.bfloat16:
        return f"({stored}.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)"
    return f"{stored}.to(tl.float32)"


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """Generated source with what the launcher needs to call it."""

    name: str
    source: str
    inputs: tuple[str, ...]  # tensor arguments, in order (the output comes last)
    input_ranks: tuple[int, ...]
    size_args: tuple[str, ...]  # symbolic size texts, in argument order
    out_rank: int
    # the plan's relayouts (TilePlan.relayouts) as (argument, axis) pairs: inputs re-read by
    # many programs whose innermost tile axis should be contiguous
    fast_axes: tuple[tuple[int, int], ...]
    check_bounds: bool  # the kernel takes in{k}_span / out_span and asserts offsets
    fp32_precision: str  # "ieee", "tf32" or "tf32x3": how fp32 contractions run
    # TilePlan.fma_dots for this target: some tl.dot multiplies IEEE float32 operands on
    # CUDA cores, operands and products in registers (the launcher then tries smaller tiles)
    fma_dots: bool = False
    extra_out_ranks: tuple[int, ...] = ()  # of the kernel's extra outputs (out1, out2, ...)
    # the output is float32 partial sums over runs of a serial loop, and the kernel takes
    # SPLITS, SPLIT_LEN and out_split after the strides ([Note: split serial loops])
    split: bool = False
    # per input, its sizes as the graph knows them: where a symbolic size is read when no
    # load of the kernel names it alone (a concatenated piece read through the whole
    # concatenation's index); set by the backend, which has the graph
    input_sizes: tuple[tuple, ...] = ()


class _Printer(SumText):
    """Prints the values, the online loop and the store of one tiled kernel."""

    def __init__(self, tk: TiledKernel, name: str, fp32_precision: str, interpret: bool, check_bounds: bool):
        super().__init__(tk, check_bounds)
        self.interpret = interpret
        self.name = name
        self.fp32_precision = fp32_precision
        self.loop_unmasked: list[str] = []  # the loop step on full tiles (kernel.unmasked)
        self.memo: dict[tuple[str, Expr, tuple], tuple[str, tuple]] = {}  # (scope, value, positions read)
        self.stored_as: dict[str, tuple[str, str]] = {}  # float32 tile -> (as loaded, its tl dtype)

    def scope_of(self, expr: Expr) -> str:
        """Where a value of the loop is printed: in it, or hoisted before it (the plan says)."""
        return "loop" if expr in self.plan.in_loop else "pre"

    # ----------------------------------------------------------------- emission
    def emit(self, expr: Expr, scope: str) -> tuple[str, tuple]:
        """``expr``'s tile variable and layout, printed once per scope it is needed in."""
        target = self.scope_of(expr) if scope == "loop" else scope
        if target == "pre" and scope == "post":
            target = "post"
        at = self.positions_read(expr)
        if target == "pre" and at and self.tiling.outer_loop:  # once per pass of the outer loop
            target = "outer"
        for s in ((target, "pre") if target != "pre" else ("pre",)):
            if (s, expr, at) in self.memo:
                return self.memo[(s, expr, at)]
        block, self.block = self.block, (self.block if at else None)  # in an inner loop only if it reads its dim
        try:
            var, layout = self._emit(expr, target)
        finally:
            self.block = block
        self.memo[(target, expr, at)] = (var, layout)
        return var, layout

    def positions_read(self, expr: Expr) -> tuple:
        """The inner loops' positions ``expr`` reads: such a value is printed in its loop and
        not taken from what was printed outside it ([Note: inner loops])."""
        if not self.positions:
            return ()
        free = free_dims(expr)
        return tuple((d.name, k) for d, k in self.positions.items() if d in free)

    def _emit(self, expr: Expr, scope: str) -> tuple[str, tuple]:
        layout = self.layouts[expr]
        if isinstance(expr, Const):
            return literal(expr.value), ()
        if isinstance(expr, SizeValue):  # [Note: sizes used as values] in flashlight.indexing
            return self.size_text(expr.size), ()
        if isinstance(expr, Load):
            return self.emit_load(expr, layout, scope), layout
        if isinstance(expr, Gather):
            return self.emit_gather(expr, layout, scope), layout
        if isinstance(expr, Iota):
            return self.assign(scope, "idx", self.index(expr.axis, layout)), layout
        if isinstance(expr, RunningMax):
            return f"m_safe{expr.index}", layout
        if isinstance(expr, LoopResult):
            return f"res{expr.index}", layout
        if isinstance(expr, Reduce):
            return self.emit_inner_reduce(expr, scope)
        if isinstance(expr, Pointwise):
            return self.emit_pointwise(expr, layout, scope), layout
        raise TypeError(type(expr))

    def emit_gather(self, gather: Gather, layout, scope: str) -> str:
        """A load at computed positions ([Note: gathers] in flashlight.lower_gather): each
        position's tile broadcast to the gather's, lanes outside the tensor loading 0."""
        k = self.inputs.index(gather.base)
        terms, masks = [], []
        for a, position in enumerate(gather.positions):
            if isinstance(position, Const) and position.value == 0:
                continue
            var, lay = self.emit(position, scope)
            var = self.broadcast(var, lay, layout)
            terms.append(f"({var}) * in{k}_s{a}")
            if gather.extents[a] is not None and not isinstance(position, Const) \
                    and not spans_extent(position, gather.extents[a]):
                if layout and not lay:  # a program's one position: a [1, 1] tile, which Triton's
                    # interpreter accepts in a tile's mask (a scalar it does not)
                    var = f"({var} + tl.zeros([{', '.join('1' for _ in layout)}], tl.int32))"
                masks.append(f"({var} >= 0) & ({var} < {self.size_text(gather.extents[a])})")
        lanes = self.mask(sorted(free_dims(gather), key=lambda d: d.name), layout)
        mask = " & ".join(([lanes] if lanes else []) + masks) or None
        offset = " + ".join(terms) or "0"
        self.assert_in_bounds(scope, f"in{k}", offset, mask, layout)
        masked = f", mask={mask}, other=0" if mask else ""
        return self.converted(gather.dtype, f"tl.load(in{k} + {offset}{masked})", scope)

    def emit_load(self, load: Load, layout, scope: str) -> str:
        """The loaded tile as computed on: float32 for floats, ``tl.int1`` for booleans.
        A 16-bit float tile is also kept as loaded (``stored_as``), for ``tl.dot``."""
        value, _ = self.load_text(load, layout, scope)
        return self.converted(load.dtype, value, scope)

    def converted(self, dtype: torch.dtype, value: str, scope: str) -> str:
        """A loaded tile ``value`` of ``dtype`` as computed on (see :meth:`emit_load`)."""
        if dtype in (torch.bfloat16, torch.float16):
            stored = self.assign(scope, "x", value)
            var = self.assign(scope, "x", widened(stored, dtype))
            self.stored_as[var] = (stored, TL_DTYPES[dtype])
            return var
        if dtype.is_floating_point:
            value += ".to(tl.float32)"
        elif dtype == torch.bool:
            value = f"({value} != 0)"
        return self.assign(scope, "x", value)

    def emit_pointwise(self, expr: Pointwise, layout, scope: str) -> str:
        args = []
        for a in expr.args:
            var, lay = self.emit(a, scope)
            args.append(self.broadcast(var, lay, layout))
        op = expr.op
        template = OPS[op].triton if op in OPS else None
        if op == "div" and not expr.dtype.is_floating_point:
            raise NotImplementedError("integer division")
        if template is not None:
            text = template.format(*args)
            if op == "where" and expr.dtype == torch.bool:
                text = f"({text} != 0)"
        elif op in DIVISION_OPS:
            int_type = None if expr.dtype.is_floating_point else TL_DTYPES[expr.dtype]
            text = rounding_division(op, args[0], args[1], int_type)
        elif op == "pow":
            text = _pow(args[0], expr.args[1].value)
        elif op == "cast" and expr.dtype == torch.bool:
            text = f"({args[0]} != 0)"
        elif op == "cast" and expr.dtype.is_floating_point:  # floats are computed on in float32
            text = args[0] if expr.args[0].dtype.is_floating_point else f"({args[0]}).to(tl.float32)"
            if expr.dtype.itemsize == 2 and expr.dtype != expr.args[0].dtype:
                # a cast to a 16-bit float rounds, as eager's does: a comparison or a
                # floor after it must see the rounded value (held in float32 again)
                text = f"({self.cast_to(scope, text, expr.dtype)}).to(tl.float32)"
        elif op == "cast":
            text = f"({args[0]}).to({TL_DTYPES[expr.dtype]})"
        else:
            raise NotImplementedError(op)
        if expr.dtype.is_floating_point and op in BOOLEAN_OPS:
            raise NotImplementedError("comparison typed as float")
        if op == "cast" and text.isidentifier():
            return text  # a float32 value cast to float32: the same variable
        return self.assign(scope, "v", text)

    def emit_dot(self, body: Pointwise, scope: str, mask_n: bool) -> tuple[str, tuple]:
        """``tl.dot`` as the plan says ([Note: dot operands] in passes/contractions)."""
        dot = self.plan.dots[body]
        (a, la), (b, lb) = (self.emit(x, scope) for x in body.args)
        if mask_n:
            a = self.mask_loop(a, la, body.args[0], "0.0")
            b = self.mask_loop(b, lb, body.args[1], "0.0")
        a = self.pad_to_zero(a, la, dot.reduced, body.args[0])
        b = self.pad_to_zero(b, lb, dot.reduced, body.args[1])
        dtype = TL_DTYPES[dot.operand_dtype(self.interpret)]
        # a loaded 16-bit operand goes in as loaded, not converted to float32 and back
        a, b = (self.stored_as[v][0] if self.stored_as.get(v, ("", ""))[1] == dtype else v for v in (a, b))
        if dot.swap:  # [y, x] = B^T A^T, in canonical order as the dot gives it
            a, b = b, a
        a = f"tl.trans({a})" if dot.trans_a else a
        b = f"tl.trans({b})" if dot.trans_b else b
        var = self.assign(scope, "dot", self.dot_call(a, b, dtype))
        if dot.trans_out:
            var = self.assign(scope, "dot", f"tl.trans({var})")
        return var, dot.out

    def cast_to(self, scope: str, text: str, dtype: torch.dtype) -> str:
        """``text`` (a float32 value) cast to ``dtype``; to bfloat16 rounded to nearest
        even, under Triton's interpreter too ([Note: bfloat16 rounding under the
        interpreter])."""
        if not (self.interpret and dtype == torch.bfloat16):
            return f"({text}).to({TL_DTYPES[dtype]})"
        x = text if text.isidentifier() else self.assign(scope, "v", text)
        bits = self.assign(scope, "v", f"{x}.to(tl.uint32, bitcast=True)")
        rounded = f"({bits} + 0x7FFF + (({bits} >> 16) & 1)) & 0xFFFF0000"
        kept = self.assign(scope, "v", f"({rounded}).to(tl.float32, bitcast=True)")
        return f"tl.where({x} != {x}, {x}, {kept}).to(tl.bfloat16)"

    def dot_call(self, a: str, b: str, dtype: str) -> str:
        """``tl.dot`` of operand tiles ``a`` and ``b`` taken as ``dtype``; float32 ones with
        the compile's float32 precision."""
        precision = f', input_precision="{self.fp32_precision}"' if dtype == "tl.float32" else ""
        return f"tl.dot({a}.to({dtype}), {b}.to({dtype}){precision})"

    def pad_to_zero(self, var: str, layout, reduced: str, operand: Expr) -> str:
        """A contraction over a padded tile dim adds the product of the padding lanes: a
        loaded operand reads 0 there (masked loads), a computed one (``var``) gets 0 on
        those lanes, since what it computes from padding need not be finite (a
        probability divided by a row sum loaded as 0), and 0 times NaN is NaN."""
        dims = [d for d, role in self.roles.items() if role == reduced and self.padded.get(d, d.size) != d.size]
        if not dims or isinstance(operand, Load):
            return var
        return f"tl.where({self.offs(reduced, layout)} < {self.size(dims[0])}, {var}, 0.0)"

    def mask_loop(self, var: str, layout, expr: Expr, neutral: str) -> str:
        """Neutralise out-of-range loop positions of a computed (non-load) value."""
        if "n" not in layout or isinstance(expr, Load):
            return var
        return self.in_loop_range(var, layout, neutral)

    def in_loop_range(self, var: str, layout, neutral: str) -> str:
        """``var`` with loop positions past the end set to ``neutral`` (none on full tiles,
        nor in a serial loop, whose every step is in range)."""
        if self.full_tiles or self.tiling.serial:
            return var
        return f"tl.where({self.offs('n', layout)} < N_SIZE, {var}, {neutral})"

    def emit_inner_reduce(self, expr: Reduce, scope: str) -> tuple[str, tuple]:
        if expr.dims[0] in self.tiling.inner_loops:
            return self.emit_inner_loop(expr, scope)
        role = self.roles[expr.dims[0]]
        if expr.body in self.plan.dots:
            return self.emit_dot(expr.body, scope, mask_n=False)
        var, lay = self.emit(expr.body, scope)
        axis = lay.index(role)
        fn = "tl.sum" if expr.op == "sum" else "tl.max"
        d = expr.dims[0]
        if self.padded.get(d) != d.size:
            neutral = "0.0" if expr.op == "sum" else 'float("-inf")'
            var = f"tl.where({self.offs(role, lay)} < {self.size(d)}, {var}, {neutral})"
        return self.assign(scope, "red", f"{fn}({var}, axis={axis})"), tuple(r for r in lay if r != role)

    # ------------------------------------------------------------ the online loop
    def whole_tiles_apart(self) -> bool:
        """Whether the whole key tiles get a loop of their own, without bounds checks: for
        kernels without a liveness scan (which finds its own runs of full tiles) whose dots
        run on tensor cores. Where some dot multiplies IEEE float32 operands on CUDA cores
        (``TilePlan.fma_dots``), operand tiles fill the registers, and ptxas spills several
        times more in both loops of a kernel with two (sm_90 builds at head width 128). The
        interpreter's source has the GPU's loops."""
        return (self.kernel.live is None and not self.tiling.serial
                and not self.plan.fma_dots(self.fp32_precision, interpret=False))

    def lazy(self, k: int) -> bool:
        """Whether loop max ``k`` rescales its sums lazily ([Note: lazy rescaling])."""
        base2 = self.kernel.loop[k].base2
        return base2 is not None and base2.threshold is not None

    def emit_loop(self) -> None:
        kernel = self.kernel
        maxes = [k for k, r in enumerate(kernel.loop) if r.op == "max"]
        sums = [k for k, r in enumerate(kernel.loop) if r.op == "sum"]
        for k in maxes:
            lay = self.plan.loop_layouts[k]
            start = f"tl.full({self.shape(lay)}, float(\"-inf\"), tl.float32)"
            if kernel.loop[k].init is not None:  # max(init, max_j body_j): start from init
                var, init_lay = self.emit(kernel.loop[k].init, "pre")
                init = self.broadcast(var, init_lay, lay)  # promoted to float32 by tl.maximum
                start = f"tl.maximum({start}, {init}, propagate_nan=tl.PropagateNan.ALL)"
            self.pre.append(f"m{k} = {start}")
            if self.lazy(k):  # m{k}: the max the sums are relative to; mt{k}: the true max
                self.pre.append(f"mt{k} = m{k}")
        for k in sums:
            self.pre.append(f"acc{k} = tl.zeros({self.acc_shape(k)}, tl.float32)")
            dot = self.plan.sum_dot(k)
            if dot is not None:  # the column [1, 0, ..., 0] ([Note: row sums on the tensor core])
                dtype = TL_DTYPES[dot.operand_dtype(self.interpret)]
                column = f"tl.arange(0, {SUM_DOT_WIDTH})[None, :] + tl.zeros([{self.role_size('n')}, 1], tl.int32)"
                self.pre.append(f"ones{k} = (({column}) == 0).to({dtype})")
        if self.tiling.outer_loop:  # [Note: the repeats outside the key loop]
            self.positions[self.tiling.inner_loops[0]] = self.fresh("u")
        masked = self.emit_loop_step(kernel.loop, full_tiles=False)
        if kernel.unmasked is not None:
            # the same step without masks, for tiles every mask keeps whole
            self.loop_unmasked = self.emit_loop_step(kernel.unmasked, full_tiles=True)
        elif self.whole_tiles_apart():
            # the same step without bounds checks along the loop, for the tiles before the last
            self.loop_unmasked = self.emit_loop_step(kernel.loop, full_tiles=True)
        self.loop = masked
        self.emit_loop_results(maxes, sums)

    def emit_loop_results(self, maxes: list[int], sums: list[int]) -> None:
        """The loop's results after it; sums of a lazily rescaled max that the epilogue
        needs relative to the true max are rescaled to it once ([Note: lazy rescaling])."""
        settled = {}  # max -> the difference of its safe stale and true maxes
        for k in maxes:
            if self.lazy(k) and self.kernel.loop[k].base2.settle:
                safe = [f"tl.where({m} == float(\"-inf\"), 0.0, {m})" for m in (f"m{k}", f"mt{k}")]
                settled[k] = f"{safe[0]} - {safe[1]}"
        for k in maxes:
            self.post.append(f"res{k} = {'mt' if self.lazy(k) else 'm'}{k}")
        for k in sums:
            acc_lay = self.plan.loop_layouts[k]
            factors = [self.assign("post", "settle", self.exp_text(j, settled[j], power))
                       for j, power in self.kernel.loop[k].rescaled_by if j in settled]
            scale = "".join(f" * {self.broadcast(f, self.plan.loop_layouts[j], acc_lay)}"
                            for f, (j, _) in zip(factors, [r for r in self.kernel.loop[k].rescaled_by if r[0] in settled]))
            total = f"tl.sum(acc{k}, axis=1)" if self.plan.sum_dot(k) is not None else f"acc{k}"
            self.post.append(f"res{k} = {total}{scale}")

    def emit_loop_step(self, loop, full_tiles: bool) -> list[str]:
        """The lines of one step of an online loop over ``loop``'s reductions. Each step
        is printed in a loop of its own: nothing computed inside another is reused. On
        ``full_tiles`` every loop position is in range (no bounds masks along it)."""
        self.loop, self.full_tiles = [], full_tiles
        self.memo = {key: v for key, v in self.memo.items() if key[0] != "loop"}
        maxes = [k for k, r in enumerate(loop) if r.op == "max"]
        sums = [k for k, r in enumerate(loop) if r.op == "sum"]
        for k in maxes:
            var, lay = self.emit(loop[k].body, "loop")
            var = self.in_loop_range(var, lay, 'float("-inf")')
            # a serial loop's step is one position: its tile is the running max's shape
            block = var if self.tiling.serial else self.assign("loop", "bmax", f"tl.max({var}, axis={lay.index('n')})")
            if self.lazy(k):
                self.emit_lazy_max(k, block, loop)
                continue
            self.loop.append(f"m_new{k} = tl.maximum(m{k}, {block}, propagate_nan=tl.PropagateNan.ALL)")
            self.loop.append(f"m_safe{k} = tl.where(m_new{k} == float(\"-inf\"), 0.0, m_new{k})")
            self.loop.append(f"alpha{k} = {self.exp_text(k, f'm{k} - m_safe{k}', 1)}")
        looped = self.emit_looped_dots(loop)
        for k in sums:
            red = loop[k]
            acc_lay = self.plan.loop_layouts[k]
            if red.body in self.plan.dots:
                part, lay = self.emit_dot(red.body, "loop", mask_n=True)
            elif k in looped:
                if looped[k] is None:
                    continue  # added up in the inner loop
                part, lay = looped[k]
            elif self.plan.sum_dot(k) is not None:
                part, lay = self.emit_sum_dot(k, red.body), acc_lay
            elif self.tiling.serial:
                part, lay = self.emit(red.body, "loop")
            else:
                var, lay = self.emit(red.body, "loop")
                var = self.in_loop_range(var, lay, "0.0")
                part = self.assign("loop", "part", f"tl.sum({var}, axis={lay.index('n')})")
                lay = tuple(r for r in lay if r != "n")
            scale = "".join(f" * {self.on_acc(k, self.rescale_factor(j, power, acc_lay))}"
                            for j, power in red.rescaled_by if not self.lazy(j))
            self.loop.append(f"acc{k} = acc{k}{scale} + {self.broadcast(part, lay, acc_lay)}")
        for k in maxes:
            if not self.lazy(k):
                self.loop.append(f"m{k} = m_new{k}")
        self.full_tiles = False
        return self.loop

    def emit_lazy_max(self, k: int, block: str, loop) -> None:
        """The step of a lazily rescaled max ([Note: lazy rescaling]): raise the true max;
        where some row of the tile grew by more than the threshold, rescale every row's
        sums to it; ``m_safe{k}`` is then the max the step's terms are relative to."""
        base2, lay = loop[k].base2, self.plan.loop_layouts[k]
        self.loop.append(f"mt{k} = tl.maximum(mt{k}, {block}, propagate_nan=tl.PropagateNan.ALL)")
        grow = self.assign("loop", "grow", f"mt{k} > m{k} + {literal(base2.threshold / base2.log2_scale)}")
        self.loop.append(f"if {_any(grow, lay)}:")
        step = [f"m_up{k} = tl.where(mt{k} == float(\"-inf\"), 0.0, mt{k})",
                f"alpha{k} = {self.exp_text(k, f'm{k} - m_up{k}', 1)}"]
        for s, red in enumerate(loop):
            for j, power in red.rescaled_by if red.op == "sum" else ():
                if j == k:
                    factor = f"alpha{k}" if power == 1 else self.exp_text(k, f"m{k} - m_up{k}", power)
                    factor = self.on_acc(s, self.broadcast(factor, lay, self.plan.loop_layouts[s]))
                    step.append(f"acc{s} = acc{s} * {factor}")
        step.append(f"m{k} = mt{k}")
        self.loop.extend("    " + line for line in step)
        self.loop.append(f"m_safe{k} = tl.where(m{k} == float(\"-inf\"), 0.0, m{k})")

    def exp_text(self, k: int, diff: str, power: float) -> str:
        """``exp(power * diff)`` of a difference of loop max ``k``'s values, in base 2 where
        the max runs in base 2 ([Note: base-2 online softmax])."""
        base2 = self.kernel.loop[k].base2
        if base2 is None:
            return f"tl.exp({diff})" if power == 1 else f"tl.exp({literal(float(power))} * ({diff}))"
        return f"tl.exp2(({diff}) * {literal(float(power) * base2.log2_scale)})"

    def rescale_factor(self, k: int, power: float, layout) -> str:
        """``exp(power * (m_old - m_new))`` of loop max ``k`` ([Note: online reduction])."""
        alpha = f"alpha{k}"
        if power != 1:
            alpha = self.assign("loop", "alpha", self.exp_text(k, f"m{k} - m_safe{k}", power))
        return self.broadcast(alpha, self.plan.loop_layouts[k], layout)

    def emit_store(self) -> None:
        for k, (output, out_roles) in enumerate(zip(self.kernel.outputs(), self.plan.store_layouts)):
            self.emit_output_store(output_arg(k), output, out_roles)

    def emit_output_store(self, out: str, output, out_roles) -> None:
        """Store one output; a program whose grid coordinate along a dim the output does
        not span is not the first stores nothing (the others hold the same values)."""
        var, lay = self.emit(output.epilogue, "post")
        var = self.broadcast(var, lay, out_roles)
        if not lay and out_roles:
            var = f"tl.full({self.shape(out_roles)}, {var}, tl.float32)"
        offset = " + ".join(f"({self.index(axis, out_roles)}) * {out}_s{a}" for a, axis in enumerate(output.axes) if axis) or "0"
        dtype = output.dtype
        if self.tiling.split:  # this program's float32 partial sum ([Note: split serial loops])
            offset, dtype = f"pid_s * {out}_split + {offset}", torch.float32
        mask = self.mask(output.dims, out_roles) or None
        masked = f", mask={mask}" if mask else ""
        self.assert_in_bounds("post", out, offset, mask, out_roles)  # the same offsets in every program
        store = f"tl.store({out} + {offset}, {self.cast_to('post', var, dtype)}{masked})"
        # a scalar condition guards the store rather than joining a block mask with `&`
        # (Triton's interpreter rejects a mask mixing a scalar and a block)
        first = " & ".join(f"({self.grid_var(d)} == 0)" for d in self.tiling.grid if d not in output.dims)
        self.post.extend([f"if {first}:", f"    {store}"] if first else [store])

    # --------------------------------------------------------------------- whole
    def print(self) -> KernelSource:
        self.emit_loop()
        self.emit_store()
        row = self.tiling.row
        # [Note: 64-bit offsets]: every offset derives from pid and index0 (its zero)
        head = ["pid = tl.program_id(0)", f"if INDEX_BITS == {WIDE_BITS}:", "    pid = pid.to(tl.int64)",
                "index0 = pid * 0"]
        # no row dim (a length-1 query axis): one program per grid point
        head.append(f"num_m = tl.cdiv({self.size(row)}, BLOCK_M)" if row is not None else "num_m = 1")
        head.append("pid_m = pid % num_m")
        head.append("rest = pid // num_m")
        if self.tiling.serial:  # the column's tiles across the grid ([Note: serial loops])
            head.append(f"num_n = tl.cdiv({self.size(self.tiling.column)}, BLOCK_N)")
            head.append("pid_n = rest % num_n")
            head.append("rest = rest // num_n")
            head.append("offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        if self.tiling.split:  # this program's run of loop positions ([Note: split serial loops])
            head.append("pid_s = rest % SPLITS")
            head.append("rest = rest // SPLITS")
        for d in reversed(self.tiling.grid):
            head.append(f"{self.grid_var(d)} = rest % {self.size(d)}")
            head.append(f"rest = rest // {self.size(d)}")
        head.append("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        for d, role in self.roles.items():
            if role[0] in "ef" and f"offs_{role} =" not in "\n".join(head):
                head.append(f"offs_{role} = index0 + tl.arange(0, {self.padded[d]})")
        loop_extent = self.size(self.kernel.loop[0].dim)
        head.append(f"N_SIZE = {loop_extent}")
        outs = [output_arg(k) for k in range(len(self.kernel.outputs()))]
        if self.whole_tiles_apart():
            # the tiles before the last one are whole: they run without bounds checks along
            # the loop (with a static size divisible by BLOCK_N, the last loop is empty)
            head.append("N_FULL = N_SIZE - N_SIZE % BLOCK_N")
            loops = [("0", "N_FULL", self.loop_unmasked), ("N_FULL", "N_SIZE", self.loop)]
        elif self.kernel.live is None:
            loops = [("0", "N_SIZE", self.loop)]
        else:
            scan = LiveScan(self, self.kernel.live, self.kernel.full)
            first, end = scan.emit()
            loops = [(first, end, self.loop)]
            if self.kernel.full is not None:
                full_first, full_end = scan.full_range
                # masked tiles before the run of full tiles, the run unmasked, masked after
                loops = [(first, full_first, self.loop), (full_first, full_end, self.loop_unmasked),
                         (full_end, end, self.loop)]
        body = []  # the key loop(s)
        for start, stop, steps in loops:
            if self.tiling.split:
                first = "pid_s * SPLIT_LEN"
                start = first if start == "0" else f"tl.maximum({start}, {first})"
                stop = f"tl.minimum({stop}, {first} + SPLIT_LEN)"
            if self.tiling.serial:
                body.append(f"for start_n in range({start}, {stop}):")
            else:
                body.append(f"for start_n in range({start}, {stop}, BLOCK_N):")
                body.append("    offs_n = index0 + start_n + tl.arange(0, BLOCK_N)")
            body += ["    " + line for line in steps]
        if self.tiling.outer_loop:  # each pass: its own values, then the key loop(s)
            (d,) = self.tiling.inner_loops
            body = [f"for {self.positions.pop(d)} in range(0, {self.size(d)}):"] + [
                "    " + line for line in self.outer + body]
        # the parameters last: every size and input the text above printed is one
        params = [f"in{k}" for k in range(len(self.inputs))] + outs
        params += [f"size{k}" for k in range(len(self.sizes))]
        params += [f"in{k}_s{a}" for k, r in enumerate(self.ranks) for a in range(r)]
        params += [f"{out}_s{a}" for out, o in zip(outs, self.kernel.outputs()) for a in range(len(o.axes))]
        if self.tiling.split:
            params += ["SPLITS", "SPLIT_LEN", f"{outs[0]}_split"]
        if self.check_bounds:
            params += [f"in{k}_span" for k in range(len(self.inputs))] + [f"{out}_span" for out in outs] + ["errors"]
        params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", f"INDEX_BITS: tl.constexpr = {NARROW_BITS}"]
        body = head + self.pre + body + self.post
        text = f"({', '.join(params)}):\n" + "\n".join("    " + line for line in body) + "\n"
        # unnamed: named by content, so the same kernel compiled again (another module of
        # the same shape, a recompile, a new process) has the same source, and Triton's
        # on-disk cache of built kernels serves it
        name = self.name or f"flashlight_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        src = "import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + f"def {name}{text}"
        return KernelSource(name, src, tuple(self.inputs), tuple(self.ranks),
                            tuple(self.sizes), len(self.kernel.axes),
                            tuple((self.inputs.index(name), axis) for name, axis in self.plan.relayouts),
                            self.check_bounds, self.fp32_precision,
                            self.plan.fma_dots(self.fp32_precision, self.interpret),
                            tuple(len(o.axes) for o in self.kernel.extra_outputs), self.tiling.split)


def output_arg(k: int) -> str:
    """The name of the kernel's ``k``-th output argument: ``out``, then ``out1``, ..."""
    return f"out{k}" if k else "out"


def _any(flag: str, layout) -> str:
    """Whether ``flag`` (a boolean tile of ``layout``) holds anywhere in the tile."""
    if not layout:
        return flag
    text = f"{flag}.to(tl.int32)"
    for axis in reversed(range(len(layout))):
        text = f"tl.max({text}, axis={axis})"
    return f"{text} > 0"


def _pow(base: str, exponent) -> str:
    """``base ** exponent``: exact products for small integer exponents, else through
    ``exp`` and ``log`` (NaN for a negative base, as ``torch.pow`` gives)."""
    special = {0.5: f"tl.sqrt({base})", -0.5: f"tl.rsqrt({base})"}
    if exponent in special:
        return special[exponent]
    if float(exponent).is_integer():  # at most MAX_POW_PRODUCT factors (the tiling checks)
        product = "(" + " * ".join([base] * int(abs(exponent))) + ")"
        return product if exponent > 0 else f"(1.0 / {product})"
    return f"tl.exp({literal(float(exponent))} * tl.log({base}))"


# [Note: float32 products as three TF32 products]
# With TF32 off (``torch.backends.cuda.matmul.allow_tf32 = False``) a float32 ``tl.dot``
# printed with ``input_precision="ieee"`` runs on the CUDA cores as a loop of FMAs, at a
# quarter to a third of the SGEMM rate cuBLAS reaches, and with operand tiles in
# registers (smaller tiles, spills at head widths of 64-128). ``"tf32x3"`` splits each
# operand into a TF32 high part and the TF32 rounding of the rest, and adds three
# tensor-core products (high x high, high x low, low x high; the dropped low x low term
# is below 2 ** -22 of the product), accumulated in float32: about 2 ** -21 relative per
# product, the size of float32's own accumulated rounding over a few dozen terms. Measured
# on an H100 against float64 (bench/results/h100_2026-12-07c/, five catalog cells): the
# kernels' errors are at most the IEEE kernels' (1e-7 to 2e-6), and they run 1.02-3.5x
# faster than the IEEE kernel or the unfused graph it fell back to, and 1.2-2.9x faster
# than SDPA's float32 kernels on four cells (1.53x slower on a plain softmax over 16384
# positions). So it is the default; ``FLASHLIGHT_FP32_DOTS=ieee`` keeps every product
# exact. With TF32 on, ``"tf32"``.
def fp32_precision() -> str:
    """How float32 ``tl.dot`` s are printed: ``"tf32"`` where
    ``torch.backends.cuda.matmul.allow_tf32`` is on, else ``"tf32x3"`` (three TF32
    products) or, with ``FLASHLIGHT_FP32_DOTS=ieee``, ``"ieee"`` ([Note: float32 products
    as three TF32 products])."""
    # the setting's values are the precisions' names; read only with TF32 off (the fold's
    # float32 runs with it on), since traced capture asks on every call
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else settings.get("fp32_dots")


def generate(tk: TiledKernel, name: str | None = None, fp32_precision: str = "ieee", interpret: bool = False,
             check_bounds: bool = False) -> KernelSource:
    """Print ``tk`` as a Triton kernel named ``name`` (default: ``flashlight_`` and a digest
    of the source, equal for equal kernels), for the interpreter if ``interpret``,
    asserting every memory offset if ``check_bounds``."""
    return _Printer(tk, name, fp32_precision, interpret, check_bounds).print()
