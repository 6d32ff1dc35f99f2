"""The benchmark report on the CPU: ``python -m bench.report`` turns result files (here
small ones written by each test) into the README section and ``bench/results/REPORT.md``:
one screen in the README, every case in the report, ratios from one run, each loss with
its hypothesis, the end-to-end, fold, fidelity and peer sections."""
import json

import pytest

pytest.importorskip("triton")

from bench import report, report_evoformer  # noqa: E402


def test_report_without_results(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n")
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    assert "No benchmark results yet" in readme.read_text()


def test_loss_hypotheses_cite_what_the_case_measured():
    """The stated cause of a loss follows the case's own cells: the tiles Flashlight ran
    with, a head width padded to a power of two, and whether the winner's memory shows
    the scores materialized (cuBLAS matmuls) or not (a fused attention kernel)."""
    shape = {"B": 1, "H": 16, "L": 4096, "D": 192}
    flops = 2.0 * 16 * 4096 * 4096 * (192 + 192)  # scores: 16 * 4096^2 float32 = 1024 MiB
    flashlight = {"status": "ok", "ms": 2.0, "shape": shape, "dtype": "tf32", "flops": flops,
                  "peak_extra_mib": 32.0, "roofline_frac": 0.15, "configs": [[32, 32, 4, 1]]}
    materializing = {"status": "ok", "ms": 1.0, "peak_extra_mib": 1100.0}
    fused = {"status": "ok", "ms": 1.0, "peak_extra_mib": 40.0}

    why = report.hypothesis("any", "tf32", "torch_compile", {"flashlight": flashlight, "torch_compile": materializing})
    assert "one-stage small tiles" in why and "32x32" in why
    assert "D=192" in why and "256 lanes" in why
    assert "1100 MiB" in why and "materializes" in why and "cuBLAS" in why

    plain = {**flashlight, "shape": {**shape, "D": 128}, "configs": [[128, 64, 8, 2]]}
    why = report.hypothesis("any", "tf32", "torch_compile", {"flashlight": plain, "torch_compile": fused})
    assert "small tiles" not in why and "power of two" not in why and "materializes" not in why
    assert "SDPA" in why


# ---------------------------------------------------------------------------- the README section


def _cell(variant, shape, dtype, impl, ms, run=0):
    return {"variant": variant, "shape": shape, "dtype": dtype, "impl": impl, "run": run, "status": "ok",
            "ms": ms, "measured_at": f"2026-12-0{run + 1}T00:00:00"}


def _results(tmp_path, name, cells, dates=("2026-11-29T10:00:00",)):
    runs = [{"id": i, "gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": d}
            for i, d in enumerate(dates)]
    (tmp_path / name).write_text(json.dumps({"schema": "flashlight-bench-kernels/1", "runs": runs, "cells": cells}))


def _section(tmp_path):
    from bench import report_summary

    latest, kruns = report.load_kernels(tmp_path)
    evo, eruns = report.load_evoformer(tmp_path)
    return (report_summary.readme_section(latest, kruns, evo, eruns),
            report.build_report(latest, kruns, evo, eruns, []))


def test_readme_section_is_one_screen_and_the_report_keeps_every_case(tmp_path):
    """Many losing cases become one line per cause in the README (count and worst ratio);
    the report keeps each case with its own hypothesis. An Evoformer row whose fastest
    peer is FlexAttention carries the note on the catalog's Flex formulation."""
    msa = {"B": 1, "S": 512, "L": 256, "H": 8, "c": 32}
    cells = [_cell("msa_row_pair_bias", msa, "bf16", i, ms)
             for i, ms in (("flashlight", 0.3), ("flex", 0.6), ("cuequivariance", 0.9))]
    for n in range(40):  # IEEE float32 losses to SDPA, 1.34x to 2x
        shape = {"B": 1, "H": 16, "L": 256 + 64 * n, "D": 64}
        cells += [_cell("vanilla", shape, "fp32", "flashlight", 2.0),
                  _cell("vanilla", shape, "fp32", "sdpa", 1.0 + n / 80)]
    for n, peer_ms in enumerate((0.5, 0.9, 1.0 / 3, 0.8, 0.7)):  # block masks lost to FlexAttention, worst 3x
        shape = {"H": 16, "L": 4096 * (n + 1), "D": 64, "n_docs": 4}
        cells += [_cell("document_mask", shape, "bf16", "flashlight", 1.0),
                  _cell("document_mask", shape, "bf16", "flex", peer_ms)]
    _results(tmp_path, "kernels_x.json", cells)
    readme, full = _section(tmp_path)

    assert len(readme) < 6000 and ".png" not in readme and "REPORT.md" in readme
    assert "| `msa_row_pair_bias` B1 S512 L256 H8 c32 | bf16 | 0.300 | FlexAttention † 0.600 | 2.00× |" in readme
    assert "catalog's formulation" in readme
    assert sum("`vanilla`" in line for line in readme.splitlines()) == 1  # one headline row, not forty
    (ieee,) = [line for line in readme.splitlines() if line.startswith("- IEEE float32")]
    assert "40 cases" in ieee and "worst 2.00×" in ieee and "SDPA" in ieee
    (masks,) = [line for line in readme.splitlines() if line.startswith("- masks that skip key tiles")]
    assert "5 cases" in masks and "worst 3.00×" in masks and "L4096" not in masks and "L12288" in masks
    assert "In 45 of the 46 measured cases" in readme

    assert full.count("IEEE float32 dot products run on CUDA cores") == 40  # each case, its hypothesis
    assert all(f"L{256 + 64 * n} D64" in full for n in range(40))
    assert "catalog's formulation" in full  # the Evoformer kernel table's note


def test_float32_losses_name_how_their_dots_ran(tmp_path):
    """A float32 loss measured since three TF32 products became the default is put down to
    them, one measured before (or with ``FLASHLIGHT_FP32_DOTS=ieee``) to IEEE products."""
    shapes = [{"B": 1, "H": 16, "L": 256 * (n + 1), "D": 128} for n in range(3)]
    cells = []
    for run, shape in enumerate(shapes):
        cells += [_cell("gqa", shape, "fp32", "flashlight", 1.5, run), _cell("gqa", shape, "fp32", "sdpa", 1.0, run)]
    _results(tmp_path, "kernels_x.json", cells, dates=("2026-12-03T10:00:00", "2026-12-07T10:00:00", "2026-12-08T10:00:00"))
    data = json.loads((tmp_path / "kernels_x.json").read_text())
    data["runs"][2]["flashlight_settings"] = {"FLASHLIGHT_FP32_DOTS": "ieee"}
    (tmp_path / "kernels_x.json").write_text(json.dumps(data))
    readme, full = _section(tmp_path)
    (ieee,) = [line for line in readme.splitlines() if line.startswith("- IEEE float32")]
    (three,) = [line for line in readme.splitlines() if line.startswith("- float32 as three TF32 products")]
    assert "2 cases" in ieee and "1 case," in three and "L512" in three
    assert full.count("three TF32 tensor-core products") == 1


def test_summary_names_the_winning_formulation_instead_of_the_catalog_note(tmp_path):
    msa = {"B": 1, "S": 512, "L": 256, "H": 8, "c": 32}
    flex = {**_cell("msa_row_pair_bias", msa, "bf16", "flex", 0.311), "formulation": "bias_input"}
    _results(tmp_path, "kernels_forms.json", [_cell("msa_row_pair_bias", msa, "bf16", "flashlight", 0.278), flex])
    readme, _ = _section(tmp_path)
    assert "| `msa_row_pair_bias` B1 S512 L256 H8 c32 | bf16 | 0.278 | FlexAttention (bias_input) 0.311 | 1.12× |" \
        in readme
    assert "†" not in readme and "the fastest of the formulations a user would write" in readme


def test_summary_marks_peers_from_another_run_and_flex_only_on_evoformer(tmp_path):
    """A peer's run that did not measure Flashlight: the row compares across runs, marked."""
    shape = {"B": 4, "H": 16, "L": 4096, "D": 64}
    _results(tmp_path, "kernels_peers.json", [_cell("causal_tril", shape, "bf16", "flex", 0.43)])
    _results(tmp_path, "kernels_rerun.json", [_cell("causal_tril", shape, "bf16", "flashlight", 0.45, run=1)],
             dates=("2026-11-29T10:00:00", "2026-11-30T10:00:00"))
    readme, _ = _section(tmp_path)
    (row,) = [line for line in readme.splitlines() if line.startswith("| `causal_tril`")]
    assert row == "| `causal_tril` B4 H16 L4096 D64 | bf16 | 0.450 | FlexAttention ‡ 0.430 | 0.96× |"
    assert "‡: Flashlight's time is from a later run" in readme
    assert "†" not in readme and "catalog's formulation" not in readme  # Flex on an LM case: its own formulation


def test_summary_compares_flashlight_and_the_fastest_peer_from_the_same_run(tmp_path):
    """Flashlight's newest time is from a later run that measured only a slower peer: the
    row sets the fastest peer against Flashlight's time from the peer's own run, unmarked."""
    tri = {"B": 1, "N": 256, "H": 4, "c": 32}
    flex = {**_cell("triangle_start", tri, "bf16", "flex", 0.207), "formulation": "bias_input"}
    _results(tmp_path, "kernels_runs.json",
             [_cell("triangle_start", tri, "bf16", "flashlight", 0.074), flex,
              _cell("triangle_start", tri, "bf16", "flashlight", 0.136, run=1),
              _cell("triangle_start", tri, "bf16", "ds4sci", 0.296, run=1)],
             dates=("2026-12-04T04:22:35", "2026-12-04T09:19:11"))
    latest, _ = report.load_kernels(tmp_path)
    assert latest[("triangle_start", json.dumps(tri, sort_keys=True), "bf16", "flashlight")]["ms"] == 0.136
    readme, full = _section(tmp_path)
    row = "| `triangle_start` B1 N256 H4 c32 | bf16 | 0.074 ¶ | FlexAttention (bias_input) 0.207 | 2.80× |"
    assert row in readme and row in full
    assert "‡" not in readme and "§" not in readme
    assert "¶: Flashlight measured again since, in a run without this peer" in readme


def test_summary_end_to_end_rows_compare_with_the_faster_of_stock_and_compile(tmp_path):
    def e2e(scope, mode, ms=None, status="ok", **extra):
        return {"scope": scope, "n_res": 256 if scope == "stack" else 1024, "mode": mode, "run": 0, "status": status,
                "n_seq": 512, "n_extra": 5120, "iters": 1, "blocks": 48, "measured_at": "2026-12-01",
                **({"ms": ms} if ms else {}), **extra}

    # stock chunked with OpenFold's chunk-size tuner off is not stock at its best: no ratio
    # against it; with the tuner on it is the peer

    cells = [e2e("stack", "stock", 878.0), e2e("stack", "compile", 510.0), e2e("stack", "flashlight", 485.0),
             e2e("model", "stock", 25997.0, chunk_size=4), e2e("model", "compile", status="timeout"),
             e2e("model", "flashlight", 5432.0),
             e2e("model", "stock", 9000.0, chunk_size=4, chunk_tuner=True, n_res=2048),
             e2e("model", "flashlight", 6000.0, n_res=2048)]
    (tmp_path / "evoformer.json").write_text(json.dumps({"runs": [{"id": 0, "gpu": "NVIDIA H200"}], "cells": cells}))
    readme, full = _section(tmp_path)
    rows = [line for line in readme.splitlines() if "N_res" in line and line.startswith("|")]
    assert rows == [
        "| Evoformer stack (48 blocks), N_res 256 | fp32 (TF32) | 485 | torch.compile per block 510; stock 878 "
        "| 1.05× |",
        "| `model_1` inference (48 blocks), N_res 1024 | fp32 (TF32) | 5432 | torch.compile per block timeout; "
        "stock 25997 (chunk 4, tuner off) | – |",
        "| `model_1` inference (48 blocks), N_res 2048 | fp32 (TF32) | 6000 | stock 9000 (chunk ≥ 4, tuned) "
        "| 1.50× |"]
    assert "### Where Flashlight loses" not in readme  # no kernel cells, nothing to lose
    assert "## OpenFold end to end" in full and "| 1.81× |" in full  # the report: against stock too
    (untuned,) = [line for line in full.splitlines() if line.startswith("| model_1 inference (48 blocks) | 1024 |")]
    assert "25997 (chunk 4, tuner off)" in untuned and "4.79" not in untuned


def test_repository_readme_section_stays_one_screen():
    """The section generated from the repository's results, and the one in README.md, stay small."""
    from bench import report_summary

    latest, kruns = report.load_kernels(report.RESULTS)
    evo, eruns = report.load_evoformer(report.RESULTS)
    if not latest and not evo:
        pytest.skip("no benchmark results in the repository")
    from bench.report_fold import load_fold_rows

    section = report_summary.readme_section(latest, kruns, evo, eruns, load_fold_rows(report.RESULTS))
    assert len(section.encode()) < 7500
    loss_lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(loss_lines) <= 8
    if any(k[0] in report.EVOFORMER and k[3] == "flex" for k in latest):
        assert report_summary.FLEX_EVOFORMER_NOTE in section or "FlexAttention †" not in section
    readme = (report.ROOT / "README.md").read_text()
    if report.BEGIN in readme:
        assert len(readme.split(report.BEGIN, 1)[1].split(report.END, 1)[0].encode()) < 7500


def _fold_row(cache, when, flashlight_s, graphs=2, mode="background", length=256, status="ok"):
    return {"length": length, "msa": "deep", "dtype": "bf16", "cache": cache, "status": status,
            "warmup_compile_setting": mode, "measured_at": when, "stock_model_s": 3.6,
            "flashlight_model_s": flashlight_s, "stock_first_call_s": 1.3, "flashlight_first_call_s": 2.5,
            "flashlight": {"active": True, **({"cuda_graphs": graphs} if graphs else {})},
            "flashlight_warmup_compile": {"mode": mode}}


def test_fold_rows_show_the_newest_default_fold_with_both_processes(tmp_path):
    """The README's fold rows come from the newest cold row of the fold's default path (CUDA
    graphs on), with the warm process after it in the same file; rows of an older path, and
    rows that did not finish, are left out."""
    from bench import report_fold, report_summary

    folder = tmp_path / report_fold.FOLDER
    folder.mkdir()
    old = [_fold_row("cold", "2026-12-02T01", 0.9, graphs=0), _fold_row("warm", "2026-12-02T02", 0.8, graphs=0)]
    new = [_fold_row("cold", "2026-12-03T01", 1.8), _fold_row("warm", "2026-12-03T02", 2.0),
           _fold_row("cold", "2026-12-03T03", 3.0, length=512, mode="inline"),
           _fold_row("warm", "2026-12-03T04", 1.0, length=512, mode="inline", status="timeout")]
    # each variant alone and cold (a solo row): the first fold a user waits for
    solo = {"length": 512, "msa": "deep", "dtype": "bf16", "cache": "solo", "status": "ok",
            "measured_at": "2026-12-03T05", "stock_first_fold_s": 4.1, "flashlight_first_fold_s": 3.2,
            "flashlight_warmup_compile": {"mode": "background"}}
    # and again in fresh processes with the caches filled: a user's next run, in place of
    # --compare's warm-up (which a plain fold does not run)
    solo_256 = dict(solo, length=256, stock_second_fold_s=2.0, flashlight_second_fold_s=1.9)
    for name, rows in (("old.json", old), ("new.json", new + [solo, solo_256])):
        (folder / name).write_text(json.dumps({"schema": report_fold.SCHEMA, "rows": rows}))
    (folder / "other.json").write_text(json.dumps({"schema": "something else", "rows": old}))
    rows = report_fold.load_fold_rows(tmp_path)
    assert sorted((r["length"], r["cache"]) for r in rows) == [(256, "cold"), (256, "solo"), (256, "warm"),
                                                               (512, "cold"), (512, "solo")]
    lines = report_fold.fold_rows(rows)
    assert lines == [
        "| `flashlight-fold`, N_res 256, deep MSA | bf16 | 1800, 2000 | stock 3600, 3600; alone 4100 / 3200, "
        "again 2000 / 1900 | 2.00×, 1.80× |",
        "| `flashlight-fold`, N_res 512, deep MSA | bf16 | 3000 | stock 3600; alone 4100 / 3200 | 1.20× |"]
    section = report_summary.readme_section({}, [], [], [], rows)
    assert lines[0] in section and report_fold.CAPTION in section


def test_end_to_end_rows_take_flashlight_at_its_faster_scope(tmp_path):
    """An end-to-end row shows Flashlight at the faster of its two scopes (the attention
    cores, or whole blocks from ``block_scope/``), labelled when it is whole blocks, and
    the report keeps both scopes' times."""
    from bench import report_summary

    def cell(mode, ms, when):
        return {"scope": "stack", "n_res": 256, "mode": mode, "status": "ok", "ms": ms, "blocks": 48,
                "run": 0, "measured_at": when}

    runs = [{"id": 0, "gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-12-01"}]
    (tmp_path / "evoformer.json").write_text(json.dumps({"runs": runs, "cells": [
        cell("stock", 880.0, "2026-12-01T00:00:00"), cell("compile", 510.0, "2026-12-01T00:00:00"),
        cell("flashlight", 485.0, "2026-12-01T00:00:00")]}))
    (tmp_path / "block_scope").mkdir()
    (tmp_path / "block_scope" / "stack.json").write_text(json.dumps({"runs": runs, "cells": [
        cell("flashlight-block", 267.0, "2026-12-03T00:00:00")]}))
    evo, _ = report.load_evoformer(tmp_path)
    (row,) = report_summary.e2e_rows(evo)
    assert row == ("| Evoformer stack (48 blocks), N_res 256, whole blocks compiled | fp32 (TF32) | 267 | "
                   "torch.compile per block 510; stock 880 | 1.91× |")
    table = "\n".join(report_evoformer.evoformer_table(evo))
    assert "| 485 | 267 | 3.30× |" in table


def test_fidelity_section_lists_every_seed_and_the_median(tmp_path):
    from bench.report_fidelity import fidelity_lines

    assert fidelity_lines(tmp_path) == []
    cells = [{"n_res": 256, "seed": s, "variant": v, "status": "ok", "rms_atom_deviation_A": rms,
              "max_atom_deviation_A": 1.0, "max_plddt_difference": 0.04, "single_relative_rms": 0.013}
             for s, v, rms in ((0, "stock_bf16", 0.08), (0, "flashlight_bf16", 0.09), (1, "stock_bf16", 0.05),
                               (1, "flashlight_bf16", 0.04), (2, "stock_bf16", 0.02), (2, "flashlight_bf16", 0.03))]
    (tmp_path / "fidelity.json").write_text(json.dumps({"runs": [{"id": 0, "gpu": "NVIDIA H200"}], "cells": cells}))
    lines = fidelity_lines(tmp_path)
    assert "| 256 | 1 | Flashlight bf16 | 0.04 | 1 | 0.04 | 0.013 | – |" in lines
    (median,) = [line for line in lines if line.startswith("- N_res 256")]
    assert "stock bf16 0.05 Å over 3 seed(s); Flashlight bf16 0.04 Å over 3 seed(s)" in median


def test_peers_section_compares_flashlight_with_graphs_to_the_fastest_other(tmp_path):
    """The newest cell of each mode is shown; the ratio is against the fastest non-Flashlight
    mode of the row; a failed cell and a run's note are listed."""
    from bench.report_peers import peers_lines

    assert peers_lines(tmp_path) == []

    def cell(mode, ms, at="2026-12-04T07:00:00Z", status="ok"):
        return {"scope": "model", "n_res": 256, "dtype": "bf16", "mode": mode, "status": status, "ms": ms,
                "peak_gib": 1.0, "measured_at": at, "message": "the peer computed no call"}

    cells = [cell("stock", 900.0), cell("cueq", 700.0), cell("cueq-graphs", 600.0, at="2026-12-04T06:00:00Z"),
             cell("cueq-graphs", 450.0), cell("ds4sci", None, status="error"), cell("flashlight-graphs", 300.0)]
    runs = [{"id": 0, "date": "2026-12-04T06:00:00", "gpu": "NVIDIA H200", "note": "beside a build"}]
    (tmp_path / "evoformer_peers.json").write_text(json.dumps({"runs": runs, "cells": cells}))
    lines = peers_lines(tmp_path)
    (row,) = [line for line in lines if line.startswith("| model_1 ")]
    assert "| 450 (1.0) |" in row and row.endswith("| 1.50× (cueq-graphs) |")
    assert "| error |" in row
    assert any("ds4sci: error: the peer computed no call" in line for line in lines)
    assert any(line.startswith("- Run 0") and "beside a build" in line for line in lines)


def test_peers_summary_row_sets_each_peer_at_its_fastest_form(tmp_path):
    """Flashlight with graphs against each other implementation's fastest valid form: with
    graphs where they help, plain where that is faster (or where graphs gave a wrong result)."""
    from bench.report_peers import summary_rows

    def cell(mode, ms, status="ok"):
        return {"scope": "model", "n_res": 256, "dtype": "bf16", "mode": mode, "status": status, "ms": ms,
                "measured_at": "2026-12-04T07:00:00Z"}

    cells = [cell("stock", 900.0), cell("cueq", 700.0), cell("flashlight", 600.0), cell("stock-graphs", 800.0),
             cell("cueq-graphs", 450.0), cell("ds4sci", 420.0), cell("ds4sci-graphs", 200.0, status="wrong"),
             cell("flashlight-graphs", 300.0)]
    (tmp_path / "evoformer_peers.json").write_text(json.dumps({"runs": [], "cells": cells}))
    (row,) = summary_rows(tmp_path)
    assert row == ("| `model_1` inference, N_res 256, attention peers | bf16 | 300 | DS4Sci 420; "
                   "cuEquivariance + graphs 450; stock + graphs 800 | 1.40× |")


def test_long_chain_rows_set_flashlight_against_stocks_low_memory_settings(tmp_path):
    from bench import report_long_chain

    assert report_long_chain.long_chain_lines(tmp_path) == [] and report_long_chain.summary_rows(tmp_path) == []
    cell = {"n_seq": 512, "n_extra": 5120, "run": 0, "finite": True}
    cells = [
        {**cell, "n_res": 2048, "mode": "flashlight", "status": "ok", "ms": 24000.0, "first_call_s": 47.7,
         "peak_gib": 50.3, "chunk_size": None},
        {**cell, "n_res": 2048, "mode": "stock_chunked", "status": "ok", "ms": 130000.0, "first_call_s": 130.0,
         "peak_gib": 14.6, "chunk_size": 4},
        {**cell, "n_res": 2048, "mode": "stock_lma", "status": "ok", "ms": 150000.0, "first_call_s": 150.0,
         "peak_gib": 9.0, "chunk_size": 4},
        {**cell, "n_res": 3072, "mode": "flashlight", "status": "oom", "message": "CUDA out of memory"},
    ]
    path = tmp_path / "long_chain.json"
    path.write_text(json.dumps({"runs": [{"id": 0, "gpu": "NVIDIA H200"}], "cells": cells}))
    (row,) = report_long_chain.summary_rows(tmp_path)  # 3072: no Flashlight pass, no row
    # both stock cells ran with OpenFold's chunk-size tuner off: not stock at its best, no ratio
    assert "N_res 2048" in row and "stock (chunk 4, tuner off) 130000" in row and row.endswith("| – |")
    lines = report_long_chain.long_chain_lines(tmp_path)
    assert any("| 3072 | Flashlight, unchunked | oom |" in line and "out of memory" in line for line in lines)
    assert sum(line.startswith("| 2048 |") for line in lines) == 3

    tuned = {"chunk_tuner": True, "tuned_chunk_sizes": {"evoformer": 256, "extra_msa_stack": 64}}
    cells[1] = {**cells[1], **tuned, "ms": 60000.0}
    path.write_text(json.dumps({"runs": [{"id": 0, "gpu": "NVIDIA H200"}], "cells": cells}))
    (row,) = report_long_chain.summary_rows(tmp_path)
    assert "stock (chunk ≥ 4, tuned) 60000" in row and row.endswith("| 2.50× |")
    (stock_line,) = [line for line in report_long_chain.long_chain_lines(tmp_path)
                     if line.startswith("| 2048 | stock, preset chunk size |")]
    assert "evoformer 256, extra_msa_stack 64" in stock_line


def test_fold_rows_take_medians_of_recent_runs_and_modules_are_read_against_stock_noise():
    """Since NOISE_SINCE a fold row is the median of every run (cold and warm processes,
    counted in its label); a module slower than stock counts as *slower* only beyond
    stock-against-stock spread over the same processes."""
    from bench import report_fold

    day = report_fold.NOISE_SINCE
    rows = []
    # two runs: stock spans of the unpatched module 1.0 and 1.2 s (noise 20%)
    for i, (flash_s, stock_mod, flash_mod) in enumerate(((1.0, 1.0, 1.1), (2.0, 1.2, 1.3))):
        for cache in ("cold", "warm"):
            row = _fold_row(cache, f"{day}T0{2 * i + (cache == 'warm')}", flash_s)
            row.update(file=f"run{i}.json", measured_at=row["measured_at"],
                       stock_modules_synchronised_s={"tri_mul_in": stock_mod, "msa_att_row": 4.0,
                                                     "pair_transition": stock_mod},
                       flashlight_modules_synchronised_s={"tri_mul_in": flash_mod, "msa_att_row": 1.0,
                                                          "pair_transition": 2 * stock_mod})
            rows.append(row)
    (line,) = report_fold.fold_rows(rows)
    assert "deep MSA (2 runs)" in line and "| 1500, 1500 | stock 3600, 3600;" in line
    assert line.endswith("| 2.70×, 2.70× |")  # medians of 3.6 and 1.8
    cells = {c["module"]: c for c in report_fold.module_noise(rows)}
    assert cells["msa_att_row"]["verdict"] == "ok" and cells["msa_att_row"]["patched"]
    assert cells["tri_mul_in"]["verdict"] == "noise"  # 0.91x, within stock's own 20%
    assert cells["tri_mul_in"]["stock_noise"] == pytest.approx(0.2)
    assert cells["pair_transition"]["verdict"] == "slower"  # 0.5x, beyond it


def test_second_run_and_new_forms_sections_set_flashlight_against_stock_and_peers(tmp_path):
    from bench import report_fold, report_new_forms

    assert report_fold.warm_first_fold_lines(tmp_path) == [] and report_new_forms.new_forms_lines(tmp_path) == []
    runs = {"stock": [{"first_fold_s": 2.0}, {"first_fold_s": 2.4}],
            "flashlight": [{"first_fold_s": 1.9}, {"first_fold_s": 2.3}]}
    (tmp_path / "fold_product_runs").mkdir()
    (tmp_path / "fold_product_runs" / "warm_first_fold_256_single_fp32.json").write_text(json.dumps({
        "schema": report_fold.WARM_SCHEMA, "fasta": "structures/examples/synthetic_256.fasta", "date": "2026-12-05",
        "gpu": "NVIDIA H200", "cold": {"first_fold_s": 2.9}, "runs": runs,
        "median_first_fold_s": {"stock": 2.2, "flashlight": 2.1}}))
    lines = report_fold.warm_first_fold_lines(tmp_path)
    (row,) = [line for line in lines if "| flashlight |" in line]
    assert "2.10 (1.90, 2.30)" in row and "0.95×" in row and row.endswith("| 2.90 |")
    cell = {"ms": 0.5, "max_rel_err": 1e-3, "peak_mib_above_inputs": 4.0}
    (tmp_path / "new_forms.json").write_text(json.dumps({"meta": {
        "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date": "2026-12-05T00:00", "dtype": "bf16",
        "flashlight_source_digest": "abc"}, "rows": [{
            "form": "latent", "B": 4, "H": 8, "L": 1024, "D": 64, "eager": cell, "torch_compile": {**cell, "ms": 0.25},
            "flashlight": {**cell, "ms": 1.0}, "flashlight_kernels": [["bmm"]], "flashlight_outside": [],
            "flashlight_tuning": [{"choice": "eager", "kernel_ms": 4.7, "eager_ms": 0.12, "candidates": 4}]}]}))
    (row,) = [line for line in report_new_forms.new_forms_lines(tmp_path) if line.startswith("| latent")]
    assert "| 0.25× |" in row and "unfused graph (0.120 ms; kernel 4.700 ms)" in row


def test_sdpa_gate_and_other_gpu_sections_set_flashlight_against_peers_of_the_same_run(tmp_path):
    from bench import report_new_forms, report_peers

    assert report_new_forms.sdpa_gate_lines(tmp_path) == [] and report_peers.other_gpu_lines(tmp_path) == []
    timed = {"ms": 0.05, "max_rel_err": 4e-3, "kernel_ms": 0.04, "host_ms": 0.042}
    (tmp_path / "sdpa_gate.json").write_text(json.dumps({
        "meta": {"gpu": "NVIDIA H100", "torch": "2.11", "triton": "3.6"}, "rows": [{
            "B": 4, "H": 8, "L": 1024, "D": 64, "eager": timed, "torch_compile": {**timed, "ms": 0.045},
            "flashlight": {**timed, "ms": 0.03}, "flashlight_kernels": 1, "flashlight_fallback_ops": []}]}))
    (row,) = [line for line in report_new_forms.sdpa_gate_lines(tmp_path) if line.startswith("| 4x8")]
    assert "| 1.50× | 1 |" in row and "0.045 (0.040 / 0.042)" in row
    run = {"id": 0, "gpu": "NVIDIA H100", "torch": "2.11", "triton": "3.6", "date": "2026-12-05T00:00"}
    shape = {"B": 4, "H": 16, "L": 4096, "D": 64}
    cells = [{"variant": "vanilla", "shape": shape, "impl": impl, "status": "ok", "ms": ms, "measured_at": "1"}
             for impl, ms in (("flex_flash", 0.5), ("flex", 0.7), ("flashlight", 0.625))]
    cells.append({"variant": "evoformer_core", "shape": {"N": 512}, "impl": "flex_flash", "status": "error",
                  "measured_at": "1", "formulations": {"catalog": {"status": "error", "message": "MLIRError: x"}}})
    (tmp_path / report_peers.OTHER_GPU_DIR).mkdir()
    (tmp_path / report_peers.OTHER_GPU_DIR / "flash_lm.json").write_text(json.dumps({"runs": [run], "cells": cells}))
    lines = report_peers.other_gpu_lines(tmp_path)
    (row,) = [line for line in lines if line.startswith("| vanilla")]
    assert row == "| vanilla | B4 H16 L4096 D64 | 0.500 | 0.700 | 0.625 |"
    assert "- evoformer_core (catalog): `MLIRError: x`" in lines and "`flash_lm.json`:" in lines


def test_dropout_section_rates_flashlight_against_the_fastest_other_form(tmp_path):
    from bench.report_new_forms import dropout_lines

    row = {"B": 2, "H": 8, "L": 1024, "D": 64, "eager": {"ms": 1.0, "peak_mib": 300.0},
           "torch_compile": {"error": "x"}, "sdpa": {"ms": 0.5, "peak_mib": 40.0},
           "flashlight": {"ms": 0.4, "peak_mib": 20.0}}
    (tmp_path / "dropout.json").write_text(json.dumps({
        "environment": {"gpu": "NVIDIA H200", "device": "cuda", "torch": "2.11", "triton": "3.6"},
        "config": {"p": 0.1}, "results": [row]}))
    lines = dropout_lines(tmp_path)
    assert any("NVIDIA H200" in line for line in lines)
    assert "| 2x8x1024x64 | 1.000 (300) | fails | 0.500 (40) | 0.400 (20) | 1.25× |" in lines
    assert dropout_lines(tmp_path / "missing") == []
