"""Confidence outputs of a fold: pLDDT, and pTM and PAE where the preset has the TM head.

OpenFold's output dict holds ``plddt`` ``[N]`` (0-100) for every preset; presets with
the TM head (``model_1_ptm`` ... ``model_5_ptm``) add ``predicted_tm_score`` (pTM, a
scalar in [0, 1], ``openfold.utils.loss.compute_tm``), ``predicted_aligned_error``
``[N, N]`` (angstroms; row ``i``: the error of residue ``j``'s position when the
prediction is aligned on residue ``i``) and ``max_predicted_aligned_error`` (the top of
the head's bins, 31.75 A for AlphaFold's 64 bins of 0.5 A).

:func:`confidence_report` is ``<name>_confidence.json`` (schema
``flashlight.fold.confidence/1``); :func:`plot_plddt` and :func:`plot_pae` draw the PNGs.
"""
from __future__ import annotations

import io
import textwrap
from typing import Dict, Optional

import numpy as np

from flashlight.structures.outputs import write_atomic

SCHEMA = "flashlight.fold.confidence/1"
# AlphaFold's pLDDT bands, as the AlphaFold database colours them.
PLDDT_BANDS = ((90, "very high", "#0053d6"), (70, "confident", "#65cbf3"),
               (50, "low", "#ffdb13"), (0, "very low", "#ff7d45"))


def confidence_arrays(out: dict) -> Dict[str, Optional[np.ndarray]]:
    """pLDDT ``[N]``, and pTM ``[]``, PAE ``[N, N]``, max PAE ``[]`` (or None) of an
    OpenFold output dict, as float32 numpy arrays."""

    def get(key):
        value = out.get(key)
        return None if value is None else value.detach().float().cpu().numpy()

    return {
        "plddt": get("plddt"),
        "ptm": get("predicted_tm_score"),
        "pae": get("predicted_aligned_error"),
        "max_pae": get("max_predicted_aligned_error"),
    }


def confidence_report(record_id: str, pred: dict, model_label: str, random_weights: bool) -> dict:
    """The content of ``<name>_confidence.json`` for a prediction of :func:`confidence_arrays`."""
    plddt = pred["plddt"]
    report = {
        "schema": SCHEMA,
        "id": record_id,
        "model": model_label,
        "random_weights": random_weights,
        "mean_plddt": round(float(plddt.mean()), 3),
        "plddt": [round(float(x), 2) for x in plddt],
        "ptm": None,
        "max_pae": None,  # the head's ceiling (AlphaFold's max_predicted_aligned_error)
        "mean_pae": None,
        "pae": None,
    }
    if pred.get("ptm") is not None:
        report["ptm"] = round(float(pred["ptm"]), 4)
    if pred.get("pae") is not None:
        report["max_pae"] = round(float(pred["max_pae"]), 3)
        report["mean_pae"] = round(float(pred["pae"].mean()), 3)
        report["pae"] = [[round(float(x), 2) for x in row] for row in pred["pae"]]
    return report


def _save(fig, path: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return write_atomic(path, buffer.getvalue(), mode="wb")


def plot_plddt(path: str, plddt: np.ndarray, title: str) -> str:
    """PNG of per-residue pLDDT ``[N]`` over AlphaFold's confidence bands."""
    from matplotlib.figure import Figure  # a bare Figure draws with Agg, no GUI backend
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 3.2), dpi=110)
    ax = fig.subplots()
    residues = np.arange(1, len(plddt) + 1)
    top = 100
    for low, name, colour in PLDDT_BANDS:
        ax.axhspan(low, top, color=colour, alpha=0.15, lw=0, label=f"{name} ({low}-{top})")
        top = low
    ax.plot(residues, plddt, color="black", lw=1.2)
    ax.set_xlim(1, max(2, len(plddt)))
    ax.set_ylim(0, 100)
    ax.set_xlabel("residue")
    ax.set_ylabel("pLDDT")
    ax.legend(loc="lower right", fontsize=7, ncol=4)
    ax.set_title(title, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return _save(fig, path)


def plot_pae(path: str, pae: np.ndarray, max_pae: float, title: str) -> str:
    """PNG of the predicted aligned error ``[N, N]`` (angstroms), 0 to ``max_pae``."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(5.2, 4.4), dpi=110)
    ax = fig.subplots()
    n = pae.shape[0]
    image = ax.imshow(pae, cmap="Greens_r", vmin=0, vmax=max_pae, origin="upper",
                      extent=(0.5, n + 0.5, n + 0.5, 0.5))
    fig.colorbar(image, ax=ax, label="expected position error (A)")
    ax.set_xlabel("scored residue")
    ax.set_ylabel("aligned residue")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(textwrap.fill(title, 70), fontsize=7)
    fig.tight_layout()
    return _save(fig, path)
