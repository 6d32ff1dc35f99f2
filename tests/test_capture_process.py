"""Traced capture in another process ([Note: capturing in another process] in
flashlight/capture_worker.py): inside a background-compile context the first call of a
static signature runs eagerly while the capture process traces it, waiting points
install its graph and compile its kernels, and whatever that process cannot do is
captured on the caller's thread as before."""
from __future__ import annotations

import pytest
import torch

import flashlight
from flashlight import background, capture_worker, settings
from flashlight.runtime import Launcher
from tests.test_traced_capture import assert_matches_float64, gated, gated_inputs


@pytest.fixture(scope="module")
def capture_process():
    """One capture process for the module (its start imports PyTorch: seconds)."""
    assert capture_worker.start()
    capture_worker.wait_ready()
    yield


@pytest.fixture
def cache_dir(tmp_path):
    with settings.override(cache_dir=str(tmp_path)):
        yield tmp_path


def launchers(traced) -> list:
    """The Flashlight kernels of every graph ``traced`` serves."""
    return [node.target for entry in traced._entries for node in entry.run.graph.nodes
            if isinstance(node.target, Launcher)]


def test_first_call_runs_eagerly_and_the_waiting_point_installs_the_graph(gen, cache_dir, capture_process):
    traced = flashlight.compile(gated, capture="trace")
    args = gated_inputs(gen, 3, 12)
    before = capture_worker.stats()["captures"]
    with torch.no_grad(), background.compiling_in_background() as compiles:
        first = traced(*args)
        # the capture is elsewhere: nothing traced here, the value is the function's own
        assert traced.captures == 0 and traced._entries == []
        torch.testing.assert_close(first, gated(*args), rtol=0, atol=0)
        compiles.settle()
        # installed at the waiting point, though no call came after the capture
        assert traced.captures == 1 and len(traced._by_signature) == 1
        assert [capture_worker.is_capture(key) for key in compiles.jobs()] == [True]
        second = traced(*args)
    assert capture_worker.stats()["captures"] == before + 1
    assert len(launchers(traced)) == 1
    assert_matches_float64(gated, second, args)
    assert_matches_float64(gated, traced(*args), args)  # outside the context, the same graph


def test_the_graph_is_kept_on_disk_like_one_traced_here(gen, cache_dir, capture_process):
    args = gated_inputs(gen, 2, 9)
    with torch.no_grad(), background.compiling_in_background():
        traced = flashlight.compile(gated, capture="trace")
        traced(*args)
    (kept,) = (cache_dir / "graphs").glob("*.pkl")
    # no graph in it is pickled the way that traces when loaded ([Note: graphs unpickled
    # without tracing])
    assert b"reduce_graph_module" not in kept.read_bytes()
    fresh = flashlight.compile(gated, capture="trace")  # as a later process: loads, traces nothing
    with torch.no_grad():
        assert_matches_float64(gated, fresh(*args), args)
    assert fresh.captures == 0 and len(fresh._entries) == 1


def test_what_the_process_cannot_import_or_a_second_shape_is_traced_here(gen, cache_dir, capture_process):
    def local_gated(*args):  # not importable by name in another process
        return gated(*args)

    local = flashlight.compile(local_gated, capture="trace")
    traced = flashlight.compile(gated, capture="trace")
    small, large = gated_inputs(gen, 2, 9), gated_inputs(gen, 3, 14)
    with torch.no_grad(), background.compiling_in_background() as compiles:
        assert_matches_float64(gated, local(*small), small)
        assert local.captures == 1
        traced(*small)
        compiles.settle()
        assert traced.captures == 1
        # a second shape is symbolic: captured on this thread, at once
        assert_matches_float64(gated, traced(*large), large)
        assert traced.captures == 2 and traced._entries[-1].signature is None
    assert not any(capture_worker.is_capture(key) and "local" in key[0] for key in compiles.jobs())


def test_without_a_capture_process_or_outside_a_context_the_capture_is_here(gen, cache_dir, monkeypatch):
    args = gated_inputs(gen, 2, 10)
    traced = flashlight.compile(gated, capture="trace")
    with torch.no_grad():
        assert_matches_float64(gated, traced(*args), args)  # no context: traced at once
    assert traced.captures == 1
    monkeypatch.setattr(capture_worker, "_workers", [])  # as in a process that started none
    again = flashlight.compile(gated, capture="trace", version="another")
    with torch.no_grad(), background.compiling_in_background() as compiles:
        assert_matches_float64(gated, again(*args), args)
    assert again.captures == 1 and not compiles.jobs()


def test_a_patched_openfold_attention_matches_stock_through_the_capture_process(gen, cache_dir, capture_process):
    from flashlight.integrations import openfold_core

    n, heads, length, width = 2, 3, 11, 12  # a signature no other test compiles
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = (r(n, heads, length, width) for _ in range(3))
    mask = torch.where(torch.rand(n, 1, 1, length, generator=gen) < 0.2, -1e9, 0.0)
    args = (q, k, v, mask, r(1, heads, length, length), r(n, length, heads, width))
    core = openfold_core.compiled_core(2, True, heads, width, torch.float32)
    stock = openfold_core.attention_core(2, True)
    with torch.no_grad(), background.compiling_in_background():
        outs = [core(*args) for _ in range(2)]
    assert core.captures == 1
    for out in outs + [core(*args)]:
        assert_matches_float64(stock, out, args)


def test_a_returned_graph_is_installed_by_the_next_call_of_any_traced_function(gen, cache_dir, capture_process):
    def local_cross(q, k, v, bias):  # traced here: not importable elsewhere
        return torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v

    traced = flashlight.compile(gated, capture="trace")
    other = flashlight.compile(local_cross, capture="trace")
    args = gated_inputs(gen, 2, 13)
    with torch.no_grad(), background.compiling_in_background() as compiles:
        traced(*args)
        (job,) = compiles.jobs().values()
        job.result()  # the capture is back
        assert traced.captures == 0
        other(*args[:3], args[3])
        # its kernels are on their way without a call of its own signature
        assert traced.captures == 1 and len(traced._by_signature) == 1
    assert_matches_float64(gated, traced(*args), args)


def test_a_kept_kernel_unpickles_without_tracing(gen, cache_dir):
    """[Note: graphs unpickled without tracing]: a kernel's unfused graph is pickled as its
    nodes, so loading it never runs PyTorch's FX tracer (which patches nn.Module.__call__
    for every thread)."""
    import pickle

    traced = flashlight.compile(gated, capture="trace")
    args = gated_inputs(gen, 2, 11)
    with torch.no_grad():
        traced(*args)
    (launcher,) = launchers(traced)
    assert launcher.eager is not None
    blob = pickle.dumps(launcher)
    assert b"reduce_graph_module" not in blob and b"_deserialize_graph_module" not in blob
    again = pickle.loads(blob)
    assert again.eager.code == launcher.eager.code
    # the same values from the rebuilt graph, on fresh inputs of the kernel's
    values = [n.meta["val"] for n in launcher.eager.graph.nodes if n.op == "placeholder"]
    inputs = [torch.randn(v.shape, dtype=v.dtype, generator=gen) for v in values]
    torch.testing.assert_close(again.eager(*inputs), launcher.eager(*inputs), rtol=0, atol=0)


def test_a_patched_model_folds_as_stock_while_its_cores_are_captured_elsewhere(cache_dir, capture_process):
    """The first pass of a patched OpenFold model inside a background-compile context:
    cores run eagerly until their graphs are back, the context's end installs and compiles
    them, and the pass folds as stock does (tolerances of test_openfold_patch_model; the
    installed graphs' values are checked by the tests above)."""
    pytest.importorskip("openfold")
    import copy

    from flashlight.integrations import openfold_core
    from flashlight.integrations import openfold_testing as oft
    from flashlight.integrations.openfold_compat import cpu_compat

    config = oft.small_model_config(chunk_size=None, max_msa_clusters=5, max_extra_msa=5)
    model = oft.random_model(config, seed=3)
    torch.manual_seed(3)
    batch = oft.model_batch(config, "MKTAYIAKQR", n_alignments=6, seed=3)

    def fold(m):
        with torch.no_grad(), cpu_compat():
            out = m({k: v.clone() for k, v in batch.items()})
        return {k: out[k] for k in ("single", "pair", "final_atom_positions")}

    want = fold(model)
    patched = copy.deepcopy(model)
    flashlight.patch_openfold(patched)
    openfold_core._compiled.clear()  # every core captured again, in this test's cache folder
    try:
        with background.compiling_in_background() as compiles:
            out = fold(patched)
        captured = [key for key in compiles.jobs() if capture_worker.is_capture(key)]
    finally:
        openfold_core._compiled.clear()
    assert len(captured) >= 4  # row, column, triangle and the global column attention's cores
    for key in ("single", "pair"):
        scale = want[key].abs().max().item()
        assert (out[key] - want[key]).abs().max().item() <= 1e-4 * scale, key
    assert torch.isfinite(out["final_atom_positions"]).all()
