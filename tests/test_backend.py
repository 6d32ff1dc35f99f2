"""The backend and its public surface: fallback with reasons, settings and debug output,
registration, runtime lengths, explain's report (kernels, graph breaks, configurations),
stable kernel names, the Hopper build of a kernel, compile options and bounds checking."""
from __future__ import annotations

import logging

import pytest
import torch

import flashlight
from flashlight import settings
from tests.helpers import attention, rand
from tests.helpers import attention_inputs as _inputs


def test_unsupported_ops_fall_back_with_a_reason():
    def with_cumsum(q, k, v):
        s = (q @ k.transpose(-1, -2)).cumsum(-1)
        return torch.softmax(s, dim=-1) @ v

    q, k, v = (rand(2, 13, 8, seed=s) for s in (9, 10, 11))
    report = flashlight.explain(with_cumsum, q, k, v)
    reasons = {op.name: op.reason for op in report.fallback_ops}
    assert "cumsum.default" in reasons and "no Flashlight lowering" in reasons["cumsum.default"]
    out = flashlight.compile(with_cumsum)(q, k, v)
    torch.testing.assert_close(out, with_cumsum(q, k, v), rtol=1e-5, atol=1e-5)


def test_cpu_without_the_interpreter_falls_back_with_a_warning():
    args = _inputs(12)
    torch.compiler.reset()
    with settings.override(interpret=False), pytest.warns(UserWarning, match="TRITON_INTERPRET"):
        out = flashlight.compile(attention)(*args)
    torch.compiler.reset()
    torch.testing.assert_close(out, attention(*args))


def test_debug_level_two_shows_the_ir_after_each_pass_and_the_source(caplog):
    with caplog.at_level(logging.WARNING, logger="flashlight"), settings.override(debug=2):
        flashlight.explain(attention, *_inputs(13))
    text = caplog.text
    for title in ("lowered IR", "IR after fuse_elementwise", "IR after fuse_reductions", "online form", "tiling of",
                  "Triton source"):
        assert title in text
    assert "@triton.jit" in text


def test_settings_override_is_scoped(monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_DEBUG", "1")
    assert settings.debug_level() == 1
    with settings.override(debug=3):
        assert settings.debug_level() == 3
    assert settings.debug_level() == 1
    with pytest.raises(KeyError):
        with settings.override(no_such_setting=1):
            pass


def test_backend_is_registered_by_name():
    args = _inputs(14)
    torch.compiler.reset()
    out = torch.compile(attention, backend="flashlight")(*args)
    torch.compiler.reset()
    ref = attention(*(a.double() for a in args))
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_lengths_are_runtime_arguments():
    from flashlight.backend import compile_count

    torch.compiler.reset()
    compiled = flashlight.compile(attention)
    before = compile_count()
    for L in (11, 19, 26, 33):
        args = _inputs(20 + L, L=L)
        out = compiled(*args)
        torch.testing.assert_close(out.double(), attention(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    # one static compile, then one with symbolic lengths that serves every other length
    assert compile_count() - before <= 2
    torch.compiler.reset()


def test_explain_reports_graph_breaks_and_a_function_left_entirely_to_eager():
    def with_generator(q, k, v, bias):
        noise = torch.randn(q.shape[-1], generator=torch.Generator().manual_seed(0))
        return attention(q, k, v, bias) + noise

    report = flashlight.explain(with_generator, *_inputs(18))
    assert len(report.kernels) == 1 and report.graphs >= 1
    assert report.graph_breaks and "graph break: " in str(report)
    assert any("Generator" in why for why in report.graph_breaks)
    nothing = flashlight.explain(lambda x: x, rand(3, seed=1))
    assert nothing.graphs == 0 and not nothing.kernels
    assert "no graph" in str(nothing)


def test_equal_kernels_print_equal_source_whatever_was_compiled_before():
    """Kernel and grid names come from the kernel itself, not from a process-wide count,
    so a recompile (or a new process) hits Triton's on-disk cache of built kernels."""
    torch.compiler.reset()
    first = flashlight.explain(attention, *_inputs(15)).kernels[0]
    flashlight.explain(lambda q, k, v, b: attention(q * 0.5, k, v, b), *_inputs(15))
    torch.compiler.reset()
    again = flashlight.explain(attention, *_inputs(16)).kernels[0]
    assert (again.name, again.source) == (first.name, first.source)
    other = flashlight.explain(lambda q, k, v, b: attention(q, k, v, b * 2.0), *_inputs(15)).kernels[0]
    assert other.name != first.name and first.name.startswith("flashlight_")
    assert f"def {first.name}(" in first.source


def test_generated_kernel_compiles_for_hopper():
    report = flashlight.explain(attention, *_inputs(15))
    result = report.kernels[0].aot_compile(90)
    assert 0 < result.shared <= 227 * 1024


def test_the_64_bit_offsets_build_compiles_for_hopper():
    # [Note: 64-bit offsets]: what a launch reaching past 2**31 - 1 elements runs
    report = flashlight.explain(attention, *_inputs(15))
    result = report.kernels[0].aot_compile(90, index_bits=64)
    assert 0 < result.shared <= 227 * 1024


def test_launches_reaching_past_32_bit_offsets_run_with_64_bit_ones(monkeypatch):
    """Every launch takes the 64-bit path when the limit is 0, and still matches
    float64; a tensor's reach is its largest offset, not its element count."""
    from flashlight import launch_sizes

    assert launch_sizes.index_kwargs([torch.empty(3, 5)]) == {}
    strided = torch.empty_strided((2, 3), (2**31, 1), device="meta")  # 6 elements, offset 2**31 + 2
    assert launch_sizes.index_kwargs([torch.empty(3, 5), strided]) == {"INDEX_BITS": 64}
    monkeypatch.setattr(launch_sizes, "OFFSET_LIMIT", 0)
    torch.compiler.reset()
    report = flashlight.api.ExplainReport()
    compiled = flashlight.compile(attention, report=report)
    args = _inputs(18, L=37)
    for _ in range(2):  # the first launch, then the launch plan's
        out = compiled(*args)
        torch.testing.assert_close(out.double(), attention(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    launchers = [kernel._chosen.__self__ for kernel in report.kernels]  # the kernels' Launchers
    plans = [plan for launcher in launchers for plan in launcher._plans.values()]
    assert plans and all(plan.chosen["INDEX_BITS"] == 64 for plan in plans)


def test_report_records_the_configuration_each_launch_ran_with():
    from flashlight.api import ExplainReport

    torch.compiler.reset()
    report = ExplainReport()
    compiled = flashlight.compile(attention, report=report)
    args = _inputs(17, L=23)
    out = compiled(*args)
    torch.testing.assert_close(out.double(), attention(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    (kernel,) = report.kernels
    (config,) = kernel.chosen_configs().values()
    block_m, block_n, warps, stages = config
    assert block_m >= 16 and block_m & (block_m - 1) == 0
    assert block_n >= 16 and block_n & (block_n - 1) == 0
    assert warps >= 1 and stages >= 1


def test_ieee_fp32_kernels_also_autotune_over_tiles_that_fit_in_registers():
    """IEEE float32 dots run on CUDA cores with operand and product tiles in registers:
    at head width 128 every tensor-core tile shape spills kilobytes per thread to local
    memory on sm_90, so the autotuning space of such a kernel also holds smaller tiles
    that spill an order of magnitude less; a bf16 kernel keeps the tensor-core space."""
    with settings.override(fp32_dots="ieee"):
        fp32_report = flashlight.explain(attention, *_inputs(16, L=40, D=128))
    bf16_report = flashlight.explain(attention, *(x.bfloat16() for x in _inputs(16, L=40, D=128)))
    (fp32_kernel,), (bf16_kernel,) = fp32_report.kernels, bf16_report.kernels
    fp32_space, bf16_space = set(fp32_kernel.gpu_configs), set(bf16_kernel.gpu_configs)
    base = fp32_space & bf16_space  # the tensor-core tile shapes it keeps
    extra = fp32_space - bf16_space
    assert base and extra

    def stack(config):
        block_m, block_n, warps, stages = config
        built = fp32_kernel.aot_compile(90, block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages)
        if built.stack < 0:
            pytest.skip("this Triton has no cuobjdump to read spills from")
        return built.stack

    least_base = min(stack(c) for c in base)
    least_extra = min(stack(c) for c in extra)
    assert least_base > 2048, "the premise: tensor-core tiles spill kilobytes at this width"
    assert least_extra < 512 and 16 * least_extra < least_base, (least_extra, least_base)


def test_compile_options_are_checked():
    with pytest.raises(TypeError, match="unknown Flashlight options"):
        flashlight.compile(attention, fallback="inductor")
    args = _inputs(16)
    torch.compiler.reset()
    out = flashlight.compile(attention, autotune=False)(*args)
    torch.compiler.reset()
    torch.testing.assert_close(out.double(), attention(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)


def test_bounds_checking_mode_asserts_every_offset(monkeypatch):
    from flashlight import runtime

    args = _inputs(17)
    torch.compiler.reset()
    with settings.override(check_bounds=True):
        report = flashlight.explain(attention, *args)
        assert "tl.atomic_add(errors" in report.kernels[0].source
        out = flashlight.compile(attention)(*args)  # every real offset is inside its tensor
        torch.testing.assert_close(out.double(), attention(*(a.double() for a in args)), rtol=1e-5, atol=1e-5)
        # pretend the tensors were one element long: the kernel must refuse
        monkeypatch.setattr(runtime, "span", lambda t: 1)  # the name the launcher calls
        torch.compiler.reset()
        with pytest.raises(Exception, match="out of bounds"):
            flashlight.compile(attention)(*args)
    torch.compiler.reset()
