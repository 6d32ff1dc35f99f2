"""Weights: OpenFold .pt state dicts and AlphaFold .npz files the tests write themselves."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("openfold")

from flashlight.structures.models import (  # noqa: E402
    WeightsError,
    load_alphafold_params,
    load_openfold_checkpoint,
    make_config,
)
from flashlight.structures.testing import (  # noqa: E402
    TINY_OPTIONS,
    export_alphafold_params,
    run_cli,
    write_fasta,
)

BLOCKS = 2


@pytest.fixture(scope="module")
def source_model():
    """A 2-block model_1 whose parameters are all non-trivial (seeded normal draws)."""
    from openfold.model.model import AlphaFold

    torch.manual_seed(11)
    model = AlphaFold(make_config("model_1", num_blocks=BLOCKS)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.02)
    return model


def _fresh_model(seed=5, blocks=BLOCKS):
    from openfold.model.model import AlphaFold

    torch.manual_seed(seed)
    return AlphaFold(make_config("model_1", num_blocks=blocks)).eval()


def _assert_same_parameters(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert differ == []


def test_pt_state_dict_round_trip(tmp_path, source_model):
    path = tmp_path / "openfold.pt"
    torch.save(source_model.state_dict(), path)
    model = _fresh_model()
    load_openfold_checkpoint(model, str(path))
    _assert_same_parameters(model, source_model)


def test_pt_ema_and_lightning_layouts(tmp_path, source_model):
    state = source_model.state_dict()
    torch.save({"ema": {"params": state}}, tmp_path / "ema.pt")
    torch.save({"state_dict": {"model." + k: v for k, v in state.items()}}, tmp_path / "pl.pt")
    for name in ("ema.pt", "pl.pt"):
        model = _fresh_model()
        load_openfold_checkpoint(model, str(tmp_path / name))
        _assert_same_parameters(model, source_model)


def test_pt_with_more_blocks_keeps_the_first(tmp_path, source_model):
    state = dict(source_model.state_dict())
    # pretend the checkpoint has a third block
    for key, value in list(state.items()):
        if key.startswith("evoformer.blocks.1."):
            state[key.replace("blocks.1.", "blocks.2.", 1)] = value.clone()
    torch.save(state, tmp_path / "deeper.pt")
    model = _fresh_model()
    load_openfold_checkpoint(model, str(tmp_path / "deeper.pt"))
    _assert_same_parameters(model, source_model)


def test_pt_mismatch_is_explained(tmp_path, source_model):
    state = dict(source_model.state_dict())
    state.pop("structure_module.linear_in.weight")
    state["not_a_layer.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "broken.pt")
    with pytest.raises(WeightsError, match=r"1 missing \(e\.g\. structure_module\.linear_in\.weight\); 1 unexpected"):
        load_openfold_checkpoint(_fresh_model(), str(tmp_path / "broken.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="cannot be read as a PyTorch checkpoint"):
        load_openfold_checkpoint(_fresh_model(), str(tmp_path / "junk.pt"))


def test_alphafold_npz_round_trip(tmp_path, source_model):
    path = export_alphafold_params(source_model, str(tmp_path / "params_model_1.npz"))
    with np.load(path) as data:
        keys = set(data.files)
    assert "alphafold/alphafold_iteration/evoformer/evoformer_iteration/msa_row_attention_with_pair_bias/attention//query_w" in keys  # haiku: module//param
    model = _fresh_model()
    load_alphafold_params(model, path, "model_1")
    _assert_same_parameters(model, source_model)


def test_npz_of_another_preset_is_explained(tmp_path, source_model):
    path = export_alphafold_params(source_model, str(tmp_path / "params.npz"))
    with np.load(path) as data:
        kept = {k: data[k] for k in data.files if "template" not in k}
    np.savez(tmp_path / "no_templates.npz", **kept)
    with pytest.raises(WeightsError, match="parameters that preset 'model_1' needs are absent"):
        load_alphafold_params(_fresh_model(), str(tmp_path / "no_templates.npz"), "model_1")


@pytest.mark.parametrize("kind", ["pt", "npz"])
def test_cli_folds_with_loaded_weights(tmp_path, source_model, kind):
    if kind == "pt":
        params = tmp_path / "weights.pt"
        torch.save(source_model.state_dict(), params)
    else:
        params = tmp_path / "params_model_1.npz"
        export_alphafold_params(source_model, str(params))
    fasta = write_fasta(tmp_path / "q.fasta", {"trp": "NLYIQWLKDGGPSSGRPPPS"})
    out = tmp_path / "out"
    result = run_cli(
        [str(fasta), "--out-dir", str(out), "--params", str(params), "--no-flashlight",
         "--no-plot", "--warmup", "0", *TINY_OPTIONS]
    )
    assert result.returncode == 0, result.output
    assert "RANDOM" not in result.output
    report = json.loads((out / "trp" / "latency.json").read_text())
    assert report["model"]["random_weights"] is False
    assert report["model"]["weights"] == str(params)
    pdb_text = (out / "trp" / "trp.pdb").read_text()
    assert pdb_text.splitlines()[0] == f"REMARK 250 flashlight-fold model_1: weights {params.name}"


def test_seeded_random_weights_are_the_same_in_every_process():
    """OpenFold draws some initial weights with NumPy's global generator: a seeded random
    model must not depend on that generator's state (another process, earlier draws),
    and building it leaves the state as it found it."""
    from flashlight.structures.models import ModelInfo, build_model

    config = make_config("model_1", num_blocks=1)
    info = ModelInfo("model_1", 1, 0, "fp32", "cpu", "random", 3, None, 4, 4)
    states = []
    models = []
    for numpy_seed in (1, 2):  # two processes' different NumPy histories
        np.random.seed(numpy_seed)
        before = np.random.get_state()[1].copy()
        models.append(build_model(config, info).state_dict())
        states.append((before, np.random.get_state()[1]))
    assert all((a == b).all() for a, b in states)
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    assert any(v.float().std() > 0 for v in models[0].values())
