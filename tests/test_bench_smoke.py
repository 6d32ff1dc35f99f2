"""The benchmark harness on the CPU (Triton interpreter), tiny shapes: it runs, records
cells with their errors against float64, resumes, stops on its time budget, and the
report turns its output into tables."""
import json
import math
import os
import pathlib
import sys
import time

import pytest
import torch

pytest.importorskip("triton")

from bench import kernels, report, report_evoformer  # noqa: E402


def _kernels(tmp_path: pathlib.Path, *extra: str) -> int:
    return kernels.main([
        "--device", "cpu", "--smoke", "--quiet",
        "--variants", "vanilla,msa_row_pair_bias",
        "--impls", "eager,sdpa,flashlight",
        "--out", str(tmp_path / "kernels_smoke_test.json"),
        *extra,
    ])


def test_kernels_smoke_records_resumes_and_reports(tmp_path):
    assert _kernels(tmp_path) == kernels.EXIT_COMPLETE
    data = json.loads((tmp_path / "kernels_smoke_test.json").read_text())
    assert len(data["runs"]) == 1
    run = data["runs"][0]
    assert run["device"] == "cpu" and run["torch"] and run["triton"] and run["date"]
    assert set(run["roofline"]) == {"copy_tb_per_s", "bf16_tflop_per_s", "tf32_tflop_per_s", "fp32_tflop_per_s"}
    cells = {(c["variant"], c["impl"]): c for c in data["cells"]}
    assert set(cells) == {(v, i) for v in ("vanilla", "msa_row_pair_bias") for i in ("eager", "sdpa", "flashlight")}
    for cell in cells.values():
        assert cell["status"] == "ok", cell
        assert cell["dtype"] == "fp32"
        assert cell["ms"] > 0 and cell["tflops"] > 0 and cell["floor_ms"] > 0
        assert cell["max_abs_err"] < 1e-4 and cell["max_rel_err"] < 1e-4
        assert cell["first_call_s"] >= 0
    assert cells[("vanilla", "flashlight")]["kernels"] == 1
    assert cells[("msa_row_pair_bias", "flashlight")]["kernels"] == 1
    for variant in ("vanilla", "msa_row_pair_bias"):  # the tile configuration each kernel ran with
        (config,) = cells[(variant, "flashlight")]["configs"]
        assert len(config) == 4 and all(isinstance(x, int) and x > 0 for x in config)
    csv_lines = (tmp_path / "kernels_smoke_test.csv").read_text().splitlines()
    assert csv_lines[0].startswith("variant,shape,dtype,impl,status,ms")
    assert len(csv_lines) == 1 + len(cells)

    # every cell is there: nothing measured, no new run recorded
    assert _kernels(tmp_path) == kernels.EXIT_COMPLETE
    assert len(json.loads((tmp_path / "kernels_smoke_test.json").read_text())["runs"]) == 1

    # the report reads result files named kernels_*.json (smoke files excluded)
    (tmp_path / "kernels_cpu.json").write_text((tmp_path / "kernels_smoke_test.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n\nText.\n")
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Project\n\nText.\n")
    assert text.count(report.BEGIN) == 1 and "## Benchmarks" in text and "msa_row_pair_bias" in text
    assert "### Where Flashlight loses" in text and "REPORT.md" in text and ".png" not in text
    assert (tmp_path / "REPORT.md").exists() and (tmp_path / "plots" / "kernels_fp32.png").exists()
    # the full report also gives each cell's throughput and first-call time (CPU: no memory figures)
    full = (tmp_path / "REPORT.md").read_text()
    assert "## Throughput, memory and first-call time" in full and "## Summary" in full
    (fl_row,) = [line for line in full.splitlines()
                 if line.startswith("| vanilla |") and line.count("/") >= 4 and "TFLOP" not in line]
    fl_cell = cells[("vanilla", "flashlight")]
    assert f"| {fl_cell['tflops']:.1f} |" in fl_row and f"{fl_cell['first_call_s']:.2f} / " in fl_row
    # regenerating replaces the section instead of appending another
    assert report.main(["--results", str(tmp_path), "--readme", str(readme)]) == 0
    assert readme.read_text().count(report.BEGIN) == 1


def test_kernels_measures_several_outputs_and_whole_modules(tmp_path):
    """A variant returning its output and log-sum-exp is checked on both against float64;
    the global column attention (a module with projections) runs with its attention in a
    Flashlight kernel; ``--variants general`` names the variants of bench/variants_general.py."""
    from bench.variants_general import GENERAL_VARIANTS

    out = tmp_path / "kernels_general_smoke.json"
    assert kernels.main(["--device", "cpu", "--smoke", "--quiet", "--variants", "attention_lse,global_column",
                         "--impls", "eager,flashlight", "--out", str(out)]) == kernels.EXIT_COMPLETE
    cells = {(c["variant"], c["impl"]): c for c in json.loads(out.read_text())["cells"]}
    assert len(cells) == 4
    for cell in cells.values():
        assert cell["status"] == "ok", cell
        assert cell["max_rel_err"] < 1e-4 and cell["nonfinite"] == 0, cell
    assert cells[("attention_lse", "flashlight")]["kernels"] == 1
    assert cells[("global_column", "flashlight")]["kernels"] >= 1
    args = kernels.parse_args(["--variants", "general"])
    from bench.variants import VARIANTS

    names = [v.name for v in kernels._select(args, VARIANTS)[0]]
    assert names == [v.name for v in GENERAL_VARIANTS]
    lm = [v.name for v in kernels._select(kernels.parse_args(["--variants", "lm"]), VARIANTS)[0]]
    assert not set(lm) & set(names)


def test_kernels_stops_on_time_budget(tmp_path):
    # no time for any cell: the run records itself, measures nothing and says "incomplete"
    assert _kernels(tmp_path, "--max-minutes", "0.01", "--impls", "eager") == kernels.EXIT_INCOMPLETE
    data = json.loads((tmp_path / "kernels_smoke_test.json").read_text())
    assert data["cells"] == [] and data["runs"][0]["cells_measured"] == 0


def test_failing_implementation_is_a_recorded_result(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("deliberate failure")

    real = kernels.make_impl
    monkeypatch.setattr(kernels, "make_impl",  # (variant, impl, device, report[, formulation])
                        lambda *a: broken if a[1] == "sdpa" else real(*a))
    assert _kernels(tmp_path, "--variants", "vanilla", "--impls", "eager,sdpa") == kernels.EXIT_COMPLETE
    cells = {c["impl"]: c for c in json.loads((tmp_path / "kernels_smoke_test.json").read_text())["cells"]}
    assert cells["eager"]["status"] == "ok"
    assert cells["sdpa"]["status"] == "error" and "deliberate failure" in cells["sdpa"]["message"]


def test_a_wrong_result_is_not_a_time(tmp_path, monkeypatch):
    """A cell whose output has NaN, or is far from float64 eager, is recorded as wrong
    (as an implementation launching outside the stream it was given would be), never ok."""
    real = kernels.make_impl

    def make(*a):
        fn = real(*a)
        if a[1] == "sdpa":
            return lambda *args: fn(*args) * float("nan")
        if a[1] == "eager":
            return lambda *args: fn(*args) * 1.5
        return fn

    monkeypatch.setattr(kernels, "make_impl", make)
    assert _kernels(tmp_path, "--variants", "vanilla", "--impls", "eager,sdpa,flashlight") == kernels.EXIT_COMPLETE
    cells = {c["impl"]: c for c in json.loads((tmp_path / "kernels_smoke_test.json").read_text())["cells"]}
    assert cells["flashlight"]["status"] == "ok"
    assert cells["sdpa"]["status"] == "wrong" and "non-finite" in cells["sdpa"]["message"]
    assert cells["eager"]["status"] == "wrong" and "relative to its scale" in cells["eager"]["message"]


def test_sdpa_with_several_batch_dims_matches_the_unflattened_call():
    import torch
    import torch.nn.functional as F

    from bench.variants import sdpa_any_batch

    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 4, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 4, 7, 5, generator=gen, dtype=torch.float64)  # [B, S, H, L, Dv]
    bias = torch.randn(2, 1, 4, 7, 7, generator=gen, dtype=torch.float64)  # broadcast over S
    got = sdpa_any_batch(q, k, v, attn_mask=bias)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    assert got.shape == (2, 3, 4, 7, 5)


@pytest.mark.parametrize("impl", ["flex", "sdpa"])
def test_peer_formulations_compute_the_variant(impl):
    """Every FlexAttention / SDPA formulation in the catalog equals the variant's plain
    form (in float64) on random inputs, so peers are timed on the same computation."""
    import torch

    from bench.variants import VARIANTS
    from bench.variants_base import as_outputs

    checked = 0
    for name, v in VARIANTS.items():
        peer = getattr(v, impl)
        if peer is None:
            continue
        gen = torch.Generator().manual_seed(1)
        args = v.make_inputs(v.default_shape, torch.float32, "cpu", gen)
        refs = as_outputs(kernels.reference(v, args))
        gots = as_outputs(peer(*args))  # every output: an attention and its log-sum-exp too
        assert len(gots) == len(refs), name
        for got, ref in zip(gots, refs):
            assert got.shape == ref.shape, name
            assert torch.isfinite(got).all(), name
            torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked >= 12


def _evoformer_stack_cell(tmp_path: pathlib.Path, mode: str) -> tuple[dict, list[str]]:
    """Run the one-block CPU stack cell of ``mode``; returns its cell and the argv."""
    pytest.importorskip("openfold")
    from bench import evoformer

    out = tmp_path / "evoformer.json"
    argv = ["--smoke", "--scopes", "stack", "--modes", mode, "--blocks", "1", "--out", str(out)]
    assert evoformer.main(argv) == evoformer.EXIT_COMPLETE
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["status"] == "ok", cell
    assert cell["scope"] == "stack" and cell["mode"] == mode and cell["blocks"] == 1
    return cell, argv


def test_evoformer_smoke_stock(tmp_path):
    from bench import evoformer

    cell, argv = _evoformer_stack_cell(tmp_path, "stock")
    assert cell["ms"] > 0 and len(cell["per_block_ms"]) == 1
    assert {"msa_att_row", "msa_att_col", "tri_att_start", "tri_att_end"} <= set(cell["breakdown_ms"])
    assert 0 < cell["attention_share"] < 1
    assert evoformer.main(argv) == evoformer.EXIT_COMPLETE  # resumes: nothing left to do
    assert len(json.loads((tmp_path / "evoformer.json").read_text())["cells"]) == 1


def test_evoformer_stack_with_graphs_calls_the_stack_whole(tmp_path):
    """A ``-graphs`` stack cell installs the graphed forwards and calls the Evoformer stack
    whole (on the CPU it runs eagerly): the stock result, a total time and no per-block
    times or breakdown."""
    cell, _ = _evoformer_stack_cell(tmp_path, "stock-graphs")
    assert cell["cuda_graphs"] == 2 and cell["ms"] > 0 and "record_call_s" in cell  # no extra-MSA stack here
    assert "per_block_ms" not in cell and "breakdown_ms" not in cell
    assert cell["max_abs_diff_vs_stock"] < 1e-5


def test_evoformer_budget_stopped_cell_is_recorded_as_timeout(tmp_path, monkeypatch):
    """A cell the call's budget stops after --record-after seconds is a result (it cannot
    finish in one call), and --retry tries it again only with more time than it ran."""
    pytest.importorskip("openfold")
    from bench import evoformer

    monkeypatch.setattr(evoformer, "MIN_CELL_START_S", 0.5)
    monkeypatch.setattr(evoformer, "run_stack", lambda *a: time.sleep(30))
    out = tmp_path / "evoformer.json"
    argv = ["--smoke", "--scopes", "stack", "--modes", "stock", "--blocks", "1", "--out", str(out),
            "--max-minutes", "0.04", "--record-after", "1", "--retry"]
    started = time.monotonic()
    assert evoformer.main(argv) == evoformer.EXIT_COMPLETE
    assert time.monotonic() - started < 10
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["status"] == "timeout" and "time budget" in cell["message"] and cell["wall_s"] >= 1
    assert evoformer.main(argv) == evoformer.EXIT_COMPLETE  # no more time now than then: not retried
    assert evoformer.wanted_again(cell, retry=True, budget_left_s=cell["wall_s"] + 60)
    assert not evoformer.wanted_again(cell, retry=False, budget_left_s=1e9)
    assert evoformer.wanted_again({"status": "oom"}, retry=True, budget_left_s=0)
    assert not evoformer.wanted_again({"status": "ok"}, retry=True, budget_left_s=1e9)
    # stock chunked with OpenFold's chunk-size tuner off is not stock at its best: measured again
    assert evoformer.wanted_again({"status": "ok", "chunk_size": 4}, retry=False, budget_left_s=0)
    assert not evoformer.wanted_again({"status": "ok", "chunk_size": 4, "chunk_tuner": True}, retry=True,
                                      budget_left_s=1e9)


def test_evoformer_budget_stopped_short_cell_is_left_for_the_next_call(tmp_path, monkeypatch):
    pytest.importorskip("openfold")
    from bench import evoformer

    monkeypatch.setattr(evoformer, "MIN_CELL_START_S", 0.5)
    monkeypatch.setattr(evoformer, "run_stack", lambda *a: time.sleep(30))
    out = tmp_path / "evoformer.json"
    argv = ["--smoke", "--scopes", "stack", "--modes", "stock", "--blocks", "1", "--out", str(out),
            "--max-minutes", "0.04"]  # stopped after ~2.4 s, under the default --record-after
    assert evoformer.main(argv) == evoformer.EXIT_INCOMPLETE
    assert json.loads(out.read_text())["cells"] == []


def test_evoformer_smoke_compile_matches_stock(tmp_path):
    """The ``compile`` mode measures a compiled block (no silent eager fallback), whose
    output matches stock OpenFold; where default Inductor fails on OpenFold's code, the
    failure is recorded next to the options the cell was measured with."""
    cell, _ = _evoformer_stack_cell(tmp_path, "compile")
    assert cell["dynamo_graphs"] >= 1 and cell["graph_breaks"] == 0
    assert cell["max_abs_diff_vs_stock"] < 1e-4
    if "compile_options" in cell:
        assert cell["compile_options"] == {"pattern_matcher": False}
        assert cell["compile_default_error"].startswith("BackendCompilerFailed")


def test_model_run_that_does_not_fit_is_chunked_the_way_openfold_ships():
    """A whole-model call that runs out of GPU memory without chunking is repeated once
    with OpenFold's default ``chunk_size`` (recorded); any other error propagates."""
    pytest.importorskip("openfold")
    import types

    import torch

    from openfold.config import model_config as of_model_config

    from bench.evoformer import _fitting

    model = types.SimpleNamespace(globals=types.SimpleNamespace(chunk_size=None))
    seen = []

    def needs_chunks():
        seen.append(model.globals.chunk_size)
        if model.globals.chunk_size is None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 GiB")
        return "out"

    default = of_model_config("model_1").globals.chunk_size
    assert default is not None
    assert _fitting(model, needs_chunks) == ("out", default)
    assert seen == [None, default] and model.globals.chunk_size == default
    assert _fitting(model, lambda: "fits") == ("fits", None) and model.globals.chunk_size is None

    def broken():
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError):
        _fitting(model, broken)
    assert model.globals.chunk_size is None


def test_synthetic_batch_shapes():
    pytest.importorskip("openfold")
    from bench.evoformer_inputs import synthetic_batch

    batch = synthetic_batch(n_res=7, n_seq=5, n_extra=9, iters=2, device="cpu", seed=0)
    assert batch["msa_feat"].shape == (5, 7, 49, 2)
    assert batch["target_feat"].shape == (7, 22, 2)
    assert batch["extra_msa"].shape == (9, 7, 2) and batch["extra_msa_mask"].shape == (9, 7, 2)
    assert batch["residx_atom37_to_atom14"].shape == (7, 37, 2)
    assert batch["aatype"].shape == (7, 2)


def test_run_all_runs_named_parts_in_the_order_given(tmp_path):
    """``bench/run_all.sh PART...`` runs those parts in the order named (not the catalog's),
    records each as done and skips it the next time; an unknown name is an error."""
    import os
    import shutil
    import subprocess

    root = tmp_path / "repo"
    (root / "bench" / "results").mkdir(parents=True)
    shutil.copy(pathlib.Path(__file__).parents[1] / "bench" / "run_all.sh", root / "bench" / "run_all.sh")
    log = tmp_path / "calls.log"
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/usr/bin/env bash\n'
                           'echo "$*${FLASHLIGHT_REPEATS_OUTSIDE:+ [repeats outside: $FLASHLIGHT_REPEATS_OUTSIDE]}" >> "$CALLS_LOG"\n')
    fake_python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake_python), "CALLS_LOG": str(log)}

    def run(*parts):
        log.write_text("")
        done = subprocess.run(["bash", "bench/run_all.sh", *parts], cwd=root, env=env,
                              capture_output=True, text=True)
        return done, [line for line in log.read_text().splitlines() if "bench.report" not in line]

    done, calls = run("kernels-lm-bf16", "evoformer-256")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    assert calls[0].startswith("-m bench.kernels") and "--variants lm" in calls[0] and "--dtypes bf16 " in calls[0]
    assert calls[1].startswith("-m bench.evoformer") and "--n-res 256" in calls[1]
    assert (root / "bench" / "results" / "run_all.done").read_text().split() == ["kernels-lm-bf16", "evoformer-256"]

    done, calls = run("evoformer-256")
    assert done.returncode == 0 and calls == []  # already done

    # a part that sets a variable for its command runs it with the variable set
    done, calls = run("training-lm-repeats-inside")
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls[0].startswith("-m bench.training") and calls[0].endswith("[repeats outside: 0]")
    listed = subprocess.run(["bash", "bench/run_all.sh", "--list"], cwd=root, env=env,
                            capture_output=True, text=True).stdout.splitlines()
    commands = [line.split(None, 2)[2] for line in listed]
    assert commands and all("=" not in command.split()[0] for command in commands)  # no VAR=value prefix

    done, calls = run("evoformer-256", "no-such-part")
    assert done.returncode == 2 and "no-such-part" in done.stderr and calls == []


def test_build_times_builds_the_given_configurations_for_a_gpu(tmp_path):
    from bench import build_times

    out = tmp_path / "build.json"
    assert build_times.main(["--variants", "vanilla", "--dtype", "bf16", "--configs", "64,32,4,2",
                             "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["variant"] == "vanilla" and row["config"] == [64, 32, 4, 2]
    assert row["build_s"] > 0 and row["shared_bytes"] > 0
    assert build_times.main(["--variants", "vanilla", "--configs", "64,32"]) == 2
    assert build_times.main(["--variants", "no_such_variant"]) == 2


def test_build_times_builds_the_kernels_of_a_training_step(tmp_path):
    from bench import build_times

    out = tmp_path / "build.json"
    assert build_times.main(["--variants", "mqa", "--dtype", "bf16", "--configs", "32,32,4,1", "--backward",
                             "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len({row["kernel"] for row in rows}) >= 3  # the forward's, and the backward's
    assert all(row["shared_bytes"] > 0 for row in rows)


def test_an_out_of_memory_from_before_the_chunked_retry_says_so():
    stock = {"scope": "model", "n_res": 1024, "mode": "stock", "status": "ok", "ms": 26000.0, "chunk_size": 4}
    old = {"scope": "model", "n_res": 1024, "mode": "flashlight", "status": "oom"}
    new = {**old, "mode": "compile", "reference_chunk_size": 4}
    (row,) = [line for line in report_evoformer.evoformer_table([stock, old, new]) if "1024" in line]
    cells = [c.strip() for c in row.split("|")]
    assert cells[3] == "26000 (chunk 4, tuner off)"
    assert cells[4] == "OOM" and cells[5] == "OOM (before chunked retry)"


def test_merge_results_folds_side_files_into_the_part_file(tmp_path):
    from bench import merge_results

    def cell(variant, impl, run, ms):
        return {"variant": variant, "shape": {"L": 256}, "dtype": "fp32", "impl": impl, "run": run,
                "status": "ok", "ms": ms}

    target = tmp_path / "kernels_lm.json"
    target.write_text(json.dumps({"schema": "flashlight-bench-kernels/1", "runs": [{"id": 0, "gpu": "a"}],
                                  "cells": [cell("gqa", "eager", 0, 1.0), cell("mqa", "eager", 0, 2.0)]}))
    side = tmp_path / "kernels_lm_gpu1.json"
    side.write_text(json.dumps({"schema": "flashlight-bench-kernels/1",
                                "runs": [{"id": 0, "gpu": "b"}, {"id": 1, "gpu": "c"}],
                                "cells": [cell("mqa", "eager", 1, 3.0), cell("differential", "eager", 0, 4.0)]}))
    assert merge_results.main([str(target), str(side), "--remove"]) == 0
    data = json.loads(target.read_text())
    assert [r["gpu"] for r in data["runs"]] == ["a", "b", "c"] and [r["id"] for r in data["runs"]] == [0, 1, 2]
    by_variant = {c["variant"]: c for c in data["cells"]}
    assert len(data["cells"]) == 3
    assert by_variant["gqa"]["run"] == 0 and by_variant["gqa"]["ms"] == 1.0
    assert by_variant["mqa"]["run"] == 2 and by_variant["mqa"]["ms"] == 3.0  # replaced, cites its own run
    assert by_variant["differential"]["run"] == 1
    assert not side.exists() and (tmp_path / "kernels_lm.csv").exists()


def test_compile_interference_compares_threads_and_worker_processes(tmp_path):
    """bench.compile_interference runs without the interpreter (a child process) and
    reports the loop alone, beside a compile on a thread and beside a worker's."""
    import subprocess

    out = tmp_path / "ci.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "bench.compile_interference", "--compiles", "1", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=str(pathlib.Path(__file__).parent.parent))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["alone", "thread", "process"]
    assert rows[0]["loop_relative"] == 1.0 and all(r["loop_per_s"] > 0 for r in rows)
    assert all(r["compile_wall_s"] > 0 for r in rows[1:])


def test_training_step_compares_gradients_that_are_not_rounding_noise():
    """A gradient zero in exact arithmetic is noise in both models: listed apart, never
    the worst relative difference."""
    from bench.training_step import grad_differences

    stock = {"w": 1.0, "v": 0.5, "u": 2.0, "ln_bias": 1e-7}
    patched = {"w": 1.1, "v": 0.5, "u": 2.0, "ln_bias": 6e-6}  # 60x the stock noise
    found = grad_differences(stock, patched)
    ratio, name = found["worst_grad_norm_differences"][0]
    assert name == "w" and math.isclose(ratio, 0.1)
    assert all(n != "ln_bias" for _, n in found["worst_grad_norm_differences"])
    assert found["near_zero_gradients"]["count"] == 1 and found["near_zero_gradients"]["largest"] == 6e-6


def test_training_saved_sizes_a_storage_at_the_training_lengths():
    """A storage counted at the prime lengths (S, R) is sized at others exactly; the
    saved-tensor count sees a score-sized tensor that stock attention keeps."""
    from bench import training_saved as ts

    scores = {"elements": ts.S * 8 * ts.R * ts.R, "element_bytes": 4}  # [S, H, R, R]
    assert ts.factor(scores["elements"]) == (1, 2, 8)
    assert ts.bytes_at(scores, 128, 256) == 128 * 8 * 256 * 256 * 4

    def attention(q, k, v):  # [S, H, R, c] -> [S, H, R, c], keeps its probabilities
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    class Block(torch.nn.Module):
        def forward(self, m, z, msa_mask, pair_mask, chunk_size=None, inplace_safe=False):
            q = m.view(ts.S, ts.R, 2, 4).transpose(1, 2)
            return attention(q, q * 2, q.sin()).transpose(1, 2).reshape(m.shape) * msa_mask[..., None], z * 2

    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(ts.S, ts.R, 8, generator=gen), torch.randn(ts.R, ts.R, 4, generator=gen),
              torch.rand(ts.S, ts.R, generator=gen), torch.rand(ts.R, ts.R, generator=gen)]
    sizes = sorted((ts.factor(s["elements"]) for s in ts.saved_storages(Block(), inputs)), reverse=True)
    assert (1, 2, 2) in sizes  # the probabilities [S, 2, R, R]


def test_dropout_bench_runs_every_form_and_records_the_output_scale():
    """Each form of attention with dropout runs forward and backward; its output keeps
    the no-dropout output's scale (within the spread of one draw) and its gradients are
    finite."""
    from bench import dropout

    row = dropout.run_shape(dropout.SMALL[0], "cpu", torch.float32)
    for name in ("eager", "sdpa", "flashlight"):
        cell = row[name]
        assert "error" not in cell, (name, cell)
        assert cell["finite_gradients"] and 0.7 < cell["mean_abs_vs_no_dropout"] < 1.3, (name, cell)


def test_new_forms_time_every_implementation_against_float64(tmp_path):
    """The new-forms benchmark runs every implementation of each form (FlexAttention where
    it can express the form), each within float32's rounding of float64, and reports
    Flashlight's kernels."""
    from bench import new_forms

    out = tmp_path / "new_forms.json"
    # 40 positions, more than the latent width of 32: the attention output is the smaller cut
    assert new_forms.main(["--device", "cpu", "--shapes", "1x2x40x4", "--dtype", "fp32", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [row["form"] for row in data["rows"]] == list(new_forms.FORMS)
    for row in data["rows"]:
        assert len(row["flashlight_kernels"]) == 1, row
        flex = ("flex",) if row["form"] in new_forms.FLEX_FORMS else ()
        assert ("flex" in row) == bool(flex)
        for impl in ("eager", "torch_compile", "flashlight", *flex):
            assert row[impl]["ms"] > 0 and row[impl]["max_rel_err"] < 1e-5, (row["form"], impl, row[impl])


def test_kernel_cells_of_another_gpu_are_measured_again_and_not_tabled_as_this_ones(tmp_path, capsys):
    """A result file resumed on another GPU model measures its cells again (a row never
    mixes two GPUs' times), and the table marks a cell it keeps from another GPU."""
    from bench.kernel_results import Results, cell_key, print_table
    from bench.variants import VARIANTS

    results = Results(tmp_path / "kernels_x.json")
    run = results.add_run({"gpu": "GPU A"})
    shape = {"B": 1, "H": 2, "L": 64, "D": 16}
    results.put({"variant": "vanilla", "shape": shape, "dtype": "bf16", "impl": "flex", "run": run,
                 "status": "ok", "ms": 1.25})
    key = cell_key("vanilla", shape, "bf16", "flex")
    assert results.done(key, retry=False, gpu="GPU A")
    assert not results.done(key, retry=False, gpu="GPU B")
    print_table(results.data, [VARIANTS["vanilla"]], ["bf16"], ["flex"], "GPU A")
    assert "1.2500" in capsys.readouterr().out
    print_table(results.data, [VARIANTS["vanilla"]], ["bf16"], ["flex"], "GPU B")
    out = capsys.readouterr().out
    assert "other GPU" in out and "1.2500" not in out


def test_the_stack_sampler_splits_calls_of_the_marker_and_attributes_their_time():
    """Two back-to-back calls of the marker are two windows (no gap between them), each
    holding the samples of its own call, with the busy function on top."""
    from bench import stack_sampler

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def run_within(seconds):
        busy(seconds)

    with stack_sampler.StackSampler(interval=0.002) as sampler:
        run_within(0.15)
        run_within(0.3)
    windows = stack_sampler.passes(sampler.samples, "run_within")
    assert len(windows) == 2
    spans = [w[-1][0] - w[0][0] for w in windows]
    assert 0.08 < spans[0] < 0.25 and 0.2 < spans[1] < 0.45, spans
    share, top = stack_sampler.summary(windows[1]).split("own:")[1].splitlines()[1].split("%")
    assert top.strip().endswith(":busy") and float(share) >= 90, (share, top)


def test_a_sample_without_the_marker_ends_its_window():
    """Two calls of the marker with a sample outside both between them are two windows even
    when the second call's frame reuses the first one's address (its id)."""
    from bench import stack_sampler

    inside = ("a.py:main", "a.py:run_within", "a.py:busy")
    samples = [(0.0, inside, (1, 7, 8)), (0.1, inside, (1, 7, 8)), (0.2, ("a.py:main",), (1,)),
               (0.3, inside, (1, 7, 9))]
    windows = stack_sampler.passes(samples, "run_within")
    assert [len(w) for w in windows] == [2, 1]
    assert windows[1][0][1] == ("a.py:busy",)


def test_loop_instructions_count_the_body_of_each_backward_branch():
    """``bench.build_times --sass`` counts a loop as the instructions from a backward
    branch's target to the branch, opcodes without predicates or modifiers; a forward
    branch is no loop."""
    from bench.build_times import loop_instructions

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FFMA R2, R3, 0.5, R4 ;
        /*0020*/               @P0 FADD.FTZ R2, R2, R5 ;
        /*0030*/                   MUFU.EX2 R6, R2 ;
        /*0040*/              @!P1 BRA `(.L_x_1) ;
        /*0050*/                   ISETP.GE.AND P1, PT, R7, 0x4, PT ;
        /*0060*/              @!P1 BRA 0x10 ;
        /*0070*/                   BRA 0x90 ;
        /*0080*/                   EXIT ;
    """
    (loop,) = loop_instructions(sass)
    assert loop["instructions"] == 6
    assert loop["opcodes"] == {"FFMA": 1, "FADD": 1, "MUFU": 1, "BRA": 2, "ISETP": 1}
