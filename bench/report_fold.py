"""The README's rows for the fold a user runs: ``bench.fold_product`` results.

``bench/results/fold_product_runs/*.json`` hold rows of ``flashlight-fold --compare`` on
synthetic records (one row per record, dtype and cache state). The summary shows, per
record size, MSA and dtype, the newest row measured with empty caches (what a first fold
on a new machine sees) and the first call of its partner row with the caches filled.
Only rows of the fold's current default path count: Flashlight active with its stacks
replayed as CUDA graphs (rows from before that default measured another program).
"""
from __future__ import annotations

import json
import pathlib

SCHEMA = "flashlight-bench-fold-product/1"
FOLDER = "fold_product_runs"
DTYPE_TITLES = {"bf16": "bf16", "fp32": "fp32 (TF32)"}
MSA_TITLES = {"deep": "deep MSA", "single": "one sequence"}


def load_fold_rows(results: pathlib.Path) -> list[dict]:
    """Every finished row of every fold-product file under ``results``, each with the
    name of its file under ``"file"``."""
    rows = []
    for path in sorted((pathlib.Path(results) / FOLDER).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            continue
        rows += [{**row, "file": path.name} for row in data.get("rows", []) if _current(row)]
    return rows


def _current(row: dict) -> bool:
    """A finished row of the default fold: Flashlight active, its stacks CUDA-graphed (a
    ``solo`` row: its Flashlight process compiled in a warm-up, which only an active
    patch does)."""
    if row.get("cache") == "solo":
        return row.get("status") == "ok" and bool(row.get("flashlight_warmup_compile"))
    patch = row.get("flashlight") or {}
    return row.get("status") == "ok" and bool(patch.get("active")) and patch.get("cuda_graphs", 0) > 0


def _key(row: dict) -> tuple:
    return row["length"], row["msa"], row["dtype"]


def newest_pairs(rows: list[dict]) -> list[tuple[dict, dict | None]]:
    """Per (length, MSA, dtype): the newest row with empty caches, and the row with
    filled caches that followed it in the same file and warm-up mode (or None)."""
    cold: dict[tuple, dict] = {}
    for row in rows:
        if row.get("cache") == "cold" and row.get("measured_at", "") >= cold.get(_key(row), {}).get("measured_at", ""):
            cold[_key(row)] = row
    pairs = []
    for key in sorted(cold, key=lambda k: (k[1] != "deep", k[0], k[2])):
        first = cold[key]
        warm = [r for r in rows if r.get("cache") == "warm" and _key(r) == key and r["file"] == first["file"]
                and r.get("warmup_compile_setting") == first.get("warmup_compile_setting")
                and r.get("measured_at", "") >= first.get("measured_at", "")]
        pairs.append((first, min(warm, key=lambda r: r["measured_at"]) if warm else None))
    return pairs


def newest_solo(rows: list[dict]) -> dict[tuple, dict]:
    """Per (length, MSA, dtype): the newest ``solo`` row (each variant alone, cold)."""
    solo: dict[tuple, dict] = {}
    for row in rows:
        if row.get("cache") == "solo" and row.get("measured_at", "") >= solo.get(_key(row), {}).get("measured_at", ""):
            solo[_key(row)] = row
    return solo


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def fold_rows(rows: list[dict]) -> list[str]:
    """Summary-table rows: Flashlight's model time against stock's in the same process,
    for the process with empty caches and the one after it with them filled (times and
    speed-ups of both, in that order: the passes are bound by the host at 256 residues
    and vary between processes), and the first calls."""
    lines = []
    solo = newest_solo(rows)
    for cold, warm in newest_pairs(rows):
        length, msa, dtype = _key(cold)
        label = f"`flashlight-fold`, N_res {length}, {MSA_TITLES.get(msa, msa)}"
        both = [r for r in (cold, warm) if r is not None]
        inline = (cold.get("flashlight_warmup_compile") or {}).get("mode") == "inline"
        alone = solo.get(_key(cold))
        if alone is not None:  # what a first run waits for: each variant alone, cold
            first = f"alone {_ms(alone['stock_first_fold_s'])} / {_ms(alone['flashlight_first_fold_s'])}"
        else:
            first = (f"first call{' (inline warm-up)' if inline else ''}: stock {_ms(cold['stock_first_call_s'])}, "
                     f"Flashlight {_ms(cold['flashlight_first_call_s'])}")
        if warm is not None:
            first += f"; warm {_ms(warm['flashlight_first_call_s'])}"
        flashlight = ", ".join(_ms(r["flashlight_model_s"]) for r in both)
        stock = ", ".join(_ms(r["stock_model_s"]) for r in both)
        speed = ", ".join(f"{r['stock_model_s'] / r['flashlight_model_s']:.2f}×" for r in both)
        lines.append(f"| {label} | {DTYPE_TITLES.get(dtype, dtype)} | {flashlight} | stock {stock}; {first} "
                     f"| {speed} |")
    return lines


CAPTION = ("Fold rows: the command a user runs (`flashlight-fold RECORD --compare [--dtype bf16]`, "
           "`bench/fold_product.py`), `model_1` with seeded random weights, 4 recycling iterations, synthetic "
           "records (5632-row MSA, or none); model time of the timed pass with empty caches, then filled; alone: "
           "stock / Flashlight, each in a fresh process with empty caches, time to its first structure (warm-up "
           "plus pass); first call: the warm-up pass of one iteration; warm: Flashlight's, caches filled.")
