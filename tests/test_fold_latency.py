"""The latency report: schema, 48 per-block entries for a 48-block model, module discovery."""
import gc
import json

import pytest
import torch

pytest.importorskip("openfold")

from flashlight.structures.fold import SCHEMA, Folder, FoldOptions  # noqa: E402
from flashlight.structures.inputs import Record  # noqa: E402
from flashlight.structures.timing import (  # noqa: E402
    MODULE_KINDS,
    FrozenHeap,
    RunTiming,
    find_block_modules,
    find_evoformer_blocks,
    median_timing,
)


@pytest.fixture
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _check_run(run, num_blocks, stages):
    assert set(run) >= {"model_s", "stages", "blocks"}
    assert run["model_s"] > 0
    assert list(run["stages"]) == stages
    assert len(run["blocks"]) == num_blocks
    for index, block in enumerate(run["blocks"]):
        assert block["index"] == index
        assert block["total_s"] > 0
        assert list(block["modules"]) == list(MODULE_KINDS)
        assert all(seconds > 0 for seconds in block["modules"].values())
        # modules run inside their block
        assert sum(block["modules"].values()) <= block["total_s"] * 1.05


def test_full_depth_model_reports_48_blocks(tmp_path, one_thread, monkeypatch):
    """The preset's 48-block model_1 (random weights) on a 6-residue sequence; with
    ``FLASHLIGHT_WARMUP_COMPILE=background`` (the default) the warm-up pass, and only it,
    runs inside ``compiling_in_background``."""
    from flashlight import background, settings

    monkeypatch.delenv("FLASHLIGHT_WARMUP_COMPILE", raising=False)
    assert settings.get("warmup_compile") == "background"  # the default

    contexts = []
    original = background.compiling_in_background

    def recorded(*args, **kwargs):
        contexts.append(original(*args, **kwargs))
        return contexts[-1]

    monkeypatch.setattr(background, "compiling_in_background", recorded)
    options = FoldOptions(
        out_dir=str(tmp_path),
        flashlight=False,
        warmup=1,
        repeats=2,
        recycles=0,
        chunk_size=None,
        max_msa_clusters=6,
        max_extra_msa=1,
        plot=False,
    )
    folder = Folder(options, warn=print)
    assert folder.info.num_blocks == 48
    frozen = []  # objects the collector skips, at each pass's start
    folder.stock.register_forward_pre_hook(lambda *_: frozen.append(gc.get_freeze_count()))
    record = Record(id="hexa", description="six residues", sequence="MKTAYI", source="-", index=1)
    report = folder.fold(record)
    # every pass (warm-up, two timed) started on a frozen heap, undone after the passes
    assert len(frozen) == 3 and min(frozen) > 0 and gc.get_freeze_count() == 0

    on_disk = json.loads((tmp_path / "hexa" / "latency.json").read_text())
    assert on_disk["schema"] == SCHEMA == report["schema"]
    stages = list(dict(folder.stock.named_children()))
    assert {"evoformer", "structure_module", "extra_msa_stack"} <= set(stages)
    stock = on_disk["runs"]["stock"]
    _check_run(stock["steady"], 48, stages)
    assert len(stock["warmup"]) == 1 and len(stock["warmup_s"]) == 1
    _check_run(stock["warmup"][0], 48, stages)
    assert len(stock["runs_s"]) == 2
    assert on_disk["timer"] == "wall_clock"
    assert on_disk["repeats"] == 2 and on_disk["warmup_runs"] == 1
    e2e = on_disk["end_to_end"]
    assert e2e["variant"] == "stock"
    assert e2e["total_s"] == pytest.approx(e2e["features_s"] + e2e["model_s"] + e2e["write_s"])
    assert e2e["model_s"] == stock["steady"]["model_s"]
    assert e2e["wall_s"] >= e2e["total_s"]
    evoformer = stock["steady"]["stages"]["evoformer"]
    assert sum(b["total_s"] for b in stock["steady"]["blocks"]) <= evoformer * 1.05
    assert on_disk["model"]["num_blocks"] == 48
    assert len(on_disk["plddt"]) == 6
    assert len(contexts) == 1 and background.active() is None
    compiled = stock["warmup_compile"]
    assert compiled["mode"] == "background" and compiled["kernels"] == 0 and compiled["wait_s"] >= 0


def test_frozen_heap_collects_before_and_releases_after():
    """[Note: the collector between passes]: entering collects the cyclic garbage and
    freezes the survivors; a refreeze collects what came since; leaving unfreezes."""

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a

    cycle()
    kept = Node()
    with FrozenHeap() as heap:
        assert not any(type(o) is Node and o is not kept for o in gc.get_objects())  # the cycle was collected
        assert gc.get_freeze_count() > 0
        cycle()
        assert sum(type(o) is Node for o in gc.get_objects()) == 2  # new objects are not frozen
        heap.refreeze()
        assert sum(type(o) is Node for o in gc.get_objects()) == 0
    assert gc.get_freeze_count() == 0 and any(o is kept for o in gc.get_objects())


def test_median_is_elementwise():
    def run(x):
        return RunTiming(x, {"evoformer": 2 * x}, [x, 3 * x], [{"msa_att_row": x}, {"msa_att_row": 5 * x}])

    med = median_timing([run(1.0), run(3.0), run(2.0)])
    assert med.model_s == 2.0
    assert med.stages == {"evoformer": 4.0}
    assert med.blocks == [2.0, 6.0]
    assert med.modules == [{"msa_att_row": 2.0}, {"msa_att_row": 10.0}]
    even = median_timing([run(1.0), run(2.0)])
    assert even.model_s == 1.5


def _upstream_style_model():
    """A module tree shaped like upstream OpenFold 2.x: blocks[i].pair_stack.tri_att_start."""
    nn = torch.nn

    def named(cls_name):
        return type(cls_name, (nn.Module,), {"forward": lambda self, x: x})

    PairStack = named("PairStack")
    Block = named("EvoformerBlock")
    Stack = named("EvoformerStack")
    stack = Stack()
    stack.blocks = nn.ModuleList()
    for _ in range(3):
        block = Block()
        block.msa_att_row = named("MSARowAttentionWithPairBias")()
        block.msa_att_col = named("MSAColumnAttention")()
        block.msa_transition = named("MSATransition")()
        block.outer_product_mean = named("OuterProductMean")()
        block.pair_stack = PairStack()
        block.pair_stack.tri_mul_out = named("TriangleMultiplicationOutgoing")()
        block.pair_stack.tri_mul_in = named("TriangleMultiplicationIncoming")()
        block.pair_stack.tri_att_start = named("TriangleAttention")()
        block.pair_stack.tri_att_end = named("TriangleAttention")()
        block.pair_stack.pair_transition = named("PairTransition")()
        stack.blocks.append(block)
    model = nn.Module()
    model.evoformer = stack
    return model


def test_modules_found_in_upstream_layout():
    model = _upstream_style_model()
    blocks = find_evoformer_blocks(model)
    assert len(blocks) == 3
    found = find_block_modules(blocks[1])
    assert list(found) == list(MODULE_KINDS)
    assert found["tri_att_start"] is blocks[1].pair_stack.tri_att_start
    assert found["tri_att_end"] is blocks[1].pair_stack.tri_att_end


def test_modules_found_by_class_when_renamed():
    model = _upstream_style_model()
    block = find_evoformer_blocks(model)[0]
    # rename the triangle attentions: class order decides start, then end
    start, end = block.pair_stack.tri_att_start, block.pair_stack.tri_att_end
    del block.pair_stack.tri_att_start, block.pair_stack.tri_att_end
    block.pair_stack.first = start
    block.pair_stack.second = end
    found = find_block_modules(block)
    assert found["tri_att_start"] is start and found["tri_att_end"] is end


def test_openfold_001_layout():
    from openfold.model.evoformer import EvoformerBlock

    block = EvoformerBlock(
        c_m=16, c_z=8, c_hidden_msa_att=4, c_hidden_opm=4, c_hidden_mul=4, c_hidden_pair_att=4,
        no_heads_msa=2, no_heads_pair=2, transition_n=2, msa_dropout=0.0, pair_dropout=0.0,
        inf=1e9, eps=1e-8,
    )
    found = find_block_modules(block)
    assert list(found) == list(MODULE_KINDS)
    assert found["tri_att_start"] is block.core.tri_att_start
    assert found["msa_att_row"] is block.msa_att_row


@pytest.mark.filterwarnings("ignore::FutureWarning")  # OpenFold uses torch.cuda.amp.autocast
def test_bf16_model_folds(tmp_path, one_thread):
    options = FoldOptions(
        out_dir=str(tmp_path), flashlight=False, dtype="bf16", num_blocks=1, recycles=1,
        warmup=0, repeats=1, chunk_size=None, max_msa_clusters=6, max_extra_msa=2, plot=False,
        profile_kernels=True,
    )
    folder = Folder(options, warn=print)
    assert next(folder.stock.parameters()).dtype == torch.bfloat16
    record = Record(id="trp", description="", sequence="NLYIQWLKDGGPSSGRPPPS", source="-", index=1)
    report = folder.fold(record)
    assert report["model"]["dtype"] == "bf16"
    steady = report["runs"]["stock"]["steady"]  # [Note: the host's record of a pass]
    host = steady["host"]
    assert set(host) == {"issue_s", "cpu_s", "probe_ms", "gc_collections", "gc_full"} and host["probe_ms"] > 0
    assert 0 < host["issue_s"] <= steady["model_s"] and host["cpu_s"] > 0
    assert host["gc_collections"] >= host["gc_full"] >= 0
    kernels = report["runs"]["stock"]["kernels"]  # the extra profiled pass: operators on a CPU
    assert 0 < len(kernels) <= 30 and all(k["total_ms"] > 0 and k["calls"] >= 1 for k in kernels)
    assert [k["total_ms"] for k in kernels] == sorted((k["total_ms"] for k in kernels), reverse=True)
    assert any(k["name"] in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear") for k in kernels)
    assert all(0 <= p <= 100 for p in report["plddt"])
    pdb_text = (tmp_path / "trp" / "trp.pdb").read_text()
    assert "nan" not in pdb_text.lower()


def test_comparison_table_takes_modules_from_the_synchronised_pass():
    """With ``--compare`` on a GPU each variant's module rows come from its pass with
    synchronised module starts ([Note: synchronised module spans]), not the timed passes."""
    from flashlight.structures.outputs import record_table

    def run(timed_s, synchronised_s):
        blocks = lambda s: [{"index": 0, "total_s": 1.0, "modules": {k: s for k in MODULE_KINDS}}]  # noqa: E731
        return {"warmup_s": [2.0], "steady": {"model_s": 1.0, "stages": {"evoformer": 1.0}, "blocks": blocks(timed_s)},
                "modules_synchronised": {"model_s": 1.2, "stages": {}, "blocks": blocks(synchronised_s)}}

    report = {"record": {"id": "r", "length": 9, "msa_depth": 1}, "timer": "cuda_events",
              "model": {"device": "cuda", "label": "model_1"}, "flashlight": {"active": True},
              "end_to_end": {"total_s": 3.0, "features_s": 0.5, "model_s": 1.0, "variant": "flashlight", "write_s": 0.1},
              "runs": {"stock": run(0.0123, 0.0456), "flashlight": run(0.0789, 0.0321)}}
    rows = [line for line in record_table(report).splitlines() if "(all blocks" in line]
    assert len(rows) == len(MODULE_KINDS)
    assert all("synchronised" in row and "45.6" in row and "32.1" in row and "78.9" not in row for row in rows)
