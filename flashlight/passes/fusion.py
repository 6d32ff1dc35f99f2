"""Elementwise fusion and structural fusion by dimension demotion.

Fusing a producer nest into a consumer means inlining it: the consumer's ``Ref`` to
the producer is replaced by the producer's body with the producer's output dims
substituted by the consumer's index. When the producer's parallel dim is mapped onto
a dim the consumer reduces over, the producer's parallel loop is *demoted* into the
consumer's reduction loop.

[Note: demotion legality]
Inlining is always semantically exact: the producer is a pure function of its index.
What can go wrong is cost and expressibility. A demoted producer is recomputed per
point of the consumer's loop, so the result is only a good kernel when (a) the
producer's own reductions run over small dims that fit one tile (the head dim of
``Q Kᵀ``), and (b) reductions that do not depend on the demoted dim (a row max feeding
``exp(s - max)``) are hoisted out of the loop rather than recomputed; the online pass
does (b) and the tiling pass checks (a). When the online pass or the tiling pass
rejects a fused nest, the driver *backs off*: it keeps one inlined reduction producer
materialized and fuses again. It picks the earliest producer whose materialization alone
lets the rejected nest compile, which puts the cut where the failing part starts (the
first attention's output when a second attention reads it as queries; a norm in the
epilogue); else the producer writing the fewest values that becomes a kernel itself
(an attention whose output feeds a projection over the merged heads or a layer norm,
which then run outside Flashlight on the kernel's output; not a term of its scores).
When neither exists and the nest did not tile, it keeps the earliest producer and tries again, so a projection feeding attention
stays a separate operation while the attention itself still fuses. Else an operand of
the nest's own op is kept: an elementwise one that becomes a kernel by itself (a gate
times the attention output, before an output projection) if any, else the latest one,
so the failing op runs on its own and the operand is compiled (backing off in turn) on
the next round. A nest left without any of these runs outside Flashlight, with the
reason.

A nest that does become a kernel may still repeat its loop's work in every program
along a grid dim: a key projection or a key norm demoted into an attention's loop does
not depend on the query, so no tiling takes the queries as rows, and the kernel runs a
program per query or per output feature, each computing it again over all keys. The
driver then keeps separate, together, the producers read along the loop but not along
a row dim the loop's reductions share, and takes that cut if the kernel then repeats
nothing; a producer read along both (the scores) is never kept, so the cut never
materializes a matrix over queries and keys.
"""
from __future__ import annotations

from typing import Callable

from flashlight.indexing import Unsupported, match_axis
from flashlight.ir import Expr, Graph, Nest, Reduce, Ref, contains, rebuild, substitute, walk


def _inline_ref(ref: Ref, producer: Nest, body: Expr) -> Expr | None:
    """The producer's body read at the consumer's index, or None if the axes don't line up."""
    mapping = {}
    for own, index in zip(producer.axes, ref.index):
        if not own:
            continue
        if len(own) == 1:
            mapping[own[0]] = index
        elif len(own) == len(index):
            mapping.update({d: (i,) for d, i in zip(own, index)})
        else:  # the consumer splits the producer's dims further: [Note: a finer read of a producer]
            try:
                mapping.update(match_axis(own, index))
            except Unsupported:
                return None
    return substitute(body, mapping)


# [Note: a finer read of a producer]
# A consumer may read a producer's axis ``(b, h)`` as ``(b, g, r)``: the gradient of keys
# shared by groups of query heads (grouped-query attention written with
# ``repeat_interleave``) is the sum over ``r`` of the gradient of the repeated keys,
# whose head axis ``h`` of ``H`` heads the sum reads as ``H / G`` groups ``g`` of ``G``
# repeats ``r``. Where each producer dim covers consecutive dims of the consumer's index
# (sizes multiply up, :func:`flashlight.indexing.match_axis`), the producer's body is read
# with each dim replaced by its group (``h -> (g, r)``: a compound index, row-major as
# every axis), the same elements; the sum over ``r`` then inlines like any reduction.


# [Note: inlining again in a search]
# The back-off search runs the graph passes once per trial cut, each time on the same
# lowered nests with one more nest kept separate; most nests come out as before. A
# nest's inlined body depends only on its own body and on the inlined bodies (and FX
# nodes) of the producers it inlines, so ``inline`` keeps each result in a memo shared
# by the compile, keyed by the identity of those bodies (objects the memo keeps alive):
# a nest no new cut reaches is found there, and only the nests downstream of the cut are
# inlined again. ``read_materialized`` does the same per nest, keyed by its body and
# the nests it reads that are materialized. Results are the same objects, equal to what
# inlining afresh gives.


def inline(graph: Graph, should_inline: Callable[[Nest], bool], memo: dict | None = None) -> Graph:
    """Inline every nest accepted by ``should_inline`` into its consumers.

    Nests that are materialized stay (their consumers still read them where they are
    not inlined); nests left without readers are dropped. ``memo``, shared by the
    calls of one compile, keeps each nest's result by what it depends on ([Note:
    inlining again in a search]).
    """
    memo = {} if memo is None else memo
    bodies: dict[str, Expr] = {}
    absorbed: dict[str, tuple[str, ...]] = {}  # nest -> the FX nodes its body now computes
    by_name = {n.name: n for n in graph.nests}
    new_nests: list[Nest] = []
    for nest in graph.nests:
        inlined = tuple((name, bodies[name], absorbed[name]) for name in producers(nest, memo)
                        if name in bodies and should_inline(by_name[name]))
        key = ("inline", nest.name, id(nest.body), nest.axes, nest.origins,
               tuple((name, id(body), origins) for name, body, origins in inlined))
        if key not in memo:  # the objects whose ids the key holds are kept alive with it
            memo[key] = (_inlined(nest, dict((name, body) for name, body, _ in inlined), by_name, absorbed),
                         nest, inlined)
        (body, origins), _, _ = memo[key]
        bodies[nest.name] = body
        absorbed[nest.name] = origins
        new_nests.append(Nest(nest.name, nest.axes, body, nest.dtype, origins))
    return graph.replace(nests=_drop_unread(new_nests, graph.materialized, memo))


def producers(nest: Nest, memo: dict) -> tuple[str, ...]:
    """The nests ``nest``'s body reads, sorted."""
    key = ("producers", id(nest.body))
    if key not in memo:
        memo[key] = (tuple(sorted({n.nest for n in walk(nest.body) if isinstance(n, Ref)})), nest.body)
    return memo[key][0]


def _inlined(nest: Nest, bodies: dict[str, Expr], by_name: dict[str, Nest],
             absorbed: dict[str, tuple[str, ...]]) -> tuple[Expr, tuple[str, ...]]:
    """``nest``'s body with the producers in ``bodies`` inlined, and the FX nodes it then
    computes."""
    origins = set(nest.origins)

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Ref) and node.nest in bodies:
            inlined = _inline_ref(node, by_name[node.nest], bodies[node.nest])
            if inlined is not None:
                origins.update(absorbed[node.nest])
            return inlined
        return None

    return rebuild(nest.body, fn), tuple(sorted(origins))


def _drop_unread(nests: list[Nest], materialized: frozenset[str], memo: dict) -> tuple[Nest, ...]:
    read: set[str] = set(materialized)
    kept: list[Nest] = []
    for nest in reversed(nests):
        if nest.name in read:
            kept.append(nest)
            read.update(producers(nest, memo))
    return tuple(reversed(kept))


def fuse_elementwise(graph: Graph, memo: dict | None = None) -> Graph:
    """Inline producers without reductions (pointwise chains, broadcasts, index maths),
    except those the back-off pinned ([Note: key-side prologues computed once] in
    :mod:`flashlight.backoff`)."""
    return inline(graph, lambda nest: not contains(nest.body, Reduce) and nest.name not in graph.pinned, memo)


def fuse_reductions(graph: Graph, memo: dict | None = None) -> Graph:
    """Inline reduction producers into their consumers, demoting dims where they meet.

    Producers kept separate (by the backoff) are read from memory; those materialized
    because something outside Flashlight reads them are inlined too (and still
    computed on their own); see [Note: demotion legality].
    """
    return inline(graph, lambda nest: nest.name not in graph.separate, memo)
