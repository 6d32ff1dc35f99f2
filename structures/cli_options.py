"""The command line of ``flashlight-fold``: its options, their defaults and checks.

:func:`build_parser` is re-exported by :mod:`flashlight.structures.cli`, which runs it.
"""
from __future__ import annotations

import argparse


def _chunk_size(text: str):
    if text in ("preset", "auto"):
        return text
    if text.lower() in ("none", "off", "0"):
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("chunk size must be positive, 'none', 'auto' or 'preset'")
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
    p.add_argument(
        "fasta", nargs="+",
        help="FASTA files, A3M files (the first sequence is the query, the file its MSA) "
        "or directories of them (*.fasta, *.fa, *.faa, *.a3m); every record is folded",
    )
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
        help="run stock OpenFold and Flashlight and report their deviation and timings "
        "(on a GPU, module times come from one extra pass per variant that starts every "
        "module on an idle device)",
    )
    p.add_argument(
        "--patch-scope", choices=("attention", "block"), default="attention",
        help="what Flashlight compiles: the attention cores (default) or each Evoformer, "
        "extra-MSA and template pair block whole (slow first call: Inductor compiles the blocks)",
    )
    p.add_argument(
        "--no-cuda-graphs", dest="cuda_graphs", action="store_false",
        help="run the Flashlight model's Evoformer and extra-MSA stacks and structure module eagerly in every "
        "recycling iteration (default on a GPU: after their first call they replay a CUDA "
        "graph, which saves the host's launch time; block and module times then come "
        "from the calls run eagerly)",
    )
    p.add_argument(
        "--require-flashlight", action="store_true",
        help="fail instead of falling back to stock OpenFold when Flashlight cannot run",
    )
    p.add_argument(
        "--require-msa", action="store_true",
        help="a record without an MSA is an input error (default: a warning, and it is "
        "folded in single-sequence mode)",
    )
    p.add_argument("--mmcif", action="store_true", help="also write ModelCIF (mmCIF) with pLDDT and pTM")
    p.add_argument(
        "--relax", action="store_true",
        help="also write <name>_relaxed.pdb: Amber relaxation with OpenMM (on the GPU when "
        "there is one); needs FLASHLIGHT_SETUP_RELAX=1 bash scripts/setup.sh",
    )
    p.add_argument(
        "--overwrite", action="store_true",
        help="fold every record again (default: skip records whose outputs are complete "
        "for the same result-deciding options)",
    )
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG plots")
    p.add_argument(
        "--repeats", type=_positive, default=1,
        help="timed passes per record, reported as medians (default 1: fold once; more for benchmarking)",
    )
    p.add_argument(
        "--warmup", type=_non_negative, default=None,
        help="full warm-up passes per record, timed and reported apart from the medians "
        "(default: one pass of a single recycling iteration where --compare times two "
        "variants, or --repeats above 1 times a Flashlight fold that compiles; none otherwise: "
        "a plain fold compiles during its one pass)",
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
        "--chunk-size", type=_chunk_size, default="auto",
        help="OpenFold's inference chunk size: a number, 'none', 'preset', or 'auto' "
        "(default: no chunking, and the preset's chunk size if the GPU runs out of memory)",
    )
    p.add_argument(
        "--max-msa-clusters", type=_positive,
        help="at most this many MSA cluster rows (default: the preset's, 512)",
    )
    p.add_argument(
        "--max-extra-msa", type=_positive,
        help="at most this many extra-MSA rows (default: the preset's, 5120)",
    )
    p.add_argument(
        "--pad-msa", action="store_true",
        help="pad every MSA to the --max-msa-clusters / --max-extra-msa sizes and run the empty templates, as OpenFold "
        "does (default: fold with the MSA's own depth, which gives the same result faster)",
    )
    p.add_argument(
        "--sync-modules", action="store_true",
        help="on a GPU, start every timed module on an idle device, so that each module's "
        "time is its own (for comparing modules; the pass gets slower)",
    )
    p.add_argument(
        "--profile-kernels", action="store_true",
        help="after the timed passes, run one more under torch.profiler and list its 30 longest "
        "kernels (GPU) or operators (CPU) in latency.json (runs.<variant>.kernels)",
    )
    p.add_argument(
        "--cpu-threads", type=_positive,
        help="threads for CPU kernels (default: torch's; under torchrun, OMP_NUM_THREADS)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and MSA sampling")
    p.add_argument(
        "--quiet", action="store_true",
        help="no progress bars, tables or progress lines (warnings and errors are still "
        "shown; the log file keeps everything)",
    )
    p.add_argument(
        "--skip-invalid", action="store_true",
        help="fold the valid records and list the invalid ones instead of stopping",
    )
    return p
