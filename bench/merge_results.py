"""Merge kernel result files measured side by side into one.

On a host with several GPUs, one ``bench.kernels`` process per GPU (``CUDA_VISIBLE_DEVICES``)
measures its own variants into its own file; this folds those files into the part's file
(``kernels_lm.json``, say), so that the part resumes from it and counts their cells:

    python -m bench.merge_results bench/results/kernels_lm.json bench/results/kernels_lm_gpu1.json

Each source's runs (machine, roofline) are appended with new ids and its cells point to
them; a cell of a source replaces the target's cell of the same variant, shape, dtype
and implementation. ``--remove`` deletes the sources once merged.
"""
from __future__ import annotations

import argparse
import json
import pathlib

from bench.kernel_results import Results


def merge(target: Results, source: dict) -> int:
    """Fold the cells (and the runs they cite) of ``source`` into ``target``; returns
    the number of cells merged."""
    new_id = {}
    for run in source["runs"]:
        new_id[run["id"]] = target.add_run({k: v for k, v in run.items() if k != "id"})
    for cell in source["cells"]:
        target.put({**cell, "run": new_id[cell["run"]]})
    return len(source["cells"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", type=pathlib.Path, help="result file to merge into (created if missing)")
    p.add_argument("sources", type=pathlib.Path, nargs="+", help="result files to merge from")
    p.add_argument("--remove", action="store_true", help="delete the sources once merged")
    args = p.parse_args(argv)
    target = Results(args.target)
    for path in args.sources:
        if path.resolve() == args.target.resolve():
            p.error(f"{path} is the target")
        n = merge(target, json.loads(path.read_text()))
        print(f"bench.merge_results: {n} cells from {path}")
    target.save()
    if args.remove:
        for path in args.sources:
            path.unlink()
            path.with_suffix(".csv").unlink(missing_ok=True)
    print(f"bench.merge_results: {len(target.data['cells'])} cells in {args.target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
