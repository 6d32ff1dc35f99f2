"""OpenFold's stacks and structure module replayed as graphs (``patch_openfold(model, cuda_graphs=True)``), on CPU.

A CUDA graph needs a GPU, so these tests give :class:`GraphedForward` a stand-in
recorder with a graph's semantics: what it records reads fixed input buffers and writes
fixed output buffers, and a replay recomputes from whatever the input buffers hold now,
into the same output buffers. A wrapper that forgot to copy a call's inputs in, or
returned the output buffers themselves, gives wrong or overwritten results here. The
model is a seeded random-weight ``model_1`` (1 Evoformer block, 1 extra-MSA block, no
templates) with 3 recycling iterations on two 10-residue sequences, stock attention: the
graphs' plumbing is what is tested; the GPU run (bench/results) checks real graphs.
"""
from __future__ import annotations

import copy
import logging
import pickle
import threading

import pytest
import torch
from torch.utils import _pytree as pytree

pytest.importorskip("openfold")

import flashlight  # noqa: E402
from flashlight.integrations import openfold_graphs  # noqa: E402
from flashlight.integrations import openfold_testing as oft  # noqa: E402
from flashlight.integrations.openfold_compat import cpu_compat  # noqa: E402
from flashlight.structures.timing import LayerTimer  # noqa: E402

SEQUENCES = ("MKTAYIAKQR", "GSHMLEDPVW")  # same length: the same graph
KEYS = ("final_atom_positions", "plddt", "single", "pair", "msa")


class StandInRecorder:
    """Graph semantics on the CPU: replay recomputes from the input buffers into the
    output buffers recorded first."""

    runs_on_cpu = True

    def __init__(self, fail: str | None = None):
        self.fail = fail
        self.recorded = 0

    def record(self, fn):
        if self.fail:
            raise RuntimeError(self.fail)
        self.recorded += 1
        outputs = fn()

        def replay():
            fresh = fn()
            for buffer, value in zip(pytree.tree_leaves(outputs), pytree.tree_leaves(fresh)):
                if isinstance(buffer, torch.Tensor):
                    buffer.copy_(value)

        return outputs, replay


def _config():
    config = oft.small_model_config(evoformer_blocks=1, max_msa_clusters=4, max_extra_msa=4)
    config.data.common.max_recycling_iters = 2
    return config


@pytest.fixture(scope="module")
def setup():
    config = _config()
    model = oft.random_model(config, seed=3)
    batches = [oft.model_batch(config, sequence, seed=s) for s, sequence in enumerate(SEQUENCES)]
    return model, batches


def _fold(model, batch):
    with torch.no_grad(), cpu_compat():
        out = model({k: v.clone() for k, v in batch.items()})
    return {k: out[k] for k in KEYS}


@pytest.fixture(scope="module")
def stock_outputs(setup):
    model, batches = setup
    return [_fold(model, b) for b in batches]


class Counts:
    """Recordings and replays summed over the model's graphed modules."""

    def __init__(self, graphed: list):
        assert len(graphed) == 3  # the Evoformer stack, the extra-MSA stack, the structure module
        self.graphed = graphed

    @property
    def recordings(self) -> int:
        return sum(g.recordings for g in self.graphed)

    @property
    def replays(self) -> int:
        return sum(g.replays for g in self.graphed)

    @property
    def failures(self) -> dict:
        return {k: v for g in self.graphed for k, v in g.failures.items()}


def _graphed(model, recorder=None):
    graphed_model = copy.deepcopy(model)
    graphed = openfold_graphs.install(graphed_model, recorder or StandInRecorder())
    return graphed_model, Counts(graphed)


def _same(a: dict, b: dict) -> None:
    for key in KEYS:
        assert torch.isfinite(a[key]).all(), key
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5 * b[key].abs().max().item(), msg=key)


def test_recycled_folds_replay_one_graph_and_match_stock(setup, stock_outputs):
    model, batches = setup
    graphed_model, graphed = _graphed(model)
    first = _fold(graphed_model, batches[0])
    # per module: iteration 0 eager, 1 recorded and replayed, 2 replayed
    assert (graphed.recordings, graphed.replays) == (3, 6)
    _same(first, stock_outputs[0])
    kept = {k: v.clone() for k, v in first.items()}
    second = _fold(graphed_model, batches[1])  # other sequence, same shapes: every call replays
    assert (graphed.recordings, graphed.replays) == (3, 15)
    _same(second, stock_outputs[1])
    assert not torch.equal(second["pair"], stock_outputs[0]["pair"])  # the inputs were copied in
    _same(first, kept)  # results are clones, not the graph's buffers


def test_autograd_training_and_suspension_stay_eager(setup, stock_outputs):
    model, batches = setup
    graphed_model, graphed = _graphed(model)
    with openfold_graphs.eager(graphed_model):
        _same(_fold(graphed_model, batches[0]), stock_outputs[0])
    assert (graphed.recordings, graphed.replays) == (0, 0)
    with cpu_compat():
        out = graphed_model({k: v.clone() for k, v in batches[0].items()})  # grad enabled
    # AlphaFold.forward runs the iterations before the last without grad: iteration 0
    # eager, 1 recorded and replayed; the last one, with grad, eager (per module)
    assert out["final_atom_positions"].requires_grad
    assert (graphed.recordings, graphed.replays) == (3, 3)
    graphed_model.train()
    with torch.no_grad(), cpu_compat():
        graphed_model({k: v.clone() for k, v in batches[0].items()})
    assert (graphed.recordings, graphed.replays) == (3, 3)  # training: dropout, no graphs


def test_a_failed_recording_is_kept_eager_and_logged(setup, stock_outputs, caplog):
    model, batches = setup
    graphed_model, graphed = _graphed(model, StandInRecorder(fail="operation not permitted when stream is capturing"))
    with caplog.at_level(logging.WARNING, logger="flashlight.openfold"):
        _same(_fold(graphed_model, batches[0]), stock_outputs[0])
        _same(_fold(graphed_model, batches[1]), stock_outputs[1])
    assert graphed.replays == 0 and len(graphed.failures) == 3  # one key per module
    assert all("not permitted" in reason for reason in graphed.failures.values())
    assert sum("stays eager" in r.message for r in caplog.records) == 3  # each tried once


def test_a_changed_flag_records_again(setup, stock_outputs):
    model, batches = setup
    graphed_model, graphed = _graphed(model)
    _fold(graphed_model, batches[0])
    graphed_model.globals.chunk_size = 4  # OpenFold reads it at run time: another graph
    try:
        _same(_fold(graphed_model, batches[0]), stock_outputs[0])
    finally:
        graphed_model.globals.chunk_size = None
    # the chunked key: eager at iteration 0 (first seen), recorded at 1, per stack; the
    # structure module takes no chunk size and keeps its graph
    assert graphed.recordings == 5


def test_layer_timer_under_replays(setup):
    model, batches = setup
    graphed_model, _ = _graphed(model)
    ticks = []
    with torch.no_grad(), cpu_compat(), LayerTimer(graphed_model, torch.device("cpu"), lambda: ticks.append(1)) as timer:
        timings = [timer.run(lambda: graphed_model({k: v.clone() for k, v in b.items()}))[1] for b in batches]
    assert len(ticks) == 6  # one per iteration, replayed or not
    assert [t.replayed_iterations for t in timings] == [6, 9]  # stack and structure-module calls
    # stage spans cover every call; block and module spans the eager ones only
    assert all(t.stages["evoformer"] > 0 and t.stages["extra_msa_stack"] > 0 for t in timings)
    assert timings[0].blocks[0] > 0 and timings[1].blocks[0] == 0
    assert timings[1].modules[0]["tri_mul_out"] == 0


def test_patch_installs_and_removes_the_graphs(setup):
    model, _ = setup
    patched = copy.deepcopy(model)
    report = flashlight.patch_openfold(patched)  # on by default
    assert report.cuda_graphs == 3 and "CUDA graphs: 3" in str(report)
    assert [type(g.module).__name__ for g in openfold_graphs.installed(patched)] == [
        "ExtraMSAStack", "EvoformerStack", "StructureModule"]
    for copied in (copy.deepcopy(patched), pickle.loads(pickle.dumps(patched))):
        graphed = openfold_graphs.find_graphed_modules(copied)
        assert [g.module for g in openfold_graphs.installed(copied)] == graphed
        assert openfold_graphs.installed(copied)[-1].recorded_kwargs == {"inplace_safe": False}
    assert flashlight.patch_openfold(patched, cuda_graphs=False).cuda_graphs == 0  # patching again without
    assert openfold_graphs.installed(patched) == []
    flashlight.patch_openfold(patched, cuda_graphs=True)
    flashlight.unpatch_openfold(patched)
    assert all("forward" not in s.__dict__ for s in openfold_graphs.find_graphed_modules(patched))


def test_the_structure_module_records_its_out_of_place_softmax(setup, stock_outputs):
    # OpenFold's in-place softmax launches on the default stream, outside a graph: the
    # structure module's recorded calls take the out-of-place path ([Note: CUDA graphs
    # for the stacks])
    model, batches = setup
    graphed_model, graphed = _graphed(model)
    seen = []

    def note(module, args, kwargs):
        seen.append((openfold_graphs.recording(), kwargs.get("inplace_safe")))

    handle = graphed_model.structure_module.ipa.register_forward_pre_hook(note, with_kwargs=True)
    try:
        _same(_fold(graphed_model, batches[0]), stock_outputs[0])
    finally:
        handle.remove()
    eager_calls = [flag for recorded, flag in seen if not recorded]
    recorded_calls = [flag for recorded, flag in seen if recorded]
    assert eager_calls and set(eager_calls) == {True}  # the caller's inference flag
    assert recorded_calls and set(recorded_calls) == {False}


def test_recording_without_draining_needs_spare_memory():
    # [Note: recording without draining the device]: the recording's pool comes from
    # free device memory only when it covers what the allocator's cache holds unused
    assert openfold_graphs.spare_memory(free=8 << 30, reserved=6 << 30, allocated=1 << 30)
    assert not openfold_graphs.spare_memory(free=4 << 30, reserved=6 << 30, allocated=1 << 30)
    from flashlight import settings

    assert settings.get("graph_capture") == "overlap"  # the default, measured faster
    with settings.override(graph_capture="drain"):
        assert settings.get("graph_capture") == "drain"


def test_weights_assigned_anew_record_again_and_weights_copied_in_replay(setup):
    """A graph reads the parameters where they were recorded: weights copied in place
    (``load_state_dict``'s default) are replayed as they are; a parameter assigned anew
    (``load_state_dict(..., assign=True)``) makes the next call record again. Both give
    the stock model's results with the new weights."""
    model, batches = setup
    graphed_model, graphed = _graphed(model)
    _fold(graphed_model, batches[0])
    assert graphed.recordings == 3
    g = torch.Generator().manual_seed(11)
    state = {k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    reference = copy.deepcopy(model)
    reference.load_state_dict(state)
    graphed_model.load_state_dict(state)  # copied into the same tensors
    _same(_fold(graphed_model, batches[0]), _fold(reference, batches[0]))
    assert graphed.recordings == 3
    state = {k: v * 1.01 if v.is_floating_point() else v for k, v in state.items()}
    reference.load_state_dict(state)
    graphed_model.load_state_dict(state, assign=True)  # new tensors
    _same(_fold(graphed_model, batches[0]), _fold(reference, batches[0]))
    assert graphed.recordings == 6  # each module recorded again, once


def test_a_graphed_module_traced_by_torch_compile_traces_its_stock_forward():
    """``torch.compile`` over a model whose stacks replay graphs (``patch_openfold``'s
    default) traces the stock forward into its graph, without a break, also once the
    module has recorded a graph of its own for these inputs eagerly."""
    layer = torch.nn.Linear(4, 3).eval()
    graphed = openfold_graphs.GraphedForward(layer, StandInRecorder())
    layer.forward = graphed
    x = torch.randn(5, 4)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        for _ in range(2):  # eager, then recorded and replayed
            torch.testing.assert_close(layer(x), want)
        assert (graphed.recordings, graphed.replays) == (1, 1)
        compiled = torch.compile(lambda t: layer(t).relu(), backend="eager", fullgraph=True)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), want.relu())
    assert (graphed.recordings, graphed.replays) == (1, 1)


def test_a_recording_waits_for_the_kernels_compiling_in_the_background(setup, stock_outputs):
    """[Note: compiling in the background during a fold's pass]: a graph recorded while
    kernels compile would hold their unfused graphs, so the first recording waits for
    every job so far (here one that finishes only once released) and the deferred work."""
    from flashlight import background

    model, batches = setup
    released = threading.Event()
    events: list[str] = []

    class Watching(StandInRecorder):
        def record(self, fn):
            events.append("record")
            return super().record(fn)

    graphed_model, graphed = _graphed(model, Watching())
    with background.compiling_in_background(threads=1) as compiles:
        compiles.submit("kernel", lambda: (released.wait(10), events.append("compiled")))
        compiles.after("choice", lambda: events.append("deferred"))
        settle = compiles.settle

        def settle_while_the_job_runs():  # the job finishes 0.15 s into the wait, however slow the pass before
            threading.Timer(0.15, released.set).start()
            return settle()

        compiles.settle = settle_while_the_job_runs
        out = _fold(graphed_model, batches[0])  # 3 recycling iterations: eager, then recorded
    assert events[:3] == ["compiled", "deferred", "record"] and events.count("deferred") == 1
    assert compiles.settle_s >= 0.1 and graphed.recordings == 3
    _same(out, stock_outputs[0])
