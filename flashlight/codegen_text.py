"""The text of a tile program: names, offsets, masks and the lines of each scope.

:class:`TileText` is what the kernel printer (:mod:`flashlight.codegen`) and the
tile-liveness scan (:mod:`flashlight.codegen_live`) share: the tiled kernel and its
plan, the lines printed so far per scope (``pre``: before the loop, ``loop``: one loop
step, ``post``: after it, ``scan``: the liveness scan's step), fresh variable names,
the symbolic sizes the kernel takes, and how a tile of each role is indexed and masked.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from flashlight.ir import Dim, Expr, Load, TiledKernel

TL_DTYPES = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.int64: "tl.int64",
    torch.int32: "tl.int32",
    torch.int16: "tl.int16",
    torch.int8: "tl.int8",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}

def literal(value) -> str:
    """A Python constant as Triton source."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value != value:
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(value)



class TileText:
    """The lines and names of one kernel being printed (see the module docstring)."""

    def __init__(self, tk: TiledKernel, check_bounds: bool):
        self.check_bounds = check_bounds
        self.tk = tk
        self.kernel = tk.kernel
        self.tiling = tk.tiling
        self.plan = tk.plan
        self.roles = dict(self.plan.roles)
        self.layouts = self.plan.layouts
        self.padded = dict(self.tiling.padded)
        self.inputs = [name for name, _ in self.plan.inputs]
        self.ranks = [rank for _, rank in self.plan.inputs]
        self.sizes: list[str] = []
        self.pre: list[str] = []
        self.loop: list[str] = []
        self.post: list[str] = []
        self.scan: list[str] = []  # the tile-liveness scan's body (see codegen_live)
        # before the key loop in each pass of a loop around it ([Note: the repeats outside
        # the key loop] in flashlight.passes.tiling)
        self.outer: list[str] = []
        self.full_tiles = False  # printing the step on full tiles: every loop position is in range
        # keys in one tile of the loop dim and their offsets (other in the coarse scan)
        self.n_width, self.n_offs = "BLOCK_N", "offs_n"
        self.counter = 0
        # an inner loop's variable while its body is printed, and the lines that body's values
        # go to (those that read the loop's dim; the others go before the loop) ([Note: inner loops])
        self.positions: dict[Dim, str] = {}
        self.block: list[str] | None = None

    @contextlib.contextmanager
    def key_tile(self, width: str, offs: str) -> Iterator[list[str]]:
        """Print, inside the block, for key tiles ``width`` wide at offsets ``offs``
        into fresh ``scan`` lines (yielded); then back to ``BLOCK_N`` tiles."""
        fine_scan = self.scan
        self.scan, self.n_width, self.n_offs = [], width, offs
        try:
            yield self.scan
        finally:
            self.scan, self.n_width, self.n_offs = fine_scan, "BLOCK_N", "offs_n"

    # ------------------------------------------------------------------ helpers
    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def size(self, d: Dim) -> str:
        return self.size_text(d.size)

    def size_text(self, size) -> str:
        """A size as printed: a number, or the size argument holding a symbolic one."""
        if isinstance(size, int):
            return str(size)
        if size not in self.sizes:
            self.sizes.append(size)
        return f"size{self.sizes.index(size)}"

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
        if d in self.positions:  # an inner loop's position ([Note: inner loops]), in the index type
            return f"(index0 + {self.positions[d]})"
        role = self.roles.get(d)
        if role is None and self.tiling.serial and d == self.kernel.loop[0].dim:
            # the position of a serial loop's step ([Note: serial loops]), in the index type
            return "(index0 + start_n)"
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

    def lines(self, scope: str) -> list[str]:
        if self.block is not None:
            return self.block
        return {"pre": self.pre, "loop": self.loop, "post": self.post, "scan": self.scan, "outer": self.outer}[scope]

    def assign(self, scope: str, hint: str, text: str) -> str:
        var = self.fresh(hint)
        self.lines(scope).append(f"{var} = {text}")
        return var

    def load_text(self, load: Load, layout, scope: str) -> tuple[str, str | None]:
        """The masked ``tl.load`` of ``load``'s tile (its input registered, its offsets
        bounds-checked in ``scope``), and the mask of valid lanes."""
        k = self.inputs.index(load.base)
        offset = " + ".join(f"({self.index(axis, layout)}) * in{k}_s{a}" for a, axis in enumerate(load.index) if axis) or "0"
        mask = self.mask(index_dims(load), layout)
        masked = f", mask={mask}, other=0" if mask else ""
        self.assert_in_bounds(scope, f"in{k}", offset, mask, layout)
        return f"tl.load(in{k} + {offset}{masked})", mask

    def assert_in_bounds(self, scope: str, tensor: str, offset: str, mask: str | None, layout) -> None:
        """With ``check_bounds``: count unmasked lanes whose offset leaves the tensor.

        The count goes to ``errors[slot]`` (one slot per tensor argument); the launcher
        raises if any is non-zero. (``tl.device_assert`` is not enforced by the Triton
        interpreter, so the check is ordinary arithmetic.)
        """
        if not self.check_bounds:
            return
        slot = len(self.inputs) + int(tensor[3:] or 0) if tensor.startswith("out") else int(tensor[2:])
        off = self.assign(scope, "off", f"{offset} + tl.zeros({self.shape(layout)}, tl.int32)" if layout else offset)
        outside = f"(({off} < 0) | ({off} >= {tensor}_span))"
        bad = f"({outside} & {mask})" if mask else outside
        count = self.assign(scope, "bad", f"tl.sum(({bad}).to(tl.int32))" if layout else f"({bad}).to(tl.int32)")
        self.lines(scope).append(f"tl.atomic_add(errors + {slot}, {count})")


def index_dims(node: Expr) -> tuple[Dim, ...]:
    axes = node.index if isinstance(node, Load) else (node.axis,)
    return tuple(d for axis in axes for d in axis)
