"""Runtime: launching a compiled kernel, through Triton's launcher or PyTorch's static one.

[Note: launching the compiled kernel] in ``flashlight/launch_plan.py``, [Note: the static
launcher] in ``flashlight/compiled_launch.py``. The CPU has no compiled kernels, so these
tests stand in for Triton's JIT function and compiled kernel and check what each launch
passes; the GPU runs check the kernels' values (``bench.kernels`` against float64).
"""
from __future__ import annotations

import types

import pytest
import torch

from flashlight import compiled_launch, launch_plan, settings

NAMES = ("in0", "out", "size0", "BLOCK_M", "BLOCK_N")  # the stand-in kernel's parameters


class Compiled:  # stands in for Triton's compiled kernel
    function, packed_metadata, hash = "function", "metadata", "k0"

    def __init__(self, calls):
        self.calls = calls

    @property
    def run(self):
        return lambda *args: self.calls.append(("direct", args))


class Jit:  # stands in for the JIT function of NAMES
    params = [types.SimpleNamespace(name=n, default=None) for n in NAMES]

    def __init__(self, calls):
        self.calls = calls

    def warmup(self, *args, grid, **options):
        self.calls.append(("warmup", args))
        return Compiled(self.calls)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append(("jit", grid, args, kw))


@pytest.fixture
def on_a_gpu(monkeypatch):
    """Launches as on a GPU: device 0 current, stream 1000 + device, Triton's hooks empty."""
    import triton

    device = {"now": 0}
    monkeypatch.setattr(compiled_launch, "current_device", lambda: device["now"])
    monkeypatch.setattr(compiled_launch, "current_stream", lambda d: 1000 + d)
    monkeypatch.setattr(compiled_launch, "compiles", lambda args: True)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", None)
    return device


def test_a_plan_launches_the_kernel_compiled_for_it_through_tritons_launcher(on_a_gpu, monkeypatch):
    """Without the static launcher a plan's launches call the compiled kernel's launcher
    with the grid, the current stream and every argument (constexprs last), the kernel
    compiled (not launched) once per alignment of the inputs; Triton's launch hooks or
    another current device launch through the JIT function."""
    import triton

    calls = []
    chosen = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4}
    plan = launch_plan.LaunchPlan((), ((4,),), (torch.float32,), (4,), (3,), chosen)
    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    profiling = triton.knobs.HookChain()
    profiling.add(print)
    kinds = []
    with settings.override(static_launch=False):
        for inputs, hook, now in [(x, None, 0), (x, triton.knobs.HookChain(), 0), (x[1:5], None, 0),
                                  (x, profiling, 0), (x, None, 1)]:
            monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", hook)
            on_a_gpu["now"] = now
            out = plan.launch(Jit(calls), [inputs])[0]
            kinds.append(calls[-1][0])
            if calls[-1][0] == "direct":
                assert calls[-1][1][:9] == (3, 1, 1, 1000, "function", "metadata", None, None, None)
                assert calls[-1][1][9] is inputs and calls[-1][1][10] is out and calls[-1][1][11:] == (4, 16, 32)
            else:
                assert calls[-1][1:] == ((3,), (inputs, out, 4), chosen)
    assert kinds == ["direct", "direct", "direct", "jit", "jit"]
    assert [c[0] for c in calls].count("warmup") == 2  # aligned, then misaligned inputs
    assert len(plan.compiled) == 2


def _source(signature: dict, constants=None):
    fn = types.SimpleNamespace(arg_names=list(NAMES))
    return types.SimpleNamespace(fn=fn, signature=signature, constants=constants or {})


@pytest.mark.parametrize("signature, constants, kept", [
    ({"in0": "*fp32", "out": "*fp32", "size0": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}, {},
     (0, 1, 2)),
    ({"in0": "*fp32", "out": "*fp32", "size0": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
     {(2,): 1, (3,): 16, (4,): 32}, (0, 1)),  # a size of 1, specialised into a constant
    ({0: "*bf16", 1: "*fp32", 2: "i64", 3: "constexpr", 4: "constexpr"}, {3: 16, 4: 32}, (0, 1, 2)),
])
def test_the_arguments_a_compiled_kernel_takes(signature, constants, kept):
    kernel = types.SimpleNamespace(src=_source(signature, constants))
    assert compiled_launch.kept_arguments(kernel, 3) == kept
    assert compiled_launch.kept_arguments(types.SimpleNamespace(src=_source({"in0": "*fp32"})), 3) is None


def test_a_static_launch_passes_the_kept_arguments_as_data_pointers(on_a_gpu):
    calls = []
    static = types.SimpleNamespace(run=lambda *args: calls.append(args))
    x, out = torch.randn(8), torch.empty(4)
    launch = compiled_launch.StaticLaunch(static, 0, (0, 1))
    assert launch.launch((3, 2), (x, out, 1))
    assert calls == [(3, 2, 1, 1000, x.data_ptr(), out.data_ptr())]
    on_a_gpu["now"] = 1
    assert not launch.launch((3,), (x, out, 1))  # another current device: the JIT function launches


def test_the_static_launcher_is_used_where_it_loads_and_tritons_elsewhere(on_a_gpu, monkeypatch):
    calls, loads = [], []
    loaded = compiled_launch.StaticLaunch(types.SimpleNamespace(run=lambda *a: calls.append(("static", a))), 0, (0,))

    def load(kernel, device, count):
        loads.append((kernel.hash, device, count))
        if kernel.hash == "broken":
            raise RuntimeError("cannot load")
        return loaded

    monkeypatch.setattr(compiled_launch, "_load", load)
    monkeypatch.setattr(compiled_launch, "_static", {})
    monkeypatch.setattr(settings, "_overrides", {"static_launch": True})
    x = torch.randn(8)
    args, options = (x, torch.empty(4), 4), {"BLOCK_M": 16, "BLOCK_N": 32}
    for _ in range(2):
        assert compiled_launch.compiled_launch(Jit(calls), args, options) is loaded
    assert loads == [("k0", 0, 3)]  # loaded once per kernel and device
    monkeypatch.setattr(Compiled, "hash", "broken")
    how = compiled_launch.compiled_launch(Jit(calls), args, options)
    assert isinstance(how, compiled_launch.TritonLaunch) and how.constexprs == (16, 32)
    with settings.override(static_launch=False):
        monkeypatch.setattr(Compiled, "hash", "other")
        assert isinstance(compiled_launch.compiled_launch(Jit(calls), args, options), compiled_launch.TritonLaunch)
    assert len(loads) == 2


def test_a_kernel_without_a_cubin_on_disk_keeps_tritons_launcher():
    kernel = types.SimpleNamespace(hash="k1", metadata_group={"k.ptx": "/nowhere/k.ptx"},
                                   src=_source({"in0": "*fp32", "out": "*fp32", "size0": "i32"}))
    assert compiled_launch._load(kernel, 0, 3) is None
