"""``patch_openfold(model, scope="block")``: whole OpenFold blocks compiled with Flashlight (CPU).

A stack of two tiny random Evoformer blocks (c_m 16, c_z 8, 2 heads of 4) runs stock and
block-scoped at three MSA sizes (sequences x residues 3x5, 4x7, 3x6, masks with zeros),
with the remainder eager (Inductor's C++ builds are slow on the CPU). Checked: the block
outputs match stock float32 and float64 within 1e-4 of their magnitude; the two blocks
share one graph; the second size compiles one graph with symbolic sizes and the third
none; a chunked call runs the eager block; unpatching restores stock bit for bit; the
report; a bad scope. One template pair block runs with the Inductor remainder. A
training step of one block (dropout on, OpenFold's checkpointing) compiles it as
training graphs with the Inductor remainder.
"""
from __future__ import annotations

import copy
import functools
import os
import random
import unittest.mock

import pytest
import torch
from torch._dynamo.utils import counters

pytest.importorskip("openfold")

import flashlight  # noqa: E402
import flashlight.inductor  # noqa: E402
from flashlight import settings  # noqa: E402
from flashlight.integrations import openfold_blocks  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402

SIZES = ((3, 5), (4, 7), (3, 6))  # (N_seq, N_res): static, then symbolic, then no compile (a small third)
SEED = int(os.environ.get("FLASHLIGHT_TEST_SEED") or random.SystemRandom().randrange(2**31))


def _evoformer_block(generator):
    from openfold.model.evoformer import EvoformerBlock

    block = EvoformerBlock(
        c_m=16, c_z=8, c_hidden_msa_att=4, c_hidden_opm=4, c_hidden_mul=8,
        c_hidden_pair_att=4, no_heads_msa=2, no_heads_pair=2, transition_n=2,
        msa_dropout=0.15, pair_dropout=0.25, inf=1e9, eps=1e-10,
    ).eval()
    oft.randomize_(block, generator, gain=0.5)
    return block


class _Stack(torch.nn.Module):
    """Blocks called as OpenFold's stacks call them at inference (``inplace_safe=True``)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, m, z, msa_mask, pair_mask, chunk_size=None):
        for block in self.blocks:
            m, z = block(m, z, msa_mask=msa_mask, pair_mask=pair_mask,
                         chunk_size=chunk_size, inplace_safe=True)
        return m, z


def _inputs(n_seq, n_res, generator, dtype=torch.float32):
    m = torch.randn(n_seq, n_res, 16, generator=generator, dtype=torch.float64)
    z = torch.randn(n_res, n_res, 8, generator=generator, dtype=torch.float64)
    masks = oft.random_mask((n_seq, n_res), generator), oft.random_mask((n_res, n_res), generator)
    return [m.to(dtype), z.to(dtype), *(mask.to(dtype) for mask in masks)]


def _run(stack, inputs, **kwargs):
    with torch.no_grad():
        return stack(*[t.clone() for t in inputs], **kwargs)


def _graphs():
    return counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def runs():
    """(stock, patched, report, [(inputs, stock out, patched out, graphs compiled)])."""
    print(f"FLASHLIGHT_TEST_SEED={SEED}")
    generator = torch.Generator().manual_seed(SEED)
    stock = _Stack([_evoformer_block(generator) for _ in range(2)])
    patched = copy.deepcopy(stock)
    report = flashlight.patch_openfold(patched, scope="block")
    torch.compiler.reset()
    openfold_blocks.clear_compiled()
    results = []
    with settings.override(remainder="eager", on_error="raise"):
        for n_seq, n_res in SIZES:
            inputs = _inputs(n_seq, n_res, generator)
            want = _run(stock, inputs)
            before = _graphs()
            got = _run(patched, inputs)
            results.append((inputs, want, got, _graphs() - before))
    yield stock, patched, report, results
    torch.compiler.reset()
    openfold_blocks.clear_compiled()


def test_report_names_the_scope_and_the_blocks(runs):
    _, _, report, _ = runs
    assert report.scope == "block" and report.blocks == {"evoformer": 2}
    assert report.total == 8
    assert "whole blocks compiled: 2" in str(report)
    assert openfold_blocks.compiled_names() == ["evoformer_block_float32"]


def test_block_outputs_match_stock_in_float32_and_float64(runs):
    stock, _, _, results = runs
    reference = copy.deepcopy(stock).double()
    for inputs, want, got, _ in results:
        exact = _run(reference, [t.double() for t in inputs])
        for name, w, g, x in zip("mz", want, got, exact):
            assert torch.isfinite(g).all(), name
            scale = x.abs().max().item()
            assert (g - w).abs().max().item() <= 1e-4 * scale, name
            assert (g.double() - x).abs().max().item() <= 1e-4 * scale, name


def test_the_blocks_share_one_graph_and_the_third_size_compiles_nothing(runs):
    _, _, _, results = runs
    assert [graphs for *_, graphs in results] == [1, 1, 0]


def test_attention_matters(runs):
    """Guard against a vacuous comparison: the attention modules change the outputs."""
    stock, _, _, results = runs
    inputs, want, _, _ = results[0]
    muted = copy.deepcopy(stock)
    with torch.no_grad():
        for block in muted.blocks:
            block.msa_att_row.mha.linear_o.weight.zero_()
            block.core.tri_att_start.mha.linear_o.weight.zero_()
    m, z = _run(muted, inputs)
    assert (m - want[0]).abs().max() > 1e-2 and (z - want[1]).abs().max() > 1e-2


def test_a_chunked_call_runs_the_eager_block(runs):
    stock, patched, _, results = runs
    inputs = results[-1][0]
    spy = unittest.mock.patch.object(openfold_blocks, "compiled_block", wraps=openfold_blocks.compiled_block)
    with settings.override(remainder="eager", on_error="raise"), spy as compiled:
        got = _run(patched, inputs, chunk_size=2)
    assert not compiled.called
    for w, g in zip(_run(stock, inputs, chunk_size=2), got):
        assert (g - w).abs().max().item() <= 1e-4 * w.abs().max().item()


def test_unpatch_restores_stock_bit_for_bit(runs):
    stock, patched, _, results = runs
    restored = copy.deepcopy(patched)
    assert flashlight.unpatch_openfold(restored) == 8
    assert not any("forward" in vars(module) for module in restored.modules())
    inputs, want, _, _ = results[0]
    for w, g in zip(want, _run(restored, inputs)):
        assert torch.equal(w, g)


def test_patching_with_scope_attention_removes_the_block_patches(runs):
    _, patched, _, _ = runs
    again = copy.deepcopy(patched)
    report = flashlight.patch_openfold(again)
    assert report.scope == "attention" and report.blocks == {}
    assert not any(isinstance(vars(b).get("_flashlight_openfold"), openfold_blocks._BlockState)
                   for b in again.blocks)


def test_an_unknown_scope_is_a_value_error():
    model = _Stack([_evoformer_block(torch.Generator().manual_seed(0))])
    with pytest.raises(ValueError, match="unknown scope 'nonsense'"):
        flashlight.patch_openfold(model, scope="nonsense")
    assert not any("forward" in vars(module) for module in model.modules())


def test_a_template_pair_block_through_the_inductor_remainder(gen):
    from openfold.model.template import TemplatePairStackBlock

    block = TemplatePairStackBlock(
        c_t=8, c_hidden_tri_att=4, c_hidden_tri_mul=8, no_heads=2,
        pair_transition_n=2, dropout_rate=0.25, inf=1e9,
    ).eval()
    oft.randomize_(block, gen, gain=0.5)
    patched = copy.deepcopy(block)
    report = flashlight.patch_openfold(patched, scope="block")
    assert report.blocks == {"template_pair": 1}
    z = torch.randn(1, 6, 6, 8, generator=gen)
    mask = oft.random_mask((1, 6, 6), gen)
    spy = unittest.mock.patch.object(flashlight.inductor, "write_into_overwritten_inputs",
                                     wraps=flashlight.inductor.write_into_overwritten_inputs)
    with torch.no_grad():
        want = block(z.clone(), mask, inplace_safe=True)
        z_in = z.clone()
        with settings.override(remainder="inductor", on_error="raise"), spy as handed:
            got = patched(z_in, mask, inplace_safe=True)
        exact = copy.deepcopy(block).double()(z.double(), mask.double())
    # Inductor compiled the rest of the block, and the result was written into the
    # caller's z, as OpenFold's in-place path does ([Note: a compiled block updates its
    # inputs in place] in openfold_blocks.py)
    assert handed.called
    assert got is z_in
    assert torch.isfinite(got).all()
    scale = exact.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * scale
    assert (got.double() - exact).abs().max().item() <= 1e-4 * scale


class _TrainingStack(torch.nn.Module):
    """Blocks called as OpenFold's stacks call them in training: through OpenFold's
    ``checkpoint_blocks`` (``blocks_per_ckpt`` 1: each block runs without autograd,
    then again with it in the backward pass), or directly with ``blocks_per_ckpt`` None."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.blocks_per_ckpt = 1

    def forward(self, m, z, msa_mask, pair_mask):
        from openfold.utils.checkpointing import checkpoint_blocks

        calls = [functools.partial(b, msa_mask=msa_mask, pair_mask=pair_mask, chunk_size=None,
                                   inplace_safe=False) for b in self.blocks]
        return checkpoint_blocks(calls, args=(m, z), blocks_per_ckpt=self.blocks_per_ckpt)


def _training_step(stack, inputs, weights, blocks_per_ckpt):
    """Loss and gradients (the parameters', then ``m``'s and ``z``'s) of one step."""
    stack.blocks_per_ckpt = blocks_per_ckpt
    stack.zero_grad(set_to_none=True)
    m, z = (t.clone().requires_grad_() for t in inputs[:2])
    torch.manual_seed(5)  # the dropout masks
    out_m, out_z = stack(m, z, *inputs[2:])
    loss = (out_m * weights[0]).sum() + (out_z * weights[1]).sum()
    loss.backward()
    return loss.item(), [p.grad for p in stack.parameters()] + [m.grad, z.grad]


def test_training_compiles_the_blocks_and_checkpointing_draws_the_same_dropout(gen):
    """[Note: compiled blocks in training] in openfold_blocks.py: under autograd the block
    compiles as a training graph (Flashlight's backward kernels, Inductor's remainder);
    with dropout on and OpenFold's checkpointing the step equals the step without
    checkpointing (the block's two runs draw the same masks); with dropout off the
    gradients match stock's."""
    # one block: checkpointing runs it twice all the same, and the Triton interpreter's
    # time goes in proportion to the blocks run
    stock = _TrainingStack([_evoformer_block(gen)]).train()
    patched = copy.deepcopy(stock)
    flashlight.patch_openfold(patched, scope="block")
    inputs = _inputs(3, 6, gen)
    weights = [torch.randn(t.shape, generator=gen) for t in inputs[:2]]
    torch.compiler.reset()
    openfold_blocks.clear_compiled()
    spy = unittest.mock.patch.object(flashlight.inductor, "compile_remainder", wraps=flashlight.inductor.compile_remainder)
    with settings.override(remainder="inductor", on_error="raise"), spy as remainder:
        loss_ckpt, grads_ckpt = _training_step(patched, inputs, weights, 1)
        loss, grads = _training_step(patched, inputs, weights, None)
    for module in (*stock.modules(), *patched.modules()):
        if type(module).__name__.startswith("Dropout"):
            module.eval()
    # the graph without dropout compiles again: its remainder runs eagerly (Inductor's
    # C++ builds of a second training graph took two minutes of the suite's time)
    with settings.override(remainder="eager", on_error="raise"):
        want_loss, want = _training_step(stock, inputs, weights, None)
        got_loss, got = _training_step(patched, inputs, weights, None)
    torch.compiler.reset()
    openfold_blocks.clear_compiled()
    assert {c.args[2] for c in remainder.call_args_list} == {"inference", "forward", "backward"}
    assert loss_ckpt == pytest.approx(loss, rel=1e-6)
    for a, b in zip(grads_ckpt, grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())
    assert got_loss == pytest.approx(want_loss, rel=1e-4)
    scale = max(g.abs().max().item() for g in want)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        assert (a - b).abs().max().item() <= 1e-4 * scale
