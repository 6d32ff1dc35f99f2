"""Building the OpenFold model: config preset, weights, dtype, and the Flashlight patch.

Weights come from one of three places:

- an AlphaFold parameter file (``params_model_1.npz``), loaded with OpenFold's
  ``import_jax_weights_`` under the preset's name;
- an OpenFold checkpoint (``.pt``: a plain state dict, ``{"ema": {"params": ...}}`` or a
  Lightning ``{"state_dict": ...}``), loaded strictly;
- otherwise a seeded random initialisation. OpenFold initialises the last layer of every
  residual update (and of the structure module and heads) to zero, which would make a
  random model's attention outputs, coordinates and pLDDT constant; those zero weights
  are drawn from a small normal distribution instead, so that the random model exercises
  every layer. A random model never predicts a structure, and every output says so.

With fewer Evoformer blocks than the checkpoint holds (``--num-blocks``), the first
blocks' weights are used.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Any, Optional

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Standard deviation (times 1/sqrt(fan_in)) for zero-initialised layers of a random model.
RANDOM_FINAL_INIT_SCALE = 0.1


class WeightsError(ValueError):
    """A weights file that cannot be loaded into the configured model."""


@dataclasses.dataclass
class ModelInfo:
    """What the model is: reported in every output."""

    preset: str
    num_blocks: int
    recycles: int
    dtype: str
    device: str
    weights: str  # path of the weights file, or "random"
    seed: int
    chunk_size: Optional[int]
    max_msa_clusters: int
    max_extra_msa: int

    @property
    def random_weights(self) -> bool:
        """True for a seeded random model (no --params)."""
        return self.weights == "random"

    def label(self) -> str:
        """One line naming the model, with a warning for random weights."""
        if self.random_weights:
            source = f"RANDOM WEIGHTS (seed {self.seed}), not a structure prediction"
        else:
            source = f"weights {os.path.basename(self.weights)}"
        return (
            f"OpenFold {self.preset}, {self.num_blocks} Evoformer block{'' if self.num_blocks == 1 else 's'}, "
            f"{self.recycles} recycles, {self.dtype}: {source}"
        )

    def to_json(self) -> dict:
        """The model description as a JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["random_weights"] = self.random_weights
        return out


def make_config(
    preset: str,
    num_blocks: Optional[int] = None,
    recycles: int = 0,
    dtype: str = "fp32",
    chunk_size: Any = "auto",
    max_msa_clusters: Optional[int] = None,
    max_extra_msa: Optional[int] = None,
):
    """OpenFold's config for ``preset`` with the run's overrides applied.

    ``chunk_size``: ``"preset"`` keeps the preset's value, ``None`` turns chunking off,
    ``"auto"`` (the default) starts without chunking, and the fold falls back to the
    preset's value if the GPU runs out of memory (:func:`preset_chunk_size`).
    ``max_msa_clusters`` / ``max_extra_msa``: the MSA rows the feature pipeline pads to
    in predict mode (preset: 512 and 5120 for model_1); smaller values make quick runs
    on short inputs cheap.
    """
    from openfold.config import model_config

    try:
        config = model_config(preset, train=False, low_prec=(dtype != "fp32"))
    except ValueError as err:
        raise ValueError(
            f"unknown OpenFold preset {preset!r} (e.g. model_1 ... model_5, model_1_ptm)"
        ) from err
    if num_blocks is not None:
        if num_blocks < 1:
            raise ValueError("--num-blocks must be at least 1")
        config.model.evoformer_stack.no_blocks = num_blocks
    if recycles < 0:
        raise ValueError("--recycles must be 0 or more")
    config.data.common.max_recycling_iters = recycles
    if chunk_size == "auto":
        config.globals.chunk_size = None
    elif chunk_size != "preset":
        config.globals.chunk_size = chunk_size
    if max_msa_clusters is not None:
        common = config.data.common
        reduce = common.get("reduce_msa_clusters_by_max_templates", False)
        reserved = config.data.predict.max_templates if reduce else 0
        if max_msa_clusters <= reserved:
            raise ValueError(
                f"--max-msa-clusters must exceed {reserved} for {preset} (it reserves "
                "rows for templates)"
            )
        config.data.predict.max_msa_clusters = max_msa_clusters
    if max_extra_msa is not None:
        if max_extra_msa < 1:
            raise ValueError("--max-extra-msa must be at least 1")
        config.data.predict.max_extra_msa = max_extra_msa
    return config


def _liven_zero_layers(model: torch.nn.Module, generator: torch.Generator) -> int:
    """Draw OpenFold's zero-initialised linear weights at random; returns how many."""
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.any():
                fan_in = module.weight.shape[1]
                std = RANDOM_FINAL_INIT_SCALE / fan_in**0.5
                module.weight.copy_(
                    torch.randn(module.weight.shape, generator=generator) * std
                )
                count += 1
    return count


def _state_dict_from(obj: Any, path: str) -> dict:
    if not isinstance(obj, dict):
        raise WeightsError(f"{path}: expected a state dict, found {type(obj).__name__}")
    if "ema" in obj and isinstance(obj["ema"], dict) and "params" in obj["ema"]:
        obj = obj["ema"]["params"]
    elif "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    elif "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    out = {}
    for key, value in obj.items():
        for prefix in ("module.", "model."):
            if key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def load_openfold_checkpoint(model: torch.nn.Module, path: str) -> None:
    """Load an OpenFold ``.pt`` checkpoint into ``model`` (strict, extra blocks dropped)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - reported with the file name
        raise WeightsError(
            f"{path}: cannot be read as a PyTorch checkpoint of tensors ({err})"
        ) from err
    state = _state_dict_from(obj, path)
    n_blocks = len(model.evoformer.blocks)
    block_key = re.compile(r"^evoformer\.blocks\.(\d+)\.")
    kept = {}
    for key, value in state.items():
        match = block_key.match(key)
        if match and int(match.group(1)) >= n_blocks:
            continue
        kept[key] = value
    missing, unexpected = model.load_state_dict(kept, strict=False)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        raise WeightsError(
            f"{path}: parameters do not match the configured model: " + "; ".join(parts)
        )


def load_alphafold_params(model: torch.nn.Module, path: str, preset: str) -> None:
    """Load AlphaFold ``.npz`` parameters with OpenFold's importer for ``preset``."""
    import numpy as np
    from openfold.utils import import_weights

    try:
        with np.load(path) as data:
            keys = set(data.files)
    except Exception as err:  # noqa: BLE001 - reported with the file name
        raise WeightsError(f"{path}: cannot be read as an .npz archive ({err})") from err
    wanted = import_weights.process_translation_dict(
        import_weights.generate_translation_dict(model, preset)
    )
    missing = sorted(k for k in wanted if k not in keys)
    if missing:
        raise WeightsError(
            f"{path}: {len(missing)} parameters that preset {preset!r} needs are absent "
            f"(e.g. {missing[0]}); is it the parameter file of another preset?"
        )
    try:
        import_weights.import_jax_weights_(model, path, version=preset)
    except Exception as err:  # noqa: BLE001 - reported with the file name
        raise WeightsError(f"{path}: {type(err).__name__}: {err}") from err


def preset_chunk_size(preset: str) -> Optional[int]:
    """The chunk size OpenFold's ``preset`` sets for inference.

    [Note: chunking only where memory needs it]
    OpenFold chunks its inference modules (``chunk_size`` 4 for model_1) so that long
    inputs fit in memory; on inputs that fit, chunking only multiplies kernel launches
    (a 256-residue pair transition runs as 64 chunks). Flashlight-patched attention
    never chunks (its kernel never stores the scores), and the fold turns chunking off
    for everything else too unless memory runs out: ``chunk_size="auto"`` runs without
    it and, on a CUDA out-of-memory error, runs the pass again with this value. The
    preset's value is then a floor, not the chunk size: OpenFold's configs turn on its
    chunk-size tuner (``tune_chunk_size``), which on the first chunked call of each
    stack tries chunk sizes from this value up to 512 and keeps the largest that runs
    without running out of memory (:func:`tuned_chunk_sizes` reads what it chose).
    Without the tuner a 2048-residue ``model_1`` pass at chunk size 4 runs its pair
    transitions and outer product mean as hundreds of launches each.
    """
    from openfold.config import model_config

    return model_config(preset, train=False).globals.chunk_size


def chunk_size_tuners(model: torch.nn.Module) -> dict[str, Any]:
    """OpenFold's chunk-size tuner of each stack of ``model`` that has one, by module name."""
    return {name: m.chunk_size_tuner for name, m in model.named_modules()
            if getattr(m, "chunk_size_tuner", None) is not None}


def tuned_chunk_sizes(model: torch.nn.Module) -> dict[str, int]:
    """The chunk size OpenFold's chunk-size tuner chose in each stack of ``model`` whose
    tuner has run, by module name ([Note: chunking only where memory needs it])."""
    return {name: int(tuner.cached_chunk_size) for name, tuner in chunk_size_tuners(model).items()
            if tuner.cached_chunk_size is not None}


def set_chunk_size(model: torch.nn.Module, chunk_size: Optional[int]) -> None:
    """Make OpenFold's ``model`` chunk with ``chunk_size`` from its next call on."""
    model.globals.chunk_size = chunk_size


@contextlib.contextmanager
def _numpy_seeded(seed: int):
    """NumPy's global generator seeded with ``seed`` inside, restored after: OpenFold's
    ``trunc_normal_init_`` samples with ``scipy.stats.truncnorm`` from that generator, so
    a model built under ``torch.manual_seed`` alone differs from process to process."""
    import numpy as np

    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def build_model(
    config, info: ModelInfo, params: Optional[str] = None
) -> torch.nn.Module:
    """The AlphaFold model in eval mode on ``info.device`` with ``info.dtype``."""
    from openfold.model.model import AlphaFold

    torch.manual_seed(info.seed)
    with _numpy_seeded(info.seed):  # OpenFold draws its truncated-normal weights with NumPy
        model = AlphaFold(config)
    if params is None:
        generator = torch.Generator().manual_seed(info.seed)
        _liven_zero_layers(model, generator)
    elif params.endswith(".npz"):
        load_alphafold_params(model, params, info.preset)
    elif params.endswith((".pt", ".pth", ".ckpt")):
        load_openfold_checkpoint(model, params)
    else:
        raise WeightsError(
            f"{params}: unknown weights format (expected AlphaFold .npz or OpenFold .pt)"
        )
    model = model.eval()
    return model.to(device=torch.device(info.device), dtype=DTYPES[info.dtype])


@dataclasses.dataclass
class PatchStatus:
    """Whether a model runs Flashlight's kernels, and why not when it does not."""

    requested: bool
    active: bool = False
    reason: Optional[str] = None
    details: Optional[str] = None
    scope: Optional[str] = None  # patch_openfold's scope, once patched
    cuda_graphs: int = 0  # modules (stacks, structure module) replayed as CUDA graphs

    def to_json(self) -> dict:
        """The status as a JSON-ready dict."""
        return dataclasses.asdict(self)


def apply_flashlight(model: torch.nn.Module, scope: str = "attention", cuda_graphs: bool = False) -> PatchStatus:
    """Patch ``model`` in place with :func:`flashlight.patch_openfold` (``scope``:
    ``"attention"`` or ``"block"``; ``cuda_graphs``: the Evoformer and extra-MSA stacks
    and the structure module replayed as CUDA graphs; see there).

    Never raises: a failure comes back as an inactive status with the reason, for the
    caller to report.
    """
    try:
        import flashlight

        result = flashlight.patch_openfold(model, scope=scope, cuda_graphs=cuda_graphs)
    except Exception as err:  # noqa: BLE001 - the reason is reported to the user
        return PatchStatus(requested=True, active=False, reason=f"{type(err).__name__}: {err}")
    details = None
    if result is not None and not isinstance(result, torch.nn.Module):
        details = str(result)[:500]
    graphs = int(getattr(result, "cuda_graphs", 0))
    return PatchStatus(requested=True, active=True, details=details, scope=scope, cuda_graphs=graphs)


def remove_flashlight(model: torch.nn.Module) -> Optional[str]:
    """Undo :func:`apply_flashlight`; returns an error message instead of raising."""
    try:
        import flashlight

        flashlight.unpatch_openfold(model)
    except Exception as err:  # noqa: BLE001 - the reason is reported to the user
        return f"{type(err).__name__}: {err}"
    return None
