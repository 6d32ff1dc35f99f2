"""The modes of :mod:`bench.evoformer` (what computes OpenFold's attentions in a cell, and
whether its stacks are replayed as CUDA graphs), how each is applied to a model and
called the first time, and when a cell's result counts as computing stock's function."""
from __future__ import annotations

import math
import time
from typing import Any

BASE_MODES = ("stock", "compile", "flashlight", "flashlight-block", "ds4sci", "cueq")
GRAPHS = "-graphs"  # a mode's suffix: its stacks and structure module replayed as CUDA graphs
MODES = BASE_MODES + tuple(m + GRAPHS for m in ("stock", "flashlight", "ds4sci", "cueq"))

# The largest difference from stock (same dtype, same weights and inputs) a cell may show
# and still count as computing the same function: stack scope, m and z activations; model
# scope, final atom positions in Angstrom. Measured agreements are well below these (bf16:
# 0.25 at the stack, 0.9-1.7 A at the model, stock's own CUDA graphs included; TF32: 0.004
# and 0.07-0.35 A), so a cell above them computed something else (an op launched outside a
# captured graph, say) and its time is not a result.
AGREEMENT_TOL = {("stack", "bf16"): 2.0, ("stack", "tf32"): 0.1, ("model", "bf16"): 5.0, ("model", "tf32"): 2.0}


def disagreement(rec: dict, scope: str, dtype_name: str) -> str | None:
    """Why a measured cell's result is not stock's within :data:`AGREEMENT_TOL`, or ``None``."""
    diff = rec.get("max_abs_diff_vs_stock")
    if rec.get("finite") is False or (diff is not None and not math.isfinite(diff)):
        return "the result has NaN or infinite values"
    tol = AGREEMENT_TOL[(scope, dtype_name)]
    if diff is not None and diff > tol:
        return f"the result differs from stock's by {diff:.3g} (at most {tol} agrees at this scope and dtype)"
    return None


def apply_mode(model, mode: str, blocks) -> dict:
    import flashlight
    from flashlight.integrations import openfold_graphs

    info: dict[str, Any] = {}
    from bench import openfold_peers  # imports torch: not before TRITON_INTERPRET is set

    base, graphs = base_mode(mode)
    if base in openfold_peers.PEERS:
        info["_peer_forwards"] = openfold_peers.patch_attention(model, base)
    elif base == "compile":
        for block in blocks:
            block.compile()
        info["compiled_blocks"] = len(blocks)
    elif base in ("flashlight", "flashlight-block"):
        report = flashlight.patch_openfold(model, scope="block" if base == "flashlight-block" else "attention",
                                           cuda_graphs=graphs)
        info["patched"] = {"total": report.total, "counts": report.counts}
    if graphs and base not in ("flashlight", "flashlight-block"):
        openfold_graphs.install(model)
    if graphs:
        info["cuda_graphs"] = len(openfold_graphs.installed(model))
    return info


def base_mode(mode: str) -> tuple[str, bool]:
    """``mode`` without its ``-graphs`` suffix, and whether it had one."""
    return (mode[: -len(GRAPHS)], True) if mode.endswith(GRAPHS) else (mode, False)


def first_call(call, mode: str, blocks, rec: dict):
    """Run the untimed first call (compilation included) and record its time.

    Under ``compile``, default ``torch.compile`` can fail on stock OpenFold code: in
    torch 2.11-2.13, Inductor's attention pattern matcher rewrites OpenFold's 5-D
    attention with a replacement written for 4-D tensors ("Attempting to permute a
    tensor of rank 5 ..."). Then the error is recorded and the blocks are compiled again
    with Inductor's pattern matcher off (``options={"pattern_matcher": False}``), so the
    cell still measures Inductor on the same code."""
    import torch

    t0 = time.perf_counter()
    try:
        out = call()
    except torch._dynamo.exc.BackendCompilerFailed as exc:
        if mode != "compile":
            raise
        rec["compile_default_error"] = f"{type(exc).__name__}: {exc}"[:300]
        options = {"pattern_matcher": False}
        torch._dynamo.reset()
        for block in blocks:
            block.compile(options=options)
        rec["compile_options"] = options
        out = call()
    rec["first_call_s"] = round(time.perf_counter() - t0, 2)
    return out


def recording_call(call, rec: dict):
    """The second untimed call of a ``-graphs`` mode, which records the CUDA graphs that
    the timed calls replay; its time goes in ``rec``."""
    t0 = time.perf_counter()
    out = call()
    rec["record_call_s"] = round(time.perf_counter() - t0, 2)
    return out


def dynamo_stats() -> dict:
    """Graphs Dynamo compiled and graph breaks since the last ``torch.compiler.reset()``:
    a compiled mode that silently fell back to eager shows here."""
    from torch._dynamo.utils import counters

    return {"dynamo_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values()))}
