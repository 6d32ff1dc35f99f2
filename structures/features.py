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
