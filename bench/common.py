"""Shared pieces of the benchmarks: environment metadata, the measured roofline, timing,
precision modes, time budgets and result files.

Every result file records the machine it was measured on (GPU, driver, torch, Triton,
CUDA, Python, date) and a digest of the Flashlight sources, so numbers can be traced to
the code that produced them.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import time
from typing import Any, Callable, Iterator

import torch

from flashlight import settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# name -> (torch dtype, float32 matmul precision). "tf32": float32 tensors with TF32
# tensor-core matmuls (OpenFold's inference setting); "fp32": IEEE float32.
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "bf16": (torch.bfloat16, "highest"),
    "tf32": (torch.float32, "high"),
    "fp32": (torch.float32, "highest"),
}


def set_precision(dtype_name: str) -> torch.dtype:
    """Select the float32 matmul precision for ``dtype_name`` and return its torch dtype."""
    dtype, precision = DTYPES[dtype_name]
    tf32 = precision == "high"
    torch.set_float32_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return dtype


# ---------------------------------------------------------------------------- metadata


def _nvidia_smi(query: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return out.strip().splitlines()[0].strip() or None
    except Exception:  # noqa: BLE001 - absent on CPU machines
        return None


GPU_SAMPLE_QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def summarise_gpu_samples(lines: list[str]) -> dict | None:
    """``nvidia-smi --query-gpu=GPU_SAMPLE_QUERY --format=csv,noheader,nounits`` lines ->
    the SM clock's min / median / max (MHz), the highest power (W) and temperature (C),
    and the share of samples with a throttle reason other than idle (bit 0x1), with the
    reasons seen; None without a parsable sample."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3], 16)))
        except (IndexError, ValueError):
            continue
    if not samples:
        return None
    clocks = [s[0] for s in samples]
    throttled = [s[3] & ~0x1 for s in samples]
    return {"samples": len(samples), "sm_mhz_min": min(clocks), "sm_mhz_median": statistics.median(clocks),
            "sm_mhz_max": max(clocks), "power_w_max": max(s[1] for s in samples),
            "temperature_c_max": max(s[2] for s in samples),
            "throttled_share": round(sum(1 for t in throttled if t) / len(samples), 3),
            "throttle_reasons": sorted({hex(t) for t in throttled if t})}


@contextlib.contextmanager
def gpu_samples(interval_ms: int = 250) -> Iterator[dict]:
    """Sample the GPU's SM clock, power, temperature and throttle reasons with
    ``nvidia-smi --loop-ms`` while the block runs; the yielded dict receives
    :func:`summarise_gpu_samples`'s summary under ``"gpu"`` on exit (None where
    ``nvidia-smi`` is absent). Where a comparison's variants differ in compute-bound
    modules only, a clock that dropped during one of them shows here."""
    out: dict = {"gpu": None}
    try:
        proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={GPU_SAMPLE_QUERY}", "--format=csv,noheader,nounits",
                                 f"--loop-ms={interval_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
    except OSError:  # no nvidia-smi: a CPU machine
        yield out
        return
    try:
        yield out
    finally:
        proc.terminate()
        try:
            text, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out["gpu"] = summarise_gpu_samples(text.splitlines())


def source_digest() -> str:
    """SHA-256 (first 16 hex digits) of the Python sources Flashlight runs from."""
    h = hashlib.sha256()
    for folder in ("flashlight", "integrations", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - a copied working tree may have no .git
        return os.environ.get("FLASHLIGHT_COMMIT")


def environment(device: str) -> dict[str, Any]:
    import triton

    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "flashlight_commit": git_commit(),
        "flashlight_source_digest": source_digest(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
        "flashlight_settings": settings.changed(),  # the Flashlight settings the run set
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            compute_capability=f"{props.major}.{props.minor}",
            driver=_nvidia_smi("driver_version"),
            gpu_clocks_mhz=_nvidia_smi("clocks.sm,clocks.max.sm"),
        )
    else:
        meta.update(gpu=None, driver=None, cpu=platform.processor() or platform.machine(),
                    cpu_count=os.cpu_count())
    return meta


# ---------------------------------------------------------------------------- timing


def bench_ms(fn: Callable[[], Any], device: str, rep_ms: int = 100, cpu_reps: int = 3) -> float:
    """Median time of ``fn()`` in milliseconds.

    CUDA: ``triton.testing.do_bench`` (CUDA events, L2 flushed between runs, median).
    CPU: median wall-clock time of ``cpu_reps`` runs after one warm-up run.
    """
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))
    fn()
    times = []
    for _ in range(cpu_reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_bytes(fn: Callable[[], Any]) -> int:
    """CUDA memory ``fn()`` allocates at its peak beyond what was allocated before it
    (what it returns included)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_roofline(device: str, small: bool = False) -> dict[str, float]:
    """Copy bandwidth and dense matmul rates measured now, on this device.

    Copy: a device-to-device copy of a 2 GiB buffer (bytes read + written / time).
    Matmul: an 8192^3 product in bf16, float32 with TF32, and IEEE float32.
    ``small`` shrinks both (CPU smoke runs only exercise the code).
    """
    n_copy = (1 << 22) if small else (1 << 29)  # float32 elements: 16 MiB / 2 GiB
    n_mm = 256 if small else 8192
    src = torch.empty(n_copy, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device)
    result = {"copy_tb_per_s": 2 * src.numel() * 4 / (ms * 1e-3) / 1e12}
    del src, dst
    for name, dtype_name in (("bf16", "bf16"), ("tf32", "tf32"), ("fp32", "fp32")):
        dtype = set_precision(dtype_name)
        a = torch.randn(n_mm, n_mm, device=device, dtype=dtype)
        b = torch.randn(n_mm, n_mm, device=device, dtype=dtype)
        ms = bench_ms(lambda: a @ b, device)
        result[f"{name}_tflop_per_s"] = 2 * n_mm**3 / (ms * 1e-3) / 1e12
        del a, b
    set_precision("fp32")
    if device == "cuda":
        torch.cuda.empty_cache()
    return {k: float(f"{v:.4g}") for k, v in result.items()}


def roofline_floor_ms(flops: float, bytes_moved: float, dtype_name: str, roofline: dict) -> float:
    """Lower bound on time: the larger of compute time at the measured matmul rate for
    this dtype and compulsory traffic time at the measured copy bandwidth."""
    rate = roofline[f"{dtype_name}_tflop_per_s"] * 1e12
    bw = roofline["copy_tb_per_s"] * 1e12
    bounds = [flops / rate if rate > 0 else 0.0, bytes_moved / bw if bw > 0 else 0.0]
    return max(bounds) * 1e3


def tensor_bytes(*tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (broadcast views count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


# ---------------------------------------------------------------------------- budgets


class TimeUp(BaseException):
    """Raised by :class:`Deadline` when the time budget (or a cell's limit) runs out.

    A ``BaseException`` so that ``except Exception`` around a peer does not swallow it.
    """


class Deadline:
    """A wall-clock budget for one process, with an optional shorter limit per step.

    ``remaining()`` says how much is left; ``step(limit_s)`` arms SIGALRM so that a step
    running past ``min(limit_s, remaining)`` raises :class:`TimeUp` in the main thread.
    """

    def __init__(self, budget_s: float):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    @contextlib.contextmanager
    def step(self, limit_s: float | None = None) -> Iterator[None]:
        allowed = self.remaining() if limit_s is None else min(limit_s, self.remaining())
        if allowed <= 0:
            raise TimeUp("time budget exhausted")
        if not hasattr(signal, "SIGALRM"):
            yield
            return

        def _alarm(signum, frame):  # noqa: ARG001
            raise TimeUp(f"step exceeded {allowed:.0f} s")

        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, max(allowed, 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def budget_from_env(max_minutes: float) -> float:
    """Seconds this process may use: ``max_minutes``, further capped by the time left
    of a GPU-machine call (``FLASHLIGHT_BUDGET_END``, a Unix time, when set)."""
    budget = max_minutes * 60
    end = os.environ.get("FLASHLIGHT_BUDGET_END")
    if end:
        budget = min(budget, float(end) - time.time())
    return budget


# ---------------------------------------------------------------------------- files


def atomic_write_json(path: pathlib.Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


RUN_FIELDS = ("gpu", "driver", "torch", "triton", "date")


def save_results(path: pathlib.Path, data: dict, rows: str, fields, row_text=None) -> None:
    """Write ``data`` to ``path`` (JSON) and ``data[rows]`` as a CSV beside it, each row
    with its run's GPU, driver, versions and date; both files replaced atomically.
    ``row_text`` (row -> dict of columns) formats columns that are not plain values."""
    import csv

    atomic_write_json(path, data)
    runs = {r["id"]: r for r in data["runs"]}
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in data[rows]:
            run = runs.get(row.get("run"), {})
            writer.writerow({**row, **(row_text(row) if row_text else {}), **{k: run.get(k) for k in RUN_FIELDS}})
    os.replace(tmp, path.with_suffix(".csv"))


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def is_fatal_cuda_error(exc: BaseException) -> bool:
    """Errors after which the CUDA context is unusable and the process must restart."""
    text = str(exc).lower()
    return any(s in text for s in (
        "illegal memory access", "device-side assert", "unspecified launch failure",
        "misaligned address", "illegal instruction", "cuda error: an illegal",
        "uncorrectable ecc", "device kernel image is invalid",
    ))


def short_error(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"
