"""The pipeline's shape: named passes each followed by its checker, the back-off search
run through them, and the checker of the tiled IR catching a broken plan."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from flashlight import backoff, pipeline, settings
from flashlight.ir import InvariantError, dim_names
from flashlight.lower import lower
from flashlight.passes.tile_plan import check_plan
from tests.golden import capture as capture_all

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
                     "make_online", "find_live_tiles", "to_base2", "tile"]
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
