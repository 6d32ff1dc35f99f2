"""The "OpenFold end to end against the peers" section of ``bench/results/REPORT.md``
(``evoformer_peers.json``, from ``bench.evoformer`` with the peer and CUDA-graph modes):
stock OpenFold, its attentions computed by cuEquivariance or DeepSpeed's DS4Sci, and
Flashlight, each plain and with the stacks and structure module replayed as CUDA graphs
(``-graphs``, what ``flashlight-fold`` runs for Flashlight on a GPU)."""
from __future__ import annotations

import json
import pathlib

from bench.evoformer_modes import GRAPHS
from bench.kernel_results import shape_label
from bench.report import DTYPE_TITLES

FILE = "evoformer_peers.json"
BASES = (("stock", "stock"), ("cueq", "cuEquivariance"), ("ds4sci", "DS4Sci"), ("flashlight", "Flashlight"))


def _cell_text(cell: dict | None) -> str:
    if cell is None:
        return "–"
    if cell["status"] != "ok":
        return cell["status"]
    return f"{cell['ms']:.0f} ({cell['peak_gib']:.1f})" if cell.get("peak_gib") is not None else f"{cell['ms']:.0f}"


def _latest(cells: list[dict]) -> dict[tuple, dict]:
    """The newest cell per (scope, n_res, dtype, mode)."""
    out: dict[tuple, dict] = {}
    for c in sorted(cells, key=lambda c: c.get("measured_at", "")):
        out[(c["scope"], c["n_res"], c.get("dtype", "tf32"), c["mode"])] = c
    return out


def _best_peer(row: dict[str, dict]) -> tuple[str, dict] | None:
    """The fastest measured non-Flashlight mode of a row."""
    peers = [(m, c) for m, c in row.items() if not m.startswith("flashlight") and c["status"] == "ok"]
    return min(peers, key=lambda mc: mc[1]["ms"]) if peers else None


def peers_lines(results: pathlib.Path) -> list[str]:
    """The section's lines, or none when the results file does not exist."""
    path = results / FILE
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    latest = _latest(data["cells"])
    rows: dict[tuple, dict[str, dict]] = {}
    for (scope, n, dtype, mode), c in latest.items():
        rows.setdefault((scope, n, dtype), {})[mode] = c
    run = data["runs"][-1]
    head = ["scope", "N_res", "dtype"] + [t for _, t in BASES] + [f"{t} + graphs" for _, t in BASES] \
        + ["Flashlight + graphs vs fastest other"]
    lines = ["## OpenFold end to end against the peers", "",
             "Median ms of a pass (peak GiB), seeded random `model_1` weights, 512 MSA rows (and 5120 "
             "extra-MSA rows, one pass, for the whole model), `chunk_size=None`; every attention module "
             "computed by the named implementation (`bench/openfold_peers.py` for cuEquivariance and "
             "DS4Sci, `patch_openfold` for Flashlight). \"+ graphs\": the Evoformer and extra-MSA stacks "
             "and the structure module replayed as CUDA graphs (`flashlight.integrations.openfold_graphs`, "
             "installed on the stock and peer models too); Flashlight + graphs is what `flashlight-fold` "
             "runs on a GPU (at the stack scope: the Evoformer stack called whole). "
             f"{run.get('gpu')}, torch {run.get('torch')}, Triton {run.get('triton')}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (scope, n, dtype), row in sorted(rows.items(), key=lambda kv: (kv[0][0] != "stack", kv[0][1], kv[0][2])):
        cols = [_cell_text(row.get(m)) for m, _ in BASES] + [_cell_text(row.get(m + GRAPHS)) for m, _ in BASES]
        fl, best = row.get("flashlight" + GRAPHS) or row.get("flashlight"), _best_peer(row)
        ratio = "–"
        if fl is not None and fl["status"] == "ok" and best is not None:
            ratio = f"{best[1]['ms'] / fl['ms']:.2f}× ({best[0]})"
        label = "Evoformer stack" if scope == "stack" else "model_1"
        lines.append(f"| {label} | {n} | {DTYPE_TITLES.get(dtype, dtype)} | " + " | ".join(cols)
                     + f" | {ratio} |")
    lines.append("")
    failed = [c for c in latest.values() if c["status"] != "ok"]
    lines += [f"- {c['scope']} N_res {c['n_res']} {c.get('dtype')} {c['mode']}: {c['status']}: "
              f"{c.get('message', '')[:200]}" for c in failed]
    lines += [f"- Run {r['id']} ({r['date'][:16]}): {r['note']}." for r in data["runs"] if r.get("note")]
    return lines + [""]


SUMMARY_CAPTION = ("Peer rows: `model_1` at the end-to-end sizes, every attention module run by the "
                   "named peer at its fastest valid form (\"+ graphs\": the stacks and structure "
                   "module replayed as CUDA graphs, as `flashlight-fold` runs Flashlight).")


def _fastest_form(latest: dict, scope: str, n: int, dtype: str, base: str) -> tuple[str, dict] | None:
    """An implementation's fastest measured cell of a row, plain or with graphs, and its
    label (the plain mode and the graphs mode are two forms of one implementation)."""
    forms = [(m, latest.get((scope, n, dtype, m))) for m in (base, base + GRAPHS)]
    forms = [(m, c) for m, c in forms if c is not None]
    if not forms:
        return None
    mode, cell = min(forms, key=lambda mc: mc[1]["ms"])
    return (" + graphs" if mode.endswith(GRAPHS) else ""), cell


def summary_rows(results: pathlib.Path) -> list[str]:
    """The README summary's rows: ``model_1``, Flashlight with graphs (what the fold runs)
    against every other implementation at its fastest valid form, the fastest first."""
    path = results / FILE
    if not path.exists():
        return []
    latest = {key: c for key, c in _latest(json.loads(path.read_text())["cells"]).items() if c["status"] == "ok"}
    rows = []
    for (scope, n, dtype, mode), fl in sorted(latest.items(), key=lambda kv: (kv[0][1], kv[0][2] != "bf16")):
        if scope != "model" or mode != "flashlight" + GRAPHS:
            continue
        others = [(title + found[0], found[1]) for m, title in BASES if m != "flashlight"
                  and (found := _fastest_form(latest, scope, n, dtype, m)) is not None]
        if not others:
            continue
        others.sort(key=lambda tc: tc[1]["ms"])
        listed = "; ".join(f"{title} {c['ms']:.0f}" for title, c in others)
        rows.append(f"| `model_1` inference, N_res {n}, attention peers | {DTYPE_TITLES.get(dtype, dtype)} "
                    f"| {fl['ms']:.0f} | {listed} | {others[0][1]['ms'] / fl['ms']:.2f}× |")
    return rows


OTHER_GPU_DIR = "h100_2026-12-05"  # not kernels_*.json: another GPU than the main tables'
OTHER_GPU_IMPLS = ("flex_flash", "flex", "torch_compile", "sdpa", "eager", "flashlight")


def other_gpu_lines(results: pathlib.Path) -> list[str]:
    """The section on the kernel runs under :data:`OTHER_GPU_DIR` (``bench.kernels`` on
    another GPU than the main tables'): a table per file, each row one variant and shape
    with every implementation of that run, and the FlexAttention FLASH formulations
    (``kernel_options={"BACKEND": "FLASH"}``) that failed, with their errors."""
    paths = sorted((results / OTHER_GPU_DIR).glob("*.json"))
    if not paths:
        return []
    first = json.loads(paths[0].read_text())["runs"][0]
    lines = ["", f"## Kernel runs on {first['gpu']}", "",
             f"`python -m bench.kernels` in `bench/results/{OTHER_GPU_DIR}/` (its README says what each file "
             f"measured), torch {first['torch']}, Triton {first['triton']}, {first['date'][:10]}: bf16 median ms "
             "of each implementation at its fastest formulation that ran; every row of a table from one run. "
             "`flex_flash`: FlexAttention with `kernel_options={\"BACKEND\": \"FLASH\"}`."]
    errors: dict[str, set[str]] = {}
    for path in paths:
        cells: dict[tuple, dict] = {}
        for c in sorted(json.loads(path.read_text())["cells"], key=lambda c: c.get("measured_at", "")):
            cells[(c["variant"], json.dumps(c["shape"]), c["impl"])] = c
        impls = [i for i in OTHER_GPU_IMPLS if any(key[2] == i for key in cells)]
        lines += ["", f"`{path.name}`:", "", "| variant | shape | " + " | ".join(impls) + " |",
                  "|---|---|" + "---|" * len(impls)]
        for variant, shape in sorted({(v, s) for v, s, _ in cells}):
            texts = []
            for impl in impls:
                c = cells.get((variant, shape, impl))
                texts.append("–" if c is None else f"{c['ms']:.3f}" if c["status"] == "ok" else "error")
                for name, form in ((c or {}).get("formulations") or {}).items():
                    if impl == "flex_flash" and form.get("status") == "error":
                        errors.setdefault(form["message"].split("\n")[0][:120], set()).add(f"{variant} ({name})")
            lines.append(f"| {variant} | {shape_label(json.loads(shape))} | {' | '.join(texts)} |")
    if errors:
        lines += ["", "FLASH formulations that failed:", ""]
        lines += [f"- {', '.join(sorted(where))}: `{message}`" for message, where in sorted(errors.items())]
    return lines + [""]
