"""A user's second run: the first fold of a fresh process whose caches an earlier fold
filled, for stock and for Flashlight under settings to compare, alternating.

    python -m bench.warm_first_fold RECORD.fasta --rounds 2 --variants stock,flashlight,flashlight:FLASHLIGHT_PRELOAD=0 --out FILE

One cold ``flashlight-fold`` process fills fresh cache folders (Flashlight's, Triton's,
Inductor's); then each round runs one process per variant (``stock`` is
``--no-flashlight``; ``flashlight:VAR=VALUE,...`` the default command with those
environment variables), each timing its first structure (its passes' sum, as
:func:`bench.fold_product.first_fold` reads it). Prints the medians; ``--out`` keeps
every process's time, its preparing thread's state at the first pass and the GPU and
versions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _variant_env(variant: str) -> tuple[list[str], dict[str, str]]:
    name, _, assignments = variant.partition(":")
    flags = ["--no-flashlight"] if name == "stock" else []
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return flags, env


def fold(fasta: str, out_dir: str, flags: list[str], env: dict[str, str]) -> dict:
    """One ``flashlight-fold`` process; its first fold's seconds and first-pass state."""
    cmd = [sys.executable, "-m", "flashlight.structures", fasta, "--out-dir", out_dir, "--no-plot", "--quiet", *flags]
    subprocess.run(cmd, env={**os.environ, **env}, check=True)
    record = next(name for name in os.listdir(out_dir) if os.path.isdir(os.path.join(out_dir, name)))
    with open(os.path.join(out_dir, record, "latency.json")) as f:
        report = json.load(f)
    variant, run = next(iter(report["runs"].items()))
    return {"variant": variant, "first_fold_s": round(sum(run.get("warmup_s") or []) + run["runs_s"][0], 4),
            "prepare_at_first_pass": run.get("prepare_at_first_pass"),
            "attention_choices_timed": len(report.get("attention_choices", []))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.warm_first_fold", description=__doc__.split("\n\n")[0])
    p.add_argument("fasta")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="stock,flashlight,flashlight:FLASHLIGHT_PRELOAD=0")
    p.add_argument("--fold-args", default="", help="more flashlight-fold options, as one string")
    p.add_argument("--out")
    args = p.parse_args(argv)
    extra = args.fold_args.split()
    work = tempfile.mkdtemp(prefix="flashlight-warm-first-fold-")
    os.environ.update({"FLASHLIGHT_CACHE_DIR": f"{work}/flashlight", "TRITON_CACHE_DIR": f"{work}/triton",
                       "TORCHINDUCTOR_CACHE_DIR": f"{work}/inductor"})
    cold = fold(args.fasta, f"{work}/cold", extra, {})
    variants = args.variants.split(",")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for k in range(args.rounds):
        for v in variants:
            flags, env = _variant_env(v)
            runs[v].append(fold(args.fasta, f"{work}/{k}-{variants.index(v)}", [*extra, *flags], env))
    medians = {v: statistics.median(r["first_fold_s"] for r in rs) for v, rs in runs.items()}
    import torch
    import triton

    result = {"schema": "flashlight-bench-warm-first-fold/1", "fasta": args.fasta, "date": time.strftime("%Y-%m-%d"),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "cold": cold, "runs": runs,
              "median_first_fold_s": medians}
    for v, m in medians.items():
        print(f"{v:45s} median {m:.3f} s  ({', '.join(str(r['first_fold_s']) for r in runs[v])})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
