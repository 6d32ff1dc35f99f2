"""The product path of the fold-speed claims: ``flashlight-fold --compare`` as a user runs it.

    python -m bench.fold_product [--lengths 256,512] [--msa deep,single] [--dtypes fp32,bf16]
                                 [--max-minutes 9] [--out bench/results/fold_product.json]

For each record (a synthetic sequence of each length, made by
``python -m flashlight.structures.examples.make_synthetic --length L --depth 5632``, folded
with its deep A3M alignment, ``deep``, or without one, ``single``: single-sequence mode)
and each dtype it runs the user's command exactly::

    flashlight-fold <fasta> --alignment-dir <dir> --compare [--dtype bf16] --out-dir <dir>

(``--out-dir`` a folder of the benchmark's, emptied before each fold, so no record is
skipped as already folded; its output is captured, and a failing fold's last lines are the row's message)

in a subprocess (``python -m flashlight.structures`` where the ``flashlight-fold`` script
is not installed; the cell records which), twice:

- ``cold``: Flashlight's kernel cache (``FLASHLIGHT_CACHE_DIR``), Triton's
  (``TRITON_CACHE_DIR``) and Inductor's (``TORCHINDUCTOR_CACHE_DIR``) point at fresh empty
  folders, as on a user's first run;
- ``warm``: the same command again with the caches the cold run filled.

From the record's ``latency.json`` each row keeps: model time (the timed pass) of stock
OpenFold and of Flashlight, their ratio, each variant's first call (warm-up pass) time,
per-module totals (all blocks summed) for both (``*_modules_s``; from the comparison's
synchronised pass: ``*_modules_synchronised_s``), the stage times, the deviation of the
two predictions, and the subprocess's wall time and exit status. Rows go to
``--out`` (JSON, and a CSV beside it) after every run.

Resumable: rows already in ``--out`` are skipped. A warm row needs the cold run's caches
in the same call (the GPU machine may be fresh per call), so a config's cold and warm
runs are started only with time for both (``--run-estimate-s``); the process stops
before ``--max-minutes`` (exit status 3: run again). Status 0: every row is in the file.

``--warmup-compile inline,background`` folds every record under each setting of
``FLASHLIGHT_WARMUP_COMPILE`` in the same call (own caches per setting; the rows carry
``warmup_compile_setting``), for a same-machine comparison of how the warm-up compiles.
Each row also keeps the variants' host records of the timed pass (``*_host``), how
their warm-up compiled (``*_warmup_compile``), the first call's stage times
(``*_warmup_stages_s``), each graphed module's recordings, replays and failed
recordings (``*_cuda_graphs``), and the GPU's SM clock, power, temperature and
throttle reasons sampled while each fold process ran (``gpu_samples``; solo rows:
``*_gpu_samples``, :func:`bench.common.gpu_samples`).

``--rows cold,warm,solo`` adds a third row per record (``cache`` "solo"): the default
command alone, without ``--compare``, in two fresh processes with empty caches, one
``--no-flashlight`` (stock) and one Flashlight, and keeps each one's *first fold*: its warm-up pass, if it
ran one, plus its timed pass, from a process that had done no GPU work before (in a
``--compare`` process stock runs first, so its first call also pays the process's CUDA
start-up, libraries and kernel modules, and the Flashlight variant's does not); and each
process's wall time (imports, model, features, fold, outputs). This is what a user
waits for on a first run. Then stock and Flashlight fold again in ``--solo-again`` more
pairs of fresh processes (alternating) with the caches the first two left: a user's next
runs (``*_second_fold_s``, the median of ``*_again_fold_s``; one process's host speed
varies too much for one to say it).

``--fold-args`` passes extra options to every fold (``--num-blocks 1 --recycles 0
--device cpu`` in the CPU smoke test).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

EXIT_COMPLETE, EXIT_INCOMPLETE = 0, 3
DEEP_DEPTH = 512 + 5120  # model_1's cluster rows plus its extra rows
CSV_FIELDS = ("length", "msa", "dtype", "cache", "status", "stock_model_s", "flashlight_model_s", "speedup",
              "stock_first_call_s", "flashlight_first_call_s", "wall_s", "chunk_size", "max_abs_diff",
              "message", "gpu", "date")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.fold_product", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="256,512")
    p.add_argument("--msa", default="deep,single", help="deep (5632-row A3M), single (no alignment)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--depth", type=int, default=DEEP_DEPTH, help="rows of the deep alignment")
    p.add_argument("--warmup-compile", default="",
                   help="comma list of FLASHLIGHT_WARMUP_COMPILE modes (inline, background): every record is "
                        "folded under each, in the same call (default: the fold's own default)")
    p.add_argument("--out", default=None)
    p.add_argument("--work-dir", default=None,
                   help="inputs, outputs and caches (default: a folder under the system's temp dir)")
    p.add_argument("--fold-args", default="", help="extra options for every fold, as one string")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed passes per fold (flashlight-fold --repeats; default: the fold's own, one)")
    p.add_argument("--profile-kernels", action="store_true",
                   help="each fold lists its longest kernels in latency.json (flashlight-fold --profile-kernels); "
                        "the rows keep them")
    p.add_argument("--max-minutes", type=float, default=9.0)
    p.add_argument("--run-estimate-s", type=float, default=60.0,
                   help="seconds one fold process of 256 residues is assumed to need (scaled with the "
                        "length) until a process of that length has been measured; a row starts only "
                        "where its processes fit in the time left")
    p.add_argument("--rows", default="cold,warm",
                   help="which rows per record: cold, warm (the --compare command with empty, then filled "
                        "caches) and solo (stock alone and Flashlight alone, cold, in fresh processes: "
                        "each one's first fold)")
    p.add_argument("--solo-again", type=int, default=3,
                   help="solo rows: pairs of warm processes (stock, Flashlight alternating) after the cold "
                        "pair; the rows keep each one's first fold and their medians")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def configs(lengths, msas, dtypes, modes=("",)) -> list[tuple[int, str, str, str]]:
    """(length, msa, dtype, warm-up compile mode) in priority order: deep fp32 first, then
    bf16, then single; the modes of one record one after another ("": the default)."""
    order = []
    for msa in msas:
        for dtype in dtypes:
            for n in lengths:
                order.extend((n, msa, dtype, mode) for mode in modes)
    return order


def processes(kind: str, again: int) -> int:
    """Fold processes one row of ``kind`` runs (a solo row: a cold pair, ``again`` warm pairs)."""
    return 2 + 2 * again if kind == "solo" else 1


def process_estimate(rows: list[dict], length: int, default_s: float) -> float:
    """Seconds one fold process of ``length`` residues is expected to take: the longest
    measured so far at that length (any finished row of the file, each process of a solo
    row), else ``default_s`` scaled with the length (256 residues: ``default_s``)."""
    walls = []
    for row in rows:
        if row.get("length") != length or row.get("status") != "ok":
            continue
        if row.get("cache") == "solo":
            for key, value in row.items():
                if key.endswith("_process_wall_s") and value:
                    walls += value if isinstance(value, list) else [value]
        elif row.get("wall_s"):
            walls.append(row["wall_s"])
    return max(walls) if walls else default_s * max(1.0, length / 256)


def row_key(row: dict) -> tuple:
    """(length, msa, dtype, cache), and the warm-up compile mode where one was set."""
    mode = row.get("warmup_compile_setting") or ""
    return (row["length"], row["msa"], row["dtype"], row["cache"]) + ((mode,) if mode else ())


def make_inputs(work: pathlib.Path, length: int, depth: int) -> pathlib.Path:
    """The synthetic record of ``length`` and its deep A3M in ``work/inputs`` (deterministic)."""
    from flashlight.structures.examples import make_synthetic

    inputs = work / "inputs"
    fasta = inputs / f"synthetic_{length}.fasta"
    a3m = inputs / f"synthetic_{length}.a3m"
    if not (fasta.exists() and a3m.exists()):
        make_synthetic.write(str(inputs), length, depth, seed=0)
    return inputs


def user_args(fasta: pathlib.Path, alignment_dir: pathlib.Path | None, dtype: str, out_dir: pathlib.Path,
              extra: list[str], mode: str = "--compare") -> list[str]:
    """The options of the user's ``flashlight-fold`` command line; ``mode`` is
    ``--compare``, ``--no-flashlight`` (stock alone) or "" (the default: Flashlight alone)."""
    args = [str(fasta)]
    if alignment_dir is not None:
        args += ["--alignment-dir", str(alignment_dir)]
    args += [mode] if mode else []
    if dtype != "fp32":
        args += ["--dtype", dtype]
    return args + ["--out-dir", str(out_dir), *extra]


def launcher() -> tuple[list[str], str]:
    """How ``flashlight-fold`` is started here: its script, else ``python -m flashlight.structures``."""
    script = shutil.which("flashlight-fold")
    if script:
        return [script], "flashlight-fold"
    return [sys.executable, "-m", "flashlight.structures"], "python -m flashlight.structures"


def cache_env(cache: pathlib.Path) -> dict:
    """Environment of a fold whose compiler caches all live under ``cache``."""
    return {**os.environ, "FLASHLIGHT_CACHE_DIR": str(cache / "flashlight"), "TRITON_CACHE_DIR": str(cache / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}


def module_totals(steady: dict) -> dict[str, float]:
    """Seconds per module kind, all blocks summed, from a ``latency.json`` steady run."""
    totals: dict[str, float] = {}
    for block in steady.get("blocks", []):
        for kind, seconds in block.get("modules", {}).items():
            totals[kind] = totals.get(kind, 0.0) + seconds
    return {k: round(v, 6) for k, v in totals.items()}


def module_blocks(steady: dict) -> dict[str, list[float]]:
    """Seconds per module kind and block, in block order, from a ``latency.json`` run: one
    block's outlier (a host stall in a synchronised pass) shows here, where the sum hides it."""
    blocks: dict[str, list[float]] = {}
    for block in steady.get("blocks", []):
        for kind, seconds in block.get("modules", {}).items():
            blocks.setdefault(kind, []).append(round(seconds, 6))
    return blocks


def summarise(report: dict) -> dict:
    """The row's fields from one record's ``latency.json``."""
    runs = report.get("runs", {})
    row: dict = {"variants": sorted(runs)}
    for name, run in runs.items():
        steady = run.get("steady", {})
        row[f"{name}_model_s"] = steady.get("model_s")
        row[f"{name}_runs_s"] = run.get("runs_s")
        row[f"{name}_warmup_s"] = run.get("warmup_s")
        row[f"{name}_first_call_s"] = run["warmup_s"][0] if run.get("warmup_s") else None
        row[f"{name}_modules_s"] = module_totals(steady)
        if run.get("modules_synchronised"):  # the comparison's own module pass
            row[f"{name}_modules_synchronised_s"] = module_totals(run["modules_synchronised"])
            row[f"{name}_modules_synchronised_blocks_s"] = module_blocks(run["modules_synchronised"])
        row[f"{name}_stages_s"] = steady.get("stages")
        row[f"{name}_host"] = steady.get("host")  # the timed pass's host record
        row[f"{name}_warmup_compile"] = run.get("warmup_compile")  # of the pass that compiled
        row[f"{name}_compiled_in_pass"] = run.get("compiled_in_pass")  # no warm-up: the pass compiled
        row[f"{name}_prepare_at_first_pass"] = run.get("prepare_at_first_pass")  # flashlight.prepare.state()
        warmups = run.get("warmup") or []
        row[f"{name}_warmup_stages_s"] = warmups[0].get("stages") if warmups else None  # the first call's
        row[f"{name}_cuda_graphs"] = run.get("cuda_graphs")  # recordings, replays, failures per module
        if run.get("kernels") is not None:
            row[f"{name}_kernels"] = run["kernels"]
        row["chunk_size"] = run.get("chunk_size")
    fell_back = (runs.get("flashlight") or {}).get("fell_back")
    if fell_back is not None:  # the fold ran stock in Flashlight's place: no Flashlight timing
        row["fell_back"] = fell_back or "Flashlight fell back to stock"
    elif row.get("stock_model_s") and row.get("flashlight_model_s"):
        row["speedup"] = round(row["stock_model_s"] / row["flashlight_model_s"], 4)
    comparison = report.get("comparison") or {}
    row["comparison"] = comparison
    row["max_abs_diff"] = comparison.get("max_atom_deviation_A")
    row["flashlight"] = report.get("flashlight")
    row["end_to_end"] = report.get("end_to_end")
    row["warmup_recycling_iterations"] = report.get("warmup_recycling_iterations")
    row["msa_depth"] = (report.get("record") or {}).get("msa_depth")
    row["environment"] = report.get("environment")
    return row


def _base(config: tuple, cache: str) -> dict:
    """The identifying fields of the row of ``config`` (length, msa, dtype, mode) and ``cache``."""
    length, msa, dtype, mode = config
    return {"length": length, "msa": msa, "dtype": dtype, "cache": cache,
            **({"warmup_compile_setting": mode} if mode else {})}


def run_fold(cmd: list[str], env: dict, out_dir: pathlib.Path, record_id: str, timeout_s: float) -> dict:
    """Run one fold; the row's measured fields (``status`` included)."""
    from bench.common import gpu_samples

    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.monotonic()
    with gpu_samples() as sampled:  # the GPU's clock, power and throttling while it ran
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            done = None
    wall = round(time.monotonic() - t0, 2)
    if done is None:
        return {"status": "timeout", "message": f"did not finish in {timeout_s:.0f} s", "wall_s": wall}
    latency = out_dir / record_id / "latency.json"
    if done.returncode != 0 or not latency.exists():
        tail = " | ".join((done.stderr or done.stdout or "").strip().splitlines()[-4:])
        return {"status": "error", "exit_status": done.returncode, "wall_s": wall,
                "message": f"exit status {done.returncode}: {tail[:600]}"}
    row = summarise(json.loads(latency.read_text()))
    if row.get("fell_back"):  # a row, but not of Flashlight: say so wherever it is read
        return {"status": "fell_back", "exit_status": 0, "wall_s": wall, "gpu_samples": sampled["gpu"],
                "message": f"Flashlight fell back to stock: {row['fell_back']}"[:600], **row}
    return {"status": "ok", "exit_status": 0, "wall_s": wall, "gpu_samples": sampled["gpu"], **row}


def first_fold(rec: dict, name: str) -> float | None:
    """Seconds from a process's first model call to its structure: the warm-up pass (where
    one ran) plus the timed pass of variant ``name`` in a fold's row."""
    runs = rec.get(f"{name}_runs_s")
    if rec.get("status") != "ok" or not runs:
        return None
    return round(sum(rec.get(f"{name}_warmup_s") or []) + runs[0], 4)


def pdb_atoms(path: pathlib.Path) -> dict[tuple, np.ndarray]:
    """(chain, residue number, atom name) -> coordinates (angstroms) of a PDB file."""
    import gemmi

    atoms = {}
    for chain in gemmi.read_structure(str(path))[0]:
        for residue in chain:
            for atom in residue:
                atoms[(chain.name, residue.seqid.num, atom.name)] = np.array(atom.pos.tolist())
    return atoms


def atom_deviation(a: dict[tuple, np.ndarray], b: dict[tuple, np.ndarray]) -> float | None:
    """The largest distance (angstroms) between the atoms two structures share, in the
    frame the model wrote them in (no fitting: as ``--compare`` measures); None when
    they share none."""
    shared = sorted(set(a) & set(b))
    return max(float(np.linalg.norm(a[k] - b[k])) for k in shared) if shared else None


def solo_fold(fold, env: dict, work: pathlib.Path, record_id: str, deadline, again: int = 3) -> dict:
    """The ``solo`` row's fields: stock alone and Flashlight alone, each in a fresh process
    with empty caches, then ``again`` more pairs of fresh processes, stock and Flashlight
    alternating, that find the caches the first two left (a user's next runs).
    ``fold(mode)`` gives a command's options, ``env`` extra environment.

    A single-sequence fold is host-bound, and one process's host speed varies from the
    next's by up to half as much again for the same work (bench/results/fold_product_runs/
    README.md), so the warm folds are repeated: ``*_again_fold_s`` lists each process's
    first fold in order, ``*_second_fold_s`` is their median (the first of them, a user's
    second run, is ``*_second_first_fold_s``), ``second_fold_ratio`` the ratio of the
    medians and ``again_ratios`` each pair's. ``max_abs_diff``: the largest atom
    deviation between the two structures the first processes wrote."""
    row: dict = {"status": "ok", "wall_s": 0.0, "again": again}
    structures: dict[str, dict] = {}
    for run, (name, mode) in enumerate((("stock", "--no-flashlight"), ("flashlight", "")) * (1 + again)):
        second = run >= 2
        cache = work / f"cache-solo-{name}"
        if not second:
            shutil.rmtree(cache, ignore_errors=True)  # the first process starts cold
        rec = run_fold([*launcher()[0], *fold(mode)], {**cache_env(cache), **env}, work / "out", record_id,
                       deadline.remaining() - 10)
        row["wall_s"] = round(row["wall_s"] + rec["wall_s"], 2)
        label = f"{name}_second" if second else name
        if rec["status"] != "ok":
            return {**row, "status": rec["status"], "message": f"{label.replace('_', ' ')} alone: {rec.get('message', '')}"}
        if second:
            row.setdefault(f"{name}_again_fold_s", []).append(first_fold(rec, name))
            row.setdefault(f"{name}_again_process_wall_s", []).append(rec["wall_s"])
            if run >= 4:
                continue  # a user's second run (below) is the first warm process's
        row[f"{label}_process_wall_s"] = rec["wall_s"]
        row[f"{label}_first_fold_s" if second else f"{name}_first_fold_s"] = first_fold(rec, name)
        row[f"{label}_compiled_in_pass"] = rec.get(f"{name}_compiled_in_pass")
        row[f"{label}_prepare_at_first_pass"] = rec.get(f"{name}_prepare_at_first_pass")
        row[f"{label}_stages_s"] = rec.get(f"{name}_stages_s")  # where the first fold's time went
        row[f"{label}_gpu_samples"] = rec.get("gpu_samples")
        if second:
            continue
        written = sorted((work / "out" / record_id).glob("*.pdb"))
        structures[name] = pdb_atoms(written[0]) if written else {}
        for key in ("model_s", "first_call_s", "warmup_stages_s", "warmup_compile", "host"):
            row[f"{name}_{key}"] = rec.get(f"{name}_{key}")
        row[f"{name}_end_to_end"] = rec.get("end_to_end")
        row["environment"] = rec.get("environment")
        if name == "flashlight":
            row["flashlight"] = rec.get("flashlight")  # the patch's report
    row["first_fold_ratio"] = round(row["flashlight_first_fold_s"] / row["stock_first_fold_s"], 4)
    if again:
        stock, flashlight = row["stock_again_fold_s"], row["flashlight_again_fold_s"]
        row["stock_second_fold_s"] = statistics.median(stock)
        row["flashlight_second_fold_s"] = statistics.median(flashlight)
        row["second_fold_ratio"] = round(row["flashlight_second_fold_s"] / row["stock_second_fold_s"], 4)
        row["again_ratios"] = [round(f / s, 4) for s, f in zip(stock, flashlight)]
    row["max_abs_diff"] = atom_deviation(structures["stock"], structures["flashlight"])
    return row


def save(path: pathlib.Path, data: dict) -> None:
    from bench.common import save_results

    save_results(path, data, "rows", CSV_FIELDS)


def describe(rec: dict) -> str:
    """One line for the log: a row's times, or its failure."""
    if rec["status"] != "ok":
        return f"{rec['status'].upper()} {rec.get('message', '')[:300]}"
    if "first_fold_ratio" in rec:
        again = (f"; again (median of {rec['again']} processes each): {rec['stock_second_fold_s']:.2f} s, "
                 f"{rec['flashlight_second_fold_s']:.2f} s ({rec['second_fold_ratio']:.2f}x)"
                 if "second_fold_ratio" in rec else "")
        return (f"first fold alone: stock {rec['stock_first_fold_s']:.2f} s, Flashlight "
                f"{rec['flashlight_first_fold_s']:.2f} s ({rec['first_fold_ratio']:.2f}x){again}, "
                f"wall {rec['wall_s']:.0f} s")
    return (f"stock {rec.get('stock_model_s', 0):.2f} s, Flashlight {rec.get('flashlight_model_s', 0):.2f} s, "
            f"first call {rec.get('flashlight_first_call_s') or 0:.1f} s, wall {rec['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from bench.common import RESULTS, Deadline, budget_from_env, environment

    args = parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    msas = [m for m in args.msa.split(",") if m]
    dtypes = [d for d in args.dtypes.split(",") if d]
    modes = [m for m in args.warmup_compile.split(",") if m] or [""]
    bad = [m for m in msas if m not in ("deep", "single")] + [d for d in dtypes if d not in ("fp32", "bf16")] \
        + [m for m in modes if m not in ("", "inline", "background")] \
        + [r for r in args.rows.split(",") if r not in ("cold", "warm", "solo")]
    if bad:
        sys.exit(f"bench.fold_product: unknown {bad}; --msa takes deep,single, --dtypes fp32,bf16, "
                 "--warmup-compile inline,background and --rows cold,warm,solo")
    out = pathlib.Path(args.out) if args.out else RESULTS / "fold_product.json"
    work = pathlib.Path(args.work_dir or pathlib.Path(tempfile.gettempdir()) / "flashlight-fold-product")
    extra = shlex.split(args.fold_args) + (["--repeats", str(args.repeats)] if args.repeats else []) \
        + (["--profile-kernels"] if args.profile_kernels else [])
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    data = json.loads(out.read_text()) if out.exists() else {"schema": "flashlight-bench-fold-product/1",
                                                             "runs": [], "rows": []}

    def finished() -> set[tuple]:
        """Keys of the rows done (a row that ran out of time is not: the next call runs it again)."""
        return {row_key(r) for r in data["rows"] if r.get("status") != "timeout"}

    have = finished()
    wanted = set(args.rows.split(",")) | ({"cold"} if "warm" in args.rows.split(",") else set())
    kinds = tuple(k for k in ("cold", "warm", "solo") if k in wanted)  # a warm row needs its cold run
    todo = [c for c in configs(lengths, msas, dtypes, modes)
            if any(row_key(_base(c, cache)) not in have for cache in kinds)]
    if not todo:
        say(f"bench.fold_product: every row is already in {out}")
        return EXIT_COMPLETE
    deadline = Deadline(budget_from_env(args.max_minutes))
    from bench.evoformer import wait_for_openfold

    why = wait_for_openfold(deadline, say)  # gpu_run.sh --openfold-bg may still be building it
    if why:
        say(f"bench.fold_product: {why}")
        return 1 if "failed" in why or "importable" in why else EXIT_INCOMPLETE
    import torch

    meta = {"id": len(data["runs"]), **environment("cuda" if torch.cuda.is_available() else "cpu"),
            "args": vars(args)}
    data["runs"].append(meta)
    save(out, data)

    def put(row: dict) -> None:
        keys = [row_key(r) for r in data["rows"]]  # one row per key, a timed-out try included
        if row_key(row) in keys:
            data["rows"][keys.index(row_key(row))] = row
        else:
            data["rows"].append(row)
        save(out, data)

    for length, msa, dtype, mode in todo:
        inputs = make_inputs(work, length, args.depth)
        record = f"synthetic_{length}"
        cache = work / f"cache-{length}-{msa}-{dtype}{'-' + mode if mode else ''}"
        shutil.rmtree(cache, ignore_errors=True)  # cold: empty caches
        have = finished()
        done = {k: row_key(_base((length, msa, dtype, mode), k)) in have for k in kinds}
        pair_done = all(v for k, v in done.items() if k != "solo")
        for kind in kinds:
            # a warm row needs its cold run's caches: the pair runs again unless both are in
            if (done[kind] if kind == "solo" else pair_done):
                continue
            need = processes(kind, args.solo_again) * process_estimate(data["rows"], length, args.run_estimate_s) + 10
            if deadline.remaining() < need:
                say(f"bench.fold_product: time budget reached ({deadline.remaining():.0f} s left, a {kind} row "
                    f"at {length} residues needs about {need:.0f} s); run the same command again to continue")
                return EXIT_INCOMPLETE
            fold = functools.partial(user_args, inputs / f"{record}.fasta", inputs if msa == "deep" else None,
                                     dtype, work / "out", extra)
            env = {"FLASHLIGHT_WARMUP_COMPILE": mode} if mode else {}
            base = {**_base((length, msa, dtype, mode), kind), "run": meta["id"], "invoked_as": launcher()[1],
                    "command": ["flashlight-fold", *fold("--compare" if kind != "solo" else "")]}
            if kind == "solo":
                rec = solo_fold(fold, env, work, record, deadline, args.solo_again)
            else:
                rec = run_fold([*launcher()[0], *fold()], {**cache_env(cache), **env}, work / "out", record,
                               deadline.remaining() - 10)
            put({**base, **rec, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            say(f"  [{deadline.elapsed():5.0f}s] N_res {length} {msa} {dtype} {kind} {mode}: " + describe(rec))
            if rec["status"] == "timeout":
                return EXIT_INCOMPLETE
    return EXIT_COMPLETE


if __name__ == "__main__":
    sys.exit(main())
