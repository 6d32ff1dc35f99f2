"""The end-to-end sections of ``bench/results/REPORT.md`` (``evoformer*.json``, from
``bench.evoformer``): the Evoformer stack and ``model_1`` against stock and
``torch.compile`` per block, and the time per Evoformer module."""
from __future__ import annotations

from bench.report import MODE_TITLES, best_flashlight, cell_text, chunk_text, fmt_ms, untuned_chunks


def _before_chunked_retry(cell: dict) -> bool:
    """A whole-model cell from before runs that do not fit were retried chunked: its
    out-of-memory may be the unchunked stock reference's, not its own mode's."""
    return cell["scope"] == "model" and cell["mode"] != "stock" and "reference_chunk_size" not in cell


def evoformer_table(cells: list[dict]) -> list[str]:
    if not cells:
        return []
    by = {}
    for c in cells:
        by.setdefault((c["scope"], c["n_res"]), {})[c["mode"]] = c
    head = ["scope", "N_res", "stock ms", "torch.compile per block ms", "Flashlight ms (attention cores)",
            "Flashlight ms (whole blocks)", "Flashlight (faster scope) vs stock",
            "attention share (stock → FL)", "peak GiB (stock / compile / FL)", "first call s (compile / FL)",
            "max abs diff vs stock (FL)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (scope, n), modes in sorted(by.items(), key=lambda kv: (kv[0][0] != "stack", kv[0][1])):
        def ms(mode):
            c = modes.get(mode)
            if c is not None and c["status"] == "oom" and _before_chunked_retry(c):
                return "OOM (before chunked retry)"
            if c is None or c["status"] != "ok":
                return cell_text(c)
            return fmt_ms(c["ms"]) + chunk_text(c)

        st, co = modes.get("stock"), modes.get("compile")
        _, fl = best_flashlight(modes)
        speed = (f"{st['ms'] / fl['ms']:.2f}×" if st and fl and st["status"] == fl["status"] == "ok"
                 and not untuned_chunks(st) else "–")
        share = "–"
        if st and st.get("attention_share") is not None:
            share = f"{100 * st['attention_share']:.0f}%"
            if fl and fl.get("attention_share") is not None:
                share += f" → {100 * fl['attention_share']:.0f}%"
        peak = " / ".join(f"{m['peak_gib']:.1f}" if m and m.get("peak_gib") is not None else "–" for m in (st, co, fl))
        first = " / ".join(f"{m['first_call_s']:.0f}" if m and m.get("first_call_s") is not None else "–"
                           for m in (co, fl))
        diff = f"{fl['max_abs_diff_vs_stock']:.1e}" if fl and fl.get("max_abs_diff_vs_stock") is not None else "–"
        label = "Evoformer stack" if scope == "stack" else "model_1 inference"
        blocks = next((m.get("blocks") for m in modes.values() if m.get("blocks")), None)
        if blocks:
            label += f" ({blocks} blocks)"
        lines.append("| " + " | ".join([label, str(n), ms("stock"), ms("compile"), ms("flashlight"),
                                         ms("flashlight-block"), speed, share,
                                         peak, first, diff]) + " |")
    return lines


def per_module_lines(cells: list[dict]) -> list[str]:
    rows = [c for c in cells if c["scope"] == "stack" and c.get("breakdown_ms") and c["status"] == "ok"]
    if not rows:
        return []
    parts = []
    for c in rows:
        for k in c["breakdown_ms"]:
            if k not in parts:
                parts.append(k)
    head = ["N_res", "mode"] + parts
    lines = ["Time per module kind, summed over the Evoformer stack's blocks (ms):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in sorted(rows, key=lambda c: (c["n_res"], c["mode"])):
        lines.append("| " + " | ".join([str(c["n_res"]), MODE_TITLES.get(c["mode"], c["mode"])]
                                       + [fmt_ms(c["breakdown_ms"].get(p)) for p in parts]) + " |")
    return lines


# ---------------------------------------------------------------------------- report


def end_to_end_lines(evo: list[dict]) -> list[str]:
    if not evo:
        return []
    sizes = [f"{evo[0]['n_seq']} MSA rows"] if evo[0].get("n_seq") else []
    extra = next((c for c in evo if c.get("n_extra")), None)
    if extra:
        sizes.append(f"{extra['n_extra']} extra-MSA rows and {extra.get('iters')} recycling iteration(s) "
                     "for the whole model")
    lines = ["## OpenFold end to end", "",
             "Seeded random `model_1` weights (no AlphaFold parameters: timings only), templates off, "
             "`chunk_size=None` (\"chunk ≥ N, tuned\": the run did not fit without chunking and used "
             "OpenFold's default chunk size as the floor of its chunk-size tuner; \"chunk N, tuner off\": "
             "measured before the benchmark kept the tuner on, every layer at chunk size N, not stock at "
             "its best, so no speed-up is quoted against it; \"OOM (before chunked retry)\": measured when the stock "
             "reference of a non-stock cell still ran unchunked, so the out-of-memory may be "
             "the reference's), fp32 with TF32, medians of CUDA-event timings"
             + (f"; {', '.join(sizes)}" if sizes else "") + ".", ""]
    lines += evoformer_table(evo) + [""]
    failed = [c for c in evo if c["status"] != "ok"]
    lines += [f"- {c['scope']} N_res {c['n_res']} {MODE_TITLES.get(c['mode'], c['mode'])}: "
              f"{c['status']}: {c.get('message', '')[:200]}" for c in failed] + ([""] if failed else [])
    return lines + per_module_lines(evo) + [""]

