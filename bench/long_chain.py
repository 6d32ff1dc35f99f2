"""The longest single chain that fits: Flashlight against stock OpenFold's low-memory settings.

    python -m bench.long_chain [--n-res 2048,3072,4096] [--modes ...] [--max-minutes 9]
                               [--out bench/results/long_chain.json]

``model_1`` (seeded random weights, templates off, 512 MSA rows and 5120 extra rows,
float32 with TF32) on a synthetic feature batch of each length, in the modes

- ``flashlight``: ``flashlight.patch_openfold``, unchunked, one pass (one recycling
  iteration); ``flashlight_chunked``: the same with the preset's ``chunk_size``, which
  the patched attention ignores (it computes its whole batch in one launch) and the
  other layers (transitions, the outer product mean) follow, as ``flashlight-fold``
  folds when the unchunked pass runs out of memory; ``flashlight_recycle``: unchunked
  with model_1's four iterations;
- ``stock_chunked``: stock OpenFold with the preset's ``chunk_size`` (its own answer to
  long inputs); ``stock_lma``: that plus ``use_lma=True`` (OpenFold 0.0.1's low-memory
  attention, Staats & Rabe), one pass each.

Chunked modes keep OpenFold's chunk-size tuner on, as model_1's config has it: the
preset's chunk size is the floor from which it picks the largest that fits, per stack
(``tuned_chunk_sizes`` in the cell).

Per cell: the time of a call after an untimed first call (whose time, Flashlight's
compilation or OpenFold's chunk-size trials included, is ``first_call_s``), peak memory
(``torch.cuda.max_memory_allocated``), whether the output is finite. Running out of GPU
memory is a result (``oom``, with the message). A cell the time budget stops after
``--record-after`` seconds is a ``timeout`` (it cannot finish in one ten-minute call);
stopped sooner, it is left for the next call (exit status 3). Resumable like the other
parts: cells in ``--out`` are skipped.
"""
from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import time

MODES = ("flashlight", "flashlight_chunked", "flashlight_recycle", "stock_chunked", "stock_lma")
EXIT_COMPLETE, EXIT_INCOMPLETE = 0, 3
MIN_CELL_START_S = 90.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.long_chain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-res", default="2048,3072,4096")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--n-seq", type=int, default=512)
    p.add_argument("--n-extra", type=int, default=5120)
    p.add_argument("--blocks", type=int, default=None, help="Evoformer blocks (default: model_1's 48)")
    p.add_argument("--out", default=None)
    p.add_argument("--max-minutes", type=float, default=9.0)
    p.add_argument("--record-after", type=float, default=300.0)
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def configure(model, mode: str) -> dict:
    """Set ``mode``'s OpenFold globals (and Flashlight's patch) on ``model``; what was set."""
    from openfold.config import model_config as of_model_config

    preset = of_model_config("model_1").globals.chunk_size
    info: dict = {"chunk_size": None, "use_lma": False}
    if mode.startswith("stock"):
        model.globals.chunk_size = info["chunk_size"] = preset
        if mode == "stock_lma":
            if "use_lma" not in model.globals:
                raise RuntimeError("this OpenFold has no use_lma setting")
            model.globals.use_lma = info["use_lma"] = True
    else:
        import flashlight

        model.globals.chunk_size = info["chunk_size"] = preset if mode == "flashlight_chunked" else None
        report = flashlight.patch_openfold(model)
        info["patched"] = report.total
    return info


def run_cell(args, n_res: int, mode: str, device: str) -> dict:
    import torch

    from bench.evoformer_inputs import build_model, chunking, model_config, synthetic_batch

    iters = 4 if mode == "flashlight_recycle" else 1
    model = build_model(model_config(args.blocks, args.n_extra), args.seed, device)
    batch = synthetic_batch(n_res, args.n_seq, args.n_extra, iters, device, args.seed)
    rec: dict = {"iters": iters, **configure(model, mode)}

    def call():
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = model(dict(batch))
        if device == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    with torch.no_grad():
        out, rec["first_call_s"] = call()  # Flashlight compiles, OpenFold's chunk tuner tries sizes
        del out
        out, seconds = call()
        rec["ms"] = round(1e3 * seconds, 1)
        rec["finite"] = bool(torch.isfinite(out["final_atom_positions"]).all())
        rec.update(chunking(model))
        if device == "cuda":
            rec["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    del model, batch, out
    return rec


def main(argv: list[str] | None = None) -> int:
    from flashlight import settings

    with settings.override(tuning_cache=False):
        return _main(argv)


def _main(argv) -> int:
    import torch

    from bench.common import RESULTS, Deadline, TimeUp, atomic_write_json, budget_from_env, environment, is_oom, \
        set_precision, short_error
    from bench.evoformer import wait_for_openfold
    from bench.report import untuned_chunks

    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        sys.exit(f"bench.long_chain: unknown modes {sorted(set(modes) - set(MODES))}; known: {', '.join(MODES)}")
    out = pathlib.Path(args.out) if args.out else RESULTS / "long_chain.json"
    data = json.loads(out.read_text()) if out.exists() else {"schema": "flashlight-bench-long-chain/1",
                                                             "runs": [], "cells": []}
    # a cell chunked with OpenFold's chunk-size tuner off is measured again, with it
    have = {(c["n_res"], c["mode"]): i for i, c in enumerate(data["cells"]) if not untuned_chunks(c)}
    todo = [(int(n), m) for n in args.n_res.split(",") if n.strip() for m in modes if (int(n), m) not in have]
    if not todo:
        print(f"bench.long_chain: every cell is already in {out}")
        return EXIT_COMPLETE
    deadline = Deadline(budget_from_env(args.max_minutes))
    why = wait_for_openfold(deadline, print)
    if why:
        print(f"bench.long_chain: {why}")
        return 1
    meta = {"id": len(data["runs"]), **environment(device), "args": vars(args)}
    data["runs"].append(meta)
    if device == "cuda":
        set_precision("tf32")
    status = EXIT_COMPLETE
    for n, mode in todo:
        if deadline.remaining() < MIN_CELL_START_S:
            status = EXIT_INCOMPLETE
            break
        t0 = time.monotonic()
        try:
            with deadline.step():
                rec = {"status": "ok", **run_cell(args, n, mode, device)}
        except TimeUp:
            ran = time.monotonic() - t0
            if ran < args.record_after:
                status = EXIT_INCOMPLETE
                break
            rec = {"status": "timeout", "message": f"did not finish in {ran:.0f} s, all the time this call had left"}
        except Exception as exc:  # noqa: BLE001 - out of memory and failures are results
            rec = {"status": "oom" if is_oom(exc) else "error", "message": short_error(exc, 600)}
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        cell = {"n_res": n, "mode": mode, "run": meta["id"], "n_seq": args.n_seq, "n_extra": args.n_extra, **rec,
                "wall_s": round(time.monotonic() - t0, 1),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        have[(n, mode)] = len(data["cells"])
        data["cells"].append(cell)
        atomic_write_json(out, data)
        print(f"  [{deadline.elapsed():5.0f}s] N_res {n} {mode}: " + (
            f"{rec['ms'] / 1e3:.1f} s, peak {rec.get('peak_gib', 0):.1f} GiB, first call {rec['first_call_s']:.1f} s"
            if rec["status"] == "ok" else f"{rec['status'].upper()} {rec.get('message', '')[:200]}"), flush=True)
    atomic_write_json(out, data)
    if status == EXIT_INCOMPLETE:
        print("bench.long_chain: time budget reached; run the same command again to continue")
    return status


if __name__ == "__main__":
    sys.exit(main())
