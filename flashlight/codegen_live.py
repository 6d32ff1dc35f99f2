"""Prints the tile-liveness scan of a kernel with a ``live`` predicate.

Before the online loop, a cheap loop visits every key tile and bounds ``live`` over the
``BLOCK_M x BLOCK_N`` tile by interval arithmetic; the online loop then runs from the
first to the last tile that may be live ([Note: tile skipping] in
:mod:`flashlight.passes.skipping`, which also says which values can be bounded).
Tiles between those two still run, masked as usual, so the result is exact whatever
the mask. With a ``full`` predicate the scan also finds the first run of tiles every
mask keeps whole, which run without masks. Two forms, by what the predicate reads:

* indices only (causal, windows): a coarse step bounds ``Tiling.scan_tiles`` key tiles
  at a time with scalars, then a scalar step per tile runs over the keys it could not
  rule out (no loads, no reductions: a few integer operations per tile);
* values loaded along the keys (document ids, key lengths): the vector scan below.

[Note: the vector scan]
A predicate that reads document ids must read every key's id: each program loads the
whole id vector. Loaded a wide step at a time and then tile by tile over the steps it
kept (the form above), the fine steps add a dependent load and two block-wide
reductions per key tile; measured on an H200 (bf16, 16384 keys, 32 documents), the
scan alone took 0.45-0.74 ms of the kernel's 1.1 ms, FlexAttention's whole kernel
0.62 (``bench/results/vector_scan``). The vector scan reads the ids once, ``scan_tiles``
key tiles per step as a ``[tiles, BLOCK_N]`` block, bounds each tile along its second
axis (``tl.min(..., axis=1)``), evaluates the predicate on ``[tiles]`` vectors (one lane
per tile), and keeps the live range per lane (``first_t``, ``end_t``), reduced once
after the loop. The first run of full tiles needs the order across lanes: per step,
its start is the smallest full tile seen so far and its end the smallest tile after
that start which is not full (two reductions of ``tiles`` values). The row tile's
bounds enter as vectors too (``row_lo_t``), so that no scalar comparison meets a
vector of booleans (the Triton interpreter keeps such a scalar comparison of floats as
a float).

Bounds per value: a number is ``(lo, hi)``; a boolean is ``(may_be_true,
may_be_false)``. Both are Triton scalars or literals, or ``[tiles]`` vectors in the
vector scan.
"""
from __future__ import annotations

import math

import torch

from flashlight.codegen_text import TileText
from flashlight.ir import Const, Dim, Expr, Iota, Load, Pointwise, SizeValue, walk
from flashlight.vocabulary import OPS

_INT_MAX = "9223372036854775807"
_INT_MIN = "-9223372036854775807"


class LiveScan:
    """Prints, into the kernel text ``p`` (its ``pre`` lines), the scan that narrows the
    loop range."""

    def __init__(self, p: TileText, live: Expr, full: Expr | None = None):
        self.p = p
        self.live = live
        self.full = full
        self.memo: dict[Expr, tuple[str, str]] = {}
        self.full_range: tuple[str, str] | None = None  # set by emit() when ``full`` is given
        self.vector = False  # inside the vector scan: loads bounded per key tile, rows as vectors

    def emit(self) -> tuple[str, str]:
        """Append the scan to ``p.pre``; returns the loop range ``(first, end)``."""
        p = self.p
        if p.tiling.row is not None:
            p.pre.append("row_lo = pid_m * BLOCK_M")
            p.pre.append(f"row_hi = tl.minimum(row_lo + BLOCK_M, {p.size(p.tiling.row)}) - 1")
        if p.tiling.scan_tiles > 1 and self.reads_keys():
            self.emit_vector(p.tiling.scan_tiles)
        else:
            scan_range = ("0", "N_SIZE")
            if p.tiling.scan_tiles > 1:
                scan_range = self.emit_coarse(f"(BLOCK_N * {p.tiling.scan_tiles})")
            self.emit_serial(scan_range)
        if self.full is not None:
            # a full tile is live, so the run lies inside [tiles_first, tiles_end); no run: empty
            p.pre.append("full_first = tl.minimum(tl.maximum(full_first, tiles_first), tiles_end)")
            p.pre.append("full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)")
            self.full_range = ("full_first", "full_end")
        return "tiles_first", "tiles_end"

    def reads_keys(self) -> bool:
        """Whether a predicate loads values along the keys (document ids, key lengths)."""
        exprs = [self.live] + ([self.full] if self.full is not None else [])
        return any(isinstance(node, Load) and self.scope(node) == "scan" for e in exprs for node in walk(e))

    def emit_serial(self, scan_range: tuple[str, str]) -> None:
        """One key tile per step over ``scan_range``."""
        p = self.p
        p.pre.append("tiles_first = N_SIZE + tl.zeros([], tl.int32)")
        p.pre.append("tiles_end = tl.zeros([], tl.int32)")
        may_live, _ = self.bound(self.live)
        runs = []
        if self.full is not None:
            # the first run of consecutive tiles where no mask can remove a position (and
            # no position lies past the end): [full_first, full_end)
            p.pre.append("full_first = N_SIZE + tl.zeros([], tl.int32)")
            p.pre.append("full_end = tl.zeros([], tl.int32) - 1")
            _, may_cut = self.bound(self.full)
            runs = [f"is_full = (({may_cut}) == 0) & (start_n + BLOCK_N <= N_SIZE)",
                    "run_starts = is_full & (full_first == N_SIZE)",
                    "run_grows = is_full & (full_end == start_n)",
                    "full_first = tl.where(run_starts, start_n, full_first)",
                    "full_end = tl.where(run_starts | run_grows, start_n + BLOCK_N, full_end)"]
        p.pre.append(f"for start_n in range({scan_range[0]}, {scan_range[1]}, BLOCK_N):")
        scan = [*self.tile_header("BLOCK_N", "offs_n"),
                *p.scan,
                f"tiles_first = tl.minimum(tiles_first, tl.where({may_live}, start_n, N_SIZE))",
                f"tiles_end = tl.where({may_live}, start_n + BLOCK_N, tiles_end)",
                *runs]
        p.pre.extend("    " + line for line in scan)

    def emit_coarse(self, width: str) -> tuple[str, str]:
        """The coarse step of an index-only predicate: bound ``live`` over ``width`` keys
        at a time; returns the range of keys, aligned to ``width``, outside which no key
        tile may be live (bounds over a wider tile contain those over any tile inside it)."""
        p = self.p
        with p.key_tile(width, "offs_coarse") as coarse_scan:
            may_live, _ = self.bound(self.live)
        p.pre.append("coarse_first = N_SIZE + tl.zeros([], tl.int32)")
        p.pre.append("coarse_end = tl.zeros([], tl.int32)")
        p.pre.append(f"for start_n in range(0, N_SIZE, {width}):")
        steps = [*self.tile_header(width, "offs_coarse"), *coarse_scan,
                 f"coarse_first = tl.minimum(coarse_first, tl.where({may_live}, start_n, N_SIZE))",
                 f"coarse_end = tl.where({may_live}, tl.minimum(start_n + {width}, N_SIZE), coarse_end)"]
        p.pre.extend("    " + line for line in steps)
        self.forget_key_bounds()  # they were for the coarse width
        return "coarse_first", "coarse_end"

    def emit_vector(self, tiles: int) -> None:
        """``tiles`` key tiles per step, bounded at once ([Note: the vector scan])."""
        p = self.p
        if p.tiling.row is not None:
            # the rows' bounds as vectors over the step's tiles, so that every value bounded
            # from them is one too: a comparison of two floating-point scalars next to
            # vectors of booleans trips the Triton interpreter (its result stays float)
            p.pre.append(f"row_lo_t = row_lo + tl.zeros([{tiles}], tl.int32)")
            p.pre.append(f"row_hi_t = row_hi + tl.zeros([{tiles}], tl.int32)")
        self.vector = True
        try:
            with p.key_tile("BLOCK_N", "offs_scan") as lines:
                may_live, _ = self.bound(self.live)
                may_cut = self.bound(self.full)[1] if self.full is not None else None
        finally:
            self.vector = False
        runs = []
        if may_cut is not None:
            p.pre.append("full_first = N_SIZE + tl.zeros([], tl.int32)")
            p.pre.append("full_end = N_SIZE + tl.zeros([], tl.int32)")
            runs = [f"is_full = (({may_cut}) == 0) & (tile_n + BLOCK_N <= N_SIZE)",
                    "full_first = tl.minimum(full_first, tl.min(tl.where(is_full, tile_n, N_SIZE)))",
                    # the run ends at the first tile after its start that is not full
                    "cut = tl.min(tl.where((is_full == 0) & (tile_n > full_first), tile_n, N_SIZE))",
                    "full_end = tl.minimum(full_end, cut)"]
        # the live range per lane of the step, reduced once after the loop
        p.pre.append(f"first_t = N_SIZE + tl.zeros([{tiles}], tl.int32)")
        p.pre.append(f"end_t = tl.zeros([{tiles}], tl.int32)")
        p.pre.append(f"for start_n in range(0, N_SIZE, BLOCK_N * {tiles}):")
        steps = [f"tile_n = start_n + tl.arange(0, {tiles}) * BLOCK_N",
                 "offs_scan = index0 + tile_n[:, None] + tl.arange(0, BLOCK_N)[None, :]",
                 "col_lo = tile_n",
                 "col_hi = tl.minimum(tile_n + BLOCK_N, N_SIZE) - 1",
                 *lines,
                 f"live_tile = ({may_live}) & (tile_n < N_SIZE)",
                 "first_t = tl.minimum(first_t, tl.where(live_tile, tile_n, N_SIZE))",
                 "end_t = tl.maximum(end_t, tl.where(live_tile, tile_n + BLOCK_N, 0))",
                 *runs]
        p.pre.extend("    " + line for line in steps)
        p.pre.append("tiles_first = tl.min(first_t)")
        p.pre.append("tiles_end = tl.max(end_t)")
        self.forget_key_bounds()  # they were for the vector step

    def forget_key_bounds(self) -> None:
        """Drop the bounds of values along the keys (kept: those of the rest)."""
        self.memo = {node: b for node, b in self.memo.items() if self.scope(node) == "pre"}

    @staticmethod
    def tile_header(width: str, offs: str) -> list[str]:
        return [f"{offs} = index0 + start_n + tl.arange(0, {width})",
                "col_lo = start_n",
                f"col_hi = tl.minimum(start_n + {width}, N_SIZE) - 1"]

    # ------------------------------------------------------------------ bounds
    def scope(self, node: Expr) -> str:
        return "scan" if node in self.p.plan.in_loop else "pre"

    def bound(self, node: Expr) -> tuple[str, str]:
        if node not in self.memo:
            self.memo[node] = self._bound(node)
        return self.memo[node]

    def _bound(self, node: Expr) -> tuple[str, str]:
        if isinstance(node, Const):
            if node.dtype == torch.bool:
                return ("True", "False") if node.value else ("False", "True")
            text = repr(node.value) if math.isfinite(node.value) else None
            if text is None:
                raise NotImplementedError("an infinite constant in a liveness predicate")
            return text, text
        if isinstance(node, SizeValue):  # its own bounds ([Note: sizes used as values] in flashlight.indexing)
            size = self.p.size_text(node.size)
            return size, size
        if isinstance(node, Iota):
            return self.iota(node.axis)
        if isinstance(node, Load):
            return self.load(node)
        assert isinstance(node, Pointwise)
        return self.pointwise(node)

    def var(self, scope: str, hint: str, text: str) -> str:
        return self.p.assign(scope, hint, text)

    def dim_range(self, d: Dim) -> tuple[str, str]:
        role = self.p.roles.get(d)
        if role is None:
            return self.p.grid_var(d), self.p.grid_var(d)
        if role == "m":
            return ("row_lo_t", "row_hi_t") if self.vector else ("row_lo", "row_hi")
        if role == "n":
            return "col_lo", "col_hi"
        return "0", f"({self.p.size(d)} - 1)"

    def iota(self, axis) -> tuple[str, str]:
        if not axis:
            return "0", "0"
        lo, hi = self.dim_range(axis[0])
        for d in axis[1:]:  # row-major: increasing in every component
            d_lo, d_hi = self.dim_range(d)
            lo, hi = f"({lo}) * {self.p.size(d)} + {d_lo}", f"({hi}) * {self.p.size(d)} + {d_hi}"
        return lo, hi

    def load(self, load: Load) -> tuple[str, str]:
        """Min and max of the loaded tile (booleans: whether any lane is true / false)."""
        scope = self.scope(load)
        layout = self.p.layouts[load]
        text, mask = self.p.load_text(load, layout, scope)
        x = self.var(scope, "lv", text)
        if load.dtype == torch.bool:
            x = self.var(scope, "lv", f"({x} != 0).to(tl.int32)")
            low, high = "1", "0"
        else:
            low, high = _INT_MAX, _INT_MIN
        if not layout:
            lo = hi = x
        else:
            axis = ", axis=1" if self.vector and scope == "scan" else ""  # per key tile
            lo = self.var(scope, "lo", f"tl.min(tl.where({mask}, {x}, {low}){axis})" if mask else f"tl.min({x}{axis})")
            hi = self.var(scope, "hi", f"tl.max(tl.where({mask}, {x}, {high}){axis})" if mask else f"tl.max({x}{axis})")
        if load.dtype == torch.bool:
            return self.var(scope, "may", f"{hi} != 0"), self.var(scope, "may", f"{lo} == 0")
        return lo, hi

    def pointwise(self, node: Pointwise) -> tuple[str, str]:
        op, scope = node.op, self.scope(node)
        args = [self.bound(a) for a in node.args]
        v = lambda hint, text: self.var(scope, hint, text)  # noqa: E731
        if node.dtype == torch.bool and op in ("maximum", "minimum", "abs"):
            op = {"maximum": "or", "minimum": "and", "abs": "identity"}[op]  # on booleans
        bounds = OPS[op].bounds if op in OPS else None  # the vocabulary's interval rule
        if bounds == "arith":
            return _arith(op, args, v)
        if bounds == "compare":
            return _compare(op, args, v)
        if op == "identity":
            return args[0]
        if op == "and":
            (at, af), (bt, bf) = args
            return v("may", f"({at}) & ({bt})"), v("may", f"({af}) | ({bf})")
        if op == "or":
            (at, af), (bt, bf) = args
            return v("may", f"({at}) | ({bt})"), v("may", f"({af}) & ({bf})")
        if op == "not":
            t, f = args[0]
            return f, t
        if op == "cast":
            return self.cast(node, args[0], v)
        if bounds == "division":  # by a positive constant (see bounded_by_intervals)
            (lo, hi), (c, _) = args
            int_type = None if node.dtype.is_floating_point else "tl.int64"
            if op == "remainder":  # in [0, c)
                return v("lo", f"0 * ({lo})"), v("hi", f"{c} + 0 * ({hi})")
            zero = f"tl.zeros([], {int_type or 'tl.float32'})"  # a literal end becomes a Triton scalar
            lo, hi = v("lo", f"{lo} + {zero}"), v("hi", f"{hi} + {zero}")
            return v("lo", rounding_division(op, lo, c, int_type)), v("hi", rounding_division(op, hi, c, int_type))
        if op == "where":
            return _select(node.dtype == torch.bool, *args, v)
        raise NotImplementedError(f"{op} in a liveness predicate")

    def cast(self, node: Pointwise, arg: tuple[str, str], v) -> tuple[str, str]:
        src_bool = node.args[0].dtype == torch.bool
        if node.dtype == torch.bool and not src_bool:  # x != 0
            lo, hi = arg
            return v("may", f"({lo} != 0) | ({hi} != 0)"), v("may", f"({lo} <= 0) & ({hi} >= 0)")
        if src_bool and node.dtype != torch.bool:  # 0 / 1
            t, f = arg
            return v("lo", f"tl.where({f}, 0, 1)"), v("hi", f"tl.where({t}, 1, 0)")
        return arg


def _select(boolean: bool, cond, a, b, v) -> tuple[str, str]:
    """where(cond, a, b): the branches cond may take, joined."""
    ct, cf = cond
    if boolean:
        (at, af), (bt, bf) = a, b
        return (v("may", f"(({ct}) & ({at})) | (({cf}) & ({bt}))"),
                v("may", f"(({ct}) & ({af})) | (({cf}) & ({bf}))"))
    (alo, ahi), (blo, bhi) = a, b
    lo = v("lo", f"tl.where({ct}, tl.where({cf}, tl.minimum({alo}, {blo}), {alo}), {blo})")
    hi = v("hi", f"tl.where({ct}, tl.where({cf}, tl.maximum({ahi}, {bhi}), {ahi}), {bhi})")
    return lo, hi


def _arith(op: str, args, v) -> tuple[str, str]:
    if op == "neg":
        lo, hi = args[0]
        return f"(-({hi}))", f"(-({lo}))"
    if op == "abs":  # |x| over [lo, hi]: 0 when the range holds 0, else the nearer end
        lo, hi = args[0]
        return (v("lo", f"tl.where({lo} > 0, {lo}, tl.where({hi} < 0, -({hi}), 0 * ({lo})))"),
                v("hi", f"tl.maximum(-({lo}), {hi})"))
    (alo, ahi), (blo, bhi) = args
    if op in ("maximum", "minimum"):  # monotone in both arguments
        return v("lo", f"tl.{op}({alo}, {blo})"), v("hi", f"tl.{op}({ahi}, {bhi})")
    if op == "add":
        return v("lo", f"{alo} + {blo}"), v("hi", f"{ahi} + {bhi}")
    if op == "sub":
        return v("lo", f"{alo} - {bhi}"), v("hi", f"{ahi} - {blo}")
    corners = [v("c", f"({x}) * ({y})") for x in (alo, ahi) for y in (blo, bhi)]
    lo = hi = corners[0]
    for c in corners[1:]:
        lo, hi = f"tl.minimum({lo}, {c})", f"tl.maximum({hi}, {c})"
    return v("lo", lo), v("hi", hi)


def _compare(op: str, args, v) -> tuple[str, str]:
    (alo, ahi), (blo, bhi) = args
    if op in ("gt", "ge"):  # a > b  is  b < a
        (alo, ahi), (blo, bhi) = (blo, bhi), (alo, ahi)
        op = "lt" if op == "gt" else "le"
    if op == "lt":
        return v("may", f"{alo} < {bhi}"), v("may", f"{ahi} >= {blo}")
    if op == "le":
        return v("may", f"{alo} <= {bhi}"), v("may", f"{ahi} > {blo}")
    overlap = v("may", f"({alo} <= {bhi}) & ({blo} <= {ahi})")
    single = v("may", f"({alo} == {ahi}) & ({blo} == {bhi}) & ({alo} == {blo})")
    never_equal = v("may", f"{single} == 0")
    return (overlap, never_equal) if op == "eq" else (never_equal, overlap)


def rounding_division(op: str, a: str, b: str, int_type: str | None) -> str:
    """``floordiv`` / ``truncdiv`` / ``remainder`` (Python's, with the divisor's sign) of
    ``a`` and ``b``, integers of Triton type ``int_type`` or floats (``None``). Triton's
    integer ``//`` and ``%`` truncate, as in C. Shared by the kernel printer and the scan."""
    if int_type is None:
        quotient = f"({a} / {b})"
        return {"floordiv": f"tl.floor{quotient}",
                "truncdiv": f"tl.where({quotient} < 0, tl.ceil{quotient}, tl.floor{quotient})",
                "remainder": f"({a} - {b} * tl.floor{quotient})"}[op]
    if op == "truncdiv":
        return f"({a} // {b})"
    # the remainder and the quotient's correction where the signs differ and it is not 0
    off = f"((({a} % {b}) != 0) & ((({a} % {b}) < 0) != ({b} < 0)))"
    if op == "floordiv":
        return f"({a} // {b} - {off}.to({int_type}))"
    return f"({a} % {b} + {b} * {off}.to({int_type}))"
