"""Work a kernel repeats across its grid: the grid dims along which its programs compute
the same loop reductions (or reductions of the loop's values) again, which the back-off
(:mod:`flashlight.backoff`) reads to cut or reject a fused nest ([Note: demotion
legality] in :mod:`flashlight.passes.fusion`)."""
from __future__ import annotations

from flashlight.ir import Dim, Reduce, TiledKernel, free_dims, walk
from flashlight.passes.tiling import MAX_TILE


def spread_grid(tiled: TiledKernel) -> set[Dim]:
    """The grid dims of ``tiled`` with more than one program along them (the column of a
    serial loop too: its tiles are programs of the grid)."""
    spread = [*tiled.tiling.grid, *([tiled.tiling.column] if tiled.tiling.serial else [])]
    return {d for d in spread if not (d.is_static and d.size == 1)}


def repeated_along(tiled: TiledKernel, exprs, only_along_loop: bool) -> set[Dim]:
    """The grid dims with several programs along them that a loop reduction of ``tiled``,
    or a reduction inside ``exprs`` (only those over loop values if ``only_along_loop``),
    is free of."""
    grid = spread_grid(tiled)
    loop_dims = {red.dim for red in tiled.kernel.loop}
    free = {d for loop in tiled.kernel.loop for d in grid - free_dims(loop.body)}
    # a reduction over the output's features of the loop's results varies along theirs
    return free | {d for e in exprs for node in walk(e)
                   if isinstance(node, Reduce) and (free_dims(node) & loop_dims or not only_along_loop)
                   for d in grid - tiled.kernel.varies_along(node)}


def wide_grid_dims(tiled: TiledKernel) -> list[Dim]:
    """The grid dims of ``tiled`` wider than a tile along which it repeats its loop's
    work (:func:`repeats_loop_work`): a value's features, or a second key dim, too wide
    for one tile, which the tiling spread one position per program, so that the loop's
    work runs again for each position (hundreds of times the unfused graph's work, which
    autotuning would time only to discard)."""
    exprs = [e for loop in tiled.kernel.loop for e in loop.exprs()]
    return sorted((d for d in repeated_along(tiled, exprs, only_along_loop=True)
                   if d.is_static and d.size > MAX_TILE), key=lambda d: d.name)


def recomputes_across_grid(tiled: TiledKernel) -> bool:
    """Whether some reduction of ``tiled`` is free of one of its grid dims, so that every
    program along that dim computes it again: e.g. a softmax's row statistics in a
    kernel with a program per output feature (attention averaged over heads, fused with
    the heads as its loop and the keys eliminated into tiles)."""
    kernel = tiled.kernel
    exprs = [*kernel.epilogues(), *(e for loop in kernel.loop for e in loop.exprs())]
    return bool(repeated_along(tiled, exprs, only_along_loop=False))


def repeats_loop_work(tiled: TiledKernel) -> bool:
    """Whether work done at every step of the loop is free of one of the grid dims, so
    that every program along that dim repeats it over all the loop: a loop reduction, or
    an inner reduction of the loop's values (a key projection, a key norm) in a kernel
    with a program per query. Unlike :func:`recomputes_across_grid`, a reduction before
    the loop (a norm of the query row, a mean of a weight) does not count: its cost does
    not grow with the loop."""
    exprs = [e for loop in tiled.kernel.loop for e in loop.exprs()]
    return bool(repeated_along(tiled, exprs, only_along_loop=True))
