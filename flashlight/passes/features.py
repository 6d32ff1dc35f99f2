"""Reductions over an output's features, computed after the online loop.

[Note: reductions over an output's features]
Attention followed by a norm over the head width, ``o * rsqrt(mean_c(o^2) + eps) * w``
(a per-head RMS norm, as the Differential Transformer applies after its two softmaxes),
reaches the online pass as one nest whose body reduces, over a head-width dim ``c'``,
values that are themselves sums over the keys, ``sum_c'(sum_j p_ij v_jc')^2``, next to
the output's own ``sum_j p_ij v_jc`` at its feature dim ``c``. One loop cannot run over
the keys and over ``c'``, so the nest used to be split: the norm's sum became a kernel of
its own that recomputed the attention inside a loop over the features (possible only
while the keys fit one tile), and the output a third kernel.

A bound dim can be renamed, ``sum_c' f(c') = sum_c f(c)``: renamed after the output's
feature dim, the inner key sums are the very sums the output reads, so they become the
loop's own reductions (accumulated as ``[rows, features]`` tiles), and the outer sum is a
reduction over the feature tile of their results, after the loop (the feature role of
the tiling holds the whole head width in one tile; padded lanes are masked). A Reduce
whose dims are output dims is therefore an epilogue reduction: it binds the output dim
inside its body, where :class:`~flashlight.ir.LoopResult` reads are taken at every
feature of the tile. The rename is made only where it lands on what the body already
computes (every key-dependent reduction inside, renamed, is one the body has at that
output dim) and where the dim fits one tile; otherwise the nest is left as it was.
"""
from __future__ import annotations

from typing import Sequence

from flashlight.ir import Dim, Expr, Reduce, free_dims, replace_nodes, substitute, walk
from flashlight.passes.tiling import MAX_TILE


def features_from_results(body: Expr, out_dims: Sequence[Dim]) -> Expr:
    """``body`` with each reduction over a dim whose values are sums the output also reads
    at one of its feature dims rebound to that dim ([Note: reductions over an output's
    features])."""
    candidates = [d for d in out_dims if d.is_static and int(d.size) <= MAX_TILE]
    if not candidates:
        return body
    computed = {node for node in walk(body) if isinstance(node, Reduce)}
    rebound: list[Dim] = []

    def visit(node: Expr) -> Expr | None:
        # only reductions outside every other (bar rebound ones) run after the loop: one
        # inside a loop's body stays as it is, and so does everything inside it
        if not isinstance(node, Reduce):
            return None
        if len(node.dims) != 1:
            return node
        (d,) = node.dims
        inner = [r for r in walk(node.body) if isinstance(r, Reduce) and d in free_dims(r)]
        if d in out_dims or not d.is_static or not inner:
            return node
        for f in candidates:
            if f.size != d.size or f in free_dims(node.body):
                continue
            if all(substitute(r, {d: (f,)}) in computed for r in inner):
                # reductions inside it over the features (a layer norm's mean inside its
                # variance) are rebound too: each binds ``f`` anew within its own body
                rebound.append(d)
                return Reduce(node.op, replace_nodes(substitute(node.body, {d: (f,)}), visit), (f,), node.dtype)
        return node

    out = replace_nodes(body, visit)
    return out if rebound else body


def over_output_dims(node: Reduce, out_dims: frozenset[Dim]) -> bool:
    """Whether ``node`` is an epilogue reduction over output dims (see the note)."""
    return bool(node.dims) and set(node.dims) <= out_dims
