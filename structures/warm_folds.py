"""Which folds this machine has compiled before, so that their warm-up (or their compiling in
the background) can be skipped.

[Note: skipping the warm-up when the caches are warm]
A Flashlight fold that times several passes (``--repeats`` above one) runs a short
warm-up pass first, where its kernels compile (and where traced graphs are captured,
[Note: traced capture] in ``flashlight/traced.py``), so that the timed passes are the
steady state; a plain fold compiles during its one pass instead ([Note: compiling in the
background during a fold's pass] in ``compile_pass.py``). Once a fold of the same shapes has
filled the caches (traced graphs, Triton's binaries, tuning choices), a warm-up only adds
the time of one recycling iteration (an H200, 256 residues: a first call with filled
caches took 1.68-1.71 s against stock's 1.51-1.69 s, bench/results/fold_product_runs/),
and compiling in the background would only put unfused graphs where cached kernels load
at once. After each Flashlight fold a marker is written to ``<Flashlight cache
folder>/folds/``, keyed by everything the compiled work depends on: the model's
configuration and dtype, every input feature's shape and dtype, the chunk size, the patch
scope, the GPU and the versions of Flashlight, PyTorch and Triton. A later fold with the
same key runs without a warm-up and compiles nothing in the background. If the caches
were emptied in between, that fold compiles where each kernel is first launched: the same
result, a slower first pass. ``--compare`` and an explicit ``--warmup`` keep their
warm-up.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict

import torch


def fold_key(model: dict, batch: Dict[str, torch.Tensor], settings: dict) -> str:
    """The key of a fold: ``model`` (its configuration as reported), the batch's shapes
    and dtypes, ``settings`` (dtype, chunk size, patch scope...), the device and versions."""
    from flashlight import settings as flashlight_settings
    from flashlight.traced import versions

    device = next(iter(batch.values())).device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    text = json.dumps({
        "model": model, "settings": settings, "gpu": gpu, **versions(),
        "interpret": bool(flashlight_settings.get("interpret")),
        "batch": sorted((k, list(v.shape), str(v.dtype)) for k, v in batch.items()),
    }, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def _path(key: str) -> str:
    from flashlight import settings

    return os.path.join(settings.get("cache_dir"), "folds", key)


def compiled_before(key: str) -> bool:
    """Whether a fold with ``key`` finished on this machine with these caches."""
    return os.path.exists(_path(key))


def remember(key: str) -> None:
    """Mark a fold with ``key`` as compiled (a failure to write only costs a warm-up)."""
    path = _path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w"):
            pass
    except OSError:
        pass
