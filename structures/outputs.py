"""Files written per record: the PDB file, the latency plot, JSON; the record folder.

mmCIF is written by :mod:`~flashlight.structures.mmcif`, the confidence files by
:mod:`~flashlight.structures.confidence`.

A record's files are written into a fresh hidden folder inside the output folder
(:func:`record_folder`), ``latency.json`` last, and that folder is renamed to
``<out_dir>/<name>`` at the end, replacing an older one whole: a record folder never
mixes files of two runs, and an interrupted run leaves the previous folder (or none).
Single files are also written under a temporary name and renamed (:func:`write_atomic`).

:func:`claim_out_dir` checks up front that the output folder can be written and takes
an exclusive ``fcntl.flock`` lock on ``<out_dir>/.flashlight-fold.lock`` for the run;
the kernel releases it when the process ends, however it ends. Hidden folders left by
a run that was killed are removed by the next run that holds the lock.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import shutil
import socket
import tempfile
import time
from typing import Dict, Iterator, Optional

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
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str, payload: dict) -> str:
    """Write ``payload`` as indented JSON, atomically."""
    return write_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


# -- the output folder and record folders -------------------------------------------

LOCK_NAME = ".flashlight-fold.lock"
STAGING_PREFIX = ".flashlight-fold-tmp-"  # a record folder being written
RETIRED_PREFIX = ".flashlight-fold-old-"  # an older record folder being replaced


class OutDirError(RuntimeError):
    """The output folder cannot be used; the message is one complete line."""


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _remove(path: str) -> None:
    """Remove a file, link or folder tree at ``path``, never following links."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _first_non_folder(path: str) -> Optional[str]:
    """The nearest existing ancestor of ``path`` (or ``path``) that is not a folder."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    return None if os.path.isdir(probe) else probe


def _make_out_dir(out_dir: str) -> None:
    if not out_dir:
        raise OutDirError("--out-dir is empty")
    blocker = _first_non_folder(out_dir)
    if blocker is not None:
        what = "a broken link" if not os.path.exists(blocker) else "a file"
        if blocker == os.path.abspath(out_dir):
            raise OutDirError(f"--out-dir {out_dir}: is {what}, not a folder")
        raise OutDirError(f"--out-dir {out_dir}: cannot be created: {blocker} is {what}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=STAGING_PREFIX + "probe-", dir=out_dir)
        os.rmdir(probe)
    except OSError as err:
        raise OutDirError(f"--out-dir {out_dir}: not writable ({err.strerror or err})") from err


class OutDirLock:
    """The run's exclusive lock on an output folder (see the module docstring)."""

    def __init__(self, out_dir: str, fd: int):
        self.path = os.path.join(out_dir, LOCK_NAME)
        self._fd: Optional[int] = fd

    @classmethod
    def acquire(cls, out_dir: str) -> "OutDirLock":
        """Lock ``out_dir`` or raise :class:`OutDirError` when another run holds it."""
        path = os.path.join(out_dir, LOCK_NAME)
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as err:
                raise OutDirError(f"--out-dir {out_dir}: not writable ({err.strerror or err})") from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip()
                os.close(fd)
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise OutDirError(f"--out-dir {out_dir}: cannot be locked ({err.strerror})") from err
                raise OutDirError(
                    f"--out-dir {out_dir} is in use by another flashlight-fold run "
                    f"({holder or 'holder unknown'}); wait for it or choose another --out-dir"
                ) from None
            # The previous holder removes the file when it ends: the lock counts only
            # if it is on the file that is still at ``path``.
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
                break
            os.close(fd)
        lock = cls(out_dir, fd)
        try:
            os.ftruncate(fd, 0)
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode())
        except BaseException:
            lock.release()
            raise
        return lock

    def release(self) -> None:
        """Remove the lock file and unlock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def claim_out_dir(out_dir: str) -> OutDirLock:
    """Create ``out_dir`` if needed, check it is writable, lock it, clear leftovers.

    Raises :class:`OutDirError` (one line) when it is a file, lies under a file, cannot
    be written or is locked by another run. Hidden record folders of killed runs are
    removed once the lock is held.
    """
    _make_out_dir(out_dir)
    lock = OutDirLock.acquire(out_dir)
    try:
        for entry in os.listdir(out_dir):
            if entry.startswith((STAGING_PREFIX, RETIRED_PREFIX)):
                _remove(os.path.join(out_dir, entry))
    except BaseException:
        lock.release()
        raise
    return lock


def _replace_folder(staging: str, final: str) -> None:
    """Rename ``staging`` to ``final``, replacing whatever ``final`` was."""
    retired = None
    if os.path.lexists(final):
        retired = os.path.join(
            os.path.dirname(final), RETIRED_PREFIX + os.path.basename(staging)[len(STAGING_PREFIX):]
        )
        os.rename(final, retired)
    try:
        os.rename(staging, final)
    except BaseException:
        if retired is not None:
            os.rename(retired, final)
        raise
    if retired is not None:
        _remove(retired)


@contextlib.contextmanager
def record_folder(out_dir: str, name: str) -> Iterator[str]:
    """A fresh hidden folder in ``out_dir`` to write a record's files into.

    When the block ends normally the folder becomes ``<out_dir>/<name>`` (an older one
    is replaced as a whole); when it raises (an error, Ctrl-C) the folder is removed.
    """
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{name[:40]}-", dir=out_dir)
    try:
        os.chmod(staging, 0o777 & ~_umask())
        yield staging
        _replace_folder(staging, os.path.join(out_dir, name))
    except BaseException:
        _remove(staging)
        raise


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
    # modules from the synchronised pass where the fold made one ([Note: synchronised
    # module spans] in timing.py), else from the timed passes
    synchronised = all("modules_synchronised" in runs[v] for v in variants)
    for kind in MODULE_KINDS:
        values = [
            sum(b["modules"].get(kind, 0.0)
                for b in runs[v]["modules_synchronised" if synchronised else "steady"]["blocks"])
            for v in variants
        ]
        add(f"    {kind} (all blocks{', synchronised' if synchronised else ''})", values)
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
    """The terminal summary of a whole run (all records, all workers)."""
    rows = []
    for entry in summary["records"]:
        model = entry.get("model_s") or {}
        rows.append(
            [
                entry["id"],
                entry.get("length", "-"),
                "done before" if entry.get("skipped") else entry["status"],
                _ms(model.get("stock")),
                _ms(model.get("flashlight")),
                _ms(entry.get("end_to_end_s")),
                "-" if entry.get("mean_plddt") is None else f"{entry['mean_plddt']:.1f}",
                "-" if entry.get("ptm") is None else f"{entry['ptm']:.3f}",
                entry.get("worker", entry.get("rank", 0)),
            ]
        )
    headers = ["record", "length", "status", "stock ms", "flashlight ms", "end to end ms", "pLDDT",
               "pTM", "worker"]
    return format_table(headers, rows)
