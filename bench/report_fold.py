"""The README's rows for the fold a user runs, and REPORT.md's module table: ``bench.fold_product`` results.

``bench/results/fold_product_runs/*.json`` hold rows of ``flashlight-fold --compare`` on
synthetic records (one row per record, dtype and cache state), and ``solo`` rows (each
variant alone). The summary shows, per record size, MSA and dtype, the medians of every
run measured since :data:`NOISE_SINCE` (the newest one alone for records with none that
recent): the process with empty caches (what a first fold on a new machine sees) and
the one after it with the caches filled, and the newest solo row's first folds. The
module table (:func:`module_noise`) reads each module's speed-up against stock's own
spread over the same processes. Only rows of the fold's current default path count:
Flashlight active with its stacks replayed as CUDA graphs (rows from before that default
measured another program).
"""
from __future__ import annotations

import json
import pathlib
import statistics

from bench.evoformer import ATTENTION_PARTS  # the Evoformer block's modules Flashlight replaces

SCHEMA = "flashlight-bench-fold-product/1"
FOLDER = "fold_product_runs"
DTYPE_TITLES = {"bf16": "bf16", "fp32": "fp32 (TF32)"}
MSA_TITLES = {"deep": "deep MSA", "single": "one sequence"}
# rows from this date on ran the fold path of fold_product_runs/README.md's current sections
# (code 7f59959 and later); older rows ran earlier warm-up and compile paths beside the
# stock passes, so their stock spans do not measure the noise of today's command
NOISE_SINCE = "2026-12-04"


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
    ``solo`` row: its Flashlight process reports how it compiled, in a warm-up or in its
    pass, which only an active patch does)."""
    if row.get("cache") == "solo":
        return row.get("status") == "ok" and bool(row.get("flashlight_warmup_compile"))
    patch = row.get("flashlight") or {}
    return row.get("status") == "ok" and bool(patch.get("active")) and patch.get("cuda_graphs", 0) > 0


def _key(row: dict) -> tuple:
    return row["length"], row["msa"], row["dtype"]


def _partner(first: dict, rows: list[dict]) -> dict | None:
    """The row with filled caches that followed ``first`` in its file and warm-up mode."""
    warm = [r for r in rows if r.get("cache") == "warm" and _key(r) == _key(first) and r["file"] == first["file"]
            and r.get("warmup_compile_setting") == first.get("warmup_compile_setting")
            and r.get("measured_at", "") >= first.get("measured_at", "")]
    return min(warm, key=lambda r: r["measured_at"]) if warm else None


def current_pairs(rows: list[dict], since: str | None = None) -> list[list[tuple[dict, dict | None]]]:
    """Per (length, MSA, dtype), oldest first: every row with empty caches measured since
    ``since`` (default :data:`NOISE_SINCE`) with its partner (:func:`_partner`), or the
    newest such pair alone where none is that recent."""
    since = NOISE_SINCE if since is None else since
    cold: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("cache") == "cold":
            cold.setdefault(_key(row), []).append(row)
    out = []
    for key in sorted(cold, key=lambda k: (k[1] != "deep", k[0], k[2])):
        ordered = sorted(cold[key], key=lambda r: r.get("measured_at", ""))
        recent = [r for r in ordered if r.get("measured_at", "") >= since] or ordered[-1:]
        out.append([(r, _partner(r, rows)) for r in recent])
    return out


def newest_solo(rows: list[dict]) -> dict[tuple, dict]:
    """Per (length, MSA, dtype): the newest ``solo`` row (each variant alone, cold)."""
    solo: dict[tuple, dict] = {}
    for row in rows:
        if row.get("cache") == "solo" and row.get("measured_at", "") >= solo.get(_key(row), {}).get("measured_at", ""):
            solo[_key(row)] = row
    return solo


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def _median_ms(values: list[float]) -> str:
    return _ms(statistics.median(values))


def fold_rows(rows: list[dict]) -> list[str]:
    """Summary-table rows: Flashlight's model time against stock's in the same process,
    for the processes with empty caches and those after them with the caches filled
    (times and speed-ups of both, in that order; medians over every pair measured since
    :data:`NOISE_SINCE`, their number in the label, where there are several: the passes
    vary from process to process), and the first calls."""
    lines = []
    solo = newest_solo(rows)
    for pairs in current_pairs(rows):
        cold = pairs[-1][0]
        length, msa, dtype = _key(cold)
        label = f"`flashlight-fold`, N_res {length}, {MSA_TITLES.get(msa, msa)}"
        label += f" ({len(pairs)} runs)" if len(pairs) > 1 else ""
        colds = [c for c, _ in pairs]
        warms = [w for _, w in pairs if w is not None]
        groups = [g for g in (colds, warms) if g]
        inline = (cold.get("flashlight_warmup_compile") or {}).get("mode") == "inline"
        alone = solo.get(_key(cold))
        if alone is not None:  # what a first run waits for: each variant alone, cold
            first = f"alone {_ms(alone['stock_first_fold_s'])} / {_ms(alone['flashlight_first_fold_s'])}"
        else:
            first = (f"first call{' (inline warm-up)' if inline else ''}: stock {_ms(cold['stock_first_call_s'])}, "
                     f"Flashlight {_ms(cold['flashlight_first_call_s'])}")
        if alone is not None and alone.get("flashlight_second_fold_s"):  # a user's next run, caches filled
            times = alone.get("again", 1)
            first += (f", again {_ms(alone['stock_second_fold_s'])} / {_ms(alone['flashlight_second_fold_s'])}"
                      + (f" (median of {times})" if times > 1 else ""))
        elif warms:
            first += f"; warm {_median_ms([w['flashlight_first_call_s'] for w in warms])}"
        flashlight = ", ".join(_median_ms([r["flashlight_model_s"] for r in g]) for g in groups)
        stock = ", ".join(_median_ms([r["stock_model_s"] for r in g]) for g in groups)
        speed = ", ".join(f"{statistics.median(r['stock_model_s'] / r['flashlight_model_s'] for r in g):.2f}×"
                          for g in groups)
        lines.append(f"| {label} | {DTYPE_TITLES.get(dtype, dtype)} | {flashlight} | stock {stock}; {first} "
                     f"| {speed} |")
    return lines


CAPTION = ("Fold rows: `flashlight-fold RECORD --compare [--dtype bf16]` (`bench/fold_product.py`), seeded "
           "random `model_1`, 4 recycling iterations, synthetic records (5632-row MSA, or none); timed pass "
           "with empty caches, then filled (medians); alone: stock / Flashlight without "
           "`--compare`, each in a fresh process, empty caches (again: filled), time to first structure; "
           "first call: `--compare`'s 1-iteration warm-up; warm: Flashlight's, caches filled.")


def _spread(values: list[float]) -> float:
    """max / min - 1: how far apart the slowest and the fastest sample are."""
    return max(values) / min(values) - 1.0


def module_noise(rows: list[dict]) -> list[dict]:
    """Per record, dtype and Evoformer module kind, from every ``--compare`` process
    (cold and warm rows of every file, measured since :data:`NOISE_SINCE`): Flashlight's
    speed-up in each process (stock's synchronised module span over Flashlight's, same
    process) and the noise it is read against, stock against stock across those
    processes: the same module, the same kernels and the same command, ``max / min - 1`` of stock's spans. A module is
    ``slower`` when its median speed-up is below ``1 / (1 + noise)``, ``noise`` when it is
    below 1.0 within that band, ``ok`` otherwise."""
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get("cache") in ("cold", "warm") and row.get("measured_at", "") >= NOISE_SINCE \
                and row.get("stock_modules_synchronised_s") and row.get("flashlight_modules_synchronised_s"):
            grouped.setdefault(_key(row), []).append(row)
    out = []
    for key in sorted(grouped, key=lambda k: (k[1] != "deep", k[0], k[2])):
        group = grouped[key]
        for part in group[0]["stock_modules_synchronised_s"]:
            pairs = [(r["stock_modules_synchronised_s"].get(part),
                      r["flashlight_modules_synchronised_s"].get(part)) for r in group]
            pairs = [(s, f) for s, f in pairs if s and f]
            if len(pairs) < 2:
                continue
            ratios = [s / f for s, f in pairs]
            noise = _spread([s for s, _ in pairs])
            median = statistics.median(ratios)
            verdict = "ok" if median >= 1.0 else ("noise" if median * (1.0 + noise) >= 1.0 else "slower")
            out.append({"length": key[0], "msa": key[1], "dtype": key[2], "module": part,
                        "patched": part in ATTENTION_PARTS, "processes": len(pairs),
                        "stock_ms": 1e3 * statistics.median(s for s, _ in pairs),
                        "speedup_median": median, "speedup_min": min(ratios), "speedup_max": max(ratios),
                        "stock_noise": noise, "verdict": verdict})
    return out


def noise_lines(results: pathlib.Path) -> list[str]:
    """REPORT.md's section on the fold's modules against stock, with the noise each
    speed-up is read against (:func:`module_noise`)."""
    cells = module_noise(load_fold_rows(results))
    if not cells:
        return []
    lines = ["", "## The fold a user runs: modules against stock, and the noise", "",
             f"`bench.fold_product` rows (`flashlight-fold RECORD --compare [--dtype bf16]`, every process with "
             f"empty and then filled caches, all files measured since {NOISE_SINCE}): per Evoformer module "
             "kind, summed over the blocks, "
             "the synchronised pass's span (each module starts on an idle GPU). Speed-up: stock over "
             "Flashlight in the same process, median and range over the processes. Noise: stock against "
             "stock over the same processes (the same kernels), slowest / fastest - 1. Verdict: *slower* "
             "when the median speed-up is below 1 / (1 + noise), *noise* when below 1.0 within it.", "",
             "| record | dtype | module | processes | stock ms | speed-up, median (range) "
             "| noise (stock vs stock) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        name = c["module"] + (" (patched)" if c["patched"] else "")
        record = f"{c['length']}, {MSA_TITLES.get(c['msa'], c['msa'])}"
        lines.append(f"| {record} | {DTYPE_TITLES.get(c['dtype'], c['dtype'])} "
                     f"| {name} | {c['processes']} | {c['stock_ms']:.0f} | {c['speedup_median']:.2f}× "
                     f"({c['speedup_min']:.2f}-{c['speedup_max']:.2f}) | ±{100 * c['stock_noise']:.0f}% "
                     f"| {c['verdict']} |")
    return lines


WARM_SCHEMA = "flashlight-bench-warm-first-fold/1"


def warm_first_fold_lines(results: pathlib.Path) -> list[str]:
    """REPORT.md's section on a user's second run (``bench.warm_first_fold`` files): the
    first fold of fresh processes whose caches an earlier fold filled, stock and
    Flashlight alternating, with the cold process that filled them."""
    files = []
    for path in sorted((results / FOLDER).glob("warm_first_fold_*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") == WARM_SCHEMA:
            files.append((path.name, data))
    if not files:
        return []
    lines = ["", "## A second run: the first fold with the caches filled", "",
             "`python -m bench.warm_first_fold RECORD --rounds N` (the default `flashlight-fold` command, "
             "no `--compare`): one process with empty caches (Flashlight's, Triton's, Inductor's) fills "
             "them, then each round runs one fresh process per variant, alternating; each time is the "
             "process's first structure (its passes, the warm-up included). `FLASHLIGHT_PRELOAD=0`: "
             "without loading the kernels of the tuning cache on a thread at import.", "",
             "| file | date | GPU | record | variant | processes | first fold s, median (each) "
             "| vs stock | cold process s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, data in files:
        medians = data["median_first_fold_s"]
        stock = medians.get("stock")
        record = pathlib.Path(data["fasta"]).stem
        for variant, runs in data["runs"].items():
            each = ", ".join(f"{r['first_fold_s']:.2f}" for r in runs)
            ratio = f"{medians[variant] / stock:.2f}×" if stock and variant != "stock" else "–"
            cold = f"{data['cold']['first_fold_s']:.2f}" if variant == "flashlight" else "–"
            lines.append(f"| `{name}` | {data['date']} | {data['gpu']} | {record} | {variant} | {len(runs)} "
                         f"| {medians[variant]:.2f} ({each}) | {ratio} | {cold} |")
    return lines
