"""The long-chain section of ``bench/results/REPORT.md`` and its row in the README summary
(``long_chain.json``, from ``bench.long_chain``): the longest single chain that folds on
one GPU, Flashlight against stock OpenFold's low-memory settings."""
from __future__ import annotations

import pathlib

from bench.report import _latest_cells, chunk_text, untuned_chunks

FILE = "long_chain.json"
TITLES = {
    "flashlight": "Flashlight, unchunked",
    "flashlight_chunked": "Flashlight, preset chunk size outside attention",
    "flashlight_recycle": "Flashlight, unchunked, 4 iterations",
    "stock_chunked": "stock, preset chunk size",
    "stock_lma": "stock, preset chunk size and LMA",
}
FLASHLIGHT_MODES = ("flashlight", "flashlight_chunked")  # the one-pass modes; a row takes the faster
STOCK_MODES = ("stock_chunked", "stock_lma")


def _cells(results: pathlib.Path) -> tuple[list[dict], dict]:
    """The newest cell of each (N_res, mode) in table order, and the newest run's description."""
    cells, runs = _latest_cells(results, FILE, lambda c: (c["n_res"], c["mode"]))
    cells.sort(key=lambda c: (c["n_res"], list(TITLES).index(c["mode"])))
    return cells, (runs[-1] if runs else {})


def _result(cell: dict) -> str:
    if cell["status"] == "ok":
        return f"{cell['ms'] / 1e3:.1f}"
    return cell["status"]


def long_chain_lines(results: pathlib.Path) -> list[str]:
    """The REPORT section, or none without results."""
    cells, run = _cells(results)
    if not cells:
        return []
    lines = ["## Long chains", "",
             "`model_1` (seeded random weights, templates off, 512 MSA and 5120 extra-MSA rows, float32 with "
             "TF32) on a synthetic chain of N_res residues, one pass unless stated (`bench/long_chain.py`); "
             "times are of a call after an untimed first one (Flashlight compiles in it; OpenFold's "
             "chunk-size tuner tries its chunk sizes); cells marked \"tuner off\" ran every layer at the "
             "preset's chunk size and stock only once, before the benchmark kept OpenFold's tuner on: not stock "
             "at its best, so no speed-up is quoted against them. "
             f"{run.get('gpu')}, torch {run.get('torch')}, Triton {run.get('triton')}.", "",
             "| N_res | mode | pass s | first call s | peak GiB | finite | note |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        note = " ".join(c.get("message", "").split())[:160] + chunk_text(c).strip(" ()")
        if c.get("tuned_chunk_sizes"):
            note += ": " + ", ".join(f"{k} {v}" for k, v in sorted(c["tuned_chunk_sizes"].items()))
        measured = (f"{c['first_call_s']:.1f} | {c['peak_gib']:.1f}" if c["status"] == "ok" else "– | –")
        lines.append(f"| {c['n_res']} | {TITLES.get(c['mode'], c['mode'])} | {_result(c)} | {measured} | "
                     f"{c.get('finite', '–')} | {note} |")
    return lines + [""]


def summary_rows(results: pathlib.Path) -> list[str]:
    """The README summary's long-chain rows: per length, Flashlight's fastest one-pass mode
    against stock's fastest low-memory setting, where both ran; the speed-up only against
    stock with its chunk-size tuner on (:func:`bench.report.untuned_chunks`)."""
    cells, _ = _cells(results)
    ok = {(c["n_res"], c["mode"]): c for c in cells if c["status"] == "ok"}
    rows = []
    for n in sorted({c["n_res"] for c in cells}):
        fl = [ok[(n, m)] for m in FLASHLIGHT_MODES if (n, m) in ok]
        stock = [ok[(n, m)] for m in STOCK_MODES if (n, m) in ok]
        if not fl or not stock:
            continue
        tuned = [c for c in stock if not untuned_chunks(c)]
        best, peer = min(fl, key=lambda c: c["ms"]), min(tuned or stock, key=lambda c: c["ms"])
        short = "stock" + (", LMA" if peer["mode"] == "stock_lma" else "") + chunk_text(peer)
        speed = f"{peer['ms'] / best['ms']:.2f}×" if tuned else "–"
        rows.append(f"| `model_1`, N_res {n}, long chain | fp32 (TF32) | {best['ms']:.0f} "
                    f"({best['peak_gib']:.0f} GiB) | {short} {peer['ms']:.0f} "
                    f"({peer['peak_gib']:.0f} GiB) | {speed} |")
    return rows
