"""How much a Triton compile slows the program that runs beside it: on a thread of the
same process, or in a compile worker process ([Note: compiling in other processes] in
``flashlight/compile_workers.py``).

    python -m bench.compile_interference [--compiles 1] [--out FILE.json]

The main thread runs a pure-Python loop (the stand-in for a fold's host work: issuing
OpenFold's unfused modules) while ``--compiles`` copies of a flash-attention kernel
(written here, compiled for sm_90 with an empty Triton cache each, so nothing is
cached) are compiled: ``alone`` (no compile), ``thread`` (on threads of this process,
as the warm-up compiled before) and ``process`` (in :class:`flashlight.compile_workers.Pool`
workers). Reported per mode: the loop's iterations per second relative to ``alone``, and
the compiles' wall time. No GPU is needed (Triton compiles for a target it is given);
run without ``TRITON_INTERPRET``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

from flashlight import triton_specializations

_KERNEL = '''import triton
import triton.language as tl


@triton.jit
def attention(Q, K, V, O, L, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    # Q, K, V, O: [programs(1), L, D] per program; online softmax over key tiles
    start = tl.program_id(0) * BLOCK_M
    base = tl.program_id(1) * L * D
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    q = tl.load(Q + base + rows[:, None] * D + cols[None, :], mask=rows[:, None] < L, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for key0 in range(0, L, BLOCK_N):
        keys = key0 + tl.arange(0, BLOCK_N)
        k = tl.load(K + base + keys[:, None] * D + cols[None, :], mask=keys[:, None] < L, other=0.0)
        v = tl.load(V + base + keys[:, None] * D + cols[None, :], mask=keys[:, None] < L, other=0.0)
        x = tl.where(keys[None, :] < L, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 1))
        p = tl.exp2(x - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        s = s * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / s[:, None]
    tl.store(O + base + rows[:, None] * D + cols[None, :], out.to(O.dtype.element_ty), mask=rows[:, None] < L)
'''
_SIGNATURE = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "L": "i32", "scale": "fp32",
              "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "D": "constexpr"}


def _job(path: str, cache: str, variant: int) -> dict:
    """A compile worker's job for copy ``variant`` of the kernel (distinct tile sizes, own cache)."""
    names = list(_SIGNATURE)
    constants = {"BLOCK_M": 64 * (1 + variant % 2), "BLOCK_N": 32 * (1 + (variant // 2) % 2), "D": 32}
    data = {"signature": _SIGNATURE, "constant_keys": [[names.index(k)] for k in constants],
            "constant_vals": list(constants.values()), "attrs_keys": [], "attrs_vals": [],
            "options": {"num_warps": 4, "num_stages": 2 + variant % 3}}
    return {"path": path, "module": "flashlight_bench_attention", "name": "attention",
            "specialization": json.dumps(data), "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "reader": triton_specializations.__file__, "env": {"TRITON_CACHE_DIR": cache}}


def _compile_here(job: dict) -> None:
    """The worker's compile, on a thread of this process."""
    import importlib.util

    import triton

    spec = importlib.util.spec_from_file_location(job["module"], job["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    src, target, options = triton_specializations.read(module.attention, job["specialization"], job["target"])
    os.environ["TRITON_CACHE_DIR"] = job["env"]["TRITON_CACHE_DIR"]
    triton.compile(src, target=target, options=options)


def _loop_rate(done: threading.Event | None, seconds: float) -> float:
    """Iterations per second of a pure-Python loop, until ``done`` (or ``seconds``)."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds and not (done is not None and done.is_set()):
        for _ in range(200):
            pass
        n += 1
    return n / (time.perf_counter() - start)


def measure(mode: str, jobs: list[dict], pool) -> dict:
    done = threading.Event()
    start = time.perf_counter()
    if mode == "thread":
        def run(job):
            _compile_here(job)
    else:
        def run(job):
            result = pool.compile(job)
            if not result["ok"]:
                raise RuntimeError(result["error"])
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    watcher = threading.Thread(target=lambda: ([t.join() for t in threads], done.set()))
    watcher.start()
    rate = _loop_rate(done, 600.0)
    watcher.join()
    return {"mode": mode, "loop_per_s": rate, "compile_wall_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compile_interference", description=__doc__.split("\n\n")[0])
    p.add_argument("--compiles", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("bench.compile_interference: run without TRITON_INTERPRET (it compiles for a GPU target)")
    from bench.common import environment
    from flashlight.compile_workers import Pool

    work = tempfile.mkdtemp(prefix="flashlight-compile-interference-")
    path = os.path.join(work, "attention.py")
    with open(path, "w") as f:
        f.write(_KERNEL)
    _compile_here(_job(path, os.path.join(work, "warm"), 99))  # this process's one-time costs
    pool = Pool(args.compiles, ("cuda", 90, 32))
    pool.wait_ready()
    try:
        rows = [{"mode": "alone", "loop_per_s": _loop_rate(None, 1.0), "compile_wall_s": 0.0}]
        for mode in ("thread", "process"):
            jobs = [_job(path, os.path.join(work, f"{mode}-{k}"), k) for k in range(args.compiles)]
            rows.append(measure(mode, jobs, pool))
    finally:
        pool.close()
    for row in rows:
        row["loop_relative"] = round(row["loop_per_s"] / rows[0]["loop_per_s"], 3)
        print(f"{row['mode']:8s} loop {row['loop_relative']:5.2f}x of alone, compiles {row['compile_wall_s']:.2f} s")
    if args.out:
        meta = {**environment("cpu"), "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count(), "compiles": args.compiles}
        with open(args.out, "w") as f:
            json.dump({"run": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
