"""REPORT.md's section on the attention forms fused whole (``bench.new_forms`` results)."""
from __future__ import annotations

import json
import pathlib

IMPLS = ("eager", "torch_compile", "flex", "flashlight")


def _cell(cell: dict | None) -> str:
    if cell is None:
        return "–"
    if "ms" not in cell:
        return f"error ({cell['error'].split(':')[0]})"
    return f"{cell['ms']:.3f} ({cell['peak_mib_above_inputs']:.0f})"


def _choice(row: dict) -> str:
    """What Flashlight's autotuner kept for each kernel: its tile or the unfused graph."""
    picks = []
    for event in row.get("flashlight_tuning", []):
        choice = event["choice"]
        if isinstance(choice, dict):
            choice = f"{choice['BLOCK_M']}x{choice['BLOCK_N']} w{choice['num_warps']} s{choice['num_stages']}"
        else:
            choice = f"unfused graph ({event['eager_ms']:.3f} ms; kernel {event['kernel_ms']:.3f} ms)"
        picks.append(choice)
    return "; ".join(picks) or "–"


def new_forms_lines(results: pathlib.Path) -> list[str]:
    data = _loaded(results, "new_forms.json")
    if data is None:
        return []
    meta = data["meta"]
    lines = ["", "## Forms fused whole: talking heads, absorbed latent attention, disentangled scores", "",
             f"`python -m bench.new_forms` on {meta['gpu']}, torch {meta['torch']}, Triton {meta['triton']}, "
             f"{meta['date'][:10]}, sources {meta['flashlight_source_digest']}, {meta['dtype']}: median ms (peak MiB "
             "allocated above the inputs); Flashlight's kernels and what its autotuner kept for each "
             "(a tile configuration, or the unfused graph where that timed faster); FlexAttention "
             "(`FLEX_FORMS` in `bench/new_forms.py`, compiled whole) where it can express the form.", "",
             "| form | B x H x L x D | eager | torch.compile | FlexAttention | Flashlight | FL vs fastest other "
             "| kernels (outside) | autotuner kept |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        cells = [_cell(row.get(i)) for i in IMPLS]
        best_other = min(row[i]["ms"] for i in IMPLS[:-1] if "ms" in row.get(i, {}))
        outside = ", ".join(row["flashlight_outside"]) or "nothing"
        lines.append(f"| {row['form']} | {row['B']}x{row['H']}x{row['L']}x{row['D']} | {' | '.join(cells)} "
                     f"| {best_other / row['flashlight']['ms']:.2f}× | {len(row['flashlight_kernels'])} ({outside}) "
                     f"| {_choice(row)} |")
    return lines + [""]


def sdpa_gate_lines(results: pathlib.Path) -> list[str]:
    """The section on SDPA with an additive mask and a sigmoid gate (``bench.sdpa_gate``)."""
    data = _loaded(results, "sdpa_gate.json")
    if data is None:
        return []
    meta, forms = data["meta"], ("eager", "torch_compile", "flashlight")
    lines = ["", "## SDPA with a mask and a gate, compiled whole", "",
             f"`python -m bench.sdpa_gate --profile` on {meta['gpu']}, torch {meta['torch']}, Triton "
             f"{meta['triton']}: `sdpa(q, k, v, attn_mask) * sigmoid(g)` in bf16, median ms of `do_bench` "
             "(kernels per call from `torch.profiler` / host time to issue one call, calls back to back).", "",
             "| B x H x L x D | eager | torch.compile | Flashlight | FL vs fastest other | Flashlight kernels |",
             "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        cells = []
        for form in forms:
            cell = row[form]
            extra = f" ({cell['kernel_ms']:.3f} / {cell['host_ms']:.3f})" if "kernel_ms" in cell else ""
            cells.append(f"{cell['ms']:.3f}{extra}")
        best_other = min(row[f]["ms"] for f in forms[:-1])
        lines.append(f"| {row['B']}x{row['H']}x{row['L']}x{row['D']} | {' | '.join(cells)} "
                     f"| {best_other / row['flashlight']['ms']:.2f}× | {row['flashlight_kernels']} |")
    return lines + [""]


def dropout_lines(results: pathlib.Path) -> list[str]:
    """The section on attention with dropout on its probabilities (``bench.dropout``)."""
    data = _loaded(results, "dropout.json")
    if data is None:
        return []
    env, forms = data["environment"], ("eager", "torch_compile", "sdpa", "flashlight")
    lines = ["", "## Attention with dropout, forward + backward", "",
             f"`python -m bench.dropout` on {env.get('gpu') or env.get('device')}, torch {env['torch']}, Triton "
             f"{env['triton']}: `dropout(softmax(q k^T / sqrt(D) + bias), {data['config']['p']}) @ v` in "
             "training mode, forward and backward, median ms (peak MiB); FlexAttention has no dropout.", "",
             "| B x H x L x D | eager | torch.compile | SDPA (dropout_p) | Flashlight | FL vs fastest other |",
             "|---|---|---|---|---|---|"]
    for row in data["results"]:
        cells, times = [], {}
        for form in forms:
            cell = row.get(form, {})
            if "ms" in cell:
                times[form] = cell["ms"]
                peak = f" ({cell['peak_mib']:.0f})" if cell.get("peak_mib") is not None else ""
                cells.append(f"{cell['ms']:.3f}{peak}")
            else:
                cells.append("fails" if "error" in cell else "-")
        others = [t for f, t in times.items() if f != "flashlight"]
        ratio = f"{min(others) / times['flashlight']:.2f}×" if others and "flashlight" in times else "-"
        lines.append(f"| {row['B']}x{row['H']}x{row['L']}x{row['D']} | {' | '.join(cells)} | {ratio} |")
    return lines + [""]


def _loaded(results: pathlib.Path, name: str) -> dict | None:
    """The result file ``name`` under ``results``, parsed, or None where no run wrote it."""
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None

