"""The fold's defaults: MSAs at their own depth, one pass, chunking only when memory runs out.

- Folding with the MSA's own depth and without the empty templates gives the structure
  the padded fold gives ([Note: folding at the MSA's depth] in ``structures/features.py``,
  [Note: no templates, no template work] in ``structures/fold.py``), for an MSA
  shallower and one deeper than the cluster rows.
- By default a record is folded once: stock alone runs one pass; where a warm-up is
  needed it is one recycling iteration.
- ``chunk_size="auto"`` runs unchunked and falls back to the preset's chunk size when
  the GPU runs out of memory ([Note: chunking only where memory needs it]).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from flashlight.structures import features
from flashlight.structures.fold import Folder, FoldOptions
from flashlight.structures.inputs import load_inputs
from flashlight.structures.testing import EXAMPLES

pytest.importorskip("openfold")

A3M_RECORD = "villin_hp36"


@pytest.fixture(scope="module")
def villin(tmp_path_factory):
    """The example record with its 6-row A3M."""
    folder = tmp_path_factory.mktemp("inputs")
    a3m = f"{EXAMPLES}/{A3M_RECORD}.a3m"
    with open(a3m) as handle:
        query = handle.read().split(">")[1].split("\n", 1)[1].replace("\n", "")
    fasta = folder / "villin.fasta"
    fasta.write_text(f">{A3M_RECORD}\n{query}\n")
    records, problems = load_inputs([str(fasta)], EXAMPLES)
    assert not problems and records[0].alignment is not None
    return records[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One stock model (1 block, 1 recycle) shared by the tests; options set per test."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    options = FoldOptions(out_dir=str(tmp_path_factory.mktemp("out")), num_blocks=1, recycles=1,
                          flashlight=False, plot=False, max_msa_clusters=4, max_extra_msa=8)
    yield Folder(options, warn=print)
    torch.set_num_threads(saved)


def _fold(folder, record, clusters=None, **options):
    """``folder.fold(record)`` with some options (and the configured cluster rows) changed."""
    import copy

    saved, saved_config = dict(vars(folder.options)), folder.data_config
    vars(folder.options).update(options)
    if clusters is not None:
        folder.data_config = copy.deepcopy(saved_config)
        folder.data_config.predict.max_msa_clusters = clusters
    try:
        return folder.fold(record)
    finally:
        vars(folder.options).update(saved)
        folder.data_config = saved_config


def _structure(report, out_dir):
    from Bio.PDB import PDBParser

    path = f"{out_dir}/{report['outputs']['pdb']}"
    structure = PDBParser(QUIET=True).get_structure("x", path)
    coords = np.array([atom.coord for atom in structure.get_atoms()])
    return coords, np.array(report["plddt"])


def test_fitted_sizes_keep_every_real_row(folder, villin):
    depth = features.msa_depth(villin)
    assert depth == len(set(villin.alignment.rows)) > 1
    deep = features.fit_msa_rows(folder.data_config, depth)  # 4 clusters of at most 4 configured
    assert (deep.predict.max_msa_clusters, deep.predict.max_extra_msa) == (4, depth - 4)
    single = features.fit_msa_rows(folder.data_config, 1)
    assert (single.predict.max_msa_clusters, single.predict.max_extra_msa) == (1, 1)
    assert folder.data_config.predict.max_msa_clusters == 4  # the original is untouched


@pytest.mark.parametrize("clusters", [4, 12], ids=["deeper_than_clusters", "shallower_than_clusters"])
def test_depth_fold_equals_padded_fold(folder, villin, clusters, tmp_path):
    template_calls = []
    handle = folder.stock.template_pair_stack.register_forward_pre_hook(lambda m, a: template_calls.append(1))
    try:
        padded = _fold(folder, villin, clusters, pad_msa=True, out_dir=str(tmp_path / "p"))
        runs_padded = len(template_calls)
        fitted = _fold(folder, villin, clusters, pad_msa=False, out_dir=str(tmp_path / "f"))
    finally:
        handle.remove()
    # the padded fold embeds its empty templates in every recycling iteration; the fitted skips them
    assert runs_padded == folder.options.recycles + 1 and len(template_calls) == runs_padded
    assert (padded["record"]["empty_templates_skipped"], fitted["record"]["empty_templates_skipped"]) == (False, True)
    assert folder.stock.config.template.enabled  # restored after the fold
    rows_p, rows_f = padded["record"]["msa_rows"], fitted["record"]["msa_rows"]
    depth = features.msa_depth(villin)
    assert rows_p == {"clusters": clusters, "extra": 8, "padded_to_configured_sizes": True}
    assert rows_f["clusters"] == min(clusters, depth)
    assert rows_f["extra"] == max(1, depth - rows_f["clusters"])
    xyz_p, plddt_p = _structure(padded, tmp_path / "p" / A3M_RECORD)
    xyz_f, plddt_f = _structure(fitted, tmp_path / "f" / A3M_RECORD)
    assert np.isfinite(xyz_f).all() and xyz_f.shape == xyz_p.shape
    # PDB coordinates carry 3 decimals; the models agree to float32 rounding
    assert np.abs(xyz_f - xyz_p).max() <= 2e-3
    assert np.abs(plddt_f - plddt_p).max() <= 1e-3
    assert np.abs(xyz_p - xyz_p.mean(0)).max() > 1.0  # a structure, not a point


def test_fold_runs_once_by_default(folder, villin, tmp_path):
    calls = []
    handle = folder.stock.register_forward_pre_hook(lambda m, a: calls.append(a[0]["aatype"].shape[-1]))
    try:
        report = _fold(folder, villin, out_dir=str(tmp_path))
    finally:
        handle.remove()
    assert calls == [folder.options.recycles + 1]  # one pass, every recycling iteration
    assert report["warmup_runs"] == 0 and len(report["runs"]["stock"]["runs_s"]) == 1
    # a warm-up, where one is needed, is a single recycling iteration
    vars(folder.options)["compare"] = True
    try:
        assert folder._warmup_plan() == (1, 1)
    finally:
        vars(folder.options)["compare"] = False
    vars(folder.options)["warmup"] = 2
    try:
        assert folder._warmup_plan() == (2, folder.options.recycles + 1)
    finally:
        vars(folder.options)["warmup"] = None


def test_auto_chunking_falls_back_on_out_of_memory(folder, villin, tmp_path):
    assert folder.stock.globals.chunk_size is None and folder.fallback_chunk_size == 4
    failures = []

    def run_out_of_memory(module, args):
        if module.globals.chunk_size is None:
            failures.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = folder.stock.register_forward_pre_hook(run_out_of_memory)
    try:
        report = _fold(folder, villin, out_dir=str(tmp_path))
    finally:
        handle.remove()
        folder.stock.globals.chunk_size = None
    run = report["runs"]["stock"]
    assert failures == [1] and run["chunk_size"] == 4
    # the preset's chunk size is the floor OpenFold's tuner starts from: nothing runs out
    # of memory here, so each stack's tuner keeps its largest candidate
    assert run["tuned_chunk_sizes"] and "evoformer" in run["tuned_chunk_sizes"]
    assert all(size > 4 for size in run["tuned_chunk_sizes"].values())


def test_module_spans_synchronise_only_when_asked():
    from flashlight.structures.cli import build_parser
    from flashlight.structures.timing import Clock

    assert build_parser().parse_args(["x.fasta"]).sync_modules is False
    assert build_parser().parse_args(["x.fasta", "--sync-modules"]).sync_modules is True
    cuda = torch.device("cuda")  # the method is decided without touching a device
    assert Clock(cuda).method == "cuda_events"
    assert Clock(cuda, synchronize_starts=True).method == "cuda_events_synchronized"
    assert Clock(torch.device("cpu"), synchronize_starts=True).method == "wall_clock"
