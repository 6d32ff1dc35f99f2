"""The bf16 fidelity section of ``bench/results/REPORT.md`` (``fidelity.json``, from
``bench.fidelity``): stock OpenFold and Flashlight in bf16, each against the same model in
IEEE float32."""
from __future__ import annotations

import json
import pathlib
import statistics

TITLES = {"stock_bf16": "stock bf16", "flashlight_bf16": "Flashlight bf16"}
COLUMNS = ("rms_atom_deviation_A", "max_atom_deviation_A", "max_plddt_difference", "single_relative_rms",
           "pair_relative_rms")


def _value(cell: dict, key: str) -> str:
    return f"{cell[key]:.3g}" if key in cell else "–"


def fidelity_lines(results: pathlib.Path) -> list[str]:
    """The section's lines, or none when ``fidelity.json`` does not exist."""
    path = results / "fidelity.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    cells = [c for c in data["cells"] if c.get("status") == "ok"]
    run = data["runs"][-1]
    lines = ["## bf16 fidelity", "",
             "Each variant in bf16 against the same `model_1` (seeded random weights, 512 MSA and 5120 extra "
             "rows, one pass, unchunked) in IEEE float32, same inputs, same frame (`bench/fidelity.py`): atom "
             "RMS and max deviation (Å), max pLDDT difference, and the relative RMS deviation of the trunk's "
             f"final single and pair representations; {run.get('gpu')}, torch {run.get('torch')}, "
             f"Triton {run.get('triton')}.", "",
             "| N_res | seed | variant | atom RMS Å | atom max Å | pLDDT max | single rel. | pair rel. |",
             "|---|---|---|---|---|---|---|---|"]
    for c in sorted(cells, key=lambda c: (c["n_res"], c.get("seed", 0), c["variant"] != "stock_bf16")):
        lines.append(f"| {c['n_res']} | {c.get('seed', 0)} | {TITLES.get(c['variant'], c['variant'])} | "
                     + " | ".join(_value(c, k) for k in COLUMNS) + " |")
    lines += ["", *_medians(cells), ""]
    return lines


def _medians(cells: list[dict]) -> list[str]:
    """One line per length: each variant's median over seeds of the atom RMS deviation."""
    out = []
    for n in sorted({c["n_res"] for c in cells}):
        parts = []
        for variant, title in TITLES.items():
            values = [c["rms_atom_deviation_A"] for c in cells if c["n_res"] == n and c["variant"] == variant]
            if values:
                parts.append(f"{title} {statistics.median(values):.3g} Å over {len(values)} seed(s)")
        out.append(f"- N_res {n}, median atom RMS deviation from float32: " + "; ".join(parts) + ".")
    return out
