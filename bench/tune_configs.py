"""Measure the tuned choices Flashlight ships (``flashlight/data/tuned_configs.json``).

    python -m bench.tune_configs [--n-res 256,512] [--dtypes bf16,tf32,fp32]
                                 [--kernels all|msa_row,triangle_start,...]
                                 [--out flashlight/data/tuned_configs.json] [--max-minutes 9] [--list]
    python -m bench.tune_configs --fold RECORD.fasta [--alignment-dir DIR] [--dtypes fp32,bf16]
    python -m bench.tune_configs --fold-synthetic 256,512 [--dtypes fp32,bf16]

Each cell (an Evoformer kernel of the catalog, :mod:`bench.variants_evoformer`, at one
N_res and dtype: ``bf16``; ``tf32``: float32 with TF32 matmuls; ``fp32``: IEEE float32)
is compiled afresh with ``FLASHLIGHT_AUTOTUNE=full`` (every candidate configuration, no
shipped choice consulted), the tuning cache off and each candidate's build timed
(``FLASHLIGHT_RECORD_BUILDS``), and called once on random inputs. An entry ships the
candidate that builds fastest among those within 3% of the fastest ([Note: a choice that
builds fast] in ``flashlight/tuned_configs.py``).
Each autotuning that call runs (``flashlight.runtime.TUNING_EVENTS``: the best of the
full space, timed against the unfused graph) becomes one entry of ``--out``, keyed by
GPU model, Triton major.minor, kernel signature and size bucket, with the measured
times and the cell it came from. Entries of other GPUs or cells are kept.

The kernels: MSA row attention with pair bias (MSA depth 512, 8 heads, c 32), the
extra-MSA stack's row attention (depth 1024, 8 heads, c 8), MSA column attention
(depth 512), triangle attention at the starting and ending node (4 heads, c 32), and
the template pair stack's triangle attention (4 heads, c 16).

``--fold`` measures the kernels a fold compiles instead: ``flashlight-fold`` runs in this
process on the record (with its alignment, at its defaults, once per dtype: ``fp32`` is
the fold's default float32 with TF32, ``bf16`` its ``--dtype bf16``) with the full
autotuning space, so the entries hold exactly the kernel signatures and size buckets of
the product path (the OpenFold cores, the global column attention, the template stack).
``--fold-synthetic`` does so for the synthetic records of those lengths that the fold
benchmark folds (``bench/fold_product.py``), each with its deep alignment and as a single
sequence.

Resumable: cells with entries in ``--out`` measured on this GPU, Triton and compiler
(the digest of Flashlight's, its integrations' and the benchmarks' sources, ``compiler``
in each entry) are skipped, so a compiler change, which can add kernels to a fold or
change their signatures, measures every cell again; the file is written after every
cell. Stops before ``--max-minutes`` (exit status 3: run again).
Needs a CUDA GPU (exit status 2 without one): nothing is written from the interpreter.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time

KERNELS: dict[str, tuple[str, dict]] = {  # cell kernel -> (catalog variant, shape; L / N set per cell)
    "msa_row": ("msa_row_pair_bias", {"B": 1, "S": 512, "H": 8, "c": 32}),
    "extra_msa_row": ("msa_row_pair_bias", {"B": 1, "S": 1024, "H": 8, "c": 8}),
    "msa_column": ("msa_column", {"B": 1, "S": 512, "H": 8, "c": 32}),
    "triangle_start": ("triangle_start", {"B": 1, "H": 4, "c": 32}),
    "triangle_end": ("triangle_end", {"B": 1, "H": 4, "c": 32}),
    "template_triangle_start": ("triangle_start", {"B": 1, "H": 4, "c": 16}),
    "template_triangle_end": ("triangle_end", {"B": 1, "H": 4, "c": 16}),
}
EXIT_COMPLETE, EXIT_NO_GPU, EXIT_INCOMPLETE = 0, 2, 3


def cells(kernels: list[str], n_res: list[int], dtypes: list[str]) -> list[tuple[str, str, dict, str]]:
    """(cell id, catalog variant, shape, dtype) for every kernel, N_res and dtype."""
    found = []
    for kernel in kernels:
        variant, base = KERNELS[kernel]
        for n in n_res:
            shape = {**base, ("N" if variant.startswith("triangle") else "L"): n}
            for dtype in dtypes:
                found.append((f"{kernel} N_res {n} {dtype}", variant, shape, dtype))
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from flashlight.tuned_configs import SHIPPED

    p = argparse.ArgumentParser(prog="python -m bench.tune_configs", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-res", default="256,512", help="residue counts, comma-separated")
    p.add_argument("--dtypes", default="bf16,tf32,fp32", help="bf16, tf32, fp32 (TF32 off), comma-separated")
    p.add_argument("--kernels", default="all", help=f"all, or some of {', '.join(KERNELS)}")
    p.add_argument("--out", default=SHIPPED, help="data file to merge the entries into")
    p.add_argument("--max-minutes", type=float, default=9.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="print the cells and exit")
    p.add_argument("--fold", metavar="FASTA", help="measure the kernels of a flashlight-fold run on this record")
    p.add_argument("--alignment-dir", help="the record's alignments (with --fold)")
    p.add_argument("--fold-synthetic", metavar="LENGTHS",
                   help="measure the kernels of folds of the fold benchmark's synthetic records of these lengths, "
                        "comma-separated (deep alignment and single sequence)")
    p.add_argument("--work-dir", help="where --fold-synthetic writes its records (default: a temporary folder)")
    args = p.parse_args(argv)
    wanted = args.kernels
    args.kernels = list(KERNELS) if wanted == "all" else [k.strip() for k in wanted.split(",") if k.strip()]
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown:
        p.error(f"unknown kernels {unknown}; known: {', '.join(KERNELS)}")
    args.n_res = [int(n) for n in args.n_res.split(",") if n.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.fold_synthetic = [int(n) for n in (args.fold_synthetic or "").split(",") if n.strip()]
    if args.fold and args.fold_synthetic:
        p.error("--fold and --fold-synthetic: one or the other")
    if (args.fold or args.fold_synthetic) and args.dtypes == ["bf16", "tf32", "fp32"]:
        args.dtypes = ["fp32", "bf16"]
    bad = [d for d in args.dtypes if d not in ("bf16", "tf32", "fp32")]
    if bad:
        p.error(f"unknown dtypes {bad}; known: bf16, tf32, fp32")
    return args


def measure_cell(variant_name: str, shape: dict, dtype_name: str, seed: int) -> list[dict]:
    """Compile and call one cell with the full autotuning space; its autotuning outcomes."""
    import torch

    import flashlight
    from bench.common import set_precision
    from bench.variants import VARIANTS
    from flashlight import runtime, settings

    variant = VARIANTS[variant_name]
    dtype = set_precision(dtype_name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    inputs = variant.make_inputs(shape, dtype, "cuda", g)
    torch.compiler.reset()
    start = len(runtime.TUNING_EVENTS)
    with settings.override(autotune="full", tuning_cache=False, record_builds=True), torch.no_grad():
        out = flashlight.compile(variant.fn)(*inputs)
        torch.cuda.synchronize()
    if not bool(torch.isfinite(out.float()).all()):
        raise RuntimeError("the output is not finite")
    torch.compiler.reset()
    return runtime.TUNING_EVENTS[start:]


def fold_cells(fasta: str, dtypes: list[str], alignment_dir: str | None) -> list[tuple[str, str, dict, str]]:
    """(cell id, record, {"alignment_dir": ...}, dtype) for a ``--fold`` run: one cell per dtype."""
    import os

    record = os.path.splitext(os.path.basename(fasta))[0]
    return [(f"fold {record} {dtype}", fasta, {"alignment_dir": alignment_dir}, dtype) for dtype in dtypes]


def synthetic_fold_cells(lengths: list[int], dtypes: list[str], work: str) -> list[tuple[str, str, dict, str]]:
    """Fold cells for the fold benchmark's synthetic record of each length (written to
    ``work`` on first use), with its deep alignment (``deep``) and without (``single``)."""
    import os

    found = []
    for length in lengths:
        fasta = os.path.join(work, "inputs", f"synthetic_{length}.fasta")
        for msa, alignment_dir in (("deep", os.path.dirname(fasta)), ("single", None)):
            where = {"alignment_dir": alignment_dir, "length": length}
            found += [(f"fold synthetic_{length} {msa} {dtype}", fasta, where, dtype) for dtype in dtypes]
    return found


def measure_fold(fasta: str, alignment_dir: str | None, dtype_name: str, length: int | None = None) -> list[dict]:
    """Fold ``fasta`` once with ``flashlight-fold`` in this process, with the full autotuning
    space and no tuning cache; the autotuning outcomes of its kernels. With ``length``,
    ``fasta`` is the fold benchmark's synthetic record, written where missing."""
    import pathlib
    import tempfile

    import torch

    from flashlight import runtime, settings
    from flashlight.structures import cli

    if dtype_name == "tf32":
        raise ValueError("a fold's float32 is TF32 already: use fp32")
    if length is not None:
        from bench.fold_product import DEEP_DEPTH, make_inputs

        make_inputs(pathlib.Path(fasta).parent.parent, length, DEEP_DEPTH)
    argv = [fasta, "--no-plot", "--quiet", "--dtype", "bf16" if dtype_name == "bf16" else "fp32"]
    if alignment_dir:
        argv += ["--alignment-dir", alignment_dir]
    torch.compiler.reset()
    start = len(runtime.TUNING_EVENTS)
    with tempfile.TemporaryDirectory() as out, settings.override(autotune="full", tuning_cache=False, record_builds=True):
        status = cli.main([*argv, "--out-dir", out])
    if status != 0:
        raise RuntimeError(f"flashlight-fold exited with status {status}")
    torch.compiler.reset()
    return runtime.TUNING_EVENTS[start:]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tempfile

    from bench.common import source_digest

    if args.fold_synthetic:
        todo = synthetic_fold_cells(args.fold_synthetic, args.dtypes, args.work_dir or tempfile.mkdtemp(prefix="tune-"))
    elif args.fold:
        todo = fold_cells(args.fold, args.dtypes, args.alignment_dir)
    else:
        todo = cells(args.kernels, args.n_res, args.dtypes)
    if args.list:
        print("\n".join(cell for cell, *_ in todo))
        return EXIT_COMPLETE
    import torch

    from flashlight import tuned_configs

    if not torch.cuda.is_available():
        print("bench.tune_configs: needs a CUDA GPU (tuned choices are measured, never interpreted)",
              file=sys.stderr)
        return EXIT_NO_GPU
    gpu, triton, compiler = torch.cuda.get_device_name(), tuned_configs.triton_version(), source_digest()
    done = {cell for e in tuned_configs.read_entries(args.out)
            if (e.get("gpu"), e.get("triton"), e.get("compiler")) == (gpu, triton, compiler) for cell in _cells_of(e)}
    deadline = time.monotonic() + args.max_minutes * 60
    for cell, variant, shape, dtype in todo:
        if cell in done:
            continue
        if time.monotonic() > deadline:
            print("bench.tune_configs: time is up; run again for the remaining cells", file=sys.stderr)
            return EXIT_INCOMPLETE
        t0 = time.monotonic()
        try:
            events = (measure_fold(variant, shape["alignment_dir"], dtype, shape.get("length"))
                      if args.fold or args.fold_synthetic else measure_cell(variant, shape, dtype, args.seed))
        except Exception as error:  # noqa: BLE001 - one failed cell does not stop the others
            print(f"{cell}: failed ({type(error).__name__}: {' '.join(str(error).split())[:300]})", file=sys.stderr)
            continue
        entries = _entries(events, cell, tuned_configs.read_entries(args.out), compiler)
        if entries:
            tuned_configs.write_entries(args.out, entries)
        for e in entries:
            fastest = f", builds faster than the fastest {_described(e['fastest'])}" if e.get("fastest") else ""
            print(f"{cell}: {e['kernel']}: {_described(e['choice'])}{fastest} (kernel {_ms(e['kernel_ms'])}, "
                  f"unfused graph {_ms(e['eager_ms'])}) [{time.monotonic() - t0:.1f} s]")
        if not entries:
            print(f"{cell}: no kernel was autotuned", file=sys.stderr)
    return EXIT_COMPLETE


def _cells_of(entry: dict) -> list[str]:
    measured = entry.get("measured", [])
    return [measured] if isinstance(measured, str) else list(measured)


def _entries(events: list[dict], cell: str, existing: list[dict], compiler: str) -> list[dict]:
    """Data-file entries for one cell's autotuning outcomes, by the ``compiler`` sources'
    digest. Cells whose kernels share a key (triangle attention at the starting and ending
    node, say) share its entry: the latest measurement's choice, and every cell that
    measured it with this compiler in ``measured``."""
    from flashlight import tuned_configs

    earlier = {tuned_configs.entry_key(e): _cells_of(e) for e in existing if e.get("compiler") == compiler}
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    entries = []
    for event in events:
        key = tuned_configs.entry_key(event)
        cells_measured = sorted({*earlier.get(key, []), cell})
        entries.append(tuned_configs.entry_from_event(event, measured=cells_measured, kernel=event["kernel"],
                                                      date=date, compiler=compiler))
    return entries


def _described(choice) -> str:
    return choice if choice == "eager" else "{BLOCK_M}x{BLOCK_N} w{num_warps} s{num_stages}".format(**choice)


def _ms(value) -> str:
    return "-" if value is None else f"{value:.4g} ms"


if __name__ == "__main__":
    sys.exit(main())
