"""Small OpenFold models, random weights and inputs, for tests and examples.

Nothing here downloads anything: weights are seeded random draws and input features
are built from a sequence by hand, then passed through OpenFold's own
``FeaturePipeline``. OpenFold's default initialisation zeroes the output projection of
every attention (``init="final"``) and the gate's weights, so a freshly built module
returns a constant; :func:`randomize_` draws all parameters so that every term of the
computation shows in the output.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator
from unittest import mock

import numpy as np
import torch


def randomize_(module: torch.nn.Module, generator: torch.Generator, gain: float = 1.0) -> None:
    """Redraw every parameter of ``module`` in place (weights ~ N(0, gain^2 / fan_in)).

    Matrices get ``N(0, gain^2 / fan_in)``, vectors named ``weight`` (layer norms)
    ``1 + N(0, 0.1^2)``, other vectors ``N(0, 0.1^2)``.
    """
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if p.dim() >= 2:
                value = noise * (gain / math.sqrt(p.shape[-1]))
            elif name.endswith("weight"):
                value = 1.0 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


@contextlib.contextmanager
def count_launches() -> Iterator[list]:
    """Within the block, every Flashlight kernel launch appends its ``Launcher`` to the
    list yielded (``launcher.src.name`` names the kernel, ``launcher.tiled`` its tiling)."""
    from flashlight import runtime

    launches: list = []
    launch = runtime.Launcher.__call__

    def counted(self, *tensors):
        launches.append(self)
        return launch(self, *tensors)

    with mock.patch.object(runtime.Launcher, "__call__", counted):
        yield launches


def random_mask(shape: tuple[int, ...], generator: torch.Generator, p_zero: float = 0.25):
    """A 0/1 float mask with some zeros; index 0 of the last two dimensions is kept 1.

    Keeping one valid key per row (in either orientation) avoids rows whose every key is
    masked, where OpenFold's ``-1e9`` bias leaves nothing but rounding to compare.
    """
    mask = (torch.rand(shape, generator=generator) >= p_zero).float()
    mask[..., 0, :] = 1.0
    mask[..., :, 0] = 1.0
    return mask


def small_model_config(
    name: str = "model_1",
    evoformer_blocks: int = 2,
    extra_msa_blocks: int = 1,
    max_msa_clusters: int = 6,
    max_extra_msa: int = 8,
    chunk_size: int | None = None,
):
    """An OpenFold ``model_config(name)`` shrunk for CPU tests: few blocks, no templates,
    no recycling, small MSA budgets."""
    from openfold.config import model_config

    config = model_config(name)
    config.model.evoformer_stack.no_blocks = evoformer_blocks
    config.model.extra_msa.extra_msa_stack.no_blocks = extra_msa_blocks
    config.model.template.enabled = False
    config.data.common.max_recycling_iters = 0
    config.data.predict.max_msa_clusters = max_msa_clusters
    config.data.predict.max_extra_msa = max_extra_msa
    config.globals.chunk_size = chunk_size
    for stack in (
        config.model.evoformer_stack,
        config.model.extra_msa.extra_msa_stack,
        config.model.template.template_pair_stack,
    ):
        stack.tune_chunk_size = False
    return config


def sequence_features(sequence: str, n_alignments: int = 4, seed: int = 0) -> dict[str, Any]:
    """Raw (numpy) features for ``sequence``: the sequence, an MSA of the sequence plus
    ``n_alignments - 1`` random point mutants, and no templates.

    The dictionary is what OpenFold's data pipeline produces for a single chain, ready
    for ``FeaturePipeline(config.data).process_features(feats, "predict")``.
    """
    from openfold.np import residue_constants as rc

    n = len(sequence)
    rng = np.random.RandomState(seed)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    rows = [sequence]
    while len(rows) < n_alignments:
        row = "".join(
            letters[rng.randint(len(letters))] if rng.rand() < 0.3 else c for c in sequence
        )
        if row not in rows:
            rows.append(row)
    return {
        "aatype": rc.sequence_to_onehot(sequence, rc.restype_order_with_x, map_unknown_to_x=True),
        "between_segment_residues": np.zeros((n,), np.int32),
        "domain_name": np.array([b"query"], dtype=object),
        "residue_index": np.arange(n, dtype=np.int32),
        "seq_length": np.full((n,), n, np.int32),
        "sequence": np.array([sequence.encode()], dtype=object),
        "deletion_matrix_int": np.zeros((len(rows), n), np.int32),
        "msa": np.array([[rc.HHBLITS_AA_TO_ID[c] for c in r] for r in rows], np.int32),
        "num_alignments": np.full((n,), len(rows), np.int32),
        "template_aatype": np.zeros((0, n), np.int64),
        "template_all_atom_positions": np.zeros((0, n, 37, 3), np.float32),
        "template_sum_probs": np.zeros((0, 1), np.float32),
        "template_all_atom_mask": np.zeros((0, n, 37), np.float32),
    }


def model_batch(config, sequence: str, n_alignments: int = 4, seed: int = 0):
    """Processed ``predict``-mode features (torch tensors) for ``sequence``."""
    from openfold.data import feature_pipeline

    feats = sequence_features(sequence, n_alignments=n_alignments, seed=seed)
    return feature_pipeline.FeaturePipeline(config.data).process_features(feats, "predict")


def random_model(config, seed: int = 0, gain: float = 0.5):
    """A seeded random-weight ``AlphaFold(config)`` in eval mode.

    OpenFold's own initialisation is kept, except in the MSA row/column (global ones
    too) and triangle attention modules, the extra-MSA stack's outer product means and
    the pLDDT head, whose parameters are all drawn (:func:`randomize_`) so that their
    outputs are not constant (OpenFold zeroes the outer product mean's output layer, so
    the extra-MSA representation would otherwise never reach the pair representation).
    """
    from openfold.model.model import AlphaFold
    from openfold.model.msa import MSAAttention, MSAColumnGlobalAttention
    from openfold.model.outer_product_mean import OuterProductMean
    from openfold.model.triangular_attention import TriangleAttention

    torch.manual_seed(seed)
    np.random.seed(seed)  # OpenFold draws its truncated-normal initial weights with NumPy
    model = AlphaFold(config).eval()
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (MSAAttention, MSAColumnGlobalAttention, TriangleAttention)):
            randomize_(module, generator, gain=gain)
    extra_msa_stack = getattr(model, "extra_msa_stack", None)  # absent with the extra MSA off
    for module in extra_msa_stack.modules() if extra_msa_stack is not None else ():
        if isinstance(module, OuterProductMean):
            randomize_(module, generator, gain=gain)
    randomize_(model.aux_heads.plddt, generator, gain=gain)
    return model
