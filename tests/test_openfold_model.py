"""A stock OpenFold ``model_1`` AlphaFold folds a short sequence on CPU (random weights).

This is the reference the Flashlight integration is compared with, so it must run on
machines without a GPU: see flashlight.integrations.openfold_compat.
"""
import numpy as np
import pytest
import torch

pytest.importorskip("openfold")

from flashlight.integrations.openfold_compat import cpu_compat  # noqa: E402

SEQUENCE = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEV"  # 32 residues


def _config(recycles: int):
    from openfold.config import model_config

    config = model_config("model_1")
    config.data.common.use_templates = False
    config.data.common.use_template_torsion_angles = False
    config.data.common.reduce_max_clusters_by_max_templates = False
    config.model.template.enabled = False
    config.data.common.max_recycling_iters = recycles
    # A single-sequence MSA: keep the padded MSA stacks small.
    config.data.predict.max_msa_clusters = 4
    config.data.predict.max_extra_msa = 8
    return config


def _single_sequence_features(sequence: str) -> dict:
    """Raw sequence and MSA features (the MSA is the query alone; no templates)."""
    from openfold.np import residue_constants as rc

    n = len(sequence)
    return {
        "aatype": rc.sequence_to_onehot(sequence, rc.restype_order_with_x, map_unknown_to_x=True),
        "between_segment_residues": np.zeros(n, dtype=np.int32),
        "residue_index": np.arange(n, dtype=np.int32),
        "seq_length": np.full(n, n, dtype=np.int32),
        "msa": np.array([[rc.HHBLITS_AA_TO_ID[aa] for aa in sequence]], dtype=np.int32),
        "deletion_matrix_int": np.zeros((1, n), dtype=np.int32),
        "num_alignments": np.full(n, 1, dtype=np.int32),
    }


@pytest.fixture(scope="module")
def folded():
    from openfold.data.feature_pipeline import FeaturePipeline
    from openfold.model.model import AlphaFold

    config = _config(recycles=1)
    torch.manual_seed(0)
    model = AlphaFold(config).eval()
    batch = FeaturePipeline(config.data).process_features(
        _single_sequence_features(SEQUENCE), mode="predict"
    )
    with torch.no_grad(), cpu_compat():
        out = model(batch)
    return model, batch, out


def test_model_1_forward_on_cpu_gives_finite_coordinates(folded):
    _, batch, out = folded
    n = len(SEQUENCE)
    assert batch["aatype"].shape == (n, 2)  # trailing dimension: recycling iterations
    positions = out["final_atom_positions"]
    assert positions.shape == (n, 37, 3)
    assert torch.isfinite(positions).all()
    # Atoms that exist for each residue type were placed, and not all in one point.
    exists = out["final_atom_mask"].bool()
    assert exists[:, :3].all()  # N, CA, C
    assert positions[exists].std() > 0.1


def test_model_1_needs_the_compat_layer_on_cpu(folded):
    """Without the fallback the stub extension raises: the layer is what makes CPU work."""
    model, batch, _ = folded
    try:
        import attn_core_inplace_cuda

        attn_core_inplace_cuda.forward_(torch.zeros(1, 2), 1, 2)
    except RuntimeError:
        pass
    else:  # pragma: no cover - an OpenFold build whose extension runs on CPU
        pytest.skip("this OpenFold build's extension works on CPU tensors")
    single = {k: v[..., :1] for k, v in batch.items()}  # no recycling: fail fast
    with torch.no_grad(), pytest.raises(RuntimeError):
        model(single)
