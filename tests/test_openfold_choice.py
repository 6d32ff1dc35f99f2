"""Stock or kernel per patched OpenFold attention call ([Note: the faster of stock and
patched attention] in ``flashlight.integrations.openfold_choice``): small calls are timed
once per shape and keep the faster variant; large calls and CPU calls run the kernel."""
from __future__ import annotations

import pytest
import torch

from flashlight.integrations import openfold_choice
from tests.helpers import stand_in_variants


@pytest.fixture(autouse=True)
def fresh_choices():
    openfold_choice.clear()
    yield
    openfold_choice.clear()


@pytest.mark.parametrize("stock_s, kept", [(0.5, "stock"), (0.95, "kernel"), (1.5, "kernel")])
def test_a_small_call_is_timed_once_and_keeps_the_clearly_faster(stock_s, kept):
    calls: list[str] = []
    patched, stock = stand_in_variants(calls)
    timed = {patched: 1.0, stock: stock_s}
    timer = lambda fn: timed[fn]  # noqa: E731 - seconds per call, as the GPU timer returns
    first = openfold_choice.run("shape", 1000, patched, stock, timer=timer)
    assert float(first) == 1.0 and calls == ["kernel"]  # the first call's output is the kernel's
    assert openfold_choice.choices() == {"shape": kept}
    later = [float(openfold_choice.run("shape", 1000, patched, stock, timer=timer)) for _ in range(3)]
    assert later == [2.0 if kept == "stock" else 1.0] * 3
    assert len(openfold_choice.TIMINGS) == 1 and openfold_choice.TIMINGS[0]["choice"] == kept


def test_large_calls_and_other_shapes():
    calls: list[str] = []
    patched, stock = stand_in_variants(calls)
    never = lambda fn: pytest.fail("a large call must not be timed")  # noqa: E731
    assert float(openfold_choice.run("big", openfold_choice.SMALL_SCORES + 1, patched, stock, timer=never)) == 1.0
    assert openfold_choice.choices() == {}
    faster_stock = lambda fn: 0.1 if fn is stock else 1.0  # noqa: E731
    openfold_choice.run("a", 10, patched, stock, timer=faster_stock)
    openfold_choice.run("b", 10, patched, stock, timer=lambda fn: 1.0)
    assert openfold_choice.choices() == {"a": "stock", "b": "kernel"}


def test_scores_count_batch_heads_queries_and_keys():
    q_x, kv_x = torch.empty(2, 3, 5, 7), torch.empty(2, 3, 11, 7)
    assert openfold_choice.scores(q_x, kv_x, heads=4) == 2 * 3 * 4 * 5 * 11


def test_cpu_calls_of_a_patched_module_are_never_timed(gen):
    pytest.importorskip("openfold")
    import flashlight
    from openfold.model.msa import MSAColumnAttention

    module = MSAColumnAttention(c_m=16, c_hidden=8, no_heads=2).eval()
    flashlight.patch_openfold(module)
    # [*, N_seq, N_res, C_m]; the interpreter runs the kernel on the CPU
    m = torch.randn(1, 5, 6, 16, generator=gen)
    with torch.no_grad():
        out = module(m, mask=torch.ones(1, 5, 6))
    assert torch.isfinite(out).all()
    assert openfold_choice.choices() == {} and openfold_choice.TIMINGS == []


@pytest.mark.parametrize("faster", ["stock", "kernel"])
def test_a_patched_module_runs_the_variant_measured_faster(faster, gen, monkeypatch):
    """The wiring on the CPU, with a stand-in timer: the chosen variant's output, the
    kernel's within float32 tolerance of stock's, one timing for two calls."""
    pytest.importorskip("openfold")
    import copy

    import flashlight
    from openfold.model.msa import MSARowAttentionWithPairBias

    stock_module = MSARowAttentionWithPairBias(c_m=16, c_z=8, c_hidden=8, no_heads=2).eval()
    for p in stock_module.parameters():
        torch.nn.init.normal_(p, std=0.3, generator=gen)
    module = copy.deepcopy(stock_module)
    flashlight.patch_openfold(module)
    monkeypatch.setattr(openfold_choice, "TIMED_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(openfold_choice, "per_call_s", lambda fn: 1.0)
    if faster == "stock":  # the second timing is stock's
        timings = iter([1.0, 0.5])
        monkeypatch.setattr(openfold_choice, "per_call_s", lambda fn: next(timings))
    # [*, N_seq, N_res, C_m], [*, N_res, N_res, C_z], [*, N_seq, N_res]
    m, z = torch.randn(1, 3, 7, 16, generator=gen), torch.randn(1, 7, 7, 8, generator=gen)
    mask = (torch.rand(1, 3, 7, generator=gen) > 0.2).float()
    with torch.no_grad():
        expected = stock_module(m, z=z, mask=mask)
        outs = [module(m, z=z, mask=mask) for _ in range(2)]
    assert list(openfold_choice.choices().values()) == [faster] and len(openfold_choice.TIMINGS) == 1
    torch.testing.assert_close(outs[0], expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    if faster == "stock":
        assert torch.equal(outs[1], expected)  # stock's own code ran
    else:
        torch.testing.assert_close(outs[1], outs[0])


def test_a_choice_is_kept_for_the_next_process(monkeypatch):
    """[Note: choices kept for the next process]: timed once on this machine, recalled
    without timing by a later process with the same versions; timed again where the
    versions differ or the tuning cache is off."""
    calls: list[str] = []
    patched, stock = stand_in_variants(calls)
    openfold_choice.run(("row", 8, torch.float32), 10, patched, stock, timer=lambda fn: 0.1 if fn is stock else 1.0)
    never = lambda fn: pytest.fail("a kept choice must not be timed again")  # noqa: E731
    openfold_choice.clear(disk=False)  # a new process
    assert float(openfold_choice.run(("row", 8, torch.float32), 10, patched, stock, timer=never)) == 2.0
    assert openfold_choice.RECALLED == [repr(("row", 8, torch.float32))] and openfold_choice.TIMINGS == []
    # another key is timed as before
    openfold_choice.run(("row", 4, torch.float32), 10, patched, stock, timer=lambda fn: 1.0)
    assert len(openfold_choice.TIMINGS) == 1

    import flashlight.traced

    openfold_choice.clear(disk=False)
    monkeypatch.setattr(flashlight.traced, "versions", lambda: {"flashlight": "another"})
    openfold_choice.run(("row", 8, torch.float32), 10, patched, stock, timer=lambda fn: 1.0)
    assert openfold_choice.RECALLED == [] and openfold_choice.choices() == {("row", 8, torch.float32): "kernel"}

    from flashlight import settings

    monkeypatch.undo()  # the versions that kept a choice for this key
    with settings.override(tuning_cache=False):
        openfold_choice.clear(disk=False)
        openfold_choice.run(("row", 8, torch.float32), 10, patched, stock, timer=lambda fn: 1.0)
        assert openfold_choice.RECALLED == [] and len(openfold_choice.TIMINGS) == 1
    openfold_choice.clear(disk=False)
    openfold_choice.run(("row", 8, torch.float32), 10, patched, stock, timer=never)
    assert openfold_choice.RECALLED == [repr(("row", 8, torch.float32))]
