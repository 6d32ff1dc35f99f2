"""Kernel benchmarks: every catalog variant, forward, Flashlight against its peers.

    python -m bench.kernels [--variants all|evoformer|lm|general|a,b] [--dtypes bf16,tf32,fp32]
                            [--shapes all|default|0,2] [--impls ...] [--max-minutes 9]
                            [--out bench/results/kernels_<part>.json]

For each variant of :mod:`bench.variants`, each of its ``bench_shapes`` and each dtype
(``bf16``; ``tf32``: float32 with TF32 matmuls; ``fp32``: IEEE float32) it measures the
forward pass of

- ``flashlight``: ``flashlight.compile(variant.fn)``;
- ``eager``: ``variant.fn`` as written;
- ``torch_compile``: default ``torch.compile(variant.fn)``;
- ``sdpa``: ``variant.sdpa`` (``F.scaled_dot_product_attention`` with the bias in the
  query's dtype), the memory-efficient backend pinned;
- ``flex``: ``torch.compile`` of FlexAttention, where one call expresses the variant;
- ``flex_flash``: the same with FlexAttention's FLASH backend (CuTeDSL), where installed;
- ``cuequivariance``, ``trifast``, ``ds4sci``: hand-written kernels (see :mod:`bench.peers`),
  where installed and applicable.

``flex``, ``flex_flash`` and ``sdpa`` are each timed in every formulation of
:mod:`bench.formulations` (the catalog's, a contiguous pair bias, contiguous q/k/v); the
cell keeps the fastest that is accurate (``formulation``), with every formulation's time
and error in ``formulations``.

Per cell (variant, shape, dtype, implementation): median time (``triton.testing.do_bench``),
TFLOP/s (the catalog's useful FLOPs), the fraction of a roofline measured in the same run
(copy bandwidth, matmul rate for the dtype), peak memory beyond the live inputs, the
first call's time (compilation included), and the max abs / relative error against the
variant computed eagerly in float64 (relative: max abs error / max |reference|). Each
shape is compiled afresh (``torch.compiler.reset()``), as a fixed-size workload would.
Failures are results: ``oom``, ``error`` (with the message), ``timeout``, ``unavailable``.

Resumable: cells already in ``--out`` are skipped; results are saved after every cell.
The run stops cleanly before ``--max-minutes`` (exit status 3: run again to continue);
status 4 means a CUDA error left the process unusable (run again: that cell is recorded
and skipped). Status 0: every requested cell is in the file.

On a CPU-only machine, ``--device cpu --smoke`` runs each variant's small default shape
through eager, torch.compile, SDPA and Flashlight (Triton interpreter) to exercise the
harness; its numbers mean nothing for performance.
"""
from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sys
import time
from typing import Any, Callable

from bench.kernel_results import Results, cell_key, describe, print_table, shape_label

IMPLS = ("eager", "sdpa", "flex", "flex_flash", "torch_compile", "flashlight", "cuequivariance", "trifast", "ds4sci")
COMPILED = ("flex", "flex_flash", "torch_compile", "flashlight")
FORMULATED = ("flex", "flex_flash", "sdpa")  # timed in each formulation of bench.formulations
EVOFORMER = ("msa_row_pair_bias", "msa_column", "triangle_start", "triangle_end")
CORE = ("evoformer_core",)
SMOKE_IMPLS = ("eager", "sdpa", "torch_compile", "flashlight")

EXIT_COMPLETE, EXIT_INCOMPLETE, EXIT_RESTART, EXIT_UNAVAILABLE = 0, 3, 4, 5

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.kernels", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="all",
                   help="all, evoformer, core, lm, general, or names separated by commas")
    p.add_argument("--dtypes", default=None, help="bf16,tf32,fp32 (default: all three; fp32 with --smoke)")
    p.add_argument("--shapes", default=None,
                   help="all (bench_shapes), default (the small default_shape), or indices into bench_shapes: 0,2")
    p.add_argument("--impls", default=None, help=f"subset of {','.join(IMPLS)} (default: all)")
    p.add_argument("--out", default=None, help="result file (.json; a .csv is written beside it)")
    p.add_argument("--max-minutes", type=float, default=9.0, help="stop cleanly before this much wall-clock time")
    p.add_argument("--cell-timeout", type=float, default=240.0, help="seconds one cell may take")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench measuring time per cell, ms")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--smoke", action="store_true", help="tiny default shapes, fp32, for checking the harness")
    p.add_argument("--retry", action="store_true", help="measure again cells recorded as error/timeout/oom")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--require", default="",
                   help="implementations (comma list) this run is for: where one cannot run here, say why and "
                        f"exit with status {EXIT_UNAVAILABLE} before measuring anything (bench/run_all.sh then "
                        "leaves the part to do)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def _sig(x: float, digits: int = 5) -> float:
    """``x`` rounded to ``digits`` significant digits (tiny CPU numbers stay non-zero)."""
    return float(f"{x:.{digits}g}")


class Restart(Exception):
    """A CUDA error made this process unusable; the cell is recorded, the run stops."""


# ---------------------------------------------------------------------------- implementations


class Unavailable(Exception):
    pass


def availability(impl: str) -> str | None:
    """``None`` where ``impl`` can run here, else why not (the peers and the FLASH backend;
    the others run wherever PyTorch does)."""
    from bench import formulations, peers

    if impl == "flex_flash":
        return formulations.flash_availability()
    if impl in peers.PEERS:
        return peers.availability(impl)
    return None


def applicable(variant, impl: str) -> bool:
    from bench import formulations, peers

    if impl in FORMULATED:
        return bool(formulations.forms(variant, impl))
    if impl in peers.PEERS:
        return peers.adapter(impl, variant.name) is not None
    return True


def make_impl(variant, impl: str, device: str, report, form: Callable | None = None) -> Callable:
    """The callable of ``impl``; for ``flex``, ``flex_flash`` and ``sdpa``, of the
    formulation ``form`` (default: the catalog's)."""
    import torch

    import flashlight
    from bench import formulations, peers

    if impl == "eager":
        return variant.fn
    if impl == "torch_compile":
        return torch.compile(variant.fn)
    if impl == "flex":
        form = form or variant.flex
        return form if formulations.compiles_itself(form) else torch.compile(form)
    if impl == "flex_flash":
        why = availability(impl)
        if why:
            raise Unavailable(why)
        form = form or next(iter(formulations.forms(variant, impl).values()))
        return form if formulations.compiles_itself(form) else torch.compile(form)
    if impl == "flashlight":
        return flashlight.compile(variant.fn, report=report)
    if impl == "sdpa":
        sdpa = form or variant.sdpa
        if device != "cuda":
            return sdpa  # the efficient backend is CUDA-only
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa_efficient(*args):
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                return sdpa(*args)

        return sdpa_efficient
    if impl in peers.PEERS:
        why = availability(impl)
        if why:
            raise Unavailable(why)
        return peers.adapter(impl, variant.name)
    raise ValueError(f"unknown implementation {impl!r}")


def reference(variant, args):
    """The variant in float64, eagerly, on the inputs' device."""
    import torch

    args64 = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    with torch.no_grad():
        return variant.fn(*args64)


# ---------------------------------------------------------------------------- one cell


def _errors(out, ref) -> tuple[float, float, int]:
    """Max abs error of ``out`` against ``ref`` (float64), relative to max |ref|, and the
    count of non-finite values of ``out``."""
    import torch

    diff = (out.double() - ref).abs().max()
    return float(diff), float(diff / ref.abs().max().clamp_min(1e-300)), int((~torch.isfinite(out)).sum())


# A cell whose output is further than this from float64 eager (relative to the output's
# largest magnitude) computed something else. Every valid cell so far is below 0.045 (bf16
# eager and cuEquivariance's TF32 included), far under this.
WRONG_REL_ERR = 0.1


def _wrong_result(rec: dict) -> str | None:
    """Why a measured cell's output does not count as the attention's, or ``None``."""
    if rec.get("nonfinite"):
        return f"{rec['nonfinite']} non-finite output values"
    rel = rec.get("max_rel_err")
    if rel is not None and not rel <= WRONG_REL_ERR:  # NaN fails too
        return f"output error {rel:.3g} relative to its scale (more than {WRONG_REL_ERR})"
    return None


def run_cell(fn: Callable, args: tuple, ref, ctx: dict, deadline, timeout_s: float, report=None) -> dict:
    """Measure ``fn(*args)``; returns the cell's measured fields (status included)."""
    import torch

    from bench.common import (TimeUp, bench_ms, is_fatal_cuda_error, is_oom, roofline_floor_ms,
                              short_error, synchronize, tensor_bytes)
    from bench.variants_base import as_outputs

    device = ctx["device"]
    cuda = device == "cuda"
    rec: dict[str, Any] = {}
    n_kernels = len(report.kernels) if report is not None else 0
    n_fallback = len(report.fallback_ops) if report is not None else 0
    t_start = time.monotonic()
    try:
        with deadline.step(timeout_s), torch.no_grad():
            synchronize(device)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            out = fn(*args)
            synchronize(device)
            rec["first_call_s"] = round(time.perf_counter() - t0, 3)
            outs = as_outputs(out)  # every output (an attention and its row log-sum-exp)
            if report is not None:
                rec["kernels"] = len(report.kernels) - n_kernels
                rec["fallback_ops"] = sorted({op.name for op in report.fallback_ops[n_fallback:]})
            if ref is not None:
                errors = [_errors(o, r) for o, r in zip(outs, as_outputs(ref), strict=True)]
                rec["max_abs_err"] = max(e[0] for e in errors)
                rec["max_rel_err"] = max(e[1] for e in errors)  # each output against its own scale
                rec["nonfinite"] = sum(e[2] for e in errors)
            out_bytes = sum(o.numel() * o.element_size() for o in outs)
            del out, outs
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                out = fn(*args)
                synchronize(device)
                rec["peak_extra_mib"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
                del out
            ms = bench_ms(lambda: fn(*args), device, rep_ms=ctx["rep_ms"], cpu_reps=ctx.get("cpu_reps", 3))
        rec["status"] = "ok"
        if (why := _wrong_result(rec)) is not None:
            rec.update(status="wrong", message=why + "; the time is not a result")
        if report is not None:
            # (BLOCK_M, BLOCK_N, num_warps, num_stages) each new kernel ran with
            rec["configs"] = [c if c == "eager" else list(c)  # "eager": the unfused graph was faster
                              for k in report.kernels[n_kernels:] for c in k.chosen_configs().values()]
        rec["ms"] = _sig(ms)
        rec["tflops"] = _sig(ctx["flops"] / (ms * 1e-3) / 1e12) if ms > 0 else None
        rec["bytes"] = tensor_bytes(*args) + out_bytes
        floor = roofline_floor_ms(ctx["flops"], rec["bytes"], ctx["dtype"], ctx["roofline"])
        rec["floor_ms"] = _sig(floor)
        rec["roofline_frac"] = _sig(floor / ms) if ms > 0 else None
    except TimeUp as exc:
        if deadline.remaining() <= 1.0 and time.monotonic() - t_start < timeout_s:
            raise  # the run's budget ran out, not this cell's limit: leave the cell undone
        rec = {"status": "timeout", "message": f"took longer than {timeout_s:.0f} s ({exc})"}
    except Exception as exc:  # noqa: BLE001 - a failing implementation is a result
        if is_fatal_cuda_error(exc):
            raise Restart(short_error(exc)) from exc
        rec = {"status": "oom" if is_oom(exc) else "error", "message": short_error(exc)}
        if report is not None and len(report.kernels) > n_kernels:
            rec["kernels"] = len(report.kernels) - n_kernels
    finally:
        if cuda:
            torch.cuda.empty_cache()
    rec["wall_s"] = round(time.monotonic() - t_start, 2)
    return rec


def run_formulations(variant, impl: str, device: str, inputs, ref, ctx: dict, deadline, timeout_s: float) -> dict:
    """Measure ``impl`` in each of its formulations; the fastest accurate one's fields,
    with ``formulation`` (its name) and ``formulations`` (every one's status, time and
    error). Raises :class:`Unavailable` when the implementation cannot run here."""
    import torch

    from bench import formulations

    results: dict[str, dict] = {}
    recs: dict[str, dict] = {}
    for name, form in formulations.forms(variant, impl).items():
        fn = make_impl(variant, impl, device, None, form)
        rec = run_cell(fn, inputs, ref, ctx, deadline, timeout_s)
        recs[name] = rec
        results[name] = {k: rec[k] for k in ("status", "ms", "max_abs_err", "max_rel_err", "nonfinite",
                                             "first_call_s", "peak_extra_mib", "message") if k in rec}
        del fn
        if device == "cuda":
            torch.cuda.empty_cache()
    best = formulations.pick(results)
    chosen = dict(recs[best] if best else next(iter(recs.values())))
    chosen["formulation"] = best
    chosen["formulations"] = results
    chosen["wall_s"] = round(sum(r.get("wall_s", 0.0) for r in recs.values()), 2)
    return chosen


# ---------------------------------------------------------------------------- the run


def _select(args, variants_all: dict) -> tuple[list, list[str], list[str]]:
    from bench.common import DTYPES
    from bench.variants_general import GENERAL_VARIANTS  # imported after TRITON_INTERPRET is set

    general = tuple(v.name for v in GENERAL_VARIANTS)
    spec = args.variants
    if spec == "all":
        names = list(variants_all)
    elif spec == "evoformer":
        names = [n for n in variants_all if n in EVOFORMER]
    elif spec == "core":
        names = [n for n in variants_all if n in CORE]
    elif spec == "general":
        names = [n for n in variants_all if n in general]
    elif spec == "lm":
        names = [n for n in variants_all if n not in EVOFORMER + CORE + general]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in variants_all]
    if unknown:
        sys.exit(f"bench.kernels: unknown variants {unknown}; known: {', '.join(variants_all)}")
    dtypes = (args.dtypes or ("fp32" if args.smoke else "bf16,tf32,fp32")).split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        sys.exit(f"bench.kernels: unknown dtypes {bad}; known: {', '.join(DTYPES)}")
    impls = (args.impls.split(",") if args.impls else list(SMOKE_IMPLS if args.smoke else IMPLS))
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        sys.exit(f"bench.kernels: unknown implementations {bad}; known: {', '.join(IMPLS)}")
    return [variants_all[n] for n in names], dtypes, impls


def _shapes(variant, spec: str) -> list[dict]:
    if spec == "default":
        return [variant.default_shape]
    if spec == "all":
        return list(variant.bench_shapes)
    idx = [int(i) for i in spec.split(",") if i.strip()]
    return [variant.bench_shapes[i] for i in idx if i < len(variant.bench_shapes)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; every first call is cold: autotuning choices kept on disk by an
    earlier process (``FLASHLIGHT_TUNING_CACHE``) are neither read nor written."""
    from flashlight import settings

    with settings.override(tuning_cache=False):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        # must precede the first import of triton
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import torch

    from bench import peers
    from bench.common import (RESULTS, Deadline, TimeUp, budget_from_env, environment, measure_roofline,
                              set_precision, short_error, is_oom)
    from bench.variants import VARIANTS
    from flashlight.api import ExplainReport

    missing = {impl: why for impl in filter(None, args.require.split(",")) if (why := availability(impl))}
    if missing:
        for impl, why in missing.items():
            print(f"bench.kernels: {impl} cannot run here: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not args.smoke:
        print("bench.kernels: no CUDA device; CPU timings are meaningless (use --smoke to check the harness)",
              file=sys.stderr)
    if args.smoke:
        args.shapes = args.shapes or "default"
        args.rep_ms = min(args.rep_ms, 20)
    shapes_spec = args.shapes or "all"
    variants, dtypes, impls = _select(args, VARIANTS)
    out = pathlib.Path(args.out) if args.out else RESULTS / ("kernels_smoke.json" if args.smoke else "kernels.json")
    results = Results(out)
    deadline = Deadline(budget_from_env(args.max_minutes))
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))

    # what is left to do: cells not yet measured on this GPU model
    meta = environment(device)
    gpu = meta.get("gpu")  # None on a CPU
    plan = []
    for v in variants:
        for dtype_name in dtypes:
            for shape in _shapes(v, shapes_spec):
                todo = [i for i in impls if applicable(v, i)
                        and not results.done(cell_key(v.name, shape, dtype_name, i), args.retry, gpu)]
                if todo:
                    plan.append((v, dtype_name, shape, todo))
    n_cells = sum(len(t) for *_, t in plan)
    if not plan:
        say(f"bench.kernels: every requested cell is already in {out}")
        return EXIT_COMPLETE
    say(f"bench.kernels: {n_cells} cells to measure ({len(plan)} variant/dtype/shape groups) -> {out}")

    for name, value in (("cache_size_limit", 64), ("recompile_limit", 64),
                        ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)

    t0 = time.monotonic()
    meta["roofline"] = measure_roofline(device, small=device != "cuda")
    meta["roofline_s"] = round(time.monotonic() - t0, 1)
    meta["args"] = {k: v for k, v in vars(args).items()}
    meta["absent_peers"] = dict(peers.ABSENT)
    run_id = results.add_run(meta)
    rf = meta["roofline"]
    say(f"  {meta.get('gpu') or device}, torch {meta['torch']}, triton {meta['triton']}; roofline: copy "
        f"{rf['copy_tb_per_s']:.2f} TB/s, bf16 {rf['bf16_tflop_per_s']:.0f}, tf32 {rf['tf32_tflop_per_s']:.0f}, "
        f"fp32 {rf['fp32_tflop_per_s']:.1f} TFLOP/s")
    results.save()

    status = EXIT_COMPLETE
    measured = 0
    try:
        for v, dtype_name, shape, todo in plan:
            if deadline.remaining() < 45:
                status = EXIT_INCOMPLETE
                break
            label = f"{v.name} [{shape_label(shape)}] {dtype_name}"
            torch.compiler.reset()
            dtype = set_precision(dtype_name)
            gen = torch.Generator(device=device).manual_seed(args.seed)
            base = {"variant": v.name, "shape": shape, "dtype": dtype_name, "run": run_id}
            try:
                with deadline.step(args.cell_timeout):
                    inputs = v.make_inputs(shape, dtype, device, gen)
            except TimeUp:
                raise
            except Exception as exc:  # noqa: BLE001
                st = "oom" if is_oom(exc) else "error"
                for impl in todo:
                    results.put({**base, "impl": impl, "status": st, "message": "inputs: " + short_error(exc)})
                results.save()
                say(f"  {label}: inputs failed: {short_error(exc)}")
                continue
            ref, ref_note = None, None
            try:
                with deadline.step(args.cell_timeout):
                    ref = reference(v, inputs)
            except TimeUp:
                if deadline.remaining() <= 1:
                    raise
                ref_note = "float64 reference took too long"
            except Exception as exc:  # noqa: BLE001
                ref_note = "float64 reference failed: " + short_error(exc, 200)
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()
            ctx = {"device": device, "dtype": dtype_name, "rep_ms": args.rep_ms, "cpu_reps": 1 if args.smoke else 3,
                   "flops": float(v.flops(shape)), "roofline": rf}
            for impl in todo:
                report = ExplainReport() if impl == "flashlight" else None
                why = peers.not_applicable(impl, v.name, shape, dtype) if impl in peers.PEERS else None
                if why:
                    results.put({**base, "impl": impl, "status": "unavailable", "message": why})
                    results.save()
                    say(f"  {label} {impl}: not applicable ({why})")
                    continue
                try:
                    if impl in FORMULATED:
                        rec = run_formulations(v, impl, device, inputs, ref, ctx, deadline, args.cell_timeout)
                    else:
                        fn = make_impl(v, impl, device, report)
                        rec = run_cell(fn, inputs, ref, ctx, deadline, args.cell_timeout, report)
                except Unavailable as exc:
                    results.put({**base, "impl": impl, "status": "unavailable", "message": str(exc)})
                    results.save()
                    say(f"  {label} {impl}: unavailable ({exc})")
                    continue
                except Restart as exc:
                    results.put({**base, "impl": impl, "status": "error", "message": f"CUDA error: {exc}"})
                    results.save()
                    say(f"  {label} {impl}: CUDA error, the process must restart: {exc}")
                    return EXIT_RESTART
                if ref_note and rec["status"] == "ok":
                    rec["error_note"] = ref_note
                rec["flops"] = ctx["flops"]
                results.put({**base, "impl": impl, **rec,
                             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                results.save()
                measured += 1
                say(f"  [{deadline.elapsed():5.0f}s] {label} {impl}: {describe(rec)}")
            del inputs, ref
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    except TimeUp:
        status = EXIT_INCOMPLETE
    finally:
        results.data["runs"][run_id]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        results.data["runs"][run_id]["cells_measured"] = measured
        results.save()

    left = n_cells - measured
    if status == EXIT_INCOMPLETE and left > 0:
        say(f"bench.kernels: time budget reached after {measured} cells; {left} left: run the same command again")
    else:
        status = EXIT_COMPLETE
        say(f"bench.kernels: done, {measured} cells measured in {deadline.elapsed():.0f} s")
    if not args.quiet:
        print_table(results.data, variants, dtypes, IMPLS, gpu)
    return status


if __name__ == "__main__":
    sys.exit(main())
