"""``flashlight-fold``: fold every record of FASTA files and report per-layer latency.

Examples::

    flashlight-fold structures/examples/miniproteins.fasta \\
        --alignment-dir structures/examples --out-dir out/fold --num-blocks 4 --recycles 0
    flashlight-fold proteins.fasta --params params_model_1.npz --compare --repeats 5
    torchrun --nproc_per_node 8 -m flashlight.structures proteins.fasta --params ...

Exit status: 0 when every record folded, 1 when a record failed, 2 for invalid input or
options (nothing is folded unless ``--skip-invalid``), including an ``--out-dir`` that
cannot be written or that another run is using; 130 after Ctrl-C and 143 after SIGTERM,
with one line naming the records that finished and those that did not.

Before any model is built the inputs are validated and the output folder is checked and
locked for the run (worker 0 holds the lock under ``torchrun``; see
:func:`flashlight.structures.outputs.claim_out_dir`). Records whose folder is already
complete for the run's options are skipped (``--overwrite`` folds them again; see
:mod:`~flashlight.structures.resume`), and the model is built only when a record is
left. ``summary.json`` is never removed: when the run ends or is interrupted, its
records replace the same ids of the earlier summary. Messages go through ``logging``
(:mod:`~flashlight.structures.logs`), and to ``<out_dir>/flashlight-fold.log``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
import uuid
import warnings
from typing import List, Optional

from flashlight.structures import distributed, resume
from flashlight.structures.cli_options import build_parser
from flashlight.structures.inputs import Problem, Record, load_inputs, safe_name
from flashlight.structures.logs import add_log_file, console, log, remove_log_file

SUMMARY_SCHEMA = "flashlight.fold.summary/1"




def _default_device(group: distributed.Group, requested: Optional[str]) -> str:
    import torch

    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and group.initialized:
        device = f"cuda:{group.local_rank}"
    return device


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM, raised in the main thread by :func:`_raise_interrupted`.

    A subclass, not ``KeyboardInterrupt`` itself: CPython ends the process with SIGINT at
    exit, even after the exception was handled, when a plain ``KeyboardInterrupt`` passed
    through code that an extension module ran with ``PyRun_String``.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# [Note: an interrupt that lands in a finalizer]
# The handler raises where the main thread is when the signal comes. If that is a
# weakref callback or a ``__del__`` run by the garbage collector (PyTorch's tracing runs
# many), CPython prints "Exception ignored" and goes on: the interrupt was lost and the
# run folded every record. So the handler also records the signal, and the fold checks
# for one after each recycling iteration and before each record (:func:`_check_interrupted`),
# which raises it again there; the swallowed one is not printed (``sys.unraisablehook``).
_PENDING: List[int] = []  # signals received and not yet seen to end the run


def _raise_interrupted(signum, frame):
    _PENDING.append(signum)
    raise Interrupted(signum)


@contextlib.contextmanager
def _swallowed_interrupts_kept():
    """Within the block, an :class:`Interrupted` that a finalizer swallowed is not printed
    as "Exception ignored" (a traceback on the user's screen): it was recorded and is
    raised again at the next check ([Note: an interrupt that lands in a finalizer]).
    Other unraisable exceptions go to the hook that was set before."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _check_interrupted() -> None:
    """Raise the first signal received since the handlers were installed, if any
    ([Note: an interrupt that lands in a finalizer])."""
    if _PENDING:
        raise Interrupted(_PENDING[0])


@contextlib.contextmanager
def _signals(handlers: dict):
    """Install ``{signal: handler}`` for the block (only in the main thread)."""
    previous = {}
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclasses.dataclass
class _Progress:
    """What an interruption report needs: this rank's records and how far they got."""

    records: Optional[List[Record]] = None  # this rank's share, once inputs are valid
    problems: list = dataclasses.field(default_factory=list)
    local: dict = dataclasses.field(default_factory=dict)  # see _fold_share
    lock: object = None  # the output folder's lock (worker 0), once claimed
    log_file: object = None  # the handler writing <out_dir>/flashlight-fold.log
    previous: list = dataclasses.field(default_factory=list)  # records of the older summary.json


def _fold_share(args, group, records, warn, say, local: dict) -> dict:
    """Fold this rank's records into ``local``; never raises an ``Exception`` (errors go
    into ``local``). ``KeyboardInterrupt`` (Ctrl-C, SIGTERM) passes through."""
    from tqdm import tqdm

    from flashlight.structures.fold import Folder, FoldOptions

    local.update(worker=group.rank, entries=[], error=None, model=None, flashlight=None)
    mine = distributed.shard(records, group)
    if not mine:  # more workers than records
        return local
    options = _options(args, group, FoldOptions)
    mine = _skip_complete(args, group, mine, dataclasses.asdict(options), local)
    if not mine:
        return local
    try:
        folder = Folder(options, warn)
    except Exception as err:  # noqa: BLE001 - reported, and the other workers still merge
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
    desc = "folding" if group.world_size == 1 else f"worker {group.rank}"
    bar = tqdm(mine, desc=desc, unit="record", disable=True if args.quiet else None, position=2 * group.rank, leave=True)
    try:
        for record in bar:
            _check_interrupted()
            local["current"] = record
            _fold_one(args, group, folder, record, bar, local)
    finally:
        bar.close()
    local["current"] = None
    local["flashlight"] = folder.status.to_json()
    return local


def _skip_complete(args, group, records: List[Record], options: dict, local: dict) -> List[Record]:
    """The records to fold; complete ones get a summary entry and a line saying so."""
    if args.overwrite:
        return records
    todo = []
    for record in records:
        report = resume.complete_report(args.out_dir, record, options)
        if report is None:
            todo.append(record)
            continue
        entry = resume.entry_from_report(report, record, args.out_dir, group.rank)
        entry["skipped"] = True
        local["entries"].append(entry)
        log.info(
            f"record {record.id!r}: outputs complete in {entry['out_dir']} (run {report.get('run_id')}, "
            "same options); skipped (--overwrite folds it again)"
        )
    return todo


def _options(args, group, FoldOptions):
    """The run's FoldOptions."""
    return FoldOptions(
        out_dir=args.out_dir,
        preset=args.preset,
        params=args.params,
        device=_default_device(group, args.device),
        dtype=args.dtype,
        flashlight=not args.no_flashlight,
        compare=args.compare,
        require_flashlight=args.require_flashlight,
        patch_scope=args.patch_scope,
        cuda_graphs=args.cuda_graphs,
        mmcif=args.mmcif,
        plot=args.plot,
        repeats=args.repeats,
        warmup=args.warmup,
        num_blocks=args.num_blocks,
        recycles=args.recycles if args.recycles is not None else _preset_recycles(args.preset),
        chunk_size=args.chunk_size,
        max_msa_clusters=args.max_msa_clusters,
        max_extra_msa=args.max_extra_msa,
        pad_msa=args.pad_msa,
        sync_modules=args.sync_modules,
        profile_kernels=args.profile_kernels,
        seed=args.seed,
        tf32=args.tf32,
        relax=args.relax,
        command=["flashlight-fold"] + list(args.argv),
        run_id=args.run_id,
    )


def _fold_one(args, group, folder, record, bar, local: dict) -> None:
    """Fold one record and append its summary entry to ``local``."""
    from tqdm import tqdm

    from flashlight.structures.outputs import record_table

    bar.set_postfix_str(f"{record.id} ({record.length} aa)")
    log.info(f"record {record.id!r} ({record.length} residues, MSA: {resume.msa_text(record)}): folding")
    if record.alignment is None:
        folder.warn(
            f"warning: record {record.id!r} has no MSA: folded in single-sequence mode, which "
            "is much less accurate (give --alignment-dir or an .a3m input; --require-msa "
            "makes this an error)"
        )
    runs = tqdm(
        total=folder.runs_per_record(), desc="  recycles", unit="pass", leave=False,
        disable=True if args.quiet else None, position=2 * group.rank + 1,
    )
    entry = {"id": record.id, "order": record.order, "length": record.length, "worker": group.rank,
             "msa": resume.msa_text(record)}
    try:
        report = folder.fold(record, on_recycle=lambda: (_check_interrupted(), runs.update(1)),
                             on_total=lambda total: (setattr(runs, "total", total), runs.refresh()))
    except Exception as err:  # noqa: BLE001 - one bad record does not stop the rest
        entry.update(status="failed", error=f"{type(err).__name__}: {err}")
        folder.warn(f"error: record {record.id!r} failed: {entry['error']}")
    else:
        entry = resume.entry_from_report(report, record, args.out_dir, group.rank)
        if not args.quiet:
            bar.write(record_table(report), file=sys.stdout)
    finally:
        runs.close()
    local["entries"].append(entry)


def _preset_recycles(preset: str) -> int:
    from openfold.config import model_config

    try:
        return int(model_config(preset).data.common.max_recycling_iters)
    except ValueError:
        return 3  # the preset error is reported when the model is built


def _quiet_library_warnings() -> None:
    """Silence library warnings that say nothing about the user's run."""
    warnings.filterwarnings("ignore", message=".*non-tuple sequence for multidimensional indexing.*")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"openfold\.")
    # numpy floating-point warnings from Triton's CPU interpreter (exp of masked lanes)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.")


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``flashlight-fold`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv, args.run_id = argv, None
    handlers = {signal.SIGINT: _raise_interrupted, signal.SIGTERM: _raise_interrupted}
    _PENDING.clear()
    with warnings.catch_warnings(), _signals(handlers), _swallowed_interrupts_kept():
        _quiet_library_warnings()
        return _run(args)


def _run(args) -> int:
    started = time.perf_counter()
    progress = _Progress()
    group = distributed.Group()

    def warn(text: str) -> None:
        log.error(text) if text.startswith("error") else log.warning(text)

    def say(text: str) -> None:
        log.info(text)

    try:
        group = distributed.setup()
        with console(args.quiet, group.rank, group.world_size):
            try:
                if args.cpu_threads:
                    import torch

                    torch.set_num_threads(args.cpu_threads)
                return _fold_all(args, group, warn, say, progress, started)
            except KeyboardInterrupt as stop:
                with _signals({signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}):
                    return _interrupted(stop, args, group, progress, warn, started)
            finally:
                remove_log_file(progress.log_file)
    finally:
        if progress.lock is not None:
            progress.lock.release()
        distributed.teardown(group)


def _fold_all(args, group, warn, say, progress: _Progress, started: float) -> int:
    from flashlight.structures import outputs

    records, problems = load_inputs(args.fasta, args.alignment_dir)
    if args.require_msa:
        problems += [Problem(r.source, "no MSA (--require-msa): give --alignment-dir with "
                             "<id>.a3m / .sto, or an .a3m input", r.id, r.index) for r in records if r.alignment is None]
        records = [r for r in records if r.alignment is not None]
        for order, record in enumerate(records):
            record.order = order
    progress.problems = problems
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
    missing = _missing_packages(args)
    if missing:
        if group.is_root:
            warn(f"error: {missing}")
        return 2
    error = None
    if group.is_root:
        try:
            progress.lock = outputs.claim_out_dir(args.out_dir)
        except outputs.OutDirError as err:
            error = str(err)
    error, args.run_id = distributed.broadcast_from_root((error, uuid.uuid4().hex[:16]), group)
    if error:
        if group.is_root:
            warn(f"error: {error}")
        return 2
    progress.log_file = add_log_file(args.out_dir, args.argv, args.run_id, group.rank)
    summary_path = os.path.join(args.out_dir, "summary.json")
    progress.previous = resume.previous_records(summary_path) if group.is_root else []
    if group.is_root:
        for record in records:
            note = record.residue_note()
            if note:
                warn(f"warning: record {record.id!r}: {note}")

    progress.records = distributed.shard(records, group)
    local = _fold_share(args, group, records, warn, say, progress.local)
    gathered = distributed.gather_to_root(local, group)
    if not group.is_root:
        return _exit_code(local)
    summary = _merge(args, group, gathered, problems, time.perf_counter() - started, progress.previous)
    path = summary_path
    try:
        outputs.write_json(path, summary)
    except OSError as err:
        warn(f"error: cannot write {path}: {err.strerror or err}")
        return 1
    say(outputs.summary_table(summary))
    if problems:
        say(f"{len(problems)} invalid record(s) skipped (listed in summary.json)")
    say(f"summary: {path}")
    if any(part["error"] for part in gathered):
        return 2
    mine = [e for part in gathered for e in part["entries"]]
    return 1 if any(e["status"] != "ok" for e in mine) else 0


def _missing_packages(args) -> Optional[str]:
    """Why an optional output the run asks for cannot be written (one line), or None."""
    if args.mmcif:
        try:
            import modelcif.dumper  # noqa: F401
        except Exception:  # noqa: BLE001 - any import failure means unusable
            return ("--mmcif needs python-modelcif, which cannot be imported; install it with "
                    "bash scripts/setup.sh (or pip install modelcif==1.8)")
    if args.relax:
        from flashlight.structures.relax import missing

        return missing()
    return None


def _shown(ids: List[str], limit: int = 10) -> str:
    """Record ids for a one-line message (odd ones quoted), at most ``limit`` of them."""
    text = ", ".join(i if i.isprintable() and "," not in i else repr(i) for i in ids[:limit])
    return text + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _written_by_this_run(args, record: Record) -> bool:
    """Whether ``record``'s folder holds a ``latency.json`` of this run."""
    import json

    path = os.path.join(args.out_dir, safe_name(record.id), "latency.json")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle).get("run_id") == args.run_id
    except (OSError, ValueError):
        return False


def _interrupted(stop, args, group, progress: _Progress, warn, started: float) -> int:
    """Report an interruption in one line (and in summary.json); the exit code."""
    if getattr(stop, "signum", signal.SIGINT) == signal.SIGTERM:
        how, code = "SIGTERM", 143
    else:
        how, code = "Ctrl-C", 130
    if progress.records is None:
        warn(f"interrupted ({how}) before folding started; nothing was folded")
        return code
    entries = list(progress.local.get("entries", []))
    current = progress.local.get("current")
    if current is not None and current.id not in {e["id"] for e in entries}:
        if _written_by_this_run(args, current):  # interrupted just after its rename
            entries.append({"id": current.id, "order": current.order, "length": current.length,
                            "worker": group.rank, "status": "ok",
                            "out_dir": os.path.join(args.out_dir, safe_name(current.id))})
    finished = [e["id"] for e in entries if e["status"] == "ok"]
    failed = [e["id"] for e in entries if e["status"] != "ok"]
    done = {e["id"] for e in entries}
    pending = [r for r in progress.records if r.id not in done]
    text = f"interrupted ({how}): {len(finished)} of {len(progress.records)} record(s) finished"
    text += f" ({_shown(finished)})" if finished else ""
    text += f", {len(failed)} failed ({_shown(failed)})" if failed else ""
    text += f"; not finished: {_shown([r.id for r in pending]) or 'none'}"
    if group.world_size == 1 and progress.lock is not None and args.run_id:
        path = _write_interrupted_summary(args, group, progress, entries, pending, how, started)
        text += f" (listed in {path})" if path else ""
    warn(text)
    return code


def _write_interrupted_summary(args, group, progress, entries, pending, how, started) -> Optional[str]:
    """summary.json of an interrupted single-process run; its path, or None if unwritable."""
    from flashlight.structures.outputs import write_json

    entries = entries + [
        {"id": r.id, "order": r.order, "length": r.length, "worker": group.rank, "status": "not finished"}
        for r in pending
    ]
    local = {"worker": group.rank, "entries": entries, "flashlight": None,
             "error": progress.local.get("error"), "model": progress.local.get("model")}
    summary = _merge(args, group, [local], progress.problems, time.perf_counter() - started, progress.previous)
    summary["failed"] = [e["id"] for e in summary["records"] if e["status"] == "failed"]
    summary["interrupted"] = how
    summary["not_finished"] = [r.id for r in pending]
    path = os.path.join(args.out_dir, "summary.json")
    try:
        write_json(path, summary)
    except OSError:
        return None
    return path


def _exit_code(local: dict) -> int:
    if local["error"]:
        return 2
    return 1 if any(e["status"] != "ok" for e in local["entries"]) else 0


def _merge(args, group, gathered, problems, elapsed_s: float, previous=()) -> dict:
    """summary.json: this run's entries of every worker, then the earlier summary's others."""
    entries = sorted((e for part in gathered for e in part["entries"]), key=lambda e: e["order"])
    entries = resume.merge_records(list(previous), entries)
    model = next((p["model"] for p in gathered if p["model"]), None)
    return {
        "schema": SUMMARY_SCHEMA,
        "command": ["flashlight-fold"] + args.argv,
        "run_id": args.run_id,
        "world_size": group.world_size,
        "model": model,
        "flashlight": [p["flashlight"] for p in gathered],
        "records": entries,
        "failed": [e["id"] for e in entries if e["status"] != "ok"],
        "invalid": [p.to_json() for p in problems],
        "worker_errors": {str(p["worker"]): p["error"] for p in gathered if p["error"]},
        "elapsed_s": elapsed_s,
        "interrupted": None,
        "not_finished": [],
    }


if __name__ == "__main__":
    sys.exit(main())
