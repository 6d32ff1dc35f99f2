"""The result file of :mod:`bench.kernels` (runs and cells, resumable; a CSV beside it)
and the lines it prints: one per measured cell, and a table of the run's cells."""
from __future__ import annotations

import json
import pathlib

CSV_FIELDS = (
    "variant", "shape", "dtype", "impl", "status", "ms", "tflops", "floor_ms", "roofline_frac",
    "peak_extra_mib", "first_call_s", "max_abs_err", "max_rel_err", "kernels", "configs", "formulation", "message",
    "gpu", "driver", "torch", "triton", "date",
)


def shape_label(shape: dict) -> str:
    return " ".join(f"{k}{v}" for k, v in shape.items())


def cell_key(variant: str, shape: dict, dtype: str, impl: str) -> tuple:
    return (variant, json.dumps(shape, sort_keys=True), dtype, impl)


def configs_label(configs: list | None) -> str:
    """[[BLOCK_M, BLOCK_N, num_warps, num_stages] or "eager", ...] -> "128x64 w4 s3; eager; ..." for the CSV."""
    return "; ".join(c if c == "eager" else "{}x{} w{} s{}".format(*c) for c in configs or ())


class Results:
    """The JSON result file: runs (machine + roofline per process) and cells."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        if path.exists():
            self.data = json.loads(path.read_text())
        else:
            self.data = {"schema": "flashlight-bench-kernels/1", "runs": [], "cells": []}
        self.index = {cell_key(c["variant"], c["shape"], c["dtype"], c["impl"]): i
                      for i, c in enumerate(self.data["cells"])}

    def done(self, key: tuple, retry: bool, gpu: str | None = None) -> bool:
        """Whether the cell ``key`` is in the file, measured on ``gpu`` (a cell measured on
        another GPU model is measured again: one table, one GPU)."""
        if key not in self.index:
            return False
        cell = self.data["cells"][self.index[key]]
        if gpu_of(self.data, cell) != gpu:
            return False
        return not (retry and cell["status"] in ("error", "timeout", "oom"))

    def add_run(self, meta: dict) -> int:
        meta = {"id": len(self.data["runs"]), **meta}
        self.data["runs"].append(meta)
        return meta["id"]

    def put(self, cell: dict) -> None:
        key = cell_key(cell["variant"], cell["shape"], cell["dtype"], cell["impl"])
        if key in self.index:
            self.data["cells"][self.index[key]] = cell
        else:
            self.index[key] = len(self.data["cells"])
            self.data["cells"].append(cell)

    def save(self) -> None:
        from bench.common import save_results

        save_results(self.path, self.data, "cells", CSV_FIELDS,
                     lambda c: {"shape": shape_label(c["shape"]), "configs": configs_label(c.get("configs"))})


def describe(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['status'].upper()} {rec.get('message', '')[:160]}"
    parts = [f"{rec['ms']:.4f} ms"]
    if rec.get("tflops") is not None:
        parts.append(f"{rec['tflops']:.1f} TFLOP/s")
    if rec.get("roofline_frac") is not None:
        parts.append(f"{100 * rec['roofline_frac']:.0f}% of roofline")
    if "peak_extra_mib" in rec:
        parts.append(f"+{rec['peak_extra_mib']:.0f} MiB")
    if "max_abs_err" in rec:
        parts.append(f"err {rec['max_abs_err']:.1e}")
    parts.append(f"first call {rec['first_call_s']:.1f} s")
    if "kernels" in rec:
        parts.append(f"{rec['kernels']} kernel(s)")
    if rec.get("configs"):
        parts.append(configs_label(rec["configs"]))
    return ", ".join(parts)


def gpu_of(data: dict, cell: dict) -> str | None:
    """The GPU model of the run that measured ``cell`` (None: a CPU run, or unknown)."""
    runs = data.get("runs", [])
    run = cell.get("run")
    return runs[run].get("gpu") if isinstance(run, int) and 0 <= run < len(runs) else None


def print_table(data: dict, variants, dtypes, impl_order, gpu: str | None = None) -> None:
    """Median ms per implementation (in ``impl_order``) for the selected variants (the
    latest of each cell); a cell measured on a GPU other than ``gpu`` reads "other GPU"."""
    names = {v.name for v in variants}
    rows: dict[tuple, dict] = {}
    for c in data["cells"]:
        if c["variant"] in names and c["dtype"] in dtypes:
            key = (c["variant"], shape_label(c["shape"]), c["dtype"])
            rows.setdefault(key, {})[c["impl"]] = c
    if not rows:
        return
    impls = [i for i in impl_order if any(i in r for r in rows.values())]
    head = f"{'variant':18s} {'shape':30s} {'dtype':5s} " + " ".join(f"{i[:11]:>11s}" for i in impls)
    print("\n" + head)
    for (variant, shape, dtype), r in rows.items():
        cells = []
        for i in impls:
            c = r.get(i)
            if c is None:
                cells.append(f"{'-':>11s}")
            elif gpu_of(data, c) != gpu:
                cells.append(f"{'other GPU':>11s}")
            elif c["status"] == "ok":
                cells.append(f"{c['ms']:11.4f}")
            else:
                cells.append(f"{c['status'][:11]:>11s}")
        print(f"{variant[:18]:18s} {shape[:30]:30s} {dtype:5s} " + " ".join(cells))
