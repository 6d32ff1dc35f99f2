"""Tuned choices shipped with Flashlight, measured on common GPUs.

The data file (``flashlight/data/tuned_configs.json``, or ``FLASHLIGHT_TUNED_CONFIGS``)
holds one entry per GPU model, Triton version (major.minor), kernel signature
(:func:`flashlight.tuning.kernel_signature`: structural, not the source text) and size
bucket (:func:`flashlight.tuning.size_bucket`). At a kernel's first launch at some sizes,
after the tuning cache (per exact source and sizes) misses, a hit here launches its
choice without autotuning. ``bench/tune_configs.py`` measures and writes the entries;
none is written by hand. Any problem with the file (missing, unreadable, another
schema, a malformed entry) means no hit, and autotuning runs as without it.

Format::

    {"schema": "flashlight-tuned-configs/1",
     "entries": [{"gpu": "NVIDIA H200", "capability": "9.0", "triton": "3.6",
                  "signature": "out bfloat16 | loads bfloat16 | ...",
                  "bucket": "rows 256 | keys 256 | grid 1024",
                  "choice": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                  "kernel_ms": 0.31, "eager_ms": 2.9, "measured": "msa_row_pair_bias ..."}]}

``choice`` is a configuration, or ``"eager"`` for the unfused graph; ``capability`` (the
GPU's compute capability) lets a model without entries take another's configurations
([Note: a GPU of the same architecture]); the other fields record the measurement and
are not read by the lookup.
"""
from __future__ import annotations

import json
import logging
import os

from flashlight import settings
from flashlight.tuning import EAGER

log = logging.getLogger("flashlight")

SCHEMA = "flashlight-tuned-configs/1"
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tuned_configs.json")
ABOUT = ("Autotuning choices measured by bench/tune_configs.py, keyed by GPU model, Triton major.minor, "
         "kernel signature and size bucket (flashlight/tuned_configs.py); choice: a configuration or 'eager'")
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
_LOADED: dict[str, tuple[tuple, dict]] = {}  # path -> (file stamp, index)
# A candidate this much slower than the fastest may be shipped where it builds faster
# ([Note: a choice that builds fast]).
BUILD_TOLERANCE = 0.03


def config_key(options: dict) -> tuple[int, ...]:
    """A configuration's (BLOCK_M, BLOCK_N, num_warps, num_stages) from launch options."""
    return tuple(int(options[k]) for k in CONFIG_KEYS)


def data_path() -> str | None:
    """The data file consulted (``FLASHLIGHT_TUNED_CONFIGS``; empty: the shipped one), or
    None when switched off (``0``)."""
    chosen = str(settings.get("tuned_configs")).strip()
    if chosen in ("0", "off", "false", "no"):
        return None
    return chosen or SHIPPED


def triton_version(version: str | None = None) -> str:
    """Triton's version as ``major.minor`` (the installed one by default)."""
    if version is None:
        import triton

        version = triton.__version__
    return ".".join(version.split(".")[:2])


def parse_choice(value) -> dict | str | None:
    """A valid choice (a configuration of four positive ints, or ``"eager"``), else None."""
    if value == EAGER:
        return EAGER
    if not isinstance(value, dict) or set(value) != set(CONFIG_KEYS):
        return None
    if not all(isinstance(value[k], int) and not isinstance(value[k], bool) and value[k] > 0 for k in CONFIG_KEYS):
        return None
    return {k: value[k] for k in CONFIG_KEYS}


def capability_of(entry: dict) -> str:
    """The compute capability (``major.minor``) of the GPU an entry was measured on, or
    "" where the entry does not say."""
    return str(entry.get("capability") or "")


def entry_key(entry: dict) -> tuple[str, str, str, str]:
    """What an entry holds for: (GPU model, Triton major.minor, signature, size bucket)."""
    return tuple(str(entry.get(k, "")) for k in ("gpu", "triton", "signature", "bucket"))


def read_entries(path: str) -> list[dict]:
    """The entries of data file ``path`` (none when it is missing or not of this schema)."""
    try:
        with open(path) as f:
            found = json.load(f)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as why:
        log.warning("flashlight: ignoring the tuned configurations in %s (%s)", path, why)
        return []
    if not isinstance(found, dict) or found.get("schema") != SCHEMA or not isinstance(found.get("entries"), list):
        log.warning("flashlight: ignoring %s: not a %s file", path, SCHEMA)
        return []
    return [e for e in found["entries"] if isinstance(e, dict)]


def _index(path: str) -> dict:
    try:
        stat = os.stat(path)
        stamp = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        return {}
    cached = _LOADED.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    index = {}
    for entry in read_entries(path):
        choice = parse_choice(entry.get("choice"))
        if choice is not None:
            index[entry_key(entry)] = (choice, capability_of(entry))
    _LOADED[path] = (stamp, index)
    return index


def lookup(gpu: str, triton: str, signature: str, bucket: str, path: str | None = None,
           capability: str = "") -> dict | str | None:
    """The shipped choice for this GPU model, Triton ``major.minor``, kernel signature and
    size bucket: a configuration dict, ``"eager"``, or None (no entry, no file, or the
    lookup switched off). Where no entry has this bucket, the configuration of the
    nearest one (:func:`nearest_bucket`). Where this GPU model has no entry for the
    signature at all, the configuration measured on another model of the same compute
    ``capability`` ([Note: a GPU of the same architecture]). ``path`` overrides
    :func:`data_path`."""
    path = path or data_path()
    if path is None:
        return None
    index = _index(path)
    found = index.get((gpu, triton, signature, bucket))
    if found is not None:
        return dict(found[0]) if isinstance(found[0], dict) else found[0]
    own = [key for key in index if key[:3] == (gpu, triton, signature)]
    if own:
        return _nearest_configuration(index, own, bucket)
    if not capability:
        return None
    siblings = [key for key, (_, cap) in index.items()
                if cap == capability and key[0] != gpu and key[1:3] == (triton, signature)]
    # one sibling model, the first by name, so that a choice never mixes two GPUs' data
    models = sorted({key[0] for key in siblings})
    return _nearest_configuration(index, [k for k in siblings if k[0] == models[0]], bucket) if models else None


def _nearest_configuration(index: dict, keys: list[tuple], bucket: str) -> dict | None:
    """The configuration of the entry among ``keys`` whose bucket is nearest ``bucket``
    (:func:`nearest_bucket`; the unfused graph's choice is never carried to other sizes)."""
    measured = {key[3]: index[key][0] for key in keys if isinstance(index[key][0], dict)}
    near = nearest_bucket(bucket, list(measured))
    return dict(measured[near]) if near is not None else None


# [Note: a GPU of the same architecture]
# Shipped choices are measured per GPU model, and a model without entries would autotune
# every kernel at its first launch: a second or more per kernel, which a first fold pays
# in full and which keeps its kernels from compiling in the background (on an H100 with
# empty caches, 11.4 s for the first call of a 256-residue fold, against 1.8 s for stock).
# Models of one compute capability share the streaming multiprocessor's design (the
# registers, shared memory and tensor-core instructions that decide which tile
# configurations fit and pipeline), and differ mostly in memory bandwidth and clocks,
# which move every configuration's time alike. So where this model has no entry for a
# kernel signature, the configuration measured on a model of the same capability is
# taken, by the same nearest-bucket rule as for its own entries. Only configurations are
# carried over: a verdict for the unfused graph weighs the kernel against memory traffic,
# which the bandwidth changes, so such a kernel is autotuned. A model's own entries, once
# measured, always win. Measured on that H100 (bench/results/fold_product_runs/): the first
# call took 4.8 s with the H200's configurations, the bare attention core ran 8% faster
# on the short MSA rows than with its own in-place tuning and 1-2% slower on the long
# ones (bench/results/core_terms/).


# [Note: the nearest tuned bucket]
# A kernel's first launch at a size bucket with no shipped entry would autotune: compile
# three or four candidates, time each and the unfused graph, about a second per kernel on
# an H200, which a short fold pays in full. The configurations measured for one kernel
# signature at neighbouring sizes are mostly the same: on the H200, of the signatures
# measured at both 256 and 512 residues with comparable grids, all but two chose the
# same tile, and those two differ by one pipeline stage or the key tile's width. Where
# the grid is small (a single-sequence fold), smaller row tiles won, so the grid counts
# as much as the rows and keys. A miss therefore takes the configuration of the measured
# bucket fewest powers of two away in rows, keys and grid together, provided its rows
# and keys are within a factor of two of this launch's; every configuration computes
# the same values. Farther away, or where the nearest entry chose the unfused graph
# (whose memory grows with the scores), the kernel is autotuned as before.
NEAREST_STEPS = 1  # powers of two that the rows and keys of a nearest bucket may differ by


def _bucket_extents(bucket: str) -> tuple[int, int, int] | None:
    """(rows, keys, grid) of a bucket written by :func:`flashlight.tuning.size_bucket`."""
    try:
        parts = dict(part.strip().split(" ", 1) for part in bucket.split("|"))
        return int(parts["rows"]), int(parts["keys"]), int(parts["grid"])
    except (KeyError, ValueError):
        return None


def nearest_bucket(bucket: str, measured: list[str]) -> str | None:
    """Of the ``measured`` buckets, the one fewest powers of two from ``bucket`` in rows,
    keys and grid together whose rows and keys are within :data:`NEAREST_STEPS` powers of
    two of its own, else None ([Note: the nearest tuned bucket])."""
    target = _bucket_extents(bucket)
    if target is None:
        return None
    steps = lambda a, b: abs(a.bit_length() - b.bit_length())  # noqa: E731 - powers of two apart
    ranked = []
    for other in measured:
        extents = _bucket_extents(other)
        if extents is None:
            continue
        rows, keys, grid = (steps(a, b) for a, b in zip(target, extents))
        if rows <= NEAREST_STEPS and keys <= NEAREST_STEPS:
            ranked.append((rows + keys + grid, rows + keys, other))
    return min(ranked)[2] if ranked else None


# [Note: a choice that builds fast]
# A shipped choice is launched without autotuning, so with empty caches it is the one
# configuration a first call compiles, on the first call's critical path: a fold's first
# pass waits for its slowest kernel's build. Builds differ more than run times do near
# the top of a kernel's ranking: Triton's stages for the single-sequence MSA row
# attention kernel (bf16, 256 residues, built for sm_90 on a 2-core CPU) took 2.08 s at
# 64 x 128 tiles, 4 warps, 2 stages (255 registers, 1.2 KB of spills; LLVM 0.99 s, ptxas
# 0.82 s) and 0.47 s at 64 x 32, 3 stages (96 registers); on an H100 host the longest
# compile jobs of a cold single-sequence fold took 0.66-1.08 s in a compile worker. So a
# candidate within BUILD_TOLERANCE of the fastest candidate's time that builds faster is
# shipped in its place (the fastest is kept in the entry as ``fastest``, every
# candidate's time and build seconds in ``candidates_measured``). Build seconds come
# from each candidate compiled from nothing in a compile worker
# (``FLASHLIGHT_RECORD_BUILDS``, which bench/tune_configs.py sets); where any candidate
# within the tolerance lacks one, the fastest is shipped. The unfused graph's choice is
# never changed. Autotuning in place keeps the fastest: there every candidate has been
# built already.


def quick_build_choice(measured: list[dict], tolerance: float = BUILD_TOLERANCE) -> dict | None:
    """Of the ``measured`` candidates (``{"config", "ms", "build_s"}``), the one that builds
    fastest among those at most ``tolerance`` slower than the fastest; None where none was
    timed or one of those lacks its build seconds ([Note: a choice that builds fast])."""
    timed = [m for m in measured if m.get("ms") is not None and m["ms"] == m["ms"] and m["ms"] > 0]
    if not timed:
        return None
    best_ms = min(m["ms"] for m in timed)
    near = [m for m in timed if m["ms"] <= best_ms * (1 + tolerance)]
    if any(m.get("build_s") is None for m in near):
        return None
    return dict(min(near, key=lambda m: (m["build_s"], m["ms"]))["config"])


def entry_from_event(event: dict, **notes) -> dict:
    """A data-file entry from one autotuning outcome (``flashlight.runtime.TUNING_EVENTS``),
    with its measured times and ``notes`` on the measurement (``measured``: what ran).
    Where the event holds every candidate's time and build seconds, the choice is the
    fastest-building candidate near the fastest ([Note: a choice that builds fast])."""
    entry = {k: event[k] for k in ("gpu", "triton", "signature", "bucket", "choice")}
    if event.get("capability"):
        entry["capability"] = event["capability"]
    entry.update({k: event.get(k) for k in ("kernel_ms", "eager_ms", "candidates")})
    measured = event.get("measured_candidates") or []
    quick = quick_build_choice(measured) if entry["choice"] != EAGER else None
    if quick is not None and quick != entry["choice"]:
        entry["fastest"], entry["choice"] = entry["choice"], quick
    if measured:  # (BLOCK_M, BLOCK_N, num_warps, num_stages, ms, build seconds) each
        entry["candidates_measured"] = [[*config_key(m["config"]), round(m["ms"], 5), m.get("build_s")]
                                        for m in measured]
    entry.update(notes)
    return entry


def write_entries(path: str, entries: list[dict]) -> int:
    """Merge ``entries`` into data file ``path`` (an entry replaces one with the same GPU,
    Triton version, signature and bucket), written atomically; returns the entry count."""
    for entry in entries:
        if parse_choice(entry.get("choice")) is None or not all(entry_key(entry)):
            raise ValueError(f"not a tuned-configuration entry: {entry}")
    merged = {entry_key(e): e for e in read_entries(path)}
    merged.update({entry_key(e): e for e in entries})
    document = {"schema": SCHEMA, "about": ABOUT, "entries": [merged[k] for k in sorted(merged)]}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return len(merged)
