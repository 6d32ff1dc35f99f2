"""Triton code generation: prints a tiled kernel as Triton source.

Every decision (which dims are tiles, which loop, what is a ``tl.dot``, how the online
loop rescales) was made by the passes; this module only spells it out. The printed
kernel has a fixed shape:

1. decode the logical grid from ``tl.program_id(0)`` (row blocks innermost, so
   programs that share keys and values run together);
2. loop-invariant values (the query tile, row biases) before the loop;
3. one loop over the ``n`` tiles updating the online reductions
   ([Note: online reduction] in :mod:`flashlight.passes.online`);
4. the epilogue and one masked store.
"""
from __future__ import annotations

import dataclasses
import hashlib

import torch

from flashlight.codegen_live import LiveScan, rounding_division
from flashlight.ir import (
    Const,
    Dim,
    Expr,
    Iota,
    Load,
    LoopResult,
    Pointwise,
    Reduce,
    RunningMax,
    TiledKernel,
    walk,
)
from flashlight.passes.tiling import Layouts, canonical, roles_of
from flashlight.vocabulary import BOOLEAN_OPS, DIVISION_OPS, OPS

TL_DTYPES = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}

@dataclasses.dataclass(frozen=True)
class KernelSource:
    """Generated source with what the launcher needs to call it."""

    name: str
    source: str
    inputs: tuple[str, ...]  # tensor arguments, in order (the output comes last)
    input_ranks: tuple[int, ...]
    size_args: tuple[str, ...]  # symbolic size texts, in argument order
    out_rank: int
    # (input, axis) pairs: inputs re-read by many programs whose innermost tile axis
    # should be contiguous; the launcher copies them into that layout when it is not
    fast_axes: tuple[tuple[int, int], ...]
    check_bounds: bool  # the kernel takes in{k}_span / out_span and asserts offsets
    fp32_precision: str  # "ieee" or "tf32": how fp32 contractions run
    # some tl.dot multiplies IEEE float32 operands: it runs on CUDA cores, with operands
    # and products in registers, not on tensor cores (the launcher then tries smaller tiles)
    fma_dots: bool = False


def _literal(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value != value:
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(value)


class _Printer:
    def __init__(self, tk: TiledKernel, name: str, fp32_precision: str, interpret: bool, check_bounds: bool):
        self.interpret = interpret
        self.check_bounds = check_bounds
        self.tk = tk
        self.kernel = tk.kernel
        self.tiling = tk.tiling
        self.name = name
        self.fp32_precision = fp32_precision
        self.roles = roles_of(self.tiling, self.kernel)
        grid = set(self.tiling.grid)
        self.layouts = Layouts(self.kernel, self.roles, grid)
        self.padded = dict(self.tiling.padded)
        self.inputs: list[str] = []
        self.ranks: list[int] = []
        self.fma_dots = False
        self.fast_axes: dict[int, int] = {}
        self.sizes: list[str] = []
        self.pre: list[str] = []
        self.loop: list[str] = []
        self.loop_unmasked: list[str] = []  # the loop step on full tiles (kernel.unmasked)
        self.full_tiles = False  # printing that step: every loop position is in range
        self.scan: list[str] = []  # the tile-liveness scan's body (see codegen_live)
        # keys in one tile of the loop dim and their offsets (other in the coarse scan)
        self.n_width, self.n_offs = "BLOCK_N", "offs_n"
        self.post: list[str] = []
        self.memo: dict[tuple[str, Expr], tuple[str, tuple]] = {}
        self.stored_as: dict[str, tuple[str, str]] = {}  # float32 tile -> (as loaded, its tl dtype)
        self.counter = 0
        self.loop_dims = {red.dim for red in self.kernel.loop}

    # ------------------------------------------------------------------ helpers
    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def size(self, d: Dim) -> str:
        if d.is_static:
            return str(d.size)
        if d.size not in self.sizes:
            self.sizes.append(d.size)
        return f"size{self.sizes.index(d.size)}"

    def role_size(self, role: str) -> str:
        if role == "m":
            return "BLOCK_M"
        if role == "n":
            return self.n_width
        for d, r in self.roles.items():
            if r == role:
                return str(self.padded[d])
        raise KeyError(role)

    def shape(self, layout) -> str:
        return "[" + ", ".join(self.role_size(r) for r in layout) + "]"

    def offs(self, role: str, layout) -> str:
        var = self.n_offs if role == "n" else f"offs_{role}"
        if len(layout) <= 1:
            return var
        return f"{var}[:, None]" if layout[0] == role else f"{var}[None, :]"

    def broadcast(self, var: str, src, dst) -> str:
        src, dst = tuple(src), tuple(dst)
        if src == dst or not src:
            return var
        if len(src) == 2:
            return f"tl.trans({var})" if src == dst[::-1] else var
        return f"{var}[:, None]" if dst[0] == src[0] else f"{var}[None, :]"

    def grid_var(self, d: Dim) -> str:
        """The program's coordinate along grid dim ``d``, named by the dim's place in the
        grid (not its global name), so equal kernels print equal source."""
        return f"g{self.tiling.grid.index(d)}"

    def dim_term(self, d: Dim, layout) -> str:
        role = self.roles.get(d)
        return self.grid_var(d) if role is None else self.offs(role, layout)

    def index(self, axis, layout) -> str:
        if not axis:
            return "0"
        text = self.dim_term(axis[0], layout)
        for d in axis[1:]:
            text = f"({text}) * {self.size(d)} + {self.dim_term(d, layout)}"
        return text

    def mask(self, dims, layout) -> str | None:
        parts = []
        for d in dims:
            role = self.roles.get(d)
            if role is None or (role == "n" and self.full_tiles):
                continue
            bound = self.extent(role)
            if role[0] in "ef" and self.padded.get(d) == d.size:
                continue
            parts.append(f"({self.offs(role, layout)} < {bound})")
        return " & ".join(parts) if parts else None

    def extent(self, role: str) -> str:
        for d, r in self.roles.items():
            if r == role:
                return self.size(d)
        raise KeyError(role)

    def scope_of(self, expr: Expr) -> str:
        for node in walk(expr):
            if isinstance(node, RunningMax):
                return "loop"
            if isinstance(node, (Load, Iota)) and any(d in self.loop_dims for d in _index_dims(node)):
                return "loop"
        return "pre"

    # ----------------------------------------------------------------- emission
    def emit(self, expr: Expr, scope: str) -> tuple[str, tuple]:
        target = self.scope_of(expr) if scope == "loop" else scope
        if target == "pre" and scope == "post":
            target = "post"
        for s in ((target, "pre") if target != "pre" else ("pre",)):
            if (s, expr) in self.memo:
                return self.memo[(s, expr)]
        var, layout = self._emit(expr, target)
        self.memo[(target, expr)] = (var, layout)
        return var, layout

    def lines(self, scope: str) -> list[str]:
        return {"pre": self.pre, "loop": self.loop, "post": self.post, "scan": self.scan}[scope]

    def assign(self, scope: str, hint: str, text: str) -> str:
        var = self.fresh(hint)
        self.lines(scope).append(f"{var} = {text}")
        return var

    def _emit(self, expr: Expr, scope: str) -> tuple[str, tuple]:
        layout = self.layouts.of(expr)
        if isinstance(expr, Const):
            return _literal(expr.value), ()
        if isinstance(expr, Load):
            return self.emit_load(expr, layout, scope), layout
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

    def load_text(self, load: Load, layout, scope: str) -> tuple[str, str | None]:
        """The masked ``tl.load`` of ``load``'s tile (its input registered, its offsets
        bounds-checked in ``scope``), and the mask of valid lanes."""
        if load.base not in self.inputs:
            self.inputs.append(load.base)
            self.ranks.append(len(load.index))
        k = self.inputs.index(load.base)
        self.note_fast_axis(k, load, layout)
        offset = " + ".join(f"({self.index(axis, layout)}) * in{k}_s{a}" for a, axis in enumerate(load.index) if axis) or "0"
        mask = self.mask(_index_dims(load), layout)
        masked = f", mask={mask}, other=0" if mask else ""
        self.assert_in_bounds(scope, f"in{k}", offset, mask, layout)
        return f"tl.load(in{k} + {offset}{masked})", mask

    def emit_load(self, load: Load, layout, scope: str) -> str:
        """The loaded tile as computed on: float32 for floats, ``tl.int1`` for booleans.
        A 16-bit float tile is also kept as loaded (``stored_as``), for ``tl.dot``."""
        value, _ = self.load_text(load, layout, scope)
        if load.dtype in (torch.bfloat16, torch.float16):
            stored = self.assign(scope, "x", value)
            var = self.assign(scope, "x", f"{stored}.to(tl.float32)")
            self.stored_as[var] = (stored, TL_DTYPES[load.dtype])
            return var
        if load.dtype.is_floating_point:
            value += ".to(tl.float32)"
        elif load.dtype == torch.bool:
            value = f"({value} != 0)"
        return self.assign(scope, "x", value)

    def assert_in_bounds(self, scope: str, tensor: str, offset: str, mask: str | None, layout) -> None:
        """With ``check_bounds``: count unmasked lanes whose offset leaves the tensor.

        The count goes to ``errors[slot]`` (one slot per tensor argument); the launcher
        raises if any is non-zero. (``tl.device_assert`` is not enforced by the Triton
        interpreter, so the check is ordinary arithmetic.)
        """
        if not self.check_bounds:
            return
        slot = len(self.inputs) if tensor == "out" else int(tensor[2:])
        off = self.assign(scope, "off", f"{offset} + tl.zeros({self.shape(layout)}, tl.int32)" if layout else offset)
        outside = f"(({off} < 0) | ({off} >= {tensor}_span))"
        bad = f"({outside} & {mask})" if mask else outside
        count = self.assign(scope, "bad", f"tl.sum(({bad}).to(tl.int32))" if layout else f"({bad}).to(tl.int32)")
        self.lines(scope).append(f"tl.atomic_add(errors + {slot}, {count})")

    def note_fast_axis(self, k: int, load: Load, layout) -> None:
        """Remember which axis should be contiguous for a tile re-read across the grid.

        A tile whose innermost role is strided in memory wastes most of every memory
        sector it touches; when the tensor is broadcast over some grid dims (a pair bias
        read for every MSA row), a one-off contiguous copy is far cheaper than that.
        """
        if not layout or k in self.fast_axes:
            return
        used = set(_index_dims(load))
        if all(d in used for d in self.tiling.grid):
            return
        inner = layout[-1]
        for a, axis in enumerate(load.index):
            if axis and self.roles.get(axis[-1]) == inner:
                self.fast_axes[k] = a

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
        elif op == "cast":
            text = f"({args[0]}).to({TL_DTYPES[expr.dtype]})"
        else:
            raise NotImplementedError(op)
        if expr.dtype.is_floating_point and op in BOOLEAN_OPS:
            raise NotImplementedError("comparison typed as float")
        return self.assign(scope, "v", text)

    def emit_dot(self, body: Pointwise, reduced: str, scope: str, mask_n: bool) -> tuple[str, tuple]:
        (a, la), (b, lb) = (self.emit(x, scope) for x in body.args)
        if mask_n:
            a = self.mask_loop(a, la, body.args[0], "0.0")
            b = self.mask_loop(b, lb, body.args[1], "0.0")
        a = self.pad_to_zero(a, la, reduced, body.args)
        x = [r for r in la if r != reduced][0]
        y = [r for r in lb if r != reduced][0]
        low = body.dtype in (torch.bfloat16, torch.float16) and not self.interpret
        # the Triton interpreter multiplies 16-bit floats wrongly: it gets fp32 operands
        dtype = TL_DTYPES[body.dtype] if low else "tl.float32"
        # a loaded 16-bit operand goes in as loaded, not converted to float32 and back
        a, b = (self.stored_as[v][0] if self.stored_as.get(v, ("", ""))[1] == dtype else v for v in (a, b))
        a = a if la == (x, reduced) else f"tl.trans({a})"
        b = b if lb == (reduced, y) else f"tl.trans({b})"
        precision = f', input_precision="{self.fp32_precision}"' if dtype == "tl.float32" else ""
        self.fma_dots |= dtype == "tl.float32" and self.fp32_precision == "ieee"
        text = f"tl.dot({a}.to({dtype}), {b}.to({dtype}){precision})"
        out = canonical((x, y))
        var = self.assign(scope, "dot", text)
        if out != (x, y):
            var = self.assign(scope, "dot", f"tl.trans({var})")
        return var, out

    def pad_to_zero(self, var: str, layout, reduced: str, operands) -> str:
        """A contraction over a padded tile dim adds the product of the padding lanes:
        zero when an operand is loaded (masked loads read 0 there), else ``var`` (the
        first operand, computed) gets 0 on those lanes."""
        dims = [d for d, role in self.roles.items() if role == reduced and self.padded.get(d, d.size) != d.size]
        if not dims or any(isinstance(x, Load) for x in operands):
            return var
        return f"tl.where({self.offs(reduced, layout)} < {self.size(dims[0])}, {var}, 0.0)"

    def mask_loop(self, var: str, layout, expr: Expr, neutral: str) -> str:
        """Neutralise out-of-range loop positions of a computed (non-load) value."""
        if "n" not in layout or isinstance(expr, Load):
            return var
        return self.in_loop_range(var, layout, neutral)

    def in_loop_range(self, var: str, layout, neutral: str) -> str:
        """``var`` with loop positions past the end set to ``neutral`` (none on full tiles)."""
        if self.full_tiles:
            return var
        return f"tl.where({self.offs('n', layout)} < N_SIZE, {var}, {neutral})"

    def emit_inner_reduce(self, expr: Reduce, scope: str) -> tuple[str, tuple]:
        role = self.roles[expr.dims[0]]
        if self.layouts.is_dot(expr.body, role):
            return self.emit_dot(expr.body, role, scope, mask_n=False)
        var, lay = self.emit(expr.body, scope)
        axis = lay.index(role)
        fn = "tl.sum" if expr.op == "sum" else "tl.max"
        d = expr.dims[0]
        if self.padded.get(d) != d.size:
            neutral = "0.0" if expr.op == "sum" else 'float("-inf")'
            var = f"tl.where({self.offs(role, lay)} < {self.size(d)}, {var}, {neutral})"
        return self.assign(scope, "red", f"{fn}({var}, axis={axis})"), tuple(r for r in lay if r != role)

    # ------------------------------------------------------------ the online loop
    def emit_loop(self) -> None:
        kernel = self.kernel
        maxes = [k for k, r in enumerate(kernel.loop) if r.op == "max"]
        sums = [k for k, r in enumerate(kernel.loop) if r.op == "sum"]
        for k in maxes:
            lay = self.layouts.loop_layouts[k]
            start = f"tl.full({self.shape(lay)}, float(\"-inf\"), tl.float32)"
            if kernel.loop[k].init is not None:  # max(init, max_j body_j): start from init
                var, init_lay = self.emit(kernel.loop[k].init, "pre")
                init = self.broadcast(var, init_lay, lay)  # promoted to float32 by tl.maximum
                start = f"tl.maximum({start}, {init}, propagate_nan=tl.PropagateNan.ALL)"
            self.pre.append(f"m{k} = {start}")
        for k in sums:
            self.pre.append(f"acc{k} = tl.zeros({self.shape(self.layouts.loop_layouts[k])}, tl.float32)")
        masked = self.emit_loop_step(kernel.loop, full_tiles=False)
        if kernel.unmasked is not None:
            # the same step without masks, for tiles every mask keeps whole
            self.loop_unmasked = self.emit_loop_step(kernel.unmasked, full_tiles=True)
        self.loop = masked
        for k in maxes:
            self.post.append(f"res{k} = m{k}")
        for k in sums:
            self.post.append(f"res{k} = acc{k}")

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
            block = self.assign("loop", "bmax", f"tl.max({var}, axis={lay.index('n')})")
            self.loop.append(f"m_new{k} = tl.maximum(m{k}, {block}, propagate_nan=tl.PropagateNan.ALL)")
            self.loop.append(f"m_safe{k} = tl.where(m_new{k} == float(\"-inf\"), 0.0, m_new{k})")
            self.loop.append(f"alpha{k} = tl.exp(m{k} - m_safe{k})")
        for k in sums:
            red = loop[k]
            acc_lay = self.layouts.loop_layouts[k]
            if self.layouts.is_dot(red.body, "n"):
                part, lay = self.emit_dot(red.body, "n", "loop", mask_n=True)
            else:
                var, lay = self.emit(red.body, "loop")
                var = self.in_loop_range(var, lay, "0.0")
                part = self.assign("loop", "part", f"tl.sum({var}, axis={lay.index('n')})")
                lay = tuple(r for r in lay if r != "n")
            scale = "".join(f" * {self.rescale_factor(j, power, acc_lay)}" for j, power in red.rescaled_by)
            self.loop.append(f"acc{k} = acc{k}{scale} + {self.broadcast(part, lay, acc_lay)}")
        for k in maxes:
            self.loop.append(f"m{k} = m_new{k}")
        self.full_tiles = False
        return self.loop

    def rescale_factor(self, k: int, power: float, layout) -> str:
        """``exp(power * (m_old - m_new))`` of loop max ``k`` ([Note: online reduction])."""
        alpha = f"alpha{k}"
        if power != 1:
            alpha = self.assign("loop", "alpha", f"tl.exp({_literal(float(power))} * (m{k} - m_safe{k}))")
        return self.broadcast(alpha, self.layouts.loop_layouts[k], layout)

    def emit_store(self) -> None:
        var, lay = self.emit(self.kernel.epilogue, "post")
        out_roles = canonical(self.roles[d] for d in self.kernel.dims if d in self.roles)
        var = self.broadcast(var, lay, out_roles)
        if not lay and out_roles:
            var = f"tl.full({self.shape(out_roles)}, {var}, tl.float32)"
        offset = " + ".join(f"({self.index(axis, out_roles)}) * out_s{a}" for a, axis in enumerate(self.kernel.axes) if axis) or "0"
        mask = self.mask(self.kernel.dims, out_roles)
        masked = f", mask={mask}" if mask else ""
        self.assert_in_bounds("post", "out", offset, mask, out_roles)
        self.post.append(f"tl.store(out + {offset}, ({var}).to({TL_DTYPES[self.kernel.dtype]}){masked})")

    # --------------------------------------------------------------------- whole
    def print(self) -> KernelSource:
        self.emit_loop()
        self.emit_store()
        row = self.tiling.row
        head = ["pid = tl.program_id(0)"]
        # no row dim (a length-1 query axis): one program per grid point
        head.append(f"num_m = tl.cdiv({self.size(row)}, BLOCK_M)" if row is not None else "num_m = 1")
        head.append("pid_m = pid % num_m")
        head.append("rest = pid // num_m")
        for d in reversed(self.tiling.grid):
            head.append(f"{self.grid_var(d)} = rest % {self.size(d)}")
            head.append(f"rest = rest // {self.size(d)}")
        head.append("offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        for d, role in self.roles.items():
            if role[0] in "ef" and f"offs_{role} =" not in "\n".join(head):
                head.append(f"offs_{role} = tl.arange(0, {self.padded[d]})")
        loop_extent = self.size(self.kernel.loop[0].dim)
        head.append(f"N_SIZE = {loop_extent}")
        params = [f"in{k}" for k in range(len(self.inputs))] + ["out"]
        params += [f"size{k}" for k in range(len(self.sizes))]
        params += [f"in{k}_s{a}" for k, r in enumerate(self.ranks) for a in range(r)]
        params += [f"out_s{a}" for a in range(len(self.kernel.axes))]
        if self.check_bounds:
            params += [f"in{k}_span" for k in range(len(self.inputs))] + ["out_span", "errors"]
        params += ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr"]
        loops = [("0", "N_SIZE", self.loop)]
        if self.kernel.live is not None:
            scan = LiveScan(self, self.kernel.live, self.kernel.full)
            first, end = scan.emit()
            loops = [(first, end, self.loop)]
            if self.kernel.full is not None:
                full_first, full_end = scan.full_range
                # masked tiles before the run of full tiles, the run unmasked, masked after
                loops = [(first, full_first, self.loop), (full_first, full_end, self.loop_unmasked),
                         (full_end, end, self.loop)]
        body = head + self.pre
        for start, stop, steps in loops:
            body.append(f"for start_n in range({start}, {stop}, BLOCK_N):")
            body.append("    offs_n = start_n + tl.arange(0, BLOCK_N)")
            body += ["    " + line for line in steps]
        body += self.post
        text = f"({', '.join(params)}):\n" + "\n".join("    " + line for line in body) + "\n"
        # unnamed: named by content, so the same kernel compiled again (another module of
        # the same shape, a recompile, a new process) has the same source, and Triton's
        # on-disk cache of built kernels serves it
        name = self.name or f"flashlight_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
        src = "import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + f"def {name}{text}"
        return KernelSource(name, src, tuple(self.inputs), tuple(self.ranks),
                            tuple(self.sizes), len(self.kernel.axes), tuple(self.fast_axes.items()),
                            self.check_bounds, self.fp32_precision, self.fma_dots)


def _index_dims(node: Expr) -> tuple[Dim, ...]:
    axes = node.index if isinstance(node, Load) else (node.axis,)
    return tuple(d for axis in axes for d in axis)


def _pow(base: str, exponent) -> str:
    """``base ** exponent``: exact products for small integer exponents, else through
    ``exp`` and ``log`` (NaN for a negative base, as ``torch.pow`` gives)."""
    special = {0.5: f"tl.sqrt({base})", -0.5: f"tl.rsqrt({base})"}
    if exponent in special:
        return special[exponent]
    if float(exponent).is_integer():  # at most MAX_POW_PRODUCT factors (the tiling checks)
        product = "(" + " * ".join([base] * int(abs(exponent))) + ")"
        return product if exponent > 0 else f"(1.0 / {product})"
    return f"tl.exp({_literal(float(exponent))} * tl.log({base}))"


def generate(tk: TiledKernel, name: str | None = None, fp32_precision: str = "ieee", interpret: bool = False,
             check_bounds: bool = False) -> KernelSource:
    """Print ``tk`` as a Triton kernel named ``name`` (default: ``flashlight_`` and a digest
    of the source, equal for equal kernels), for the interpreter if ``interpret``,
    asserting every memory offset if ``check_bounds``."""
    return _Printer(tk, name, fp32_precision, interpret, check_bounds).print()
