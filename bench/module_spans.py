"""Per-call host and device spans of a fold's graphed modules, in one ``flashlight-fold`` process.

    python -m bench.module_spans --out spans.json -- RECORD.fasta [flashlight-fold options]

Runs ``flashlight-fold`` with the given options in this process and times every call of
the modules ``patch_openfold`` replays as CUDA graphs (the Evoformer stack, the extra-MSA
stack, the structure module: [Note: CUDA graphs for the stacks] in
``integrations/openfold_graphs.py``), stock or patched, through PyTorch's global module
hooks: host seconds from the call's start to its return, device seconds between CUDA
events recorded at both ends (on a CPU, none). Each call is labelled by what its
:class:`~flashlight.integrations.openfold_graphs.GraphedForward` counted during it:
``eager``, ``record`` (recorded, then replayed) or ``replay``. A host span equal to its
device span says the host bounded the call; a first iteration much longer than stock's
says where a fold's one-time costs went (``bench/results/fold_product_runs/README.md``).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

MODULES = ("EvoformerStack", "ExtraMSAStack", "StructureModule")


class Spans:
    """Forward hooks that time the calls of :data:`MODULES`; :attr:`calls` holds them."""

    def __init__(self):
        self.calls: list[dict] = []
        self._open: list[tuple] = []  # (module, host start, start event, graph counts)
        self._handles = [torch.nn.modules.module.register_module_forward_pre_hook(self._pre),
                         torch.nn.modules.module.register_module_forward_hook(self._post)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    @staticmethod
    def _counts(module) -> tuple[int, int]:
        graphed = module.__dict__.get("forward")  # the patch's instance forward, if any
        return getattr(graphed, "recordings", 0), getattr(graphed, "replays", 0)

    @staticmethod
    def _event():
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _pre(self, module, args) -> None:
        if type(module).__name__ in MODULES:
            self._open.append((module, time.perf_counter(), self._event(), self._counts(module)))

    def _post(self, module, args, output) -> None:
        if not self._open or self._open[-1][0] is not module:
            return
        _, start, start_event, (recordings, replays) = self._open.pop()
        host = time.perf_counter() - start
        now_recordings, now_replays = self._counts(module)
        path = "record" if now_recordings > recordings else "replay" if now_replays > replays else "eager"
        self.calls.append({"module": type(module).__name__, "path": path, "host_s": host,
                           "events": (start_event, self._event())})

    def rows(self) -> list[dict]:
        """The calls so far, device spans read off their events (the device synchronised first)."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rows = []
        for call in self.calls:
            start, end = call["events"]
            device_ms = round(start.elapsed_time(end), 2) if start is not None and end is not None else None
            rows.append({"module": call["module"], "path": call["path"], "host_ms": round(call["host_s"] * 1e3, 2),
                         "device_ms": device_ms})
        return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.module_spans", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file for the calls")
    p.add_argument("fold_args", nargs=argparse.REMAINDER, help="-- then flashlight-fold's arguments")
    args = p.parse_args(argv)
    fold_args = args.fold_args[1:] if args.fold_args[:1] == ["--"] else args.fold_args
    from bench.common import atomic_write_json, environment
    from flashlight.structures import cli

    spans = Spans()
    start = time.perf_counter()
    try:
        status = cli.main(fold_args)
    finally:
        spans.close()
    wall = time.perf_counter() - start
    rows = spans.rows()
    device = [r["device_ms"] for r in rows if r["device_ms"] is not None]
    atomic_write_json(pathlib.Path(args.out), {
        "what": "per-call host and device spans of the graphed modules in one flashlight-fold process "
                "(bench/module_spans.py)",
        "environment": environment("cuda" if torch.cuda.is_available() else "cpu"),
        "fold_args": fold_args, "exit": status, "main_s": round(wall, 2), "calls": rows,
        "sum_device_ms": round(sum(device), 1) if device else None})
    for r in rows:
        device_text = "-" if r["device_ms"] is None else f"{r['device_ms']:.1f}"
        print(f"  {r['module']:16s} {r['path']:7s} host {r['host_ms']:9.1f} ms  device {device_text:>9s} ms")
    return status


if __name__ == "__main__":
    sys.exit(main())
