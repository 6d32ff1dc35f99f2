"""Where a fold's first call goes: ``flashlight-fold`` under cProfile, in this process.

    python -m bench.first_call RECORD.fasta [--alignment-dir DIR] [--out DIR] [-- FOLD OPTIONS...]

Runs the default fold of one record (no ``--compare``) under :mod:`cProfile` and writes,
into ``--out``: ``first_call.pstats`` (the raw profile), ``first_call.txt`` (the functions
with the most cumulative and own time, and torch.compile's own per-phase times) and
``first_call.json`` (the fold's ``latency.json``: warm-up and timed passes). Run it twice
on one machine to see the cold (empty caches) and the warm (caches filled) first call;
the caches are Flashlight's, Triton's and Inductor's usual ones, so point
``FLASHLIGHT_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` at empty
folders for a cold run. cProfile slows Python down (by about 1.5-2x on this code), so
read the split, not the absolute total.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.first_call", description=__doc__.split("\n\n")[0])
    p.add_argument("fasta")
    p.add_argument("--alignment-dir")
    p.add_argument("--out", default="bench/results/first_call")
    p.add_argument("--label", default="run", help="prefix of the files written")
    p.add_argument("--top", type=int, default=45)
    p.add_argument("--sample", action="store_true",
                   help="sample the main thread's stack instead of cProfile: per pass, where its "
                        "wall time goes (bench.stack_sampler); writes LABEL.samples.txt and .folded")
    args, rest = p.parse_known_args(argv)
    args.fold_args = [a for a in rest if a != "--"]  # more flashlight-fold options
    return args


def _stats_text(profile: cProfile.Profile, top: int) -> str:
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def _compile_times() -> str:
    try:
        from torch._dynamo.utils import compile_times

        return str(compile_times(repr="str", aggregate=True))
    except Exception as error:  # noqa: BLE001 - a private helper; its absence is not an error
        return f"(torch.compile's phase times unavailable: {type(error).__name__})"


def _sampled(fold_main, fold: list[str], prefix: str, top: int) -> int:
    """``fold_main(fold)`` with its thread's stack sampled; each model pass (a
    ``run_within`` window) summarised into ``prefix.samples.txt`` and its folded stacks
    into ``prefix.folded`` (one ``# pass N`` header per pass)."""
    from bench import stack_sampler

    with stack_sampler.StackSampler() as sampler:
        status = fold_main(fold)
    windows = stack_sampler.passes(sampler.samples, "run_within")
    with open(prefix + ".samples.txt", "w") as text, open(prefix + ".folded", "w") as stacks:
        text.write(f"flashlight-fold {' '.join(fold)}\nexit status {status}\n"
                   f"main thread sampled every {sampler.interval * 1e3:.0f} ms; {len(windows)} passes\n")
        for i, window in enumerate(windows):
            text.write(f"\n# pass {i}: " + stack_sampler.summary(window, top, sampler.interval) + "\n")
            stacks.write(f"# pass {i}\n" + stack_sampler.folded(window) + "\n")
    print(open(prefix + ".samples.txt").read()[:6000])
    return status


def main(argv=None) -> int:
    args = parse_args(argv)
    from flashlight.structures import cli

    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="flashlight-first-call-")
    fold = [args.fasta, "--out-dir", work, "--no-plot", "--quiet", *args.fold_args]
    if args.alignment_dir:
        fold += ["--alignment-dir", args.alignment_dir]
    prefix = os.path.join(args.out, args.label)
    if args.sample:
        status = _sampled(cli.main, fold, prefix, args.top)
    else:
        profile = cProfile.Profile()
        status = profile.runcall(cli.main, fold)
        profile.dump_stats(prefix + ".pstats")
        with open(prefix + ".txt", "w") as f:
            f.write(f"flashlight-fold {' '.join(fold)}\nexit status {status}\n\n")
            f.write("torch.compile phases:\n" + _compile_times() + "\n\n")
            f.write(_stats_text(profile, args.top))
    latency = [os.path.join(root, name) for root, _, names in os.walk(work) for name in names
               if name == "latency.json"]
    if latency:
        shutil.copy(latency[0], prefix + ".json")
        report = json.load(open(latency[0]))
        for variant, run in report.get("runs", {}).items():
            print(f"{args.label}: {variant}: exit {status}; first call (warm-up) {run.get('warmup_s')} s; "
                  f"timed {run.get('runs_s')} s")
    shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
