"""Resumable batches: which records are already folded, and merging ``summary.json``.

A record counts as complete when its folder holds a ``latency.json`` (written last,
so a folder that has one is whole) whose record is the same input (sequence, MSA files
and depth) and whose options that decide the result (:data:`RESULT_OPTIONS`) equal the
run's, and which lists every file the run asks for (mmCIF, plots, relaxed structure).
Options that only change timing (``repeats``, ``warmup``, ``chunk_size``, Flashlight
or stock, ``--compare``) do not matter.

``summary.json`` is never removed: at the end of a run (or when it is interrupted) the
records of this run replace the same ids of the previous summary, the others are kept.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional

from flashlight.structures.inputs import Record, safe_name

RESULT_OPTIONS = (
    "preset", "params", "dtype", "seed", "recycles", "num_blocks", "pad_msa",
    "max_msa_clusters", "max_extra_msa", "tf32",
)


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def msa_text(record: Record) -> str:
    """The summary's description of a record's MSA."""
    if record.alignment is None:
        return "none (single sequence)"
    return f"{record.alignment.depth} rows from {', '.join(record.alignment.paths)}"


def complete_report(out_dir: str, record: Record, options: dict) -> Optional[dict]:
    """The ``latency.json`` of ``record``'s folder when it is complete for a run with
    ``options`` (``dataclasses.asdict`` of its FoldOptions), else None."""
    report = _read_json(os.path.join(out_dir, safe_name(record.id), "latency.json"))
    if report is None or not isinstance(report.get("options"), dict):
        return None
    old, rec = report["options"], report.get("record") or {}
    if any(old.get(key) != options.get(key) for key in RESULT_OPTIONS):
        return None
    paths = record.alignment.paths if record.alignment else None
    depth = record.alignment.depth if record.alignment else 1
    if (rec.get("id"), rec.get("sequence"), rec.get("msa"), rec.get("msa_depth")) != (
        record.id, record.sequence, paths, depth
    ):
        return None
    files = report.get("outputs") or {}
    wanted = ["pdb", "confidence"] + (["mmcif"] if options.get("mmcif") else [])
    wanted += ["plot", "plddt_plot"] if options.get("plot") else []
    if any(key not in files for key in wanted):
        return None
    if options.get("relax") and not report.get("relax"):
        return None
    folder = os.path.join(out_dir, safe_name(record.id))
    if not all(os.path.isfile(os.path.join(folder, name)) for name in files.values()):
        return None
    return report


def entry_from_report(report: dict, record: Record, out_dir: str, worker: int) -> dict:
    """A summary entry for ``record`` from its ``latency.json`` report."""
    runs = report.get("runs") or {}
    return {
        "id": record.id,
        "order": record.order,
        "length": record.length,
        "worker": worker,
        "status": "ok",
        "out_dir": os.path.join(out_dir, safe_name(record.id)),
        "msa": msa_text(record),
        "run_id": report.get("run_id"),
        "end_to_end_s": (report.get("end_to_end") or {}).get("total_s"),
        "model_s": {k: v["steady"]["model_s"] for k, v in runs.items()},
        "warmup_s": {k: (v["warmup_s"][0] if v.get("warmup_s") else None) for k, v in runs.items()},
        "mean_plddt": report.get("mean_plddt"),
        "ptm": report.get("ptm"),
        "comparison": report.get("comparison"),
    }


def previous_records(path: str) -> List[dict]:
    """The records of an earlier ``summary.json`` (``rank`` read as ``worker``)."""
    summary = _read_json(path)
    records = summary.get("records") if summary else None
    if not isinstance(records, list):
        return []
    out = []
    for entry in records:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            entry = dict(entry)
            if "worker" not in entry and "rank" in entry:
                entry["worker"] = entry.pop("rank")
            out.append(entry)
    return out


def merge_records(previous: List[dict], current: List[dict]) -> List[dict]:
    """This run's entries (in order), then the previous ones whose ids this run lacks."""
    ids = {e["id"] for e in current}
    return list(current) + [e for e in previous if e["id"] not in ids]
