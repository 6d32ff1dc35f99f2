"""``flashlight-fold``: fold every record of FASTA files and report per-layer latency.

Examples::

    flashlight-fold structures/examples/miniproteins.fasta \\
        --alignment-dir structures/examples --out-dir out/fold --num-blocks 4 --recycles 0
    flashlight-fold proteins.fasta --params params_model_1.npz --compare --repeats 5
    torchrun --nproc_per_node 8 -m flashlight.structures proteins.fasta --params ...

Exit status: 0 when every record folded, 1 when a record failed, 2 for invalid input or
options (nothing is folded unless ``--skip-invalid``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import List, Optional

from flashlight.structures import distributed
from flashlight.structures.inputs import load_inputs, safe_name

SUMMARY_SCHEMA = "flashlight.fold.summary/1"


def _chunk_size(text: str):
    if text == "preset":
        return "preset"
    if text.lower() in ("none", "off", "0"):
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("chunk size must be positive, 'none' or 'preset'")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``flashlight-fold``."""
    p = argparse.ArgumentParser(
        prog="flashlight-fold",
        description="Fold FASTA records with OpenFold, accelerated by Flashlight, and "
        "report end-to-end and per-layer latency. Exit status: 0 all records folded, "
        "1 a record failed, 2 invalid input or options.",
    )
    p.add_argument("fasta", nargs="+", help="FASTA files; every record is folded")
    p.add_argument(
        "--alignment-dir",
        help="folder with <record id>.a3m / .sto (or <record id>/*.a3m); records "
        "without one are folded in single-sequence mode",
    )
    p.add_argument("--out-dir", default="fold_out", help="output folder (default: fold_out)")
    p.add_argument("--preset", default="model_1", help="OpenFold config preset (default: model_1)")
    p.add_argument(
        "--params",
        help="AlphaFold .npz parameters or OpenFold .pt checkpoint; without it the "
        "model has seeded random weights and every output says so",
    )
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument(
        "--dtype", choices=("fp32", "bf16"), default="fp32", help="model precision (default fp32)"
    )
    p.add_argument(
        "--no-tf32", dest="tf32", action="store_false",
        help="on GPUs, compute fp32 matmuls in full fp32 (default: TF32, as OpenFold does)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--no-flashlight", action="store_true", help="stock OpenFold only")
    mode.add_argument(
        "--compare", action="store_true",
        help="run stock OpenFold and Flashlight and report their deviation",
    )
    p.add_argument(
        "--require-flashlight", action="store_true",
        help="fail instead of falling back to stock OpenFold when Flashlight cannot run",
    )
    p.add_argument("--mmcif", action="store_true", help="also write mmCIF")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG plot")
    p.add_argument("--repeats", type=_positive, default=3, help="timed runs per record (median; default 3)")
    p.add_argument(
        "--warmup", type=_non_negative, default=1,
        help="first runs per record, where Flashlight compiles; timed and reported apart "
        "from the steady-state medians (default 1)",
    )
    p.add_argument(
        "--num-blocks", type=_positive,
        help="Evoformer blocks (default: the preset's, 48); fewer for quick runs",
    )
    p.add_argument(
        "--recycles", type=_non_negative, default=None,
        help="recycling iterations (default: the preset's, 3)",
    )
    p.add_argument(
        "--chunk-size", type=_chunk_size, default="preset",
        help="OpenFold's inference chunk size: a number, 'none', or 'preset' (default)",
    )
    p.add_argument(
        "--max-msa-clusters", type=_positive,
        help="MSA cluster rows the input is padded to (default: the preset's, 512)",
    )
    p.add_argument(
        "--max-extra-msa", type=_positive,
        help="extra-MSA rows the input is padded to (default: the preset's, 5120)",
    )
    p.add_argument(
        "--cpu-threads", type=_positive,
        help="threads for CPU kernels (default: torch's; under torchrun, OMP_NUM_THREADS)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and MSA sampling")
    p.add_argument("--quiet", action="store_true", help="no progress bars or tables (warnings still shown)")
    p.add_argument(
        "--skip-invalid", action="store_true",
        help="fold the valid records and list the invalid ones instead of stopping",
    )
    return p


def _default_device(group: distributed.Group, requested: Optional[str]) -> str:
    import torch

    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and group.initialized:
        device = f"cuda:{group.local_rank}"
    return device


def _fold_share(args, group, records, warn, say) -> dict:
    """Fold this rank's records; never raises (errors go into the returned dict)."""
    from tqdm import tqdm

    from flashlight.structures.fold import Folder, FoldOptions
    from flashlight.structures.outputs import record_table

    local = {"rank": group.rank, "entries": [], "error": None, "model": None, "flashlight": None}
    mine = distributed.shard(records, group)
    if not mine:  # more ranks than records
        return local
    try:
        options = FoldOptions(
            out_dir=args.out_dir,
            preset=args.preset,
            params=args.params,
            device=_default_device(group, args.device),
            dtype=args.dtype,
            flashlight=not args.no_flashlight,
            compare=args.compare,
            require_flashlight=args.require_flashlight,
            mmcif=args.mmcif,
            plot=args.plot,
            repeats=args.repeats,
            warmup=args.warmup,
            num_blocks=args.num_blocks,
            recycles=args.recycles if args.recycles is not None else _preset_recycles(args.preset),
            chunk_size=args.chunk_size,
            max_msa_clusters=args.max_msa_clusters,
            max_extra_msa=args.max_extra_msa,
            seed=args.seed,
            tf32=args.tf32,
        )
        folder = Folder(options, warn)
    except Exception as err:  # noqa: BLE001 - reported, and the other ranks still merge
        local["error"] = f"{type(err).__name__}: {err}"
        warn(f"error: cannot set up the model: {local['error']}")
        return local
    local["model"] = {**folder.info.to_json(), "label": folder.info.label()}
    if group.is_root:
        say(f"model: {folder.info.label()}")
        if folder.info.random_weights:
            warn(
                f"WARNING: no --params given: the model has RANDOM WEIGHTS (seed "
                f"{folder.info.seed}); outputs are not structure predictions"
            )
    desc = "folding" if group.world_size == 1 else f"rank {group.rank}"
    bar = tqdm(mine, desc=desc, unit="record", disable=True if args.quiet else None, position=2 * group.rank, leave=True)
    for record in bar:
        bar.set_postfix_str(f"{record.id} ({record.length} aa)")
        runs = tqdm(
            total=folder.runs_per_record(), desc="  recycles", unit="pass", leave=False,
            disable=True if args.quiet else None, position=2 * group.rank + 1,
        )
        entry = {"id": record.id, "order": record.order, "length": record.length, "rank": group.rank}
        try:
            report = folder.fold(record, on_recycle=lambda: runs.update(1))
        except Exception as err:  # noqa: BLE001 - one bad record does not stop the rest
            entry.update(status="failed", error=f"{type(err).__name__}: {err}")
            warn(f"error: record {record.id!r} failed: {entry['error']}")
        else:
            entry.update(
                status="ok",
                out_dir=os.path.join(args.out_dir, safe_name(record.id)),
                end_to_end_s=report["end_to_end"]["total_s"],
                model_s={k: v["steady"]["model_s"] for k, v in report["runs"].items()},
                warmup_s={k: (v["warmup_s"][0] if v["warmup_s"] else None) for k, v in report["runs"].items()},
                mean_plddt=report["mean_plddt"],
                comparison=report["comparison"],
            )
            if not args.quiet:
                bar.write(record_table(report), file=sys.stdout)
        finally:
            runs.close()
        local["entries"].append(entry)
    bar.close()
    local["flashlight"] = folder.status.to_json()
    return local


def _preset_recycles(preset: str) -> int:
    from openfold.config import model_config

    try:
        return int(model_config(preset).data.common.max_recycling_iters)
    except ValueError:
        return 3  # the preset error is reported when the model is built


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``flashlight-fold`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*non-tuple sequence for multidimensional indexing.*")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"openfold\.")
    started = time.perf_counter()
    group = distributed.setup()
    if args.cpu_threads:
        import torch

        torch.set_num_threads(args.cpu_threads)

    def warn(text: str) -> None:
        prefix = f"[rank {group.rank}] " if group.world_size > 1 else ""
        print(prefix + text, file=sys.stderr, flush=True)

    def say(text: str) -> None:
        if not args.quiet:
            print(text, flush=True)

    try:
        records, problems = load_inputs(args.fasta, args.alignment_dir)
        if problems and group.is_root:
            kind = "skipped" if args.skip_invalid else "invalid"
            warn(f"{len(problems)} invalid input(s) ({kind}):")
            for problem in problems:
                warn(f"  {problem}")
        if problems and not args.skip_invalid:
            if group.is_root:
                warn("error: nothing was folded; fix the inputs or pass --skip-invalid")
            return 2
        if not records:
            if group.is_root:
                warn("error: no valid records to fold")
            return 2
        if args.params and not os.path.isfile(args.params):
            if group.is_root:
                warn(f"error: --params {args.params}: no such file")
            return 2

        local = _fold_share(args, group, records, warn, say)
        gathered = distributed.gather_to_root(local, group)
        if not group.is_root:
            return _exit_code(local)
        summary = _merge(argv, group, gathered, problems, time.perf_counter() - started)
        from flashlight.structures.outputs import summary_table, write_json

        write_json(os.path.join(args.out_dir, "summary.json"), summary)
        say(summary_table(summary))
        if problems:
            say(f"{len(problems)} invalid record(s) skipped (listed in summary.json)")
        say(f"summary: {os.path.join(args.out_dir, 'summary.json')}")
        if any(part["error"] for part in gathered):
            return 2
        return 1 if summary["failed"] else 0
    finally:
        distributed.teardown(group)


def _exit_code(local: dict) -> int:
    if local["error"]:
        return 2
    return 1 if any(e["status"] != "ok" for e in local["entries"]) else 0


def _merge(argv, group, gathered, problems, elapsed_s: float) -> dict:
    entries = sorted((e for part in gathered for e in part["entries"]), key=lambda e: e["order"])
    model = next((p["model"] for p in gathered if p["model"]), None)
    return {
        "schema": SUMMARY_SCHEMA,
        "command": ["flashlight-fold"] + argv,
        "world_size": group.world_size,
        "model": model,
        "flashlight": [p["flashlight"] for p in gathered],
        "records": entries,
        "failed": [e["id"] for e in entries if e["status"] != "ok"],
        "invalid": [p.to_json() for p in problems],
        "rank_errors": {str(p["rank"]): p["error"] for p in gathered if p["error"]},
        "elapsed_s": elapsed_s,
    }


if __name__ == "__main__":
    sys.exit(main())
