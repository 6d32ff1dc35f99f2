"""Plots, tables and the README's "Benchmarks" section, from the measured results.

    python -m bench.report                # plots + bench/results/REPORT.md + README section
    python -m bench.report --summary      # a short text table of the latest results
    python -m bench.report --no-readme    # leave README.md alone

Reads every ``kernels_*.json`` and ``evoformer*.json`` under ``bench/results/`` (smoke-test
files excluded); when a cell was measured more than once, the latest measurement counts.
Runs on the CPU: nothing here measures anything, and with no result files it says so.

- ``bench/results/REPORT.md``: every cell (all tables, the end-to-end and per-module
  times), every case where Flashlight is slower than a peer or fails with a hypothesis
  for why, the peers not measured, and the plots (``bench/results/plots/*.png``,
  drawn by ``bench.report_plots``).
- ``README.md`` between ``<!-- benchmarks:begin -->`` and ``<!-- benchmarks:end -->``
  (appended at the end the first time): one screen from ``bench.report_summary``, the
  machine, one summary table of headline cases, the losses grouped by cause, and a
  link to the report.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from bench.kernel_results import shape_label

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"

IMPLS = ("flashlight", "eager", "torch_compile", "sdpa", "flex", "flex_flash", "cuequivariance", "trifast",
         "ds4sci")
IMPL_TITLES = {"flashlight": "Flashlight", "eager": "eager", "torch_compile": "torch.compile",
               "sdpa": "SDPA (bias)", "flex": "FlexAttention", "flex_flash": "FlexAttention (FLASH)",
               "cuequivariance": "cuEquivariance", "trifast": "trifast", "ds4sci": "DS4Sci"}
EVOFORMER = ("msa_row_pair_bias", "msa_column", "triangle_start", "triangle_end")
BLOCK_MASK = ("causal_tril", "causal_triu", "causal_index", "alibi", "sliding_window", "prefix_lm", "document_mask",
              "attention_sinks")
HEAD_WIDTH_KEYS = ("D", "Dv", "c")  # the catalog's names for the widths a head's dots run over
DTYPE_TITLES = {"bf16": "bf16", "tf32": "fp32 (TF32)", "fp32": "fp32 (TF32 off)"}  # TF32 off: IEEE or three TF32 products
MODE_TITLES = {"stock": "stock", "compile": "torch.compile per block", "flashlight": "Flashlight",
               "flashlight-block": "Flashlight, whole blocks",
               "ds4sci": "stock + DS4Sci", "cueq": "stock + cuEquivariance"}


# ---------------------------------------------------------------------------- loading


def _latest_cells(results: pathlib.Path, patterns: str | tuple[str, ...], key) -> tuple[list[dict], list[dict]]:
    """The latest cell per ``key(cell)`` over every result file matching one of
    ``patterns`` (``rglob`` patterns), each with its run's metadata (``_run``), file
    name (``_file``) and the key's other ok cells (``_others``, annotated alike), plus all runs."""
    latest: dict[tuple, dict] = {}
    every: dict[tuple, list[dict]] = {}
    runs: list[dict] = []
    patterns = (patterns,) if isinstance(patterns, str) else patterns
    for path in sorted({p for pattern in patterns for p in results.rglob(pattern)}):
        if "smoke" in path.name:
            continue
        data = json.loads(path.read_text())
        file_runs = {r["id"]: r for r in data.get("runs", [])}
        runs.extend(data.get("runs", []))
        for c in data.get("cells", []):
            cell = {**c, "_run": file_runs.get(c.get("run"), {}), "_file": path.name}
            every.setdefault(key(c), []).append(cell)
            old = latest.get(key(c))
            if old is None or c.get("measured_at", "") >= old.get("measured_at", ""):
                latest[key(c)] = cell
    for k, cell in latest.items():
        cell["_others"] = [c for c in every[k] if c is not cell and c.get("status") == "ok"]
    return list(latest.values()), runs


def load_kernels(results: pathlib.Path) -> tuple[dict, list[dict]]:
    """Latest cell per (variant, shape, dtype, impl), each with its run's metadata."""
    def key(c):
        return (c["variant"], json.dumps(c["shape"], sort_keys=True), c["dtype"], c["impl"])

    cells, runs = _latest_cells(results, "kernels_*.json", key)
    return {key(c): c for c in cells}, runs


def load_evoformer(results: pathlib.Path, everything: bool = False) -> tuple[list[dict], list[dict]]:
    """Latest cell per (scope, n_res, mode, sizes, dtype) over every ``evoformer*.json``;
    unless ``everything``, only the TF32 cells of stock, compile and Flashlight (the
    tables' columns; bf16 and the peer modes are left to their own tables)."""
    def key(c):
        return (c["scope"], c["n_res"], c["mode"], c.get("n_seq"), c.get("n_extra"), c.get("iters"), c.get("blocks"),
                c.get("dtype", "tf32"))

    # block_scope/: the same benchmark's runs of whole-block compilation
    cells, runs = _latest_cells(results, ("evoformer*.json", "block_scope/*.json"), key)
    if not everything:
        cells = [c for c in cells if c.get("dtype", "tf32") == "tf32" and c["mode"] in E2E_MODES]
    return cells, runs


# the modes of the end-to-end tables: Flashlight at both scopes of patch_openfold
E2E_MODES = ("stock", "compile", "flashlight", "flashlight-block")


def best_flashlight(modes: dict[str, dict]) -> tuple[str, dict | None]:
    """The faster of Flashlight's scopes that ran (attention cores, whole blocks):
    ``(mode, cell)``; the cores' cell (or None) when neither has a time."""
    timed = [(modes[m]["ms"], m) for m in ("flashlight", "flashlight-block")
             if modes.get(m) is not None and modes[m]["status"] == "ok"]
    if not timed:
        return "flashlight", modes.get("flashlight")
    mode = min(timed)[1]
    return mode, modes[mode]


def cases(latest: dict) -> dict[tuple, dict[str, dict]]:
    """(variant, shape json, dtype) -> {impl: cell}, in the order first measured."""
    out: dict[tuple, dict[str, dict]] = {}
    for (variant, shape, dtype, impl), cell in latest.items():
        out.setdefault((variant, shape, dtype), {})[impl] = cell
    return out


# ---------------------------------------------------------------------------- formatting


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def cell_text(cell: dict | None) -> str:
    if cell is None:
        return "–"
    status = cell["status"]
    if status == "ok":
        return fmt_ms(cell["ms"])
    return {"oom": "OOM", "error": "error", "timeout": "timeout", "unavailable": "absent"}.get(status, status)


def case_shape(row: dict[str, dict]) -> str:
    """The shape of a case, its keys in the catalog's order."""
    return shape_label(next(iter(row.values()))["shape"])


def ratio(x: float) -> str:
    return f"{x:.2f}×" if x >= 0.01 else f"{x:.1e}×"


def ok_ms(cell: dict | None) -> float | None:
    return cell["ms"] if cell is not None and cell.get("status") == "ok" else None


def untuned_chunks(cell: dict | None) -> bool:
    """Whether ``cell`` ran chunked with OpenFold's chunk-size tuner off (cells measured
    before the benchmarks kept it on): every layer at the preset's chunk size, so not
    OpenFold at its best, and no ratio is quoted against it."""
    return bool(cell and cell.get("chunk_size") and not cell.get("chunk_tuner"))


def chunk_text(cell: dict) -> str:
    """What a cell's time ran with, after the time: nothing unchunked, else the chunk size
    and whether OpenFold's tuner raised it."""
    if not cell.get("chunk_size"):
        return ""
    return f" (chunk {cell['chunk_size']}, tuner off)" if untuned_chunks(cell) else \
        f" (chunk ≥ {cell['chunk_size']}, tuned)"


def hypothesis(variant: str, dtype: str, winner: str, row: dict[str, dict] | None = None) -> str:
    """A likely cause for Flashlight losing this case. A hypothesis to check (with
    FLASHLIGHT_DEBUG=2 and a profiler), not a measured fact. ``row`` (impl -> cell)
    adds what the case's own measurements show: tiles, padding, memory."""
    facts = _measured_facts(row or {}, winner)
    general = _general_hypothesis(variant, dtype, winner, materialized=bool(facts["materialized"]),
                                  tf32x3=three_products((row or {}).get("flashlight")))
    return "; ".join([*facts["flashlight"], general, *facts["materialized"]])


# float32 dots with TF32 off run as three TF32 products by default from this date on
THREE_PRODUCTS_SINCE = "2026-12-07"


def three_products(cell: dict | None) -> bool:
    """Whether a Flashlight float32 cell ran its dots as three TF32 products (measured
    since :data:`THREE_PRODUCTS_SINCE` without ``FLASHLIGHT_FP32_DOTS=ieee``)."""
    run = (cell or {}).get("_run") or {}
    dots = (run.get("flashlight_settings") or {}).get("FLASHLIGHT_FP32_DOTS", "tf32x3")
    return run.get("date", "") >= THREE_PRODUCTS_SINCE and dots == "tf32x3"


def loss_cause(variant: str, dtype: str, winner: str, materialized: bool = False, tf32x3: bool = False) -> str:
    """The kind of cause a loss to ``winner`` is put down to (a key of ``CAUSES``);
    ``tf32x3``: a float32 cell whose dots ran as three TF32 products."""
    if variant in KEY_PROLOGUE:
        return "key_prologue"
    if variant in WHOLE_MODULE:
        return "whole_module"
    if dtype == "fp32" and winner in ("flex", "torch_compile", "sdpa"):
        return "tf32x3" if tf32x3 else "ieee"
    if variant in ("triangle_end", "msa_column") and winner in ("flex", "sdpa", "cuequivariance", "trifast"):
        return "strided"
    if winner == "flex":
        return "block_mask" if variant in BLOCK_MASK else "flex_tuned"
    if winner in ("cuequivariance", "trifast"):
        return "hand_written"
    if winner == "torch_compile":
        return "compile_cublas" if materialized else "compile_sdpa"
    return {"sdpa": "sdpa_tuned", "eager": "eager"}.get(winner, "unknown")


# variants whose keys are computed by a prologue fused into their loads (rotary embeddings)
KEY_PROLOGUE = {"rotary"}
# variants timed as a whole module, projections included (global column attention)
WHOLE_MODULE = {"global_column"}


# cause -> one line for the README's list of losses (the per-case text is _general_hypothesis)
CAUSES = {
    "failed": "Flashlight did not run (error, out of memory or timeout; messages in the report)",
    "ieee": "IEEE float32 (before the three-TF32 default): `tl.dot` on CUDA cores",
    "tf32x3": "float32 as three TF32 products at head width 128 (64x64 tiles chosen)",
    "strided": "attention along a strided dim (triangle end, MSA column): the peer's wrapper copies q, k, v "
               "contiguous first, Flashlight's kernel reads the strided views",
    "block_mask": "masks that skip key tiles: Flex builds its block mask outside the timing, Flashlight's "
                  "programs find live tiles at run time",
    "flex_tuned": "FlexAttention's template, autotuned per shape",
    "compile_sdpa": "plain attention, which torch.compile maps onto PyTorch's SDPA flash kernel",
    "compile_cublas": "torch.compile's cuBLAS matmuls around a fused softmax (scores materialised)",
    "sdpa_tuned": "SDPA's hand-written memory-efficient (CUTLASS) kernel",
    "hand_written": "a hand-written kernel specialised for the layout (cuEquivariance, trifast)",
    "eager": "eager cuBLAS / cuDNN calls at small sizes (launch and tiling overheads)",
    "key_prologue": "keys' rotary embeddings recomputed by every query block (measured before they left "
                    "the loop: H100 0.733 -> 0.427 ms, Flex 0.468)",
    "whole_module": "global column attention as a whole module: projections and gate outside the kernels, "
                    "whose attention runs a program per column and head without `tl.dot`",
    "unknown": "other",
}


def _general_hypothesis(variant: str, dtype: str, winner: str, materialized: bool, tf32x3: bool = False) -> str:
    cause = loss_cause(variant, dtype, winner, materialized, tf32x3)
    if cause == "tf32x3":
        return ("float32 dots as three TF32 tensor-core products (each operand split into a high and a "
                "low part), where autotuning chose 64x64 tiles with 4 warps and 2 stages at head width "
                "128 (over 128x64 with 8 warps) and reached 56-61% of the float32 roofline, SDPA's "
                "float32 kernel 87-89%")
    if cause == "ieee":
        ieee = ("IEEE float32 dot products run on CUDA cores, where Triton's code for `tl.dot` "
                "reaches a quarter to a third of the measured SGEMM rate where it loses (FL % roofline), "
                "while torch.compile and "
                "SDPA hand the two matmuls to cuBLAS / CUTLASS float32 kernels (materialising the "
                "scores, which at these sizes costs less than the slower dots); the smaller tiles "
                "for such kernels removed the register spills (c 128: 7.02 -> 2.89 ms) but not this gap")
        if variant in ("vanilla", "softcap"):
            ieee += ("; with no mask there are no key tiles to skip (the causal, prefix and ALiBi "
                     "kernels skip about half and win from 4k keys), so it loses at every length; "
                     "softcap's tanh adds only 3-5% to vanilla's time")
        return ieee
    if cause == "strided":
        return ("this variant attends along a strided dim of its inputs (the transposed pair "
                "representation / the MSA's sequence dim): the winner's wrapper first copies q, k, v "
                "into a contiguous layout, while a kernel reading the strided views directly makes "
                "uncoalesced loads")
    if cause == "block_mask":
        return _block_mask_hypothesis(variant)
    return {
        "flex_tuned": "FlexAttention's template is autotuned per shape (tile sizes, warps, stages)",
        "sdpa_tuned": "the hand-written memory-efficient (CUTLASS) kernel is better tuned for this shape",
        "hand_written": f"{IMPL_TITLES.get(winner, winner)}'s hand-written kernel is specialised for this layout "
                        "and size",
        "compile_cublas": "torch.compile runs the two matmuls as cuBLAS calls on tensor cores around "
                          "Inductor's fused softmax, which at this size outruns the generated kernel",
        "compile_sdpa": "default torch.compile pattern-matches this plain attention onto PyTorch's fused "
                        "SDPA (flash) kernel, hand-written CUDA; Flashlight's generated Triton kernel with "
                        "its eight autotuning candidates reaches less of the roofline here",
        "eager": "eager cuBLAS/cuDNN calls win at this size: launch and tiling overheads dominate",
        "key_prologue": "the rotation of the keys is fused into their loads, so each of the L / BLOCK_M "
                        "query-block programs of a head loads both halves of every key tile and the cos / sin "
                        "tables again and rotates them; the peer rotates q and k once in PyTorch and its kernel "
                        "loads plain tiles (the gap grows with the length: 1.24x at 256, 1.59x at 4096)",
        "whole_module": "the k, v, gate and output projections and the gate's sigmoid run as separate "
                        "kernels (Inductor's, or cuBLAS), and the attention kernel computes the pooled "
                        "query's projection itself, so its grid is a program per column and head that "
                        "reloads the shared keys and values for each head without `tl.dot`; torch.compile "
                        "fuses the same module into fewer, larger kernels",
    }.get(cause, "unknown")


def _measured_facts(row: dict[str, dict], winner: str) -> dict[str, list[str]]:
    """What the cells of one case show about why Flashlight is slower there."""
    fl, peer = row.get("flashlight") or {}, row.get(winner) or {}
    on_flashlight = []
    tile_configs = [c for c in fl.get("configs") or () if c != "eager"]  # "eager": the unfused graph ran
    if any(c[3] == 1 for c in tile_configs):
        tiles = ", ".join(f"{m}x{n}" for m, n, _, stages in tile_configs if stages == 1)
        on_flashlight.append(
            f"no regular tile candidate fitted in shared memory at these head widths, so the kernel "
            f"ran on the one-stage small tiles tried then ({tiles}; "
            f"{_pct(fl.get('roofline_frac'))} of roofline)")
    padded = {k: v for k, v in (fl.get("shape") or {}).items()
              if k in HEAD_WIDTH_KEYS and isinstance(v, int) and v & (v - 1)}
    for key, width in padded.items():
        tile = 1 << (width - 1).bit_length()
        on_flashlight.append(f"head width {key}={width} is not a power of two: the kernel's tiles span "
                             f"{tile} lanes, {tile / width - 1:.0%} more work on padding")
    materialized = []
    scores_mib, peer_mib = _scores_mib(fl), peer.get("peak_extra_mib")
    if scores_mib and peer_mib is not None and peer_mib >= scores_mib / 2:
        materialized.append(f"{IMPL_TITLES.get(winner, winner)} uses {peer_mib:.0f} MiB of extra memory "
                            f"(Flashlight {fl.get('peak_extra_mib', 0):.0f} MiB; the scores are about "
                            f"{scores_mib:.0f} MiB): it materializes them")
    return {"flashlight": on_flashlight, "materialized": materialized}


def _scores_mib(cell: dict) -> float | None:
    """About how much memory the case's scores take: its counted FLOPs are two per
    (query, key) pair and head-width lane, over ``q . k`` and ``p @ v``."""
    shape, flops = cell.get("shape") or {}, cell.get("flops")
    width = shape.get("c") or shape.get("D")
    if not flops or not width:
        return None
    pairs = flops / (2 * (width + shape.get("Dv", width)))
    return pairs * (2 if cell.get("dtype") == "bf16" else 4) / 2**20


def _pct(frac: float | None) -> str:
    return "?" if frac is None else f"{frac:.0%}"


def _block_mask_hypothesis(variant: str) -> str:
    """Why FlexAttention's block mask can beat Flashlight's run-time tile skipping."""
    common = ("both skip dead key tiles and run full tiles without the mask; FlexAttention reads "
              "a block mask built once per mask input (not timed), while each Flashlight program "
              "first finds its live tile range at run time, 16 key tiles per step and then tile by "
              "tile over the blocks that step leaves (the coarse step: document mask L16384 D128 "
              "3.04 -> 1.22 ms, causal L16384 1.94 -> 1.67 ms)")
    if variant == "document_mask":
        return (common + "; the mask is data (document ids), so that search is a serial chain of "
                "small loads, comparable to the handful of live tiles each program then computes")
    if variant == "sliding_window":
        return (common + "; with a 16-token window each program has one or two live tiles, so "
                "its fixed work (the search, loading q, writing the output) is as large as the "
                "attention itself")
    return (common + "; here the mask is index arithmetic, so the search is a few scalar steps "
            "and the rest of the gap is the tile loop (45-48% of roofline at 4k-16k keys, Flex "
            "about 50%; Flex autotunes more tile shapes). At 256 keys near-identical kernels "
            "measured 0.069-0.105 ms in one run, which points to autotuning's choice; the cells "
            "now record the configuration each kernel ran with")


# ---------------------------------------------------------------------------- tables


def machine_lines(runs: list[dict]) -> list[str]:
    if not runs:
        return []
    gpus = sorted({r.get("gpu") or r.get("device", "?") for r in runs})
    drivers = sorted({str(r.get("driver")) for r in runs if r.get("driver")})
    torches = sorted({r.get("torch", "?") for r in runs})
    tritons = sorted({r.get("triton", "?") for r in runs})
    dates = sorted(r.get("date", "")[:10] for r in runs if r.get("date"))
    when = (f", {dates[0]}" + (f" to {dates[-1]}" if dates[-1] != dates[0] else "")) if dates else ""
    lines = [f"Measured on {', '.join(gpus)} (driver {', '.join(drivers) or '?'}), torch {', '.join(torches)}, "
             f"Triton {', '.join(tritons)}{when}."]
    roofs = [r["roofline"] for r in runs if r.get("roofline")]
    if roofs:
        def med(k):
            xs = sorted(r[k] for r in roofs)
            return xs[len(xs) // 2]
        lines.append(
            f"Roofline measured in the same runs (median over {len(roofs)} run(s)): copy "
            f"{med('copy_tb_per_s'):.2f} TB/s, matmul bf16 {med('bf16_tflop_per_s'):.0f}, TF32 "
            f"{med('tf32_tflop_per_s'):.0f}, IEEE fp32 {med('fp32_tflop_per_s'):.1f} TFLOP/s.")
    return lines


def kernel_table(case_map: dict, keys: list[tuple], impls: tuple[str, ...]) -> list[str]:
    present = [i for i in impls if any(i in case_map[k] for k in keys)]
    head = ["variant", "shape", "dtype"] + [IMPL_TITLES[i] for i in present] + [
        "floor", "FL % roofline", "FL vs best peer", "FL max rel err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        variant, shape, dtype = k
        row = case_map[k]
        fl = row.get("flashlight")
        fl_ms = ok_ms(fl)
        peers = {i: ok_ms(row.get(i)) for i in present if i != "flashlight" and ok_ms(row.get(i)) is not None}
        texts = []
        best = min(peers.values()) if peers else None
        for i in present:
            t = cell_text(row.get(i))
            ms = ok_ms(row.get(i))
            if ms is not None and fl_ms is not None and ms == min([fl_ms, *peers.values()]):
                t = f"**{t}**"
            if i == "flashlight" and fl_ms is not None and (fl.get("kernels") == 0 or fl.get("fallback_ops")):
                t += " (unfused)" if fl.get("kernels") == 0 else " (+fallback ops)"
            texts.append(t)
        floor = next((c.get("floor_ms") for c in row.values() if c.get("floor_ms")), None)
        frac = f"{100 * fl['roofline_frac']:.0f}%" if fl_ms is not None and fl.get("roofline_frac") else "–"
        vs = ratio(best / fl_ms) if fl_ms and best else "–"
        err = f"{fl['max_rel_err']:.1e}" if fl_ms is not None and fl.get("max_rel_err") is not None else "–"
        lines.append("| " + " | ".join([variant, case_shape(row), DTYPE_TITLES.get(dtype, dtype),
                                         *texts, fmt_ms(floor), frac, vs, err]) + " |")
    return lines


COST_IMPLS = IMPLS[:5]  # Flashlight and the peers measured for every variant


def _cost(cell: dict | None, field: str, fmt: str) -> str:
    if cell is None or cell.get("status") != "ok" or cell.get(field) is None:
        return "–"
    return format(cell[field], fmt)


def cost_table(case_map: dict, keys: list[tuple]) -> list[str]:
    """Per case: Flashlight's TFLOP/s, and every implementation's peak extra memory and
    first-call time (compilation included)."""
    present = [i for i in COST_IMPLS if any(i in case_map[k] for k in keys)]
    names = " / ".join(IMPL_TITLES[i] for i in present)
    head = ["variant", "shape", "dtype", "FL TFLOP/s", f"peak extra MiB ({names})", f"first call s ({names})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        variant, _, dtype = k
        row = case_map[k]
        peak = " / ".join(_cost(row.get(i), "peak_extra_mib", ".0f") for i in present)
        first = " / ".join(_cost(row.get(i), "first_call_s", ".2f") for i in present)
        lines.append("| " + " | ".join([variant, case_shape(row), DTYPE_TITLES.get(dtype, dtype),
                                         _cost(row.get("flashlight"), "tflops", ".1f"), peak, first]) + " |")
    return lines


def losses(case_map: dict) -> list[dict]:
    """Every case where Flashlight is slower than FlexAttention, torch.compile or any other
    implementation measured, or did not run; one entry per case, slowest first."""
    out = []
    for (variant, _, dtype), row in case_map.items():
        fl = row.get("flashlight")
        if fl is None:
            continue
        label = f"{variant} [{case_shape(row)}] {DTYPE_TITLES.get(dtype, dtype)}"
        if fl["status"] != "ok":
            out.append({"case": label, "what": f"Flashlight {fl['status']}: {fl.get('message', '')[:160]}",
                        "why": "see the message", "variant": variant, "ratio": float("inf"), "cause": "failed"})
            continue
        faster = sorted((ms, impl) for impl, cell in row.items()
                        if impl != "flashlight" and (ms := ok_ms(cell)) is not None and ms < fl["ms"])
        if not faster:
            continue
        best_ms, winner = faster[0]
        what = f"Flashlight {fmt_ms(fl['ms'])} ms; faster: " + ", ".join(
            f"{IMPL_TITLES[i]} {fmt_ms(ms)} ms ({fl['ms'] / ms:.2f}×)" for ms, i in faster)
        materialized = bool(_measured_facts(row, winner)["materialized"])
        out.append({"case": label, "variant": variant, "peer": winner, "ratio": fl["ms"] / best_ms,
                    "what": what, "why": hypothesis(variant, dtype, winner, row),
                    "cause": loss_cause(variant, dtype, winner, materialized, three_products(fl))})
    return sorted(out, key=lambda d: -d["ratio"])


def build_report(latest: dict, kruns: list[dict], evo: list[dict], eruns: list[dict], plots: list[str],
                 training: list[str] = ()) -> str:
    """``REPORT.md``: the summary, then every table and loss; ``plots`` are image paths
    relative to it."""
    from bench import report_summary  # it builds on this module's tables

    case_map = cases(latest)
    lines = ["# Benchmark report", ""]
    lines += ["Generated by `python -m bench.report` from the raw results in `bench/results/` "
              "(JSON and CSV); reproduce them with `bench/run_all.sh` (see [bench/README.md](../README.md)). "
              "Forward pass only, median milliseconds of `triton.testing.do_bench`; **bold**: fastest; "
              "\"FL vs best peer\" > 1 means Flashlight is faster than every other implementation measured. "
              "Each implementation computes the whole variant as written in the catalog (`bench/variants_lm.py`, "
              "`bench/variants_lm_masked.py`, `bench/variants_evoformer.py`, `bench/variants_general.py`) "
              "(for the Evoformer attentions: both biases, softmax, `@ v` and the sigmoid gate). "
              "\"floor\": the roofline lower bound from the measured copy bandwidth and matmul rate; "
              "errors are against float64 eager; \"–\": not measured or not applicable; \"absent\": "
              "package not installed; \"(unfused)\": Flashlight generated no kernel and ran the graph "
              "eagerly, \"(+fallback ops)\": some operations ran outside its kernels.", ""]
    lines += machine_lines(kruns + eruns) + [""]
    table = report_summary.summary_table(case_map, evo)
    if table:
        lines += ["## Summary", ""] + table
    if case_map:
        lines += ["Losses by likely cause:", ""] + report_summary.loss_lines(case_map)
    evo_keys = [k for k in case_map if k[0] in EVOFORMER]
    lm_keys = [k for k in case_map if k[0] not in EVOFORMER]
    if evo_keys:
        lines += ["## Evoformer attention kernels", ""]
        if any("flex" in case_map[k] for k in evo_keys):
            lines += [report_summary.FLEX_EVOFORMER_NOTE, ""]
        lines += kernel_table(case_map, evo_keys, IMPLS) + [""]
    if lm_keys:
        lines += ["## Language-model attention variants", ""] + kernel_table(case_map, lm_keys, IMPLS[:5]) + [""]
    if case_map:
        lines += ["## Throughput, memory and first-call time", "",
                  "Peak extra memory: `torch.cuda.max_memory_allocated` during a call beyond what was allocated "
                  "before it (the output included); "
                  "first call: the untimed first call of a fresh compilation (Dynamo, lowering, Triton "
                  "compilation and autotuning included).", ""]
        lines += cost_table(case_map, evo_keys + lm_keys) + [""]
    from bench.report_evoformer import end_to_end_lines

    lines += end_to_end_lines(evo) + list(training) + _loss_table_lines(case_map) + _absent_lines(latest, kruns)
    lines += [f"![{pathlib.PurePosixPath(rel).stem}]({rel})" for rel in plots] + ([""] if plots else [])
    return "\n".join(lines)


def _loss_table_lines(case_map: dict) -> list[str]:
    if not case_map:
        return []
    loss = losses(case_map)
    lines = ["## Where Flashlight loses", ""]
    if not loss:
        return lines + ["In every measured case Flashlight was the fastest implementation.", ""]
    lines += ["Every measured case where another implementation is faster than Flashlight, or where "
              "Flashlight did not run; worst first. The causes are hypotheses, not measurements.", "",
              "| case | result (×: how much faster than Flashlight) | likely cause (fastest peer) |",
              "|---|---|---|"]
    return lines + [f"| {d['case']} | {d['what']} | {d['why']} |" for d in loss] + [""]


def _absent_lines(latest: dict, kruns: list[dict]) -> list[str]:
    # the newest run's list: a peer absent from an older run may have been measured since
    newest = max(kruns, key=lambda r: r.get("date", ""), default={})
    absent = dict(newest.get("absent_peers", {}))
    unavailable = sorted({c.get("message", "") for c in latest.values() if c["status"] == "unavailable"})
    if not absent and not unavailable:
        return []
    return ["Peers not measured: " + "; ".join([f"{k}: {v}" for k, v in absent.items()] + unavailable) + ".", ""]


def update_readme(readme: pathlib.Path, section: str) -> None:
    text = readme.read_text() if readme.exists() else ""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail.lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    readme.write_text(text)


def summary(latest: dict, evo: list[dict]) -> str:
    case_map = cases(latest)
    lines = []
    if case_map:
        impls = [i for i in IMPLS if any(i in row for row in case_map.values())]
        lines.append(f"{'variant':18s} {'shape':26s} {'dtype':5s} " + " ".join(f"{IMPL_TITLES[i][:10]:>10s}" for i in impls))
        for (variant, _, dtype), row in case_map.items():
            lines.append(f"{variant[:18]:18s} {case_shape(row)[:26]:26s} {dtype:5s} "
                         + " ".join(f"{cell_text(row.get(i)):>10s}" for i in impls))
    for c in evo:
        lines.append(f"{c['scope']:6s} N_res {c['n_res']:5d} {c['mode']:10s} "
                     + (f"{c['ms']:10.1f} ms" if c["status"] == "ok" else c["status"]))
    return "\n".join(lines) if lines else "no benchmark results yet"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(RESULTS), help="folder of result files (default: %(default)s)")
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="README whose section is rewritten")
    p.add_argument("--no-readme", action="store_true", help="leave the README alone")
    p.add_argument("--summary", action="store_true", help="print a short table and exit")
    args = p.parse_args(argv)
    results = pathlib.Path(args.results)
    latest, kruns = load_kernels(results)
    evo, eruns = load_evoformer(results)
    if args.summary:
        print(summary(latest, evo))
        return 0
    plots: list[pathlib.Path] = []
    if latest or evo:
        from bench.report_plots import plot_evoformer, plot_kernels

        plots_dir = results / "plots"
        plots_dir.mkdir(parents=True, exist_ok=True)
        plots = plot_kernels(cases(latest), plots_dir) + plot_evoformer(evo, plots_dir)
        rel = [os.path.relpath(p.resolve(), results.resolve()).replace(os.sep, "/") for p in plots]
        from bench.report_fidelity import fidelity_lines
        from bench.report_fold import noise_lines, warm_first_fold_lines
        from bench.report_long_chain import long_chain_lines
        from bench.report_new_forms import dropout_lines, new_forms_lines, sdpa_gate_lines
        from bench.report_peers import other_gpu_lines, peers_lines
        from bench.report_training import training_lines

        report = build_report(latest, kruns, evo, eruns, rel,
                              peers_lines(results) + training_lines(results) + fidelity_lines(results)
                              + long_chain_lines(results) + noise_lines(results)
                              + warm_first_fold_lines(results) + new_forms_lines(results)
                              + sdpa_gate_lines(results) + dropout_lines(results) + other_gpu_lines(results))
        (results / "REPORT.md").write_text(report.rstrip() + "\n")
    if not args.no_readme:
        from bench import report_long_chain
        from bench.report_fold import load_fold_rows
        from bench.report_peers import summary_rows
        from bench.report_summary import readme_section

        section = readme_section(latest, kruns, evo, eruns, load_fold_rows(results),
                                 summary_rows(results) + report_long_chain.summary_rows(results))
        update_readme(pathlib.Path(args.readme).resolve(), section)
    print(f"bench.report: {len(latest)} kernel cells, {len(evo)} end-to-end cells"
          + (f"; wrote {results / 'REPORT.md'}" if latest or evo else "")
          + ("" if args.no_readme else f"; updated the section of {args.readme}")
          + (f"; plots: {', '.join(p.name for p in plots)}" if plots else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
