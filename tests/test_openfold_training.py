"""A training step of a whole patched OpenFold ``model_1`` matches stock's (CPU, interpreter).

The model is the small seeded random-weight ``model_1`` of the other model tests, with
one Evoformer block (and 1 extra-MSA block, no templates, no recycling) in ``train()`` mode, so
OpenFold applies its dropout around the attention modules, with activation
checkpointing as OpenFold configures it for training (``blocks_per_ckpt=1``: every
block's forward runs again during the backward pass). Both models draw the same dropout
masks (the same seed before each step; the patched attentions draw no random numbers).
The loss is a fixed random weighting of the structure module's atom positions, the
distogram and masked-MSA logits and the single and pair representations.

Stated tolerance (float32): every parameter's gradient within 1e-4 relative of stock's,
on a common floor of 1e-5 times the largest gradient (some gradients are zero but for
rounding).
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("openfold")

import flashlight  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402
from flashlight.integrations.openfold_compat import cpu_compat  # noqa: E402

SEQUENCE = "MKTAYIAKQRQI"  # 12 residues
LOSS_KEYS = ("final_atom_positions", "distogram_logits", "masked_msa_logits", "single", "pair")


def _step(model, batch, weights) -> tuple[dict, int]:
    """One forward and backward pass; returns the parameters' gradients and the number
    of Flashlight kernel launches."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)  # the same dropout masks for both models
    with cpu_compat(), oft.count_launches() as launches:
        out = model({k: v.clone() for k, v in batch.items()})
        loss = sum((out[k] * weights[k]).sum() for k in LOSS_KEYS)
        loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}, len(launches)


@pytest.fixture(scope="module")
def training_step():
    # one Evoformer block: checkpointing runs it again all the same, and the Triton
    # interpreter's time goes in proportion to the blocks run
    config = oft.small_model_config(max_msa_clusters=5, max_extra_msa=5, evoformer_blocks=1)
    config.globals.blocks_per_ckpt = 1
    stock = oft.random_model(config, seed=2).train()
    torch.manual_seed(2)  # MSA sampling in the feature pipeline
    batch = oft.model_batch(config, SEQUENCE, n_alignments=8, seed=2)
    patched = copy.deepcopy(stock)
    flashlight.patch_openfold(patched)
    with torch.no_grad(), cpu_compat():
        shapes = {k: v.shape for k, v in stock({k: v.clone() for k, v in batch.items()}).items()
                  if k in LOSS_KEYS}
    gen = torch.Generator().manual_seed(4)
    weights = {k: torch.randn(shape, generator=gen) for k, shape in shapes.items()}
    stock_grads, _ = _step(stock, batch, weights)
    patched_grads, launches = _step(patched, batch, weights)
    return stock, stock_grads, patched_grads, launches


def test_training_runs_flashlight_kernels_with_dropout_and_checkpointing(training_step):
    stock, _, _, launches = training_step
    assert stock.training and stock.globals.blocks_per_ckpt == 1
    dropouts = [m for m in stock.evoformer.modules() if type(m).__name__.startswith("Dropout")]
    assert dropouts and all(m.training and getattr(m, "r", getattr(m, "p", 0)) > 0 for m in dropouts)
    assert launches > 0


def test_parameter_gradients_match_stock(training_step):
    _, stock_grads, patched_grads, _ = training_step
    assert stock_grads.keys() == patched_grads.keys()
    scale = max(g.abs().max().item() for g in stock_grads.values() if g is not None)
    checked = 0
    for name, want in stock_grads.items():
        got = patched_grads[name]
        if want is None:  # a parameter the loss does not reach (e.g. the template embedder)
            assert got is None, name
            continue
        assert got is not None and torch.isfinite(got).all(), name
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale, msg=name)
        checked += 1
    attention = [n for n in stock_grads if ".mha.linear_q." in n and stock_grads[n] is not None]
    assert attention and checked > len(stock_grads) // 2
