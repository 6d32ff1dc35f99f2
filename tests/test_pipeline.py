"""The pipeline's shape: named passes each followed by its checker, the back-off search
run through them, and the checker of the tiled IR catching a broken plan."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from flashlight import backoff, pipeline, settings
from flashlight.ir import Reduce, Ref, contains, dim_names, walk
from flashlight.ir_check import InvariantError
from flashlight.ir_print import format_tiled
from flashlight.lower import lower
from flashlight.passes.fusion import fuse_elementwise, fuse_reductions
from flashlight.passes.tile_plan import check_plan
from tests.golden import capture as capture_all
from tests.helpers import gated_attention_block

L, D = 29, 16


def _chained_attention_graph():
    """Two attentions in a chain: one fused nest cannot run, so the search backs off."""
    def chained(q, k, v):
        o = torch.softmax(q @ k.transpose(-1, -2) * 0.25, dim=-1) @ v
        return torch.softmax(o @ k.transpose(-1, -2) * 0.25, dim=-1) @ v

    g = torch.Generator().manual_seed(5)
    (gm,) = capture_all(chained, [torch.randn(2, 3, L, D, generator=g) for _ in range(3)])
    return lower(gm)


def test_pass_lists_are_named_with_checkers():
    passes = pipeline.GRAPH_PASSES + pipeline.KERNEL_PASSES
    names = [p.name for p in passes]
    assert names == ["fuse_elementwise", "fuse_reductions", "read_materialized",
                     "make_online", "find_live_tiles", "to_base2", "hoist_divisors", "exps_in_base2", "tile"]
    assert all(callable(p.check) and callable(p.show) for p in passes)


@pytest.mark.parametrize("check", [False, True])
def test_checkers_run_after_every_pass_in_backoff_trials_too(check):
    lowered = _chained_attention_graph()
    calls = {"traced": 0, "quiet": 0}

    def counted(p):
        def check_and_count(value):
            p.check(value)
            calls[state["trace"]] += 1
        return dataclasses.replace(p, check=check_and_count)

    state = {"trace": "traced"}

    class Counting(pipeline.Pipeline):
        def run(self, passes, value, trace, context):
            state["trace"] = "traced" if trace else "quiet"
            return super().run(passes, value, trace, context)

    base = pipeline.pipeline_for(lowered)
    counting = Counting(base.context, check, tuple(map(counted, base.graph_passes)),
                        tuple(map(counted, base.kernel_passes)))
    with dim_names(lowered.next_dim_id):
        plan = backoff.search(lowered, counting, lambda title, text: None)
    assert len(plan.kernels) == 2 and not plan.rejected
    if check:
        assert calls["traced"] > 0 and calls["quiet"] > 0, calls
    else:
        assert calls == {"traced": 0, "quiet": 0}


def test_check_ir_setting_turns_checking_on():
    lowered = _chained_attention_graph()
    assert not pipeline.pipeline_for(lowered).check
    with settings.override(check_ir=True):
        assert pipeline.pipeline_for(lowered).check
        plan = pipeline.compile_graph(lowered)
    assert sorted(plan.kernels) == sorted(pipeline.compile_graph(lowered).kernels)


def test_the_tiled_ir_checker_catches_a_broken_plan():
    plan = pipeline.compile_graph(_chained_attention_graph())
    tiled = next(iter(plan.kernels.values()))
    check_plan(tiled)
    broken = [dataclasses.replace(tiled.plan, relayouts=(("not_an_input", 0),)),
              dataclasses.replace(tiled.plan, roles=tiled.plan.roles[1:]),
              dataclasses.replace(tiled.plan, loop_layouts=tiled.plan.loop_layouts[1:])]
    for bad in broken:
        with pytest.raises(InvariantError):
            check_plan(dataclasses.replace(tiled, plan=bad))


def _gated_block_graph():
    """Projections, attention, a sigmoid gate and an output projection: the search backs
    off over several rounds, with trial cuts in each."""
    B, L, H, D, C = 2, 13, 3, 8, 24
    g = torch.Generator().manual_seed(7)
    args = [torch.randn(B, L, C, generator=g), *(torch.randn(C, H * D, generator=g) for _ in range(4)),
            torch.randn(H * D, C, generator=g)]
    (gm,) = capture_all(gated_attention_block, args)
    return lower(gm)


def _plan_text(plan) -> str:
    """The plan's kernels as printed, dims renumbered in order of appearance."""
    text = "\n".join(f"{name}: {format_tiled(plan.kernels[name])}" for name in sorted(plan.kernels))
    text += repr(sorted(plan.rejected.items())) + repr(sorted(plan.outputs.items()))
    numbers: dict[str, str] = {}
    return re.sub(r"\b[jd]\d+\b", lambda m: numbers.setdefault(m.group(), f"#{len(numbers)}"), text)


class _Forgetful(dict):
    """A memo that never has what is asked for: every pass runs again."""

    def __contains__(self, key):
        return False


@pytest.mark.parametrize("graph", [_chained_attention_graph, _gated_block_graph])
def test_the_search_runs_the_kernel_passes_once_per_nest_and_plans_as_without_memos(graph):
    """[Note: one result per input in a search]: the kernel passes see each (nest, node)
    once, and the plan is the one the passes give when run afresh every time."""
    lowered = graph()
    seen: list[tuple] = []

    class Counting(pipeline.Pipeline):
        def run(self, passes, value, trace, context):
            if passes is self.kernel_passes:
                seen.append((value, context.node))
            return super().run(passes, value, trace, context)

    class Afresh(pipeline.Pipeline):
        def _once(self, key, trace, compute, keep=None):
            return compute()

    base = pipeline.pipeline_for(lowered)
    with dim_names(lowered.next_dim_id):
        remembered = backoff.search(lowered, Counting(base.context, False), lambda title, text: None)
    with dim_names(lowered.next_dim_id):
        afresh = backoff.search(lowered, Afresh(pipeline.Context(base.context.node_of_nest, memo=_Forgetful()),
                                                False), lambda title, text: None)
    assert len(seen) == len(set(seen)) and len(seen) >= len(remembered.kernels) >= 1
    assert _plan_text(remembered) == _plan_text(afresh)


def test_inlining_again_reuses_what_a_new_cut_does_not_change():
    """[Note: inlining again in a search]: with a shared memo, a kept nest that a new cut
    does not feed is the same object as before, the output the cut feeds is inlined
    anew, and both equal what inlining without a memo gives."""
    graph = fuse_elementwise(_gated_block_graph().graph)
    reads = {n.name: {r.nest for r in walk(n.body) if isinstance(r, Ref)} for n in graph.nests}

    def feeds(a, b):  # whether nest a's value reaches nest b
        return a in reads[b] or any(feeds(a, c) for c in reads[b])

    reductions = [n.name for n in graph.nests if contains(n.body, Reduce) and n.name not in graph.materialized]
    kept, cut = next((a, b) for a in reversed(reductions) for b in reductions
                     if a != b and not feeds(b, a) and contains(graph.nest(a).body, Ref))
    memo: dict = {}
    before = fuse_reductions(graph.keeping_separate({kept}), memo)
    after = fuse_reductions(graph.keeping_separate({kept, cut}), memo)
    assert after.nests == fuse_reductions(graph.keeping_separate({kept, cut})).nests
    assert after.nest(kept).body is before.nest(kept).body
    output = next(iter(graph.materialized))
    assert after.nest(output).body is not before.nest(output).body
