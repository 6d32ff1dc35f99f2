"""Model input features for one record, built with OpenFold's own feature pipeline.

OpenFold's ``data_pipeline`` module (which normally assembles raw features) does not
import with numpy 2 or recent Biopython, so the raw feature dict is assembled here with
the same keys and dtypes: sequence features, MSA features (from the record's alignment
or the query alone) and empty template features. The raw dict then goes through
``openfold.data.feature_pipeline.FeaturePipeline(config.data)`` in ``predict`` mode,
which does the MSA clustering, padding and recycling dimension exactly as OpenFold does.
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Sequence

import numpy as np
import torch

from flashlight.structures.inputs import Record


def sequence_features(sequence: str, description: str) -> Dict[str, np.ndarray]:
    """AlphaFold's per-sequence features (one-hot ``aatype``, residue index, ...)."""
    from openfold.np import residue_constants

    n = len(sequence)
    return {
        "aatype": residue_constants.sequence_to_onehot(
            sequence=sequence,
            mapping=residue_constants.restype_order_with_x,
            map_unknown_to_x=True,
        ),
        "between_segment_residues": np.zeros((n,), dtype=np.int32),
        "domain_name": np.array([description.encode("utf-8")], dtype=np.object_),
        "residue_index": np.arange(n, dtype=np.int32),
        "seq_length": np.full((n,), n, dtype=np.int32),
        "sequence": np.array([sequence.encode("utf-8")], dtype=np.object_),
    }


def msa_features(rows: Sequence[str], deletions: Sequence[Sequence[int]]) -> Dict[str, np.ndarray]:
    """MSA features from aligned rows (query first); repeated rows are kept once."""
    from openfold.np import residue_constants

    if not rows:
        raise ValueError("an MSA needs at least the query row")
    seen = set()
    int_msa: List[List[int]] = []
    deletion_matrix: List[Sequence[int]] = []
    for row, dels in zip(rows, deletions):
        if row in seen:
            continue
        seen.add(row)
        int_msa.append([residue_constants.HHBLITS_AA_TO_ID[c] for c in row])
        deletion_matrix.append(dels)
    n = len(rows[0])
    return {
        "deletion_matrix_int": np.array(deletion_matrix, dtype=np.int32),
        "msa": np.array(int_msa, dtype=np.int32),
        "num_alignments": np.full((n,), len(int_msa), dtype=np.int32),
    }


def empty_template_features(n: int) -> Dict[str, np.ndarray]:
    """Template features for no templates (the pipeline pads them as configured)."""
    return {
        "template_aatype": np.zeros((0, n), dtype=np.int64),
        "template_all_atom_positions": np.zeros((0, n, 37, 3), dtype=np.float32),
        "template_sum_probs": np.zeros((0, 1), dtype=np.float32),
        "template_all_atom_mask": np.zeros((0, n, 37), dtype=np.float32),
    }


def raw_features(record: Record) -> Dict[str, np.ndarray]:
    """The unprocessed feature dict for ``record`` (single-sequence mode without MSA)."""
    if record.alignment is not None:
        rows, dels = record.alignment.rows, record.alignment.deletions
    else:
        rows, dels = [record.sequence], [[0] * record.length]
    return {
        **sequence_features(record.sequence, record.description),
        **msa_features(rows, dels),
        **empty_template_features(record.length),
    }


def msa_depth(record: Record) -> int:
    """Distinct MSA rows of ``record`` (1 without an alignment), as the features hold them."""
    if record.alignment is None:
        return 1
    return len(set(record.alignment.rows))


def fit_msa_rows(data_config, depth: int):
    """A copy of ``data_config`` whose MSA sizes fit an MSA of ``depth`` distinct rows.

    [Note: folding at the MSA's depth]
    In predict mode OpenFold's feature pipeline samples up to ``max_msa_clusters`` rows
    of the MSA as cluster centres (the query first), hands the rest to the extra MSA (up
    to ``max_extra_msa``), and then pads both with masked rows to those fixed sizes. The
    padded rows change nothing: MSA row attention works on each row alone, column
    attention, the extra stack's global attention and the outer product mean mask them
    out, so the real rows and the pair representation come out the same. They do cost
    time: a single-sequence record padded to model_1's 512 + 5120 rows spends almost all
    of its MSA work on padding. The fitted sizes keep every real row (clusters: as many
    as the MSA has, within the configured maximum; the extra MSA: what is left, at least
    one masked row, since the extra stack needs a row), so the sampling draws the same
    rows with the same random numbers, and only the padding goes. Tested against the
    padded fold in ``tests/test_fold_msa_depth.py``.
    """
    import copy

    config = copy.deepcopy(data_config)
    predict = config.predict
    reduce = config.common.get("reduce_msa_clusters_by_max_templates", False)
    reserved = int(predict.max_templates) if reduce else 0
    clusters = min(int(predict.max_msa_clusters), depth + reserved)
    extra = min(int(predict.max_extra_msa), max(1, depth - (clusters - reserved)))
    predict.max_msa_clusters = clusters
    predict.max_extra_msa = extra
    return config


def processed_features(record: Record, data_config, seed: int) -> Dict[str, torch.Tensor]:
    """Model-ready tensors for ``record`` (CPU), with a trailing recycling dimension.

    ``seed`` fixes the random MSA cluster sampling of the feature pipeline.
    """
    from openfold.data.feature_pipeline import FeaturePipeline

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-tuple sequence for multidim.*")
            feats = FeaturePipeline(data_config).process_features(
                raw_features(record), mode="predict"
            )
    finally:
        torch.random.set_rng_state(state)
    return dict(feats)


def to_device(
    feats: Dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
) -> Dict[str, torch.Tensor]:
    """Features on ``device``; floating-point ones cast to the model's ``dtype``."""
    out = {}
    for key, value in feats.items():
        value = value.to(device)
        if value.is_floating_point():
            value = value.to(dtype)
        out[key] = value
    return out
