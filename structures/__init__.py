"""Folding FASTA inputs with OpenFold (stock or Flashlight) and reporting latency.

The ``flashlight-fold`` command (:mod:`flashlight.structures.cli`) is the entry point.
The pieces, usable on their own:

- :mod:`~flashlight.structures.inputs`: FASTA/MSA reading and validation;
- :mod:`~flashlight.structures.features`: model features via OpenFold's pipeline;
- :mod:`~flashlight.structures.models`: config presets, weights, the Flashlight patch;
- :mod:`~flashlight.structures.timing`: per-stage, per-block, per-module latency hooks;
- :mod:`~flashlight.structures.fold`: :class:`Folder`, which folds and reports a record;
- :mod:`~flashlight.structures.outputs`: PDB/mmCIF, plot, JSON and terminal tables;
- :mod:`~flashlight.structures.distributed`: record sharding under ``torchrun``.

Submodules import torch and OpenFold lazily; importing this package is cheap.
"""

__all__ = ["cli", "distributed", "features", "fold", "inputs", "models", "outputs", "timing"]
