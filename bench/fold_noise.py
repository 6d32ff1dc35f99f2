"""Per-module timing of stock and Flashlight-patched OpenFold, run in alternation.

Answers two questions the end-to-end comparison cannot: how large is run-to-run noise
per module (stock against stock), and does a module that Flashlight does not patch
really run slower in the patched model, or is it the order of the runs, the timer or the
host? Each module is timed twice per run: on the GPU (CUDA events between the module's
forward pre-hook and hook, what ``latency.json`` reports) and on the host
(``perf_counter`` at the same hooks). A module whose host span is as long as its GPU
span is launch-bound: the GPU waited for the host to issue its kernels.

    python -m bench.fold_noise --length 256 --chunk-size preset none --rounds 3
    python -m bench.fold_noise --length 256 --depth 5632 --chunk-size none --out noise.json

Each round also times one pass without hooks (``pass`` rows: wall seconds, the host's
seconds until the forward returned, before the final synchronisation, and the process's
CPU seconds over all its threads); ``--profile`` runs one more pass of each model under
cProfile and prints the functions its host time goes to.

``--depth N`` folds the synthetic record with a deep A3M of N rows (made by
``flashlight.structures.examples.make_synthetic``, as the product benchmark
:mod:`bench.fold_product` folds it); without it the record is folded single-sequence.

Prints one table per configuration: per-module medians (ms, all blocks summed) for
stock and Flashlight, their ratio, the stock-vs-stock spread (max/min over rounds) and
the host/GPU span ratio; writes the rows as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import time

import torch


def _host_spans(model, kinds):
    """Hooks recording host-side seconds per timed module kind; returns (totals, handles)."""
    from flashlight.structures.timing import find_block_modules, find_evoformer_blocks

    totals: dict[str, float] = {}
    handles = []
    for block in find_evoformer_blocks(model):
        for kind, module in find_block_modules(block).items():
            if kind not in kinds:
                continue
            opened: list[float] = []

            def pre(mod, args, opened=opened):
                opened.append(time.perf_counter())

            def post(mod, args, out, opened=opened, kind=kind):
                if opened:
                    totals[kind] = totals.get(kind, 0.0) + time.perf_counter() - opened.pop()

            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post))
    return totals, handles


def _timed_run(model, batch, device):
    from flashlight.structures.timing import MODULE_KINDS, LayerTimer, module_totals

    host, handles = _host_spans(model, MODULE_KINDS)
    try:
        with torch.no_grad(), LayerTimer(model, device, synchronize=True) as timer:
            _, timing = timer.run(lambda: model(batch))
    finally:
        for handle in handles:
            handle.remove()
    gpu = module_totals(timing)
    gpu.update({f"stage:{k}": v for k, v in timing.stages.items()})
    gpu["model"] = timing.model_s
    return gpu, dict(host)


def _plain_pass(model, batch) -> dict:
    """One unhooked pass: wall seconds, seconds until the forward returned (the host's
    issue time), and the process's CPU seconds (all threads) over the pass."""
    torch.cuda.synchronize()
    cpu, start = time.process_time(), time.perf_counter()
    with torch.no_grad():
        model(batch)
    issued = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return {"pass:wall": end - start, "pass:host_issue": issued - start, "pass:cpu": time.process_time() - cpu}


def _profiled_pass(model, batch, top: int = 25) -> str:
    """The functions one pass's host time goes to (cProfile, own time), as text."""
    from bench.module_host import host_profile

    with torch.no_grad():
        return host_profile(lambda: model(batch), 1, top)


def record_paths(length: int, depth: int | None) -> tuple[str, str | None]:
    """FASTA path and alignment folder of the synthetic record of ``length``."""
    if not depth:
        return f"structures/examples/synthetic_{length}.fasta", None
    import tempfile

    from flashlight.structures.examples import make_synthetic

    folder = os.path.join(tempfile.gettempdir(), f"flashlight-fold-noise-{depth}")
    fasta = os.path.join(folder, f"synthetic_{length}.fasta")
    if not (os.path.exists(fasta) and os.path.exists(fasta[:-len(".fasta")] + ".a3m")):
        make_synthetic.write(folder, length, depth, seed=0)
    return fasta, folder


def run_config(length: int, chunk_size, rounds: int, recycles: int, dtype: str, seed: int,
               depth: int | None = None, profile: bool = False) -> list[dict]:
    from flashlight.structures.features import processed_features, to_device
    from flashlight.structures.inputs import load_inputs
    from flashlight.structures.models import DTYPES, ModelInfo, apply_flashlight, build_model, make_config

    device = torch.device("cuda")
    config = make_config("model_1", None, recycles, dtype, chunk_size)
    info = ModelInfo("model_1", 48, recycles, dtype, "cuda", "random", seed, config.globals.chunk_size,
                     int(config.data.predict.max_msa_clusters), int(config.data.predict.max_extra_msa))
    fasta, alignment_dir = record_paths(length, depth)
    records, problems = load_inputs([fasta], alignment_dir)
    assert not problems, problems
    feats = processed_features(records[0], config.data, seed)
    batch = to_device(feats, device, DTYPES[dtype])
    stock = build_model(config, info)
    flash = copy.deepcopy(stock)
    status = apply_flashlight(flash)
    assert status.active, status.reason
    first = {}
    for name, model in (("stock", stock), ("flashlight", flash)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model(batch)
        torch.cuda.synchronize()
        first[name] = time.perf_counter() - start
    samples: dict[str, list] = {"stock": [], "flashlight": []}
    for _ in range(rounds):
        for name, model in (("stock", stock), ("flashlight", flash)):
            gpu, host = _timed_run(model, batch, device)
            gpu.update(_plain_pass(model, batch))
            samples[name].append((gpu, host))
    if profile:
        for name, model in (("stock", stock), ("flashlight", flash)):
            print(f"\n== cProfile of one {name} pass (N_res {length}, chunk_size {chunk_size}, {dtype})")
            print(_profiled_pass(model, batch))
    rows = []
    for key in samples["stock"][0][0]:
        s = [g[key] for g, _ in samples["stock"]]
        f = [g[key] for g, _ in samples["flashlight"]]
        hs = [h.get(key) for _, h in samples["stock"]]
        hf = [h.get(key) for _, h in samples["flashlight"]]
        rows.append({
            "key": key, "stock_ms": 1e3 * statistics.median(s), "flashlight_ms": 1e3 * statistics.median(f),
            "stock_spread": max(s) / max(min(s), 1e-9), "flash_spread": max(f) / max(min(f), 1e-9),
            "stock_host_ms": 1e3 * statistics.median(hs) if None not in hs else None,
            "flash_host_ms": 1e3 * statistics.median(hf) if None not in hf else None,
        })
    rows.append({"key": "first_call_s", "stock_ms": first["stock"], "flashlight_ms": first["flashlight"]})
    gc.collect()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--chunk-size", nargs="+", default=["preset", "none"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--recycles", type=int, default=3)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--depth", type=int, default=None, help="fold with a synthetic A3M of this many rows")
    p.add_argument("--profile", action="store_true", help="print a cProfile of one pass of each model")
    p.add_argument("--out")
    args = p.parse_args()
    if args.out and os.path.exists(args.out):
        print(f"bench.fold_noise: {args.out} exists; nothing to do")
        return
    from bench.common import Deadline
    from bench.evoformer import wait_for_openfold

    why = wait_for_openfold(Deadline(540.0), print)  # gpu_run.sh --openfold-bg may still be building it
    if why:
        raise SystemExit(f"bench.fold_noise: {why}")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    results = {}
    for text in args.chunk_size:
        chunk = "preset" if text == "preset" else (None if text == "none" else int(text))
        rows = run_config(args.length, chunk, args.rounds, args.recycles, args.dtype, args.seed, args.depth,
                          args.profile)
        results[text] = rows
        print(f"\n== N_res {args.length}, chunk_size {text}, {args.dtype}, {args.rounds} rounds (medians, ms)")
        print(f"{'module':<28}{'stock':>9}{'flash':>9}{'ratio':>7}{'s-spr':>7}{'f-spr':>7}{'s-host':>9}{'f-host':>9}")
        for r in rows:
            ratio = r["stock_ms"] / r["flashlight_ms"] if r["flashlight_ms"] else float("nan")
            host = "".join(f"{v:>9.1f}" if v is not None else f"{'-':>9}"
                           for v in (r.get("stock_host_ms"), r.get("flash_host_ms")))
            print(f"{r['key']:<28}{r['stock_ms']:>9.1f}{r['flashlight_ms']:>9.1f}{ratio:>7.2f}"
                  f"{r.get('stock_spread', 0):>7.2f}{r.get('flash_spread', 0):>7.2f}{host}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
