"""patch_openfold / unpatch_openfold: what gets patched, reversal, weights, bad input.

Kernels run through the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("openfold")

from openfold.model.msa import MSAColumnAttention, MSARowAttentionWithPairBias  # noqa: E402
from openfold.model.triangular_attention import TriangleAttention  # noqa: E402

import flashlight  # noqa: E402
from flashlight.integrations import openfold as ofp  # noqa: E402
from flashlight.integrations import openfold_core  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402
from tests.helpers import H200_SHARED_MEMORY, shared_memory  # noqa: E402


pytestmark = pytest.mark.usefixtures("fresh_openfold_warnings")


class _PairCore(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tri_att_start = TriangleAttention(16, 32, 2, starting=True)
        self.tri_att_end = TriangleAttention(16, 32, 2, starting=False)


class _Block(torch.nn.Module):
    """An Evoformer-like module tree (0.0.1 layout); module level, so that it pickles."""

    def __init__(self):
        super().__init__()
        self.msa_att_row = MSARowAttentionWithPairBias(32, 16, 32, 2)
        self.msa_att_col = MSAColumnAttention(32, 32, 2)
        self.core = _PairCore()

    def forward(self, m, z, msa_mask, pair_mask, chunk_size=None):
        m = m + self.msa_att_row(m, z=z, mask=msa_mask, chunk_size=chunk_size)
        m = m + self.msa_att_col(m, mask=msa_mask, chunk_size=chunk_size)
        z = z + self.core.tri_att_start(z, mask=pair_mask, chunk_size=chunk_size)
        z = z + self.core.tri_att_end(z, mask=pair_mask, chunk_size=chunk_size)
        return m, z


def _block_like(gen):
    """A small Evoformer-like block with random weights, and its inputs."""
    block = _Block().eval()
    oft.randomize_(block, gen)
    n_seq, n_res = 5, 11
    inputs = (
        torch.randn(n_seq, n_res, 32, generator=gen),
        torch.randn(n_res, n_res, 16, generator=gen),
        oft.random_mask((n_seq, n_res), gen),
        oft.random_mask((n_res, n_res), gen),
    )
    return block, inputs


def _run(module, inputs, **kwargs):
    with torch.no_grad():
        return module(*inputs, **kwargs)


def _close(a, b, tol=1e-4):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol * y.abs().max().item())


def test_report_counts_each_kind_by_stack():
    config = oft.small_model_config(evoformer_blocks=2, extra_msa_blocks=1)
    config.model.template.enabled = True
    config.model.template.template_pair_stack.no_blocks = 2
    from openfold.model.model import AlphaFold

    model = AlphaFold(config)
    report = flashlight.patch_openfold(model)
    per_block = {
        "msa_row_attention_with_pair_bias": 1,
        "msa_column_attention": 1,
        "triangle_attention_start": 1,
        "triangle_attention_end": 1,
    }
    assert report.counts["evoformer"] == {k: 2 * v for k, v in per_block.items()}
    assert report.counts["extra_msa"] == {
        "msa_row_attention_with_pair_bias": 1,
        "msa_global_column_attention": 1,
        "triangle_attention_start": 1,
        "triangle_attention_end": 1,
    }
    assert report.counts["template_pair"] == {
        "triangle_attention_start": 2,
        "triangle_attention_end": 2,
    }
    assert report.total == 8 + 4 + 4 == len(report.paths)
    assert report.by_kind["triangle_attention_start"] == 5
    assert "evoformer.blocks.1.core.tri_att_end.mha" in report.paths
    assert "extra_msa_stack.blocks.0.msa_att_col.global_attention" in report.paths
    assert "template_pair" in str(report) and "msa_global_column_attention" in str(report)
    assert ofp.is_patched(model.extra_msa_stack.blocks[0].msa_att_col.global_attention)
    # the template pointwise attention keeps its forward
    assert "forward" not in vars(model.template_pointwise_att.mha)
    assert flashlight.unpatch_openfold(model) == 16


def test_patch_matches_and_unpatch_restores_bit_identical(gen):
    block, inputs = _block_like(gen)
    stock = copy.deepcopy(block)
    want = _run(stock, inputs)
    report = flashlight.patch_openfold(block)
    assert report.counts == {
        "other": {
            "msa_row_attention_with_pair_bias": 1,
            "msa_column_attention": 1,
            "triangle_attention_start": 1,
            "triangle_attention_end": 1,
        }
    }
    assert all(ofp.is_patched(m) for m in (block.msa_att_row.mha, block.core.tri_att_end.mha))
    _close(_run(block, inputs), want)
    assert flashlight.unpatch_openfold(block) == 4
    for module in block.modules():
        assert "forward" not in vars(module) and not hasattr(module, "_flashlight_openfold")
    for x, y in zip(_run(block, inputs), want):
        assert torch.equal(x, y)
    assert flashlight.unpatch_openfold(block) == 0  # nothing left to undo


def test_patching_twice_is_harmless(gen):
    block, inputs = _block_like(gen)
    want = _run(copy.deepcopy(block), inputs)
    first = flashlight.patch_openfold(block)
    forward = block.msa_att_row.mha.forward
    second = flashlight.patch_openfold(block)
    assert second.counts == first.counts and second.already_patched == 4
    assert block.msa_att_row.mha.forward == forward
    _close(_run(block, inputs), want)
    assert flashlight.unpatch_openfold(block) == 4
    for x, y in zip(_run(block, inputs), want):
        assert torch.equal(x, y)


def test_kinds_option_patches_a_subset(gen):
    block, _ = _block_like(gen)
    report = flashlight.patch_openfold(block, kinds=["triangle_attention_end"])
    assert report.total == 1 and ofp.is_patched(block.core.tri_att_end.mha)
    assert not ofp.is_patched(block.core.tri_att_start.mha)
    with pytest.raises(ValueError, match="unknown OpenFold attention kinds"):
        flashlight.patch_openfold(block, kinds=["msa_global_attention"])
    with pytest.raises(ValueError, match="none of the requested kinds"):
        flashlight.patch_openfold(MSAColumnAttention(32, 32, 2), kinds=["triangle_attention_end"])


def test_state_dict_is_unchanged_and_loading_after_patching_takes_effect(gen):
    block, inputs = _block_like(gen)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    params = [id(p) for p in block.parameters()]
    flashlight.patch_openfold(block)
    after = block.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    # parameters are used in place: the patched module holds no copies
    assert [id(p) for p in block.parameters()] == params
    out_before = _run(block, inputs)

    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in before.items()}
    block.load_state_dict(perturbed)
    stock = copy.deepcopy(block)
    flashlight.unpatch_openfold(stock)
    stock.load_state_dict(perturbed)
    out = _run(block, inputs)
    _close(out, _run(stock, inputs))
    assert not torch.allclose(out[0], out_before[0], atol=1e-3)
    assert not torch.allclose(out[1], out_before[1], atol=1e-3)


def test_model_without_openfold_attention_is_a_clear_error():
    with pytest.raises(ValueError, match="no OpenFold attention module"):
        flashlight.patch_openfold(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        flashlight.patch_openfold("model_1")


def test_cpu_without_interpreter_falls_back_with_one_warning(gen):
    block, inputs = _block_like(gen)
    want = _run(copy.deepcopy(block), inputs)
    flashlight.patch_openfold(block)
    with flashlight.settings.override(interpret=False):
        with pytest.warns(RuntimeWarning, match="TRITON_INTERPRET") as record:
            out = _run(block, inputs)
            out2 = _run(block, inputs)
    assert len([w for w in record if "TRITON_INTERPRET" in str(w.message)]) == 1
    for x, y, z in zip(out, out2, want):  # the stock forward ran: bit-identical
        assert torch.equal(x, z) and torch.equal(y, z)


def test_cpu_without_interpreter_can_refuse(gen):
    block, inputs = _block_like(gen)
    flashlight.patch_openfold(block, fallback_on_cpu=False)
    with flashlight.settings.override(interpret=False):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            _run(block, inputs)


def test_autograd_runs_flashlight_forward_and_backward(gen):
    """A training step of a patched block: Flashlight's kernels run, and every parameter's
    gradient matches the stock block's (the stacked projections included)."""
    block, inputs = _block_like(gen)
    stock = copy.deepcopy(block)
    flashlight.patch_openfold(block)
    weights = [torch.randn(x.shape, generator=gen) for x in (inputs[0], inputs[1])]
    grads = []
    for module in (block, stock):
        with oft.count_launches() as launches:
            m, z = module(*inputs)
            ((m * weights[0]).sum() + (z * weights[1]).sum()).backward()
        grads.append({name: p.grad for name, p in module.named_parameters()})
        assert len(launches) > 0 or module is stock
    scale = max(g.abs().max().item() for g in grads[1].values())
    for name, want in grads[1].items():
        got = grads[0][name]
        assert got is not None and torch.isfinite(got).all(), name
        # a common floor: some gradients are zero but for rounding (a bias whose
        # gradient sums a softmax's score gradients over their keys)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_compiled_cores_are_shared_by_signature(gen):
    openfold_core.clear_compiled()
    modules = [
        TriangleAttention(16, 32, 2, starting=True),
        TriangleAttention(16, 32, 2, starting=False),
        MSAColumnAttention(32, 32, 2),
    ]
    x = torch.randn(11, 11, 16, generator=gen)
    m = torch.randn(5, 11, 32, generator=gen)
    for module in modules:
        flashlight.patch_openfold(module)
    with torch.no_grad():
        modules[0](x)
        modules[1](x)
        modules[2](m)
    # both triangle attentions (2 biases, H 2, c 32) share one; the column (1 bias) its own
    assert openfold_core.compiled_names() == [
        "gated_attention_1_h2_c32_float32",
        "gated_attention_2_h2_c32_float32",
    ]


class _Upstream2PairStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tri_att_start = TriangleAttention(16, 32, 2, starting=True)
        self.tri_att_end = TriangleAttention(16, 32, 2, starting=False)


class _Upstream2Block(torch.nn.Module):
    """OpenFold 2.x nests the triangle attentions under ``pair_stack``."""

    def __init__(self):
        super().__init__()
        self.msa_att_row = MSARowAttentionWithPairBias(32, 16, 32, 2)
        self.msa_att_col = MSAColumnAttention(32, 32, 2)
        self.pair_stack = _Upstream2PairStack()


class _Upstream2Stack(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Upstream2Block() for _ in range(n)])


UPSTREAM2_FLAGS = {
    "use_memory_efficient_kernel": False,
    "use_deepspeed_evo_attention": False,
    "use_cuequivariance_attention": False,
    "use_lma": False,
    "lma_q_chunk_size": 1024,
    "lma_kv_chunk_size": 4096,
    "use_flash": False,
    "flash_mask": None,
}


def test_upstream_2x_layout_and_flags(gen):
    stack = _Upstream2Stack(2).eval()
    oft.randomize_(stack, gen)
    stock = copy.deepcopy(stack)
    report = flashlight.patch_openfold(stack)
    assert report.counts == {
        "other": {
            "msa_row_attention_with_pair_bias": 2,
            "msa_column_attention": 2,
            "triangle_attention_start": 2,
            "triangle_attention_end": 2,
        }
    }
    assert "blocks.1.pair_stack.tri_att_end.mha" in report.paths
    n = 12
    x = torch.randn(n, n, 16, generator=gen)
    mask = oft.random_mask((n, n), gen)
    biases = [
        (1e9 * (mask - 1))[..., :, None, None, :],  # [I, 1, 1, J]
        torch.randn(1, 2, n, n, generator=gen),  # [1, H, I, J]
    ]
    with torch.no_grad():
        for patched_block, stock_block in zip(stack.blocks, stock.blocks):
            for name in ("tri_att_start", "tri_att_end"):
                mha = getattr(patched_block.pair_stack, name).mha
                want = getattr(stock_block.pair_stack, name).mha(x, x, biases)
                # the call an OpenFold 2.x owner makes: every flag by keyword
                out = mha(q_x=x, kv_x=x, biases=biases, **UPSTREAM2_FLAGS)
                torch.testing.assert_close(
                    out, want, rtol=1e-4, atol=1e-4 * want.abs().max().item()
                )
    assert flashlight.unpatch_openfold(stack) == 8




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("width", [32, 16], ids=["c32", "c16"])
def test_attention_core_is_one_kernel_that_builds_for_hopper(width, dtype, gen):
    """Scores, biases, softmax, P@V and the gate become one kernel, which builds for sm_90.

    Widths: the Evoformer's head width (32) and the template pair stack's (16).
    """
    row = MSARowAttentionWithPairBias(32, 16, width, 2).eval()
    oft.randomize_(row, gen)
    row = row.to(dtype)
    m = torch.randn(5, 11, 32, generator=gen).to(dtype)
    z = torch.randn(11, 11, 16, generator=gen).to(dtype)
    msa_mask = oft.random_mask((5, 11), gen).to(dtype)
    with torch.no_grad():
        m_in, mask_bias, pair_bias = row._prep_inputs(m, z, msa_mask)
        m_in = row.layer_norm_m(m_in)
        for biases in ([mask_bias, pair_bias], [mask_bias], []):
            fn, args = ofp.core_call(row.mha, m_in, m_in, biases)
            report = flashlight.explain(fn, *args)
            assert len(report.kernels) == 1, str(report)
            kernel = report.kernels[0]
            ops = " ".join(kernel.aten_ops)
            assert "sigmoid" in ops, ops
            assert "exp" in ops or "softmax" in ops, ops
            assert "mm" in ops, ops  # both matmuls (mm/bmm/matmul) are inside
            compute = [op for op in report.fallback_ops if not _is_view(op.name)]
            assert not compute, str(report)
            assert 0 <= shared_memory(kernel.aot_compile(90)) <= H200_SHARED_MEMORY


_VIEW_OPS = ("view", "transpose", "permute", "expand", "unsqueeze", "squeeze", "alias", "t.")


def _is_view(name: str) -> bool:
    return any(v in name for v in _VIEW_OPS)


def test_deepcopy_of_a_patched_model_is_patched_on_its_own_weights(gen):
    block, inputs = _block_like(gen)
    flashlight.patch_openfold(block)
    twin = copy.deepcopy(block)
    assert ofp.is_patched(twin.msa_att_row.mha)
    assert twin.msa_att_row.mha.forward.__self__ is twin.msa_att_row.mha
    with torch.no_grad():
        twin.msa_att_row.mha.linear_o.weight.mul_(2.0)
    stock_twin = copy.deepcopy(twin)
    flashlight.unpatch_openfold(stock_twin)
    _close(_run(twin, inputs), _run(stock_twin, inputs))
    assert not torch.allclose(_run(twin, inputs)[0], _run(block, inputs)[0])


def test_inference_mode(gen):
    block, inputs = _block_like(gen)
    stock = copy.deepcopy(block)
    flashlight.patch_openfold(block)
    with torch.inference_mode():
        _close(block(*inputs), stock(*inputs))


def test_torch_save_round_trip_loads_a_patched_model(gen, tmp_path):
    """A patched model pickles whole; the loaded model is patched, with its options."""
    block, inputs = _block_like(gen)
    want = _run(copy.deepcopy(block), inputs)
    flashlight.patch_openfold(block, fallback_on_cpu=False)
    path = tmp_path / "model.pt"
    torch.save(block, path)
    loaded = torch.load(path, weights_only=False)
    attentions = [loaded.msa_att_row.mha, loaded.msa_att_col._msa_att.mha,
                  loaded.core.tri_att_start.mha, loaded.core.tri_att_end.mha]
    for mha in attentions:
        assert ofp.is_patched(mha) and mha.forward.__self__ is mha
        assert getattr(mha, "_flashlight_openfold").options.fallback_on_cpu is False
    _close(_run(loaded, inputs), want)
    with flashlight.settings.override(interpret=False):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            _run(loaded, inputs)
    assert flashlight.unpatch_openfold(loaded) == 4
    for x, y in zip(_run(loaded, inputs), want):
        assert torch.equal(x, y)
    # unpatched before saving: the file holds a stock model
    torch.save(loaded, path)
    again = torch.load(path, weights_only=False)
    assert not any("forward" in vars(m) for m in again.modules())


def test_unpatch_leaves_every_module_as_it_was(gen):
    block, _ = _block_like(gen)
    before = {name: sorted(vars(m)) for name, m in block.named_modules()}
    flashlight.patch_openfold(block)
    flashlight.patch_openfold(block, kinds="triangle_attention_end")
    flashlight.unpatch_openfold(block)
    assert {name: sorted(vars(m)) for name, m in block.named_modules()} == before


def test_kinds_argument_forms(gen):
    block, _ = _block_like(gen)
    report = flashlight.patch_openfold(block, kinds="triangle_attention_start")
    assert report.by_kind == {"triangle_attention_start": 1}
    report = flashlight.patch_openfold(block, kinds=(k for k in ["msa_column_attention"]))
    assert report.by_kind == {"msa_column_attention": 1}
    # the earlier call's module stays patched
    assert ofp.is_patched(block.core.tri_att_start.mha)
    assert not ofp.is_patched(block.core.tri_att_end.mha)
    with pytest.raises(TypeError, match="kinds must be a kind name or an iterable"):
        flashlight.patch_openfold(block, kinds=3)
    with pytest.raises(TypeError, match="kinds must be strings"):
        flashlight.patch_openfold(block, kinds=["triangle_attention_end", 1])
    with pytest.raises(ValueError, match="kinds is empty"):
        flashlight.patch_openfold(block, kinds=[])
    assert not ofp.is_patched(block.core.tri_att_end.mha)


def test_bad_arguments_are_clear_errors_and_patch_nothing(gen):
    block, _ = _block_like(gen)
    with pytest.raises(TypeError, match="unpatch_openfold expects a torch.nn.Module"):
        flashlight.unpatch_openfold("x")
    with pytest.raises(TypeError, match="compile_options must be a dict"):
        flashlight.patch_openfold(block, compile_options="autotune")
    with pytest.raises(TypeError, match=r"unknown compile_options \['autotnue'\]"):
        flashlight.patch_openfold(block, compile_options={"autotnue": False})
    assert not any(ofp.is_patched(m) for m in block.modules())
    # an instance forward set by something else is not overwritten
    other = block.core.tri_att_end.mha.forward
    block.core.tri_att_end.mha.forward = other
    with pytest.raises(ValueError, match="core.tri_att_end.mha already has a forward"):
        flashlight.patch_openfold(block)
    assert not any(ofp.is_patched(m) for m in block.modules())
    assert vars(block.core.tri_att_end.mha)["forward"] is other
