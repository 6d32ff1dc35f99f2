"""Autotuning's candidates, its choice against the unfused graph, and the shipped tuned choices."""
from __future__ import annotations

import json
import math

import pytest
import torch

triton = pytest.importorskip("triton")

from flashlight import aot, backend, runtime, settings, tile_configs, tuned_configs, tuning, tuning_cache  # noqa: E402
from flashlight.codegen import generate  # noqa: E402
from flashlight.decompositions import decompositions  # noqa: E402
from tests.helpers import FakeJit, FakeTuner  # noqa: E402

CPU = torch.device("cpu")


def _attention(q, k, v, bias):
    # [B, H, L, D] x3, [B, H, L, L] -> [B, H, L, D]
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, -1) @ v * 2.0


def _inputs(dtype=torch.float32, L=24, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, L, D, generator=g) for _ in range(3))
    bias = torch.randn(1, 2, L, L, generator=g)
    return tuple(t.to(dtype) for t in (q, k, v, bias))


def _built(fn, *inputs, tf32: bool = False):
    """The FX module Flashlight builds for ``fn`` and its launchers (interpreter, static sizes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        gm = backend.build(make_fx(fn, decomposition_table=decompositions(inference=True))(*inputs), inputs, None, {})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    launchers = [n.target for n in gm.graph.nodes if isinstance(n.target, runtime.Launcher)]
    assert launchers, "no Flashlight kernel was generated"
    return gm, launchers


def _gpu_source(launcher):
    return generate(launcher.tiled, launcher.src.name, launcher.src.fp32_precision, interpret=False)


def _two_configs():
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": 32}, num_warps=4, num_stages=2) for m in (64, 128)]


# ------------------------------------------------------------------ the kernel or the graph


@pytest.mark.parametrize("kernel_ms, eager_ms, chosen", [
    (1.0, 0.5, "eager"), (80.0, 1.0, "eager"),  # the graph clearly faster
    (1.0, 0.97, "kernel"), (1.0, 1.0, "kernel"), (0.5, 1.0, "kernel"),  # within the margin, or slower
    (1.0, None, "kernel"), (1.0, math.nan, "kernel"), (1.0, math.inf, "kernel"),  # the graph not timed
    (None, 1.0, "eager"), (math.nan, 1.0, "eager"), (None, None, "kernel"),
])
def test_the_chooser_keeps_the_faster_with_ties_to_the_kernel(kernel_ms, eager_ms, chosen):
    assert tuning.choose(kernel_ms, eager_ms) == chosen


def _fake_launcher(eager=None):
    src = runtime.KernelSource("flashlight_k", "def flashlight_k(x):\n    pass\n", ("x",), (1,), ("s0",), 1,
                               (), False, "ieee", False)
    launcher = object.__new__(runtime.Launcher)
    launcher.src, launcher._chosen, launcher._raw, launcher.eager = src, {}, FakeJit(), eager
    launcher.__name__ = "flashlight_k"
    return launcher


@pytest.mark.parametrize("eager_ms, chosen", [(0.2, "eager"), (3.0, (128, 32, 4, 2))])
def test_a_first_launch_times_the_best_candidate_against_the_graph_and_records_the_faster(
        tmp_path, monkeypatch, eager_ms, chosen):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "precompile", lambda *a: 1)
    timed = []

    def fake_median(fn):  # the best candidate is timed first, then the graph
        fn()
        timed.append(fn)
        return 1.0 if len(timed) == 1 else eager_ms

    monkeypatch.setattr(runtime, "_median_ms", fake_median)
    ran = []
    launcher = _fake_launcher(eager=lambda *t: ran.append(t) or torch.zeros(2))
    tuner = FakeTuner(_two_configs())
    assert launcher._first_launch(tuner, ("args",), None, (96,), CPU, True, eager_inputs=("x",)) is None
    assert len(tuner.launches) == 1 and len(timed) == 2 and ran  # tuned, then both timed
    assert launcher.chosen_configs() == {(96,): chosen}
    recorded = tuning_cache.recall_choice(launcher.src, CPU, (96,))
    assert (recorded if recorded == "eager" else (recorded["BLOCK_M"], recorded["BLOCK_N"])) == \
        (chosen if chosen == "eager" else chosen[:2])

    # another process recalls it; the graph's result is what the launch returns
    again, tuner = _fake_launcher(eager=lambda *t: torch.full((2,), 7.0)), FakeTuner(_two_configs())
    result = again._first_launch(tuner, ("args",), None, (96,), CPU, True, eager_inputs=("x",))
    assert tuner.launches == []
    if chosen == "eager":
        assert torch.equal(result, torch.full((2,), 7.0)) and again._raw.launches == []
    else:
        assert result is None and again._raw.launches[0]["BLOCK_M"] == 128
    # a launcher without the graph tunes instead of recalling a choice it cannot run
    blind, tuner = _fake_launcher(eager=None), FakeTuner(_two_configs())
    blind._first_launch(tuner, ("args",), None, (96,), CPU, True, eager_inputs=("x",))
    assert len(tuner.launches) == (1 if chosen == "eager" else 0)


def test_a_graph_that_fails_to_run_leaves_the_kernel_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "precompile", lambda *a: 1)
    monkeypatch.setattr(runtime, "_median_ms", lambda fn: (fn(), 1.0)[1])

    def broken(*tensors):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    launcher = _fake_launcher(eager=broken)
    launcher._first_launch(FakeTuner(_two_configs()), ("args",), None, (8,), CPU, True, eager_inputs=("x",))
    assert launcher.chosen_configs() == {(8,): (128, 32, 4, 2)}

    # the graph chosen earlier (here, or by another process) but out of memory now: the kernel
    for first in (True, False):
        tuning_cache.remember_choice(launcher.src, CPU, (9,), "eager")
        launcher, tuner = _fake_launcher(eager=broken), FakeTuner(_two_configs())
        if first:
            result = launcher._first_launch(tuner, ("args",), None, (9,), CPU, True, eager_inputs=("x",))
        else:
            launcher.pin_choice((9,), "eager")
            result = launcher._eager_launch(tuner, ("args",), None, (9,), CPU, ("x",), True)
        assert result is None and len(tuner.launches) == 1  # the kernel wrote the output
        assert launcher.chosen_configs() == {(9,): (128, 32, 4, 2)}


def test_a_launcher_whose_choice_is_eager_returns_the_graphs_result():
    """The unfused graph the backend attaches computes the kernel's value: pinned as the
    choice, the launcher returns it (same shape, dtype, layout) and it matches float64."""
    from bench.variants import VARIANTS

    variant = VARIANTS["msa_row_pair_bias"]
    inputs = variant.make_inputs(variant.default_shape, torch.float32, "cpu", torch.Generator().manual_seed(3))
    gm, launchers = _built(variant.fn, *inputs)
    reference = variant.fn(*(t.double() for t in inputs))
    kernel_out = gm(*inputs)  # every launcher runs its kernel
    for launcher in launchers:
        assert launcher.eager is not None
        for sizes, config in launcher.chosen_configs().items():
            assert config != "eager"
            launcher.pin_choice(sizes, "eager")
    eager_out = gm(*inputs)
    assert all(set(launcher.chosen_configs().values()) == {"eager"} for launcher in launchers)
    for out in (kernel_out, eager_out):
        assert out.dtype == torch.float32 and not out.isnan().any()
        torch.testing.assert_close(out.double(), reference, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="no unfused graph"):
        _fake_launcher(eager=None).pin_choice((1,), "eager")


def test_the_graphs_result_comes_in_the_kernels_shape_dtype_and_layout():
    inputs = _inputs(L=20)
    gm, (launcher,) = _built(_attention, *inputs)
    feed = dict(zip([n.name for n in gm.graph.nodes if n.op == "placeholder"], inputs))
    args = [feed[name] for name in launcher.src.inputs]
    kernel_out = launcher(*args)
    (sizes,) = launcher.chosen_configs()
    launcher.pin_choice(sizes, "eager")
    eager_out = launcher(*args)
    assert launcher.chosen_configs() == {sizes: "eager"}
    assert (eager_out.shape, eager_out.dtype, eager_out.stride()) == (kernel_out.shape, kernel_out.dtype,
                                                                      kernel_out.stride())
    reference = _attention(*(t.double() for t in inputs))
    for out in (kernel_out, eager_out):
        torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)


def test_a_signature_that_chose_the_graph_runs_it_without_the_kernels_launch_work():
    """Once the unfused graph is the choice at a call signature, later calls run it on the
    inputs as given, with none of the general path's work (sizes, outputs, arguments);
    a new choice for those sizes ends that."""
    inputs = _inputs(L=20)
    gm, (launcher,) = _built(_attention, *inputs)
    feed = dict(zip([n.name for n in gm.graph.nodes if n.op == "placeholder"], inputs))
    args = [feed[name] for name in launcher.src.inputs]
    launcher(*args)
    ((sizes, config),) = launcher.chosen_configs().items()
    launcher.pin_choice(sizes, "eager")
    graph, seen = launcher.eager, []
    launcher.eager = lambda *tensors: seen.append(tensors) or graph(*tensors)
    first = launcher(*args)  # the general path, which then keeps the signature

    def general_path(*_):
        raise AssertionError("the general launch path ran")

    general = launcher._size
    launcher._size = general_path
    second = launcher(*args)
    assert torch.equal(first, second) and len(seen) == 2 and all(a is b for a, b in zip(seen[1], args))
    launcher._size = general
    launcher.pin_choice(sizes, dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), config)))
    launcher(*args)
    assert len(seen) == 2  # the kernel again


# ------------------------------------------------------------------ the pruned candidates


@pytest.mark.parametrize("dtype, tf32", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)])
def test_the_pruned_candidates_are_a_few_ordered_members_of_the_full_space(dtype, tf32, monkeypatch):
    _, (launcher,) = _built(_attention, *_inputs(dtype), tf32=tf32)
    src = _gpu_source(launcher)
    full = tile_configs.config_space(src)
    pruned = tile_configs.candidate_space(src, launcher.tiled)
    assert 1 <= len(pruned) <= tuning.MAX_CANDIDATES < len(full)
    assert len(set(pruned)) == len(pruned) and set(pruned) <= set(full)
    prior = tuning.prior(launcher.tiled, src.fma_dots)
    assert prior is (tuning._FMA_PRIOR if src.fma_dots else tuning._HALF_PRIOR if dtype == torch.bfloat16
                     else tuning._TF32_PRIOR)
    # at a narrow head width nothing is heavy: the prior's first members, in its order
    assert pruned == [c for c in prior if c in full][:len(pruned)]
    assert [c.all_kwargs()["BLOCK_M"] for c in tile_configs.configs(src, False, True, launcher.tiled)] == \
        [c[0] for c in pruned]
    (first,) = tile_configs.configs(src, False, False, launcher.tiled)  # FLASHLIGHT_AUTOTUNE=0
    assert (first.all_kwargs()["BLOCK_M"], first.all_kwargs()["BLOCK_N"]) == pruned[0][:2]

    # the whole space back (at this head width all of it fits), by the setting or by the option
    assert tile_configs.candidate_space(src, launcher.tiled, "full") == full == tuning.fitting(launcher.tiled, full)
    monkeypatch.setenv("FLASHLIGHT_AUTOTUNE", "full")
    assert settings.get("autotune") == "full"
    assert [c.all_kwargs()["BLOCK_M"] for c in tile_configs.configs(src, False, settings.get("autotune"),
                                                                  launcher.tiled)] == [c[0] for c in full]
    with settings.override(autotune="full"):
        assert runtime.Launcher(launcher.tiled, src).candidate_configs() == full
    monkeypatch.setenv("FLASHLIGHT_AUTOTUNE", "0")
    assert settings.get("autotune") is False


def test_the_cost_model_drops_what_does_not_fit_and_demotes_wide_tiles():
    _, (launcher,) = _built(_attention, *_inputs(torch.float32, D=128), tf32=True)
    src = _gpu_source(launcher)
    full = tile_configs.config_space(src)
    pruned = tuning.pruned_space(launcher.tiled, src.fma_dots, full)
    # at head width 128 the 4-warp 128-row tiles hold too many values per thread: last if kept
    heavy = (128, 64, 4, 2)
    assert (128, 64, 8, 2) == pruned[0] and (heavy not in pruned or pruned[-1] == heavy)
    # and the 3-stage pipelines of 128 x 64 float32 tiles do not fit in shared memory
    assert (128, 64, 8, 3) in full and (128, 64, 8, 3) not in tuning.fitting(launcher.tiled, full)
    shared = {c: tuning.estimates(launcher.tiled, src.fma_dots, c)[0] for c in full}
    budget = sorted(shared.values())[2]  # only the three smallest fit
    small = tuning.pruned_space(launcher.tiled, src.fma_dots, full, budget=budget)
    assert small and all(shared[c] <= budget for c in small)
    tiny = tuning.pruned_space(launcher.tiled, src.fma_dots, full, budget=1)  # nothing fits
    assert tiny and set(tiny) <= set(full) and shared[tiny[0]] == min(shared.values())


def test_every_pruned_candidate_builds_for_sm90():
    """Ahead-of-time builds (no GPU): each candidate of an Evoformer kernel in TF32
    compiles, and the cost model's shared-memory estimate does not undercount."""
    from bench.variants import VARIANTS

    variant = VARIANTS["triangle_start"]
    inputs = variant.make_inputs(variant.default_shape, torch.float32, "cpu", torch.Generator().manual_seed(0))
    _, (launcher,) = _built(variant.fn, *inputs, tf32=True)
    src = _gpu_source(launcher)
    for config in tile_configs.candidate_space(src, launcher.tiled):
        m, n, w, s = config
        built = aot.aot_compile(src, list(launcher.input_dtypes), launcher.kernel.dtype, 90,
                                    block_m=m, block_n=n, num_warps=w, num_stages=s)
        assert built.num_warps == w
        assert tuning.estimates(launcher.tiled, src.fma_dots, config)[0] >= 0.75 * built.shared, (config, built)


# ------------------------------------------------------------------ shipped tuned choices


def test_size_buckets_round_lengths_up_to_powers_of_two():
    assert tuning.size_bucket(250, 250, 1000) == tuning.size_bucket(256, 256, 1024)
    assert tuning.size_bucket(257, 256, 1024) != tuning.size_bucket(256, 256, 1024)
    # MSA row (512 rows x 8 heads) and triangle (256 x 4) programs per row block stay apart
    assert tuning.size_bucket(256, 256, 4096) != tuning.size_bucket(256, 256, 1024)
    assert tuning.size_bucket(256, 256, 1 << 20) == tuning.size_bucket(256, 256, 1 << 16)  # capped
    assert tuning.size_bucket(1, 1, 1) == "rows 1 | keys 1 | grid 1"


def test_the_signature_follows_structure_not_source_text():
    _, (a,) = _built(_attention, *_inputs())
    _, (b,) = _built(lambda q, k, v, bias: _attention(q, k, v, bias) * 3.0, *_inputs())
    _, (c,) = _built(_attention, *_inputs(torch.bfloat16))
    _, (d,) = _built(_attention, *_inputs(D=32))
    assert a.src.source != b.src.source and a.signature == b.signature
    assert len({a.signature, c.signature, d.signature}) == 3

    def cast_bias(q, k, v, bias):  # OpenFold's biases may come in float32 next to bf16 operands
        return _attention(q, k, v, bias.to(q.dtype))

    q, k, v, bias = _inputs(torch.bfloat16)
    _, (e,) = _built(cast_bias, q, k, v, bias.float())
    assert e.signature == c.signature
    assert a._bucket(()) == tuning.size_bucket(24, 24, 2)  # static sizes: rows, keys, heads


def _entry(choice, gpu="NVIDIA H200", triton_version="3.6", signature="sig", bucket="rows 256 | keys 256 | grid 1024"):
    return {"gpu": gpu, "triton": triton_version, "signature": signature, "bucket": bucket, "choice": choice,
            "kernel_ms": 0.3, "eager_ms": 1.2, "measured": ["a cell"]}


def test_the_shipped_lookup_hits_misses_and_survives_bad_files(tmp_path):
    path = str(tmp_path / "tuned.json")
    config = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", "b", path=path) is None  # no file
    tuned_configs.write_entries(path, [_entry(config), _entry("eager", signature="other")])
    bucket = "rows 256 | keys 256 | grid 1024"
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", bucket, path=path) == config
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "other", bucket, path=path) == "eager"
    for gpu, version, other_bucket in (("NVIDIA B200", "3.6", bucket), ("NVIDIA H200", "3.5", bucket),
                                       ("NVIDIA H200", "3.6", "rows 1024 | keys 1024 | grid 1024"),
                                       ("NVIDIA H200", "3.6", "rows 256 | keys 64 | grid 1024")):
        assert tuned_configs.lookup(gpu, version, "sig", other_bucket, path=path) is None
    # a bucket within a factor of two in rows and keys takes the nearest measured
    # configuration; the unfused graph's choice is never carried to other sizes
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", "rows 512 | keys 512 | grid 4096", path=path) == config
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "other", "rows 512 | keys 512 | grid 1024", path=path) is None
    # the setting names the file; 0 switches the lookup off
    with settings.override(tuned_configs=path):
        assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", bucket) == config
    with settings.override(tuned_configs="0"):
        assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", bucket) is None
    # an entry merged later replaces the one with its key
    tuned_configs.write_entries(path, [_entry({**config, "BLOCK_N": 32})])
    assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", bucket, path=path)["BLOCK_N"] == 32
    assert len(tuned_configs.read_entries(path)) == 2
    with pytest.raises(ValueError):
        tuned_configs.write_entries(path, [_entry({"BLOCK_M": 128})])
    for text in ("{not json", json.dumps({"schema": "another/1", "entries": [_entry(config)]}),
                 json.dumps({"schema": tuned_configs.SCHEMA, "entries": [_entry({**config, "num_warps": -4}),
                                                                         _entry("fast", signature="x"), 5]})):
        (tmp_path / "tuned.json").write_text(text)
        assert tuned_configs.lookup("NVIDIA H200", "3.6", "sig", bucket, path=path) is None


def test_a_gpu_without_entries_takes_the_configurations_of_one_of_its_architecture(tmp_path):
    """[Note: a GPU of the same architecture]: configurations only, the model's own
    entries first, never another capability's."""
    path = str(tmp_path / "tuned.json")
    config = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    bucket = "rows 256 | keys 256 | grid 1024"
    tuned_configs.write_entries(path, [
        {**_entry(config), "capability": "9.0"},
        {**_entry("eager", signature="graph"), "capability": "9.0"},
        {**_entry({**config, "num_stages": 2}, gpu="NVIDIA A100", signature="ampere"), "capability": "8.0"},
    ])
    assert tuned_configs.lookup("NVIDIA H100 80GB HBM3", "3.6", "sig", bucket, path=path, capability="9.0") == config
    near = "rows 512 | keys 512 | grid 2048"  # the nearest-bucket rule as for its own entries
    assert tuned_configs.lookup("NVIDIA H100 80GB HBM3", "3.6", "sig", near, path=path, capability="9.0") == config
    for gpu, signature, capability in (("NVIDIA H100 80GB HBM3", "sig", ""),  # not known
                                       ("NVIDIA H100 80GB HBM3", "sig", "8.0"),  # another architecture
                                       ("NVIDIA H100 80GB HBM3", "graph", "9.0"),  # a verdict for the graph
                                       ("NVIDIA H100 80GB HBM3", "ampere", "9.0")):
        assert tuned_configs.lookup(gpu, "3.6", signature, bucket, path=path, capability=capability) is None
    # once the model has an entry for the signature, its own come first, even farther away
    own = {**config, "BLOCK_N": 32}
    tuned_configs.write_entries(path, [{**_entry(own, gpu="NVIDIA H100 80GB HBM3", bucket=near), "capability": "9.0"}])
    assert tuned_configs.lookup("NVIDIA H100 80GB HBM3", "3.6", "sig", bucket, path=path, capability="9.0") == own
    # what the runtime records carries the capability into an entry
    event = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "triton": "3.6", "signature": "s",
             "bucket": bucket, "choice": config, "kernel_ms": 0.1, "eager_ms": 0.2, "candidates": 3}
    assert tuned_configs.entry_from_event(event)["capability"] == "9.0"


def test_the_shipped_file_is_of_the_schema_with_valid_entries():
    with open(tuned_configs.SHIPPED) as f:
        shipped = json.load(f)
    assert shipped["schema"] == tuned_configs.SCHEMA and isinstance(shipped["entries"], list)
    assert all(tuned_configs.parse_choice(e.get("choice")) is not None for e in shipped["entries"])
    assert all(tuned_configs._bucket_extents(e["bucket"]) is not None for e in shipped["entries"])
    assert all(tuned_configs.capability_of(e) for e in shipped["entries"])  # models without entries use them


def test_the_nearest_bucket_weighs_rows_keys_and_grid_alike():
    measured = ["rows 256 | keys 256 | grid 8", "rows 512 | keys 512 | grid 2048", "rows 256 | keys 256 | grid 4096"]
    nearest = lambda bucket: tuned_configs.nearest_bucket(bucket, measured)  # noqa: E731
    assert nearest("rows 512 | keys 512 | grid 8") == measured[0]  # a small grid keeps small-grid tiles
    assert nearest("rows 1024 | keys 1024 | grid 8192") == measured[1]
    assert nearest("rows 128 | keys 128 | grid 4096") == measured[2]
    assert nearest("rows 2048 | keys 2048 | grid 2048") is None  # rows and keys 4x away: autotuned
    assert nearest("not a bucket") is None


def test_a_first_launch_takes_the_tuning_cache_then_the_shipped_choice_then_autotunes(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "precompile", lambda *a: 1)
    path = str(tmp_path / "tuned.json")
    monkeypatch.setenv("FLASHLIGHT_TUNED_CONFIGS", path)
    _, (launcher,) = _built(_attention, *_inputs())
    shipped = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 2, "num_stages": 1}
    # "cpu" stands for the GPU model: the lookup keys on whatever the device reports
    tuned_configs.write_entries(path, [_entry(shipped, gpu="cpu", triton_version=tuned_configs.triton_version(),
                                              signature=launcher.signature, bucket=launcher._bucket(()))])

    def first_launch(autotune=True):
        launcher._chosen, launcher._raw, launcher.autotune = {}, FakeJit(), autotune
        tuner = FakeTuner(_two_configs())
        launcher._first_launch(tuner, ("args",), None, (), CPU, True)
        return tuner, launcher._raw

    tuner, raw = first_launch()
    assert tuner.launches == [] and raw.launches == [shipped]  # no autotuning
    assert launcher.chosen_configs() == {(): (16, 32, 2, 1)}
    tuner, raw = first_launch(autotune="full")  # benchmarks: the whole space, nothing shipped
    assert len(tuner.launches) == 1 and raw.launches == []
    tuning_cache.remember_choice(launcher.src, CPU, (), {"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 4, "num_stages": 3})
    tuner, raw = first_launch()  # the tuning cache, per exact source, comes first
    assert tuner.launches == [] and raw.launches[0]["BLOCK_M"] == 64
    monkeypatch.setenv("FLASHLIGHT_TUNING_CACHE", "0")
    monkeypatch.setenv("FLASHLIGHT_TUNED_CONFIGS", str(tmp_path / "missing.json"))
    tuner, raw = first_launch()  # no file: autotuning as usual
    assert len(tuner.launches) == 1 and raw.launches == []
    # what autotuning found is ready to ship
    (event,) = [e for e in runtime.TUNING_EVENTS[-2:] if e["kernel"] == launcher.src.name][-1:]
    assert event["signature"] == launcher.signature and event["bucket"] == launcher._bucket(())
    entry = tuned_configs.entry_from_event(event, measured=["a cell"])
    tuned_configs.write_entries(path, [entry])
    assert tuned_configs.lookup(event["gpu"], event["triton"], event["signature"], event["bucket"], path=path) \
        == {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


def test_the_tuning_script_lists_its_cells_and_needs_a_gpu(capsys):
    from bench import tune_configs

    assert tune_configs.main(["--list", "--n-res", "256,512", "--dtypes", "tf32,bf16"]) == 0
    listed = capsys.readouterr().out.split("\n")
    assert "msa_row N_res 256 bf16" in listed and "template_triangle_end N_res 512 tf32" in listed
    assert len([c for c in listed if c]) == len(tune_configs.KERNELS) * 2 * 2
    if not torch.cuda.is_available():
        assert tune_configs.main(["--kernels", "triangle_start"]) == tune_configs.EXIT_NO_GPU
    # the fold benchmark's records: deep alignment and single sequence, a fold's dtypes
    assert tune_configs.main(["--list", "--fold-synthetic", "256,512"]) == 0
    listed = [c for c in capsys.readouterr().out.split("\n") if c]
    assert len(listed) == 8 and "fold synthetic_512 single bf16" in listed and "fold synthetic_256 deep fp32" in listed


def test_the_tuning_script_measures_again_after_a_compiler_change():
    """A cell counts as measured only with the compiler that measured it: a change can
    add kernels to a fold (its cell would otherwise never measure them)."""
    from bench import tune_configs

    event = {"gpu": "NVIDIA H200", "capability": "9.0", "triton": "3.6", "signature": "s", "kernel": "k",
             "bucket": "rows 256 | keys 256 | grid 8", "choice": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4,
                                                                   "num_stages": 3}, "kernel_ms": 0.1, "eager_ms": 1.0}
    (old,) = tune_configs._entries([event], "fold a bf16", [], compiler="old")
    assert old["compiler"] == "old" and old["measured"] == ["fold a bf16"] and old["capability"] == "9.0"
    (same,) = tune_configs._entries([event], "fold b bf16", [old], compiler="old")
    assert same["measured"] == ["fold a bf16", "fold b bf16"]
    (new,) = tune_configs._entries([event], "fold b bf16", [old], compiler="new")
    assert new["measured"] == ["fold b bf16"]  # cells of another compiler are not carried


# ------------------------------------------------------------------------- launch plans


def _matches_float64(gm, *inputs):
    out = gm(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _attention(*(t.double() for t in inputs)), rtol=1e-5, atol=1e-5)


def test_a_repeated_call_signature_launches_through_its_plan(monkeypatch):
    # [Note: launch plans]: the first steady launch of a signature records its plan, later
    # calls with that signature use it, a new signature (other strides) gets its own
    from flashlight.launch_plan import LaunchPlan

    gm, (launcher,) = _built(_attention, *_inputs())
    planned = []
    real_launch = LaunchPlan.launch
    monkeypatch.setattr(LaunchPlan, "launch", lambda plan, raw, ts: planned.append(plan) or real_launch(plan, raw, ts))
    for seed in range(3):  # first launch, steady launch (records the plan), planned launch
        q, k, v, bias = _inputs(seed=seed)
        _matches_float64(gm, q, k, v, bias)
    assert len(planned) == 1 and len(launcher._plans) == 1
    q, k, v, bias = _inputs(seed=4)
    k_strided = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, other strides
    for _ in range(2):
        _matches_float64(gm, q, k_strided, v, bias)
    assert len(planned) == 2 and len(launcher._plans) == 2
    launcher.pin_choice((), dict(launcher._chosen[()]))
    assert not launcher._plans  # a changed choice drops the plans
