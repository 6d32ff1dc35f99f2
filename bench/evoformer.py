"""End-to-end OpenFold benchmarks: stock vs ``torch.compile`` per block vs Flashlight.

    python -m bench.evoformer [--n-res 256,512] [--scopes stack,model]
                              [--modes stock,compile,flashlight] [--max-minutes 9]
                              [--out bench/results/evoformer.json]

Two scopes, each at every ``--n-res``:

- ``stack``: the 48-block Evoformer stack of ``model_1`` alone, on random MSA and pair
  representations (``--n-seq`` rows); latency of each block and of the stack, and, for
  ``stock`` and ``flashlight``, the time of each module kind inside the blocks (MSA
  row/column attention, triangle attentions and multiplications, transitions, outer
  product mean) from CUDA events around each module call, measured in a separate pass.
- ``model``: full ``model_1`` inference on a synthetic feature batch (random sequence and
  MSA of the right shapes, ``--n-extra`` extra-MSA rows, templates off, ``--iters``
  recycling iterations, i.e. 1 = a single pass), with the time of its top-level parts
  (embedders, extra-MSA stack, Evoformer, structure module, heads).

Modes: ``stock`` (OpenFold 0.0.1 as installed, with its CUDA extension);
``compile`` (stock with ``torch.compile`` applied to each Evoformer block via
``Module.compile()``); ``flashlight`` (``flashlight.patch_openfold(model, cuda_graphs=False)``);
``flashlight-block`` (``patch_openfold(model, scope="block", cuda_graphs=False)``: each block compiled whole,
Flashlight's kernels for the attentions and Inductor for the rest; no module breakdown,
as for ``compile``); ``ds4sci`` and
``cueq`` (stock with every ``Attention`` module computing its attention with DeepSpeed's
DS4Sci_EvoformerAttention or cuEquivariance, :mod:`bench.openfold_peers`; calls a peer
cannot take run stock and are counted in ``peer``). A peer that is not installed is a
cell with status ``unavailable`` and the reason. ``stock-graphs``, ``flashlight-graphs``
(``patch_openfold(model)``'s default, what ``flashlight-fold`` runs on a GPU),
``ds4sci-graphs`` and ``cueq-graphs``: the same, with the Evoformer and extra-MSA stacks
and the structure module replayed as CUDA graphs ([Note: CUDA graphs for the stacks]),
timed after a second untimed call, which records the graphs; at the stack scope these
call the Evoformer stack whole (the other modes call its blocks one by one, timing each),
so they have neither per-block times nor a module breakdown.

``--dtypes``: ``tf32`` (float32, TF32 matmuls: OpenFold's inference setting), ``bf16``.

Weights are a seeded random initialisation (``model_1`` shapes, attention modules
drawn so they are not constant): no AlphaFold parameters are loaded, so the outputs are
not structures, only timings. float32 with TF32 matmuls (OpenFold's inference setting),
``chunk_size=None``, inference under ``torch.no_grad()``. A whole-model run that does not
fit without chunking (stock OpenFold materialises the extra-MSA row attention's
``[N_extra, H, N_res, N_res]`` logits: 160 GiB at 1024 residues) is run again with
OpenFold's own default ``chunk_size`` and chunk-size tuner, and the cell records
``chunk_size`` and the sizes the tuner chose (``tuned_chunk_sizes``); the stock
reference of the other modes follows the same rule (``reference_chunk_size``). Times are CUDA-event medians of
``--reps`` calls after one untimed call (whose time, compilation included, is reported
as the first call). Peak memory is ``torch.cuda.max_memory_allocated`` during a timed
call (weights and inputs included). Non-stock modes are also compared with a stock run on
the same weights and inputs (max abs difference); a cell further from stock than
:data:`bench.evoformer_modes.AGREEMENT_TOL`, or with NaN, is recorded as ``wrong``.

Resumable like :mod:`bench.kernels`: cells (scope, n_res, mode) in ``--out`` are skipped;
exit status 3 means the time budget ran out (run again), 0 that all cells are done. A
cell the budget stops after ``--record-after`` seconds is recorded as a timeout: it does
not fit in one call (``--retry`` tries it again only in a call with more time).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

from bench.evoformer_modes import (MODES, apply_mode, base_mode, disagreement, dynamo_stats, first_call,
                                  recording_call)
from bench.evoformer_inputs import build_model, cast_model, chunking, model_config, stack_inputs, synthetic_batch, \
    torch_dtype

DTYPE_NAMES = ("tf32", "bf16")
SCOPES = ("stack", "model")
EXIT_COMPLETE, EXIT_INCOMPLETE = 0, 3
MIN_CELL_START_S = 60.0  # a cell starts only with at least this much of the budget left

CSV_FIELDS = ("scope", "n_res", "mode", "dtype", "status", "ms", "first_call_s", "peak_gib", "attention_ms",
              "attention_share", "max_abs_diff_vs_stock", "compile_options", "n_seq", "n_extra", "iters",
              "blocks", "chunk_size", "reference_chunk_size", "message", "gpu", "driver", "torch", "triton", "date")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.evoformer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-res", default="256,512", help="residue counts, comma-separated")
    p.add_argument("--scopes", default="stack,model")
    p.add_argument("--modes", default="stock,compile,flashlight")
    p.add_argument("--dtypes", default="tf32", help="tf32 (float32, TF32 matmuls) and/or bf16")
    p.add_argument("--n-seq", type=int, default=512, help="MSA cluster rows")
    p.add_argument("--n-extra", type=int, default=5120, help="extra MSA rows (model scope)")
    p.add_argument("--iters", type=int, default=1, help="recycling iterations (1: a single pass)")
    p.add_argument("--blocks", type=int, default=None, help="Evoformer blocks (default: model_1's 48)")
    p.add_argument("--reps", type=int, default=3, help="timed calls per cell")
    p.add_argument("--out", default=None)
    p.add_argument("--max-minutes", type=float, default=9.0)
    p.add_argument("--cell-timeout", type=float, default=420.0)
    p.add_argument("--record-after", type=float, default=300.0,
                   help="a cell that the time budget stops after this many seconds is recorded as a "
                        "timeout (it cannot finish in one call); a shorter one is left for the next call")
    p.add_argument("--device", default=None)
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes (2 blocks, 16 residues) to check the harness on a CPU machine")
    p.add_argument("--retry", action="store_true",
                   help="measure again cells recorded as error/oom, and timeouts when this call has more time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-kernels", action="store_true",
                   help="stack scope: one more pass under torch.profiler; its longest kernels go in the cell")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------- timing helpers


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def module_timer(modules: dict[str, Any], events: "Clock", totals: dict[str, list]):  # noqa: F821
    """Forward hooks that record (start, end) events around each call of ``modules``."""
    handles = []
    for name, module in modules.items():
        def pre(mod, args, _name=name):
            mod._bench_start = events.mark()

        def post(mod, args, out, _name=name):
            totals.setdefault(_name, []).append((mod._bench_start, events.mark()))

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def block_parts(block) -> dict[str, Any]:
    """The timed parts of one Evoformer block: its children and its ``core``'s (0.0.1) or
    ``pair_stack``'s (2.x) children, dropout layers left out."""
    parts = {}
    for name, child in block.named_children():
        if name in ("core", "pair_stack"):
            for sub, grandchild in child.named_children():
                if "dropout" not in sub:
                    parts[sub] = grandchild
        elif "dropout" not in name:
            parts[name] = child
    return parts


ATTENTION_PARTS = ("msa_att_row", "msa_att_col", "tri_att_start", "tri_att_end")


def _call_block(block, m, z, msa_mask, pair_mask):
    kwargs = dict(msa_mask=msa_mask, pair_mask=pair_mask, chunk_size=None, use_lma=False,
                  use_flash=False, inplace_safe=True, _mask_trans=True)
    params = inspect.signature(block.forward).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return block(m, z, **kwargs)


# ---------------------------------------------------------------------------- cells


def run_stack(args, n_res: int, mode: str, device: str) -> dict:
    import torch

    from bench import openfold_peers

    from flashlight.structures.timing import Clock

    config = model_config(args.blocks, 0)
    dtype = torch_dtype(getattr(args, "dtype_name", "tf32"))
    model = cast_model(build_model(config, args.seed, device), dtype)
    stack = model.evoformer
    blocks = list(stack.blocks)
    m0, z0, msa_mask, pair_mask = (t.to(dtype) for t in stack_inputs(n_res, args.n_seq, device, args.seed))
    events = Clock(torch.device(device))

    graphed = base_mode(mode)[1]

    def run_pass(collect_blocks: bool = False):
        m, z = m0.clone(), z0.clone()
        marks = [events.mark()]
        if graphed:  # the stack whole, as a replayed graph: no marks between its blocks
            m, z, _ = stack(m, z, msa_mask=msa_mask, pair_mask=pair_mask, chunk_size=None, use_lma=False,
                            use_flash=False, inplace_safe=True, _mask_trans=True)
            collect_blocks = False
        for block in () if graphed else blocks:
            m, z = _call_block(block, m, z, msa_mask, pair_mask)
            if collect_blocks:
                marks.append(events.mark())
        if not collect_blocks:
            marks.append(events.mark())
        sync(device)
        return m, z, marks

    rec: dict[str, Any] = {"blocks": len(blocks), "n_seq": args.n_seq}
    with torch.no_grad():
        ref = None
        if mode != "stock":
            m_ref, z_ref, _ = run_pass()
            ref = (m_ref.cpu(), z_ref.cpu())
            del m_ref, z_ref
        rec.update(apply_mode(model, mode, blocks))
        m, z, _ = first_call(run_pass, mode, blocks, rec)
        if graphed:
            m, z, _ = recording_call(run_pass, rec)
        rec.update(dynamo_stats())
        if ref is not None:
            rec["max_abs_diff_vs_stock"] = max(float((m.cpu() - ref[0]).abs().max()),
                                               float((z.cpu() - ref[1]).abs().max()))
            rec["max_abs_diff_m"] = float((m.cpu() - ref[0]).abs().max())
            rec["max_abs_diff_z"] = float((z.cpu() - ref[1]).abs().max())
        del m, z
        totals, per_block = [], []
        for _ in range(args.reps):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            _, _, marks = run_pass(collect_blocks=True)
            totals.append(events.ms(marks[0], marks[-1]))
            per_block.append([events.ms(a, b) for a, b in zip(marks, marks[1:])])
        rec["ms"] = round(statistics.median(totals), 3)
        rec["rep_ms"] = [round(t, 3) for t in totals]
        if not graphed:
            rec["per_block_ms"] = [round(statistics.median(col), 3) for col in zip(*per_block)]
        if device == "cuda":
            rec["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if getattr(args, "profile_kernels", False):
            from flashlight.structures.timing import kernel_profile

            rec["kernels"] = kernel_profile(run_pass, torch.device(device))
        # hooks inside compiled blocks would break their graphs; a replay runs none
        if mode not in ("compile", "flashlight-block") and not graphed:
            spans: dict[str, list] = {}
            parts = {}
            for i, block in enumerate(blocks):
                for name, module in block_parts(block).items():
                    parts[f"{i}.{name}"] = module
            with module_timer(parts, events, spans):
                run_pass()
            breakdown: dict[str, float] = {}
            for key, pairs in spans.items():
                name = key.split(".", 1)[1]
                breakdown[name] = breakdown.get(name, 0.0) + sum(events.ms(a, b) for a, b in pairs)
            rec["breakdown_ms"] = {k: round(v, 3) for k, v in breakdown.items()}
            att = sum(v for k, v in breakdown.items() if k in ATTENTION_PARTS)
            rec["attention_ms"] = round(att, 3)
            rec["attention_share"] = round(att / max(sum(breakdown.values()), 1e-9), 4)
    openfold_peers.record_summary(rec)
    del model, stack, blocks
    return rec


def wanted_again(cell: dict, retry: bool, budget_left_s: float) -> bool:
    """Whether a recorded cell is measured again: a cell that ran chunked with OpenFold's
    chunk-size tuner off (:func:`bench.report.untuned_chunks`: not stock at its best);
    with ``retry``, every error and out-of-memory, and a timeout only when this call has
    more time than the cell ran (a cell stopped by one call's budget would stop again
    after the same time)."""
    from bench.report import untuned_chunks

    if untuned_chunks(cell):
        return True
    if not retry or cell["status"] == "ok":
        return False
    if cell["status"] == "timeout":
        return budget_left_s > cell.get("wall_s", 0.0) + 30.0
    return True


def _fitting(model, call):
    """``call()`` with ``chunk_size=None``; when that runs out of GPU memory, again with
    OpenFold's default ``chunk_size`` (its own answer to long inputs: the floor its
    chunk-size tuner raises), which stays set on ``model`` for the calls that follow.
    Returns ``(call's result, chunk_size used)``."""
    import torch
    from openfold.config import model_config as of_model_config

    from bench.common import is_oom

    model.globals.chunk_size = None
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - only running out of memory is retried
        if not is_oom(exc):
            raise
    gc.collect()
    torch.cuda.empty_cache()
    model.globals.chunk_size = of_model_config("model_1").globals.chunk_size
    return call(), model.globals.chunk_size


def run_model(args, n_res: int, mode: str, device: str) -> dict:
    import torch

    from bench import openfold_peers

    from flashlight.structures.timing import Clock

    config = model_config(args.blocks, args.n_extra)
    dtype = torch_dtype(getattr(args, "dtype_name", "tf32"))
    graphed = base_mode(mode)[1]
    model = cast_model(build_model(config, args.seed, device), dtype)
    batch = synthetic_batch(n_res, args.n_seq, args.n_extra, args.iters, device, args.seed)
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    events = Clock(torch.device(device))
    blocks = list(model.evoformer.blocks)

    def forward():
        t = [events.mark()]
        out = model(dict(batch))
        t.append(events.mark())
        sync(device)
        return out, events.ms(t[0], t[1])

    rec: dict[str, Any] = {"blocks": len(blocks), "n_seq": args.n_seq, "n_extra": args.n_extra,
                           "iters": args.iters, "weights": "seeded random init (no AlphaFold parameters)"}
    with torch.no_grad():
        ref = None
        if mode != "stock":
            (out, _), rec["reference_chunk_size"] = _fitting(model, forward)
            ref = {"pos": out["final_atom_positions"].cpu(), "plddt": out["plddt"].cpu()}
            del out
        rec.update(apply_mode(model, mode, blocks))
        (out, _), rec["chunk_size"] = _fitting(model, lambda: first_call(forward, mode, blocks, rec))
        rec.update(chunking(model))
        if graphed:
            del out
            out, _ = recording_call(forward, rec)
        rec.update(dynamo_stats())
        if ref is not None:
            rec["max_abs_diff_vs_stock"] = float((out["final_atom_positions"].cpu() - ref["pos"]).abs().max())
            rec["max_abs_diff_plddt"] = float((out["plddt"].cpu() - ref["plddt"]).abs().max())
        rec["finite"] = bool(torch.isfinite(out["final_atom_positions"]).all())
        del out
        times = []
        for _ in range(args.reps):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            out, ms = forward()
            del out
            times.append(ms)
        rec["ms"] = round(statistics.median(times), 2)
        rec["rep_ms"] = [round(t, 2) for t in times]
        if device == "cuda":
            rec["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        spans: dict[str, list] = {}
        parts = {name: child for name, child in model.named_children()}
        with module_timer(parts, events, spans):
            out, _ = forward()
            del out
        rec["breakdown_ms"] = {k: round(sum(events.ms(a, b) for a, b in v), 2) for k, v in spans.items()}
    openfold_peers.record_summary(rec)
    del model, batch
    return rec


# ---------------------------------------------------------------------------- the run


def wait_for_openfold(deadline, say) -> str | None:
    """When OpenFold is being built in the background on the GPU machine, wait for it.
    Returns why OpenFold cannot be used, or None."""
    status_file = os.environ.get("FLASHLIGHT_OPENFOLD_STATUS")
    if status_file:
        announced = False
        while True:
            try:
                status = pathlib.Path(status_file).read_text().strip()
            except OSError:
                status = None
            if status != "building":
                break
            if deadline.remaining() < 120:
                return "OpenFold is still building; not enough time left in this run"
            if not announced:
                say("bench.evoformer: waiting for the OpenFold build to finish")
                announced = True
            time.sleep(5)
        if status == "failed":
            return "the OpenFold build failed (see bench/results/logs/*-openfold-build.log)"
    try:
        import openfold.model.model  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"OpenFold is not importable: {type(exc).__name__}: {exc}"
    return None


def save(path: pathlib.Path, data: dict) -> None:
    from bench.common import save_results

    save_results(path, data, "cells", CSV_FIELDS)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; every first call is cold: autotuning choices kept on disk by an
    earlier process (``FLASHLIGHT_TUNING_CACHE``) are neither read nor written."""
    from flashlight import settings

    with settings.override(tuning_cache=False):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.device = args.device or "cpu"
        args.blocks = args.blocks or 2
        args.n_seq, args.n_extra, args.reps = min(args.n_seq, 8), min(args.n_extra, 16), min(args.reps, 1)
        if args.n_res == "256,512":
            args.n_res = "16"
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import warnings

    import torch

    from bench import openfold_peers
    from bench.common import (RESULTS, Deadline, TimeUp, budget_from_env, environment, is_oom, set_precision,
                              short_error)

    # OpenFold 0.0.1 indexes with lists, which torch warns about on every call
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence for multidimensional indexing")

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = pathlib.Path(args.out) if args.out else RESULTS / ("evoformer_smoke.json" if args.smoke else "evoformer.json")
    data = json.loads(out.read_text()) if out.exists() else {"schema": "flashlight-bench-evoformer/1",
                                                              "runs": [], "cells": []}
    deadline = Deadline(budget_from_env(args.max_minutes))
    say = lambda *a: print(*a, flush=True)  # noqa: E731

    def key(c):
        return (c["scope"], c["n_res"], c["mode"], c.get("n_seq"), c.get("n_extra"), c.get("iters"), c.get("blocks"),
                c.get("dtype", "tf32"))

    sizes = [int(n) for n in args.n_res.split(",") if n.strip()]
    scopes = [s for s in args.scopes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    dtype_names = [d for d in args.dtypes.split(",") if d]
    for bad, known in ((set(scopes) - set(SCOPES), SCOPES), (set(modes) - set(MODES), MODES),
                       (set(dtype_names) - set(DTYPE_NAMES), DTYPE_NAMES)):
        if bad:
            sys.exit(f"bench.evoformer: unknown {sorted(bad)}; known: {', '.join(known)}")

    why = wait_for_openfold(deadline, say)
    if why:
        say(f"bench.evoformer: {why}")
        return 1 if "failed" in why or "importable" in why else EXIT_INCOMPLETE

    from openfold.config import model_config as of_model_config

    n_blocks = args.blocks or of_model_config("model_1").model.evoformer_stack.no_blocks
    existing = {}
    for i, c in enumerate(data["cells"]):
        existing[key(c)] = i

    def cell_id(scope, n, mode, dtype_name):
        return (scope, n, mode, args.n_seq, args.n_extra if scope == "model" else None,
                args.iters if scope == "model" else None, n_blocks, dtype_name)

    todo = []
    for dtype_name in dtype_names:
        for n in sizes:
            for scope in scopes:
                for mode in modes:
                    k = cell_id(scope, n, mode, dtype_name)
                    if k in existing and not wanted_again(data["cells"][existing[k]], args.retry,
                                                          deadline.remaining()):
                        continue
                    todo.append((scope, n, mode, dtype_name))
    if not todo:
        say(f"bench.evoformer: every requested cell is already in {out}")
        return EXIT_COMPLETE

    meta = environment(device)
    meta["args"] = vars(args)
    meta["id"] = len(data["runs"])
    data["runs"].append(meta)
    run_id = meta["id"]
    if device == "cuda":
        set_precision("tf32")
    # 48 compiled blocks must not hit Dynamo's recompile limit and fall back to eager
    for name, value in (("cache_size_limit", 256), ("recompile_limit", 256),
                        ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)
    from flashlight.integrations import openfold_core

    compat = contextlib.nullcontext()
    if device == "cpu":
        from flashlight.integrations.openfold_compat import cpu_compat

        compat = cpu_compat()
    say(f"bench.evoformer: {len(todo)} cells -> {out} ({meta.get('gpu') or device}, torch {meta['torch']})")

    status = EXIT_COMPLETE
    try:
        with compat:
            for scope, n, mode, dtype_name in todo:
                if deadline.remaining() < MIN_CELL_START_S:
                    status = EXIT_INCOMPLETE
                    break
                base = {"scope": scope, "n_res": n, "mode": mode, "run": run_id, "n_seq": args.n_seq,
                        "n_extra": args.n_extra if scope == "model" else None,
                        "iters": args.iters if scope == "model" else None, "blocks": n_blocks,
                        "dtype": dtype_name}
                args.dtype_name = dtype_name
                t0 = time.monotonic()
                torch.compiler.reset()
                torch._dynamo.utils.counters.clear()
                openfold_core.clear_compiled()  # each cell captures again (or loads what is on disk)
                why = openfold_peers.availability(base_mode(mode)[0], dtype_name)
                try:
                    if why:
                        raise openfold_peers.PeerAbsent(why)
                    with deadline.step(args.cell_timeout):
                        fn = run_stack if scope == "stack" else run_model
                        rec = {"status": "ok", **fn(args, n, mode, device)}
                    if (why := disagreement(rec, scope, dtype_name)) is not None:
                        rec.update(status="wrong", message=why + "; the time is not a result")
                except TimeUp as exc:
                    ran_s = time.monotonic() - t0
                    if deadline.remaining() > 1.0:
                        rec = {"status": "timeout", "message": f"took longer than {args.cell_timeout:.0f} s ({exc})"}
                    elif ran_s >= args.record_after:
                        rec = {"status": "timeout", "message": f"did not finish in {ran_s:.0f} s, all the time this "
                                                              "call had left (time budget)"}
                    else:
                        raise
                except openfold_peers.PeerAbsent as exc:
                    rec = {"status": "unavailable", "message": str(exc)}
                except Exception as exc:  # noqa: BLE001 - a failing configuration is a result
                    rec = {"status": "oom" if is_oom(exc) else "error", "message": short_error(exc, 600)}
                finally:
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
                rec["wall_s"] = round(time.monotonic() - t0, 1)
                cell = {**base, **rec, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                k = key(cell)
                if k in existing:
                    data["cells"][existing[k]] = cell
                else:
                    existing[k] = len(data["cells"])
                    data["cells"].append(cell)
                save(out, data)
                say(f"  [{deadline.elapsed():5.0f}s] {scope} N_res {n} {mode} {dtype_name}: " + (
                    f"{rec['ms']:.1f} ms, first call {rec['first_call_s']:.1f} s"
                    + (f", peak {rec['peak_gib']:.1f} GiB" if "peak_gib" in rec else "")
                    + (f", attention {100 * rec['attention_share']:.0f}%" if "attention_share" in rec else "")
                    + (f", max |diff| vs stock {rec['max_abs_diff_vs_stock']:.2e}" if "max_abs_diff_vs_stock" in rec else "")
                    if rec["status"] == "ok" else f"{rec['status'].upper()} {rec.get('message', '')[:200]}"))
    except TimeUp:
        status = EXIT_INCOMPLETE
    finally:
        data["runs"][run_id]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        save(out, data)
    if status == EXIT_INCOMPLETE:
        say("bench.evoformer: time budget reached; run the same command again to continue")
    return status


if __name__ == "__main__":
    sys.exit(main())
