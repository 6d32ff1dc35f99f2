"""Models and inputs for the end-to-end benchmark (:mod:`bench.evoformer`): OpenFold's
``model_1`` configuration with seeded random weights, a synthetic feature batch of the
right shapes, and MSA / pair representations for the Evoformer stack alone."""
from __future__ import annotations


def model_config(blocks: int | None, n_extra: int):
    from openfold.config import model_config as of_model_config

    config = of_model_config("model_1")
    config.model.template.enabled = False
    config.globals.chunk_size = None
    config.globals.use_lma = False
    config.globals.offload_inference = False
    if blocks is not None:
        config.model.evoformer_stack.no_blocks = blocks
        config.model.extra_msa.extra_msa_stack.no_blocks = max(1, min(blocks, 4))
    config.model.extra_msa.enabled = n_extra > 0
    # OpenFold's chunk-size tuner stays on as model_1's config has it: inert unchunked,
    # and where a run that does not fit is chunked, the preset's chunk size becomes the
    # floor the tuner raises ([Note: chunking only where memory needs it])
    return config


def chunking(model) -> dict:
    """How a model that ran chunked chose its chunk sizes: whether OpenFold's tuner ran,
    and what it chose per stack (empty for an unchunked model)."""
    from flashlight.structures.models import tuned_chunk_sizes

    if model.globals.chunk_size is None:
        return {}
    tuned = tuned_chunk_sizes(model)
    return {"chunk_tuner": bool(tuned), "tuned_chunk_sizes": tuned}


def build_model(config, seed: int, device: str):
    from flashlight.integrations.openfold_testing import random_model

    return random_model(config, seed=seed).to(device)


def torch_dtype(name: str):
    """The torch dtype of a benchmark's ``tf32`` / ``fp32`` / ``bf16`` setting."""
    import torch

    return torch.bfloat16 if name == "bf16" else torch.float32


def cast_model(model, dtype):
    """``model`` in ``dtype`` (float32: left as built)."""
    import torch

    return model if dtype == torch.float32 else model.to(dtype)


def synthetic_batch(n_res: int, n_seq: int, n_extra: int, iters: int, device: str, seed: int) -> dict:
    """model_1 input features of the right shapes and kinds, drawn at random.

    Keys and shapes as ``AlphaFold.forward`` documents them, each with a trailing
    recycling dimension of size ``iters``: aatype, target_feat [N, 22], residue_index,
    msa_feat [S, N, 49] (one-hot MSA, deletions, cluster profile, deletion mean),
    seq/msa masks, the extra MSA (E rows) and the atom14/atom37 index maps of the
    sequence.
    """
    import torch
    from openfold.data.data_transforms import make_atom14_masks

    g = torch.Generator().manual_seed(seed)
    aatype = torch.randint(0, 20, (n_res,), generator=g)
    target_feat = torch.zeros(n_res, 22)
    target_feat[torch.arange(n_res), aatype + 1] = 1.0
    msa = torch.randint(0, 21, (n_seq, n_res), generator=g)
    msa[0] = aatype
    one_hot = torch.nn.functional.one_hot(msa, 23).float()
    has_deletion = (torch.rand(n_seq, n_res, generator=g) < 0.05).float()
    deletion_value = has_deletion * torch.rand(n_seq, n_res, generator=g)
    profile = torch.softmax(torch.randn(n_seq, n_res, 23, generator=g), dim=-1)
    cluster_profile = 0.7 * one_hot + 0.3 * profile
    deletion_mean = 0.1 * torch.rand(n_seq, n_res, generator=g)
    msa_feat = torch.cat([one_hot, has_deletion[..., None], deletion_value[..., None], cluster_profile,
                          deletion_mean[..., None]], dim=-1)  # [S, N, 49]
    batch = {
        "aatype": aatype,
        "target_feat": target_feat,
        "residue_index": torch.arange(n_res),
        "msa_feat": msa_feat,
        "seq_mask": torch.ones(n_res),
        "msa_mask": torch.ones(n_seq, n_res),
        "extra_msa": torch.randint(0, 21, (max(n_extra, 1), n_res), generator=g),
        "extra_has_deletion": (torch.rand(max(n_extra, 1), n_res, generator=g) < 0.05).float(),
        "extra_deletion_value": 0.1 * torch.rand(max(n_extra, 1), n_res, generator=g),
        "extra_msa_mask": torch.ones(max(n_extra, 1), n_res),
    }
    batch = make_atom14_masks(batch)
    return {k: v[..., None].expand(*v.shape, iters).contiguous().to(device) for k, v in batch.items()}


def stack_inputs(n_res: int, n_seq: int, device: str, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    m = torch.randn(1, n_seq, n_res, 256, generator=g).to(device)
    z = torch.randn(1, n_res, n_res, 128, generator=g).to(device)
    return m, z, torch.ones(1, n_seq, n_res, device=device), torch.ones(1, n_res, n_res, device=device)
