"""The README's benchmark section: one summary table and the losses grouped by cause.

``bench.report`` writes every table and per-case hypothesis to ``bench/results/REPORT.md``;
this module picks what a user reads first: the headline cases (the Evoformer attentions at
AlphaFold 2's sizes, a few language-model variants) with Flashlight's time against the
fastest other implementation of the same case, the end-to-end OpenFold rows, and one line
per cause of the cases Flashlight loses.
"""
from __future__ import annotations

from bench.report import (
    CAUSES,
    DTYPE_TITLES,
    EVOFORMER,
    IMPL_TITLES,
    MODE_TITLES,
    best_flashlight,
    case_shape,
    cases,
    cell_text,
    chunk_text,
    fmt_ms,
    losses,
    machine_lines,
    ok_ms,
    untuned_chunks,
)
from bench.report_fold import CAPTION as FOLD_CAPTION
from bench.report_fold import fold_rows

REPORT_LINK = "[bench/results/REPORT.md](bench/results/REPORT.md)"

# (variant, shape as the tables label it, dtypes): the summary's rows, in this order. A
# variant measured at none of these shapes shows its first measured case instead.
HEADLINES = (
    ("msa_row_pair_bias", "B1 S512 L256 H8 c32", ("bf16", "tf32")),
    ("msa_column", "B1 S512 L256 H8 c32", ("bf16", "tf32")),
    ("triangle_start", "B1 N256 H4 c32", ("bf16", "tf32")),
    ("triangle_end", "B1 N256 H4 c32", ("bf16", "tf32")),
    ("vanilla", "B4 H16 L4096 D64", ("bf16",)),
    ("causal_tril", "B4 H16 L4096 D64", ("bf16",)),
    ("document_mask", "H16 L16384 D64 n_docs12", ("bf16",)),
    ("alibi", "B4 H16 L4096 D64", ("bf16",)),
    ("softcap", "B4 H16 L4096 D64", ("bf16",)),
    ("differential", "B4 H8 L4096 D64 Dv128", ("bf16",)),
)

# FlexAttention cells measured before the formulations harness (bench/formulations.py)
# carry no ``formulation``: on the Evoformer attentions they are the catalog's form
# (bench/variants_evoformer.py). Cells measured since name the fastest form.
FLEX_EVOFORMER_NOTE = (
    "FlexAttention on the Evoformer attentions is the catalog's formulation "
    "(`bench/variants_evoformer.py`), which reads OpenFold's permuted pair bias inside `score_mod`; "
    "rows measured with every formulation a user would try (`bench/formulations.py`) name the fastest "
    "in brackets instead."
)
FORMULATION_NOTE = (
    "FlexAttention / SDPA (form): the fastest of the formulations a user would write "
    "(`bench/formulations.py`), timed in the same run."
)


def headline_keys(case_map: dict) -> list[tuple]:
    """The summary's case keys (variant, shape json, dtype) present in ``case_map``."""
    keys = []
    for variant, shape, dtypes in HEADLINES:
        mine = [k for k in case_map if k[0] == variant and "flashlight" in case_map[k]]
        at_shape = [k for k in mine if case_shape(case_map[k]) == shape]
        if not at_shape and mine:  # not measured at the headline size: the first size measured
            first = case_shape(case_map[mine[0]])
            at_shape = [k for k in mine if case_shape(case_map[k]) == first]
        chosen = [k for d in dtypes for k in at_shape if k[2] == d] or at_shape[:1]
        keys.extend(chosen)
    return keys


def best_peer(row: dict[str, dict]) -> tuple[str, dict] | None:
    """The fastest implementation other than Flashlight that ran the case, with its cell."""
    timed = [(ms, impl) for impl, cell in row.items() if impl != "flashlight" and (ms := ok_ms(cell))]
    if not timed:
        return None
    _, impl = min(timed)
    return impl, row[impl]


def _same_run(a: dict, b: dict) -> bool:
    return a.get("_file") == b.get("_file") and a.get("run") == b.get("run")


def same_run_flashlight(fl: dict, peer: dict) -> dict:
    """Flashlight's cell to set against ``peer``'s: the latest measurement of the case
    measured in the peer's run (``fl`` or one of its ``_others``), else ``fl``, the latest.
    Small kernels' times vary between runs by up to 2x (host-bound launches), so a
    speed-up compares two times from one run wherever that run measured both; a latest
    cell that failed is kept, so a row never hides a newer failure behind an older time."""
    if ok_ms(fl) is None or _same_run(fl, peer):
        return fl
    in_run = [c for c in fl.get("_others", ()) if ok_ms(c) is not None and _same_run(c, peer)]
    return max(in_run, key=lambda c: c.get("measured_at", ""), default=fl)


def _same_setup(a: dict, b: dict) -> bool:
    """Two cells' runs had the same GPU model and torch / Triton versions."""
    return all(a.get("_run", {}).get(k) == b.get("_run", {}).get(k) for k in ("gpu", "torch", "triton"))


def _run_date(cell: dict) -> str:
    return cell.get("_run", {}).get("date", "")


def kernel_rows(case_map: dict, keys: list[tuple]) -> tuple[list[str], set[str]]:
    """One table row per case: Flashlight's time, the fastest peer and the speed-up;
    and the footnote marks the rows use. The fastest peer is chosen by every peer's latest
    cell, runs without Flashlight included, so a row never hides a faster peer; Flashlight's
    time is then the one from that peer's run (:func:`same_run_flashlight`; marked ¶ where
    Flashlight was measured again since), and a row whose two times come from different
    runs is marked (‡ / §)."""
    rows, marks = [], set()
    for key in keys:
        variant, _, dtype = key
        row = case_map[key]
        fl, peer = row["flashlight"], best_peer(row)
        newest = fl
        if peer is not None:
            fl = same_run_flashlight(fl, peer[1])
        fl_ms = ok_ms(fl)
        remeasured = ""
        if fl is not newest and ok_ms(newest) is not None:
            remeasured = " ¶"  # measured again since, in a run without this peer
            marks.add("¶")
        peer_text, speed = "–", "–"
        if peer is not None:
            impl, cell = peer
            name = IMPL_TITLES.get(impl, impl)
            if cell.get("formulation") and cell["formulation"] != "catalog":
                name += f" ({cell['formulation']})"
                marks.add("form")
            elif impl == "flex" and variant in EVOFORMER and not cell.get("formulation"):
                name += " †"
                marks.add("†")
            if not _same_run(fl, cell):
                later = _same_setup(fl, cell) and _run_date(fl) > _run_date(cell)
                name += " ‡" if later else " §"
                marks.add("‡" if later else "§")
            peer_text = f"{name} {fmt_ms(cell['ms'])}"
            if fl_ms:
                speed = f"{cell['ms'] / fl_ms:.2f}×"
        rows.append(f"| `{variant}` {case_shape(row)} | {DTYPE_TITLES.get(dtype, dtype)} | "
                    f"{cell_text(fl)}{remeasured} | {peer_text} | {speed} |")
    return rows, marks


def _e2e_text(cell: dict | None) -> str:
    if cell is None or cell["status"] != "ok":
        return cell_text(cell)
    return fmt_ms(cell["ms"]) + chunk_text(cell)


def e2e_rows(evo: list[dict]) -> list[str]:
    """One row per (scope, N_res): Flashlight against the faster of stock and torch.compile."""
    by: dict[tuple, dict[str, dict]] = {}
    for c in evo:
        by.setdefault((c["scope"], c["n_res"]), {})[c["mode"]] = c
    rows = []
    for (scope, n), modes in sorted(by.items(), key=lambda kv: (kv[0][0] != "stack", kv[0][1])):
        blocks = next((m.get("blocks") for m in modes.values() if m.get("blocks")), None)
        label = ("Evoformer stack" if scope == "stack" else "`model_1` inference") + (
            f" ({blocks} blocks)" if blocks else "") + f", N_res {n}"
        mode, fl = best_flashlight(modes)
        if mode == "flashlight-block":
            label += ", whole blocks compiled"
        others = [(modes[m]["ms"], m) for m in ("compile", "stock")
                  if ok_ms(modes.get(m)) and not untuned_chunks(modes[m])]
        peer_text = "; ".join(f"{MODE_TITLES[m]} {_e2e_text(modes.get(m))}" for m in ("compile", "stock")
                              if m in modes)
        speed = f"{min(others)[0] / fl['ms']:.2f}×" if others and ok_ms(fl) else "–"
        rows.append(f"| {label} | fp32 (TF32) | {_e2e_text(fl)} | {peer_text or '–'} | {speed} |")
    return rows


def summary_table(case_map: dict, evo: list[dict], fold: list[dict] = (), prows: list[str] = ()) -> list[str]:
    """The headline table with its caption (footnotes for the marks it uses); ``fold``:
    rows of ``bench.fold_product`` (:func:`bench.report_fold.load_fold_rows`); ``prows``:
    the peer rows (:func:`bench.report_peers.summary_rows`)."""
    krows, marks = kernel_rows(case_map, headline_keys(case_map))
    erows = e2e_rows(evo)
    frows = fold_rows(list(fold))
    if not krows and not erows and not frows and not prows:
        return []
    lines = ["| case | dtype | Flashlight ms | fastest other, ms | Flashlight speed-up |",
             "|---|---|---|---|---|", *krows, *erows, *prows, *frows, ""]
    caption = ["Forward pass only, median ms; speed-up: the fastest other's time over Flashlight's "
               "(below 1: slower). Kernel rows: each implementation computes the whole "
               "catalog variant (`bench/variants_*.py`), errors checked against float64; peers: eager, "
               "torch.compile, SDPA, FlexAttention, cuEquivariance, trifast where they apply."]
    if erows:
        caption.append("End-to-end rows: OpenFold with seeded random `model_1` weights (timings only), "
                       "512 MSA rows (the whole model: also 5120 extra-MSA rows, one recycling iteration), "
                       "`chunk_size=None` unless a chunk size is shown (\"tuner off\": without OpenFold's "
                       "chunk-size tuner, no ratio).")
    if prows:
        from bench.report_peers import SUMMARY_CAPTION

        caption.append(SUMMARY_CAPTION)
    if frows:
        caption.append(FOLD_CAPTION)
    if "form" in marks:
        caption.append(FORMULATION_NOTE)
    if "†" in marks:
        caption.append(f"†: {FLEX_EVOFORMER_NOTE}")
    if "‡" in marks:
        caption.append("‡: Flashlight's time is from a later run than the peer's (the same GPU model, torch "
                       "and Triton).")
    if "¶" in marks:
        caption.append("¶: Flashlight measured again since, in a run without this peer (the report's tables "
                       "show that newer time).")
    if "§" in marks:
        caption.append("§: Flashlight's time and the peer's are from different runs (see the report).")
    return lines + [" ".join(caption), ""]


def loss_lines(case_map: dict) -> list[str]:
    """One line per cause of Flashlight's losses: how many cases, the worst and its winner."""
    loss = losses(case_map)
    measured = sum(1 for row in case_map.values() if "flashlight" in row)
    if not loss:
        return [f"In every one of the {measured} measured cases Flashlight was the fastest implementation.", ""]
    groups: dict[str, list[dict]] = {}
    for d in loss:  # worst first, so each group's first entry is its worst
        groups.setdefault(d["cause"], []).append(d)
    lines = [f"In {len(loss)} of the {measured} measured cases another implementation is faster, or "
             "Flashlight did not run; by likely cause (hypotheses, not measurements):", ""]
    for cause, group in groups.items():
        worst = group[0]
        peer = IMPL_TITLES.get(worst.get("peer"), "")
        what = "failed" if cause == "failed" else f"worst {worst['ratio']:.2f}× ({worst['case']}, {peer})"
        lines.append(f"- {CAUSES.get(cause, cause)}: {len(group)} case{'s' * (len(group) != 1)}, {what}.")
    return lines + [""]


def readme_section(latest: dict, kruns: list[dict], evo: list[dict], eruns: list[dict],
                   fold: list[dict] = (), prows: list[str] = ()) -> str:
    """The README's "Benchmarks" section, one screen: machine, summary table, losses, link."""
    case_map = cases(latest)
    lines = ["## Benchmarks", ""]
    if not case_map and not evo and not fold:
        return "\n".join(lines + ["No benchmark results yet: run `bench/run_all.sh` on a CUDA GPU machine "
                                  "(see [bench/README.md](bench/README.md)).", ""])
    lines += ["Generated by `python -m bench.report` from the results in `bench/results/`; reproduce them "
              "with `bench/run_all.sh` (see [bench/README.md](bench/README.md)). "
              + " ".join(machine_lines(kruns + eruns)[:1]), ""]
    lines += summary_table(case_map, evo, fold, prows)
    if case_map:
        lines += ["### Where Flashlight loses", ""] + loss_lines(case_map)
    lines += [f"Every table (all cases, memory, first calls, modules), every loss with its hypothesis, "
              f"the plots, the peers not measured: {REPORT_LINK}.", ""]
    return "\n".join(lines)
