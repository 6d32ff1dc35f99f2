"""Files written per record: structure (PDB, optional mmCIF), latency plot, JSON.

Every file is written to a temporary name in its final folder and renamed into place
(``os.replace``), so an interrupted run never leaves a file that looks complete.
``latency.json`` is written last: its presence means the record's folder is complete.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Dict, Optional

import numpy as np

from flashlight.structures.timing import MODULE_KINDS


def write_atomic(path: str, data, mode: str = "w") -> str:
    """Write ``data`` (str, or bytes with ``mode="wb"``) to ``path`` via a temporary file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str, payload: dict) -> str:
    """Write ``payload`` as indented JSON, atomically."""
    return write_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def pdb_string(
    aatype: np.ndarray,
    positions: np.ndarray,
    atom_mask: np.ndarray,
    plddt: np.ndarray,
    remark: Optional[str],
) -> str:
    """A PDB file (OpenFold's writer) with per-residue pLDDT in the B-factor column.

    ``aatype`` is ``[N]`` (indices into ``restypes`` + X), ``positions`` ``[N, 37, 3]``,
    ``atom_mask`` ``[N, 37]``, ``plddt`` ``[N]``.
    """
    from openfold.np import protein

    b_factors = np.repeat(plddt[:, None], positions.shape[1], axis=1) * atom_mask
    prot = protein.from_prediction(
        features={"aatype": aatype, "residue_index": np.arange(len(aatype))},
        result={"final_atom_positions": positions, "final_atom_mask": atom_mask},
        b_factors=b_factors,
        remark=remark,
    )
    return protein.to_pdb(prot)


def mmcif_string(pdb_text: str, name: str, title: Optional[str]) -> str:
    """The structure of ``pdb_text`` as mmCIF (Biopython), with ``title`` as _struct.title."""
    from Bio.PDB import MMCIFIO, PDBParser

    structure = PDBParser(QUIET=True).get_structure(name, io.StringIO(pdb_text))
    writer = MMCIFIO()
    writer.set_structure(structure)
    buffer = io.StringIO()
    writer.save(buffer)
    text = buffer.getvalue()
    if title:
        lines = text.splitlines(keepends=True)
        quoted = "'" + title.replace("'", "") + "'"
        lines.insert(1, f"_struct.entry_id {name}\n_struct.title {quoted}\n#\n")
        text = "".join(lines)
    return text


def plot_latency(
    path: str, title: str, runs: Dict[str, dict], labels: Optional[Dict[str, str]] = None
) -> str:
    """PNG of per-block latency and per-module totals for each variant in ``runs``.

    ``runs`` maps a variant name (``stock``, ``flashlight``) to its steady-state timing
    in the ``latency.json`` layout; ``labels`` optionally renames variants in the legend.
    """
    labels = labels or {}
    from matplotlib.figure import Figure  # a bare Figure draws with Agg, no GUI backend
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 4.2), dpi=110)
    ax_blocks, ax_modules = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    kinds = [k for k in MODULE_KINDS]
    width = 0.8 / max(1, len(runs))
    for n, (variant, run) in enumerate(runs.items()):
        blocks = run["blocks"]
        xs = [b["index"] for b in blocks]
        label = labels.get(variant, variant)
        ax_blocks.plot(xs, [b["total_s"] * 1e3 for b in blocks], marker=".", label=label)
        per_kind = [sum(b["modules"].get(k, 0.0) for b in blocks) * 1e3 for k in kinds]
        positions = [i + (n - (len(runs) - 1) / 2) * width for i in range(len(kinds))]
        ax_modules.bar(positions, per_kind, width=width, label=label)
    ax_blocks.set_xlabel("Evoformer block")
    ax_blocks.set_ylabel("latency per forward pass (ms)")
    ax_blocks.set_title("per block (median)")
    ax_blocks.set_ylim(bottom=0)
    ax_blocks.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_blocks.legend()
    ax_blocks.grid(alpha=0.3)
    ax_modules.set_xticks(range(len(kinds)))
    ax_modules.set_xticklabels(kinds, rotation=45, ha="right", fontsize=8)
    ax_modules.set_ylabel("ms, summed over blocks")
    ax_modules.set_title("per module (median)")
    ax_modules.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return write_atomic(path, buffer.getvalue(), mode="wb")


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


def format_table(headers, rows) -> str:
    """A plain aligned text table (first column left-aligned, others right-aligned)."""
    cells = [list(map(str, headers))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row):
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def record_table(report: dict) -> str:
    """The terminal summary of one record's ``latency.json``."""
    rec, runs = report["record"], report["runs"]
    variants = list(runs)
    lines = [
        f"{rec['id']}  ({rec['length']} residues, MSA depth {rec['msa_depth']}, "
        f"{report['model']['device']}, timer: {report['timer']})",
        f"  {report['model']['label']}",
    ]
    e2e = report["end_to_end"]
    lines.append(
        f"  end to end {_ms(e2e['total_s'])} ms = features {_ms(e2e['features_s'])} + "
        f"model {_ms(e2e['model_s'])} ({e2e['variant']}) + writing {_ms(e2e['write_s'])}"
    )
    inactive = not report["flashlight"]["active"]
    headers = ["part"] + [
        f"{v} ms" + (" (inactive: stock)" if v == "flashlight" and inactive else "") for v in variants
    ]
    if len(variants) == 2:
        headers.append("speed-up")
    rows = []

    def add(name, values):
        row = [name] + [_ms(v) for v in values]
        if len(variants) == 2:
            a, b = values
            row.append(f"{a / b:.2f}x" if a and b else "-")
        rows.append(row)

    add("warm-up (first call)", [runs[v]["warmup_s"][0] if runs[v]["warmup_s"] else None for v in variants])
    add("model (median)", [runs[v]["steady"]["model_s"] for v in variants])
    for stage in runs[variants[0]]["steady"]["stages"]:
        add(f"  {stage}", [runs[v]["steady"]["stages"].get(stage) for v in variants])
    for kind in MODULE_KINDS:
        values = [
            sum(b["modules"].get(kind, 0.0) for b in runs[v]["steady"]["blocks"]) for v in variants
        ]
        add(f"    {kind} (all blocks)", values)
    lines.append(format_table(headers, rows))
    comparison = report.get("comparison")
    if comparison:
        lines.append(
            f"  stock vs flashlight: max atom deviation {comparison['max_atom_deviation_A']:.3g} A, "
            f"RMS {comparison['rms_atom_deviation_A']:.3g} A, max |dpLDDT| "
            f"{comparison['max_plddt_difference']:.3g}"
            + ("" if comparison["flashlight_active"] else "  (Flashlight inactive: both runs stock)")
        )
    return "\n".join(lines)


def summary_table(summary: dict) -> str:
    """The terminal summary of a whole run (all records, all ranks)."""
    rows = []
    for entry in summary["records"]:
        model = entry.get("model_s") or {}
        rows.append(
            [
                entry["id"],
                entry.get("length", "-"),
                entry["status"],
                _ms(model.get("stock")),
                _ms(model.get("flashlight")),
                _ms(entry.get("end_to_end_s")),
                "-" if entry.get("mean_plddt") is None else f"{entry['mean_plddt']:.1f}",
                entry.get("rank", 0),
            ]
        )
    headers = ["record", "length", "status", "stock ms", "flashlight ms", "end to end ms", "pLDDT", "rank"]
    return format_table(headers, rows)
