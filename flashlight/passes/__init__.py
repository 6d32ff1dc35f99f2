"""Named passes over the loop-nest IR; each is a function from IR to IR."""
from __future__ import annotations

import dataclasses
from typing import Callable

from flashlight.ir import Expr, Kernel, replace_nodes


def rewrite_loop_bodies(kernel: Kernel, fn: Callable[[Expr], Expr | None]) -> Kernel:
    """``kernel`` with every loop reduction's body (the loop on masked and on full tiles)
    rewritten top-down by ``fn`` (:func:`flashlight.ir.replace_nodes`); ``kernel`` itself
    where nothing changed."""

    def rewritten(red):
        body = replace_nodes(red.body, fn)
        return red if body == red.body else dataclasses.replace(red, body=body)

    loop = tuple(rewritten(red) for red in kernel.loop)
    unmasked = tuple(rewritten(red) for red in kernel.unmasked) if kernel.unmasked is not None else None
    if loop == kernel.loop and unmasked == kernel.unmasked:
        return kernel
    return dataclasses.replace(kernel, loop=loop, unmasked=unmasked)
