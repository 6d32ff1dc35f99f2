"""A whole OpenFold ``model_1``, patched and stock, folds the same sequence alike (CPU).

The model is a seeded random-weight ``model_1`` with 2 Evoformer blocks, 1 extra-MSA
block, no templates and no recycling (its attention modules, the extra-MSA global column
attention included, the extra-MSA outer product mean and the pLDDT head have every
parameter drawn, so they are not zero), on a 12-residue sequence with an 8-sequence MSA
(5 MSA rows, and 5 extra-MSA rows of which 3 are sequences, so masks have zeros),
unchunked and with ``chunk_size=4``.
Stock OpenFold needs ``cpu_compat()`` on CPU; the patched kernels run through the Triton
interpreter.

Stated tolerances (float32): single and pair representations within 1e-4 of their
largest magnitude; final atom positions within 1e-3 Å; pLDDT within 1e-2. (Measured on
CPU through the interpreter: about 3e-7 relative, 4e-6 Å and 4e-6 pLDDT.)
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
KEYS = ("final_atom_positions", "plddt", "single", "pair")


def _fold(model, batch):
    with torch.no_grad(), cpu_compat():
        out = model({k: v.clone() for k, v in batch.items()})
    return {k: out[k] for k in KEYS}


@pytest.fixture(scope="module", params=[None, 4], ids=["unchunked", "chunk4"])
def folded(request):
    config = oft.small_model_config(chunk_size=request.param, max_msa_clusters=5, max_extra_msa=5)
    model = oft.random_model(config, seed=1)
    torch.manual_seed(1)  # MSA sampling in the feature pipeline
    batch = oft.model_batch(config, SEQUENCE, n_alignments=8, seed=1)
    stock_out = _fold(model, batch)
    patched = copy.deepcopy(model)
    report = flashlight.patch_openfold(patched)
    patched_out = _fold(patched, batch)
    return model, patched, batch, report, stock_out, patched_out


def test_report(folded):
    _, _, _, report, _, _ = folded
    assert report.counts == {
        "evoformer": {
            "msa_row_attention_with_pair_bias": 2,
            "msa_column_attention": 2,
            "triangle_attention_start": 2,
            "triangle_attention_end": 2,
        },
        "extra_msa": {
            "msa_row_attention_with_pair_bias": 1,
            "msa_global_column_attention": 1,
            "triangle_attention_start": 1,
            "triangle_attention_end": 1,
        },
    }


def test_patched_model_matches_stock(folded):
    _, _, batch, _, want, out = folded
    for key in ("single", "pair"):
        scale = want[key].abs().max().item()
        diff = (out[key] - want[key]).abs().max().item()
        assert diff <= 1e-4 * scale, f"{key}: {diff:.3g} (scale {scale:.3g})"
    exists = batch["atom37_atom_exists"][..., -1].bool()
    positions = (out["final_atom_positions"] - want["final_atom_positions"])[exists]
    assert positions.abs().max().item() <= 1e-3
    assert (out["plddt"] - want["plddt"]).abs().max().item() <= 1e-2
    assert torch.isfinite(out["final_atom_positions"]).all()


def test_attention_matters(folded):
    """Guard against a vacuous comparison: the attention modules change the outputs."""
    model, _, batch, _, want, _ = folded
    muted = copy.deepcopy(model)
    with torch.no_grad():
        for block in muted.evoformer.blocks:
            block.msa_att_row.mha.linear_o.weight.zero_()
            block.core.tri_att_start.mha.linear_o.weight.zero_()
    out = _fold(muted, batch)
    assert (out["single"] - want["single"]).abs().max() > 1e-2
    assert (out["pair"] - want["pair"]).abs().max() > 1e-2
    # the extra-MSA stack's global column attention too
    muted = copy.deepcopy(model)
    with torch.no_grad():
        muted.extra_msa_stack.blocks[0].msa_att_col.global_attention.linear_o.weight.zero_()
    out = _fold(muted, batch)
    assert (out["pair"] - want["pair"]).abs().max() > 1e-3


def test_unpatch_restores_bit_identical_outputs(folded):
    model, patched, batch, _, want, _ = folded
    restored = copy.deepcopy(patched)
    assert flashlight.unpatch_openfold(restored) == 12
    out = _fold(restored, batch)
    for key in KEYS:
        assert torch.equal(out[key], want[key]), key


@pytest.mark.parametrize("folded", [None], ids=["unchunked"], indirect=True)
def test_state_dict_round_trip(folded, tmp_path):
    model, patched, batch, _, want, patched_out = folded
    state = patched.state_dict()
    reference = model.state_dict()
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    path = tmp_path / "weights.pt"
    torch.save(state, path)

    # a differently seeded model (other outputs), patched, then loaded from the file:
    # it reproduces the patched model's outputs, so the loaded weights took effect
    other = oft.random_model(oft.small_model_config(max_msa_clusters=5, max_extra_msa=5), seed=7)
    assert not torch.allclose(_fold(other, batch)["single"], want["single"])
    flashlight.patch_openfold(other)
    other.load_state_dict(torch.load(path))
    after = _fold(other, batch)
    for key in KEYS:
        torch.testing.assert_close(after[key], patched_out[key], rtol=1e-5, atol=1e-5)
    # and unpatched, it reproduces the stock outputs exactly
    flashlight.unpatch_openfold(other)
    out = _fold(other, batch)
    assert all(torch.equal(out[key], want[key]) for key in KEYS)


@pytest.mark.parametrize("folded", [None], ids=["unchunked"], indirect=True)
def test_bfloat16_model_is_as_close_to_float32_as_stock(folded):
    """In bfloat16, patched and stock models err alike against the float32 stock model.

    Tolerance: the patched model's error is at most twice the stock bfloat16 model's,
    plus 1e-2 of the magnitude (single, pair), 0.1 Å (positions) or 0.1 (pLDDT).
    """
    model, _, batch, _, want, _ = folded
    stock = copy.deepcopy(model).to(torch.bfloat16)
    patched = copy.deepcopy(stock)
    flashlight.patch_openfold(patched)
    stock_out, out = _fold(stock, batch), _fold(patched, batch)
    exists = batch["atom37_atom_exists"][..., -1].bool()
    floors = {"single": 1e-2, "pair": 1e-2, "plddt": None, "final_atom_positions": None}
    for key in KEYS:
        ref = want[key].double()
        got, base = out[key].double(), stock_out[key].double()
        if key == "final_atom_positions":
            ref, got, base = ref[exists], got[exists], base[exists]
        floor = 0.1 if floors[key] is None else floors[key] * ref.abs().max().item()
        err, stock_err = (got - ref).abs().max().item(), (base - ref).abs().max().item()
        assert torch.isfinite(got).all(), key
        assert err <= 2 * stock_err + floor, f"{key}: patched {err:.3g}, stock {stock_err:.3g}"
