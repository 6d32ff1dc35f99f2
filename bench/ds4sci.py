"""DeepSpeed's ``DS4Sci_EvoformerAttention``: building its CUDA op once, and finding it later.

    python -m bench.ds4sci --build [--max-minutes 9.5]   # JIT-builds the op (~9 min on the H200)
    python -m bench.ds4sci --status                      # says whether the op is ready

DeepSpeed (installed from its sdist with ``DS_BUILD_OPS=0`` by ``scripts/gpu_run.sh
--deepspeed``) compiles the op against CUTLASS the first time
``EvoformerAttnBuilder().load()`` runs. With ``CUTLASS_PATH=DS_USE_CUTLASS_PYTHON_BINDINGS``
it takes CUTLASS's headers from the ``nvidia-cutlass`` wheel. The build goes into
``TORCH_EXTENSIONS_DIR`` (gpu_run.sh points it at ``<site>/torch_extensions``, which
lasts while the machine is warm), where every later process finds it: a second
``load()`` only checks that nothing changed. ``--build`` is a part of
``bench/run_all.sh`` on its own (``ds4sci-build``): about nine of a call's ten minutes. If
the call's time runs out first, the build is stopped cleanly (exit status 3) and the
next call on the same machine continues it: ninja keeps the objects already compiled.

A fresh machine has lost that folder. So after building, ``--build`` also packs the
folder's build products (objects, ``build.ninja``, ninja's logs and the ``.so``) into
``$FLASHLIGHT_GPU_OUT/ds4sci-evoformer-attn.tar.xz.part00`` (and further parts: a file
coming back holds at most 16 MiB) when that variable names a folder that comes back
from the machine. Carried back as ``.gpu/peers/deepspeed/prebuilt.tar.xz.part*``,
``gpu_run.sh --deepspeed`` unpacks it into ``TORCH_EXTENSIONS_DIR`` and dates DeepSpeed's
just-installed sources before the build, so ninja finds the products up to date and
``load()`` links nothing (same interpreter, torch and paths: ``/tmp/site``). Where that fails
(another torch, another path), the op is simply built again by this part.

:func:`availability` says whether the op is ready without building it (a kernel cell
must not start a nine-minute build), :func:`attention` calls the public
``DS4Sci_EvoformerAttention``.
"""
from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
import tarfile
import time

OP_NAME = "evoformer_attn"
PACK_NAME = "ds4sci-evoformer-attn.tar"


def extensions_dir() -> pathlib.Path:
    """Where torch's JIT extensions go (``TORCH_EXTENSIONS_DIR`` or torch's default)."""
    from torch.utils.cpp_extension import _get_build_directory

    return pathlib.Path(_get_build_directory(OP_NAME, verbose=False))


def built_library() -> pathlib.Path | None:
    """The op's shared library when a build finished, else ``None``."""
    try:
        folder = extensions_dir()
    except Exception:  # noqa: BLE001 - torch without cpp_extension support
        return None
    found = sorted(folder.glob(f"{OP_NAME}*.so")) or sorted(folder.parent.glob(f"*{OP_NAME}*/*{OP_NAME}*.so"))
    return found[0] if found else None


def deepspeed_site() -> str | None:
    """The folder DeepSpeed is installed in, off ``PYTHONPATH`` (``gpu_run.sh --deepspeed``
    names it in ``FLASHLIGHT_DEEPSPEED_SITE``), or ``None`` when it is on the path anyway."""
    return os.environ.get("FLASHLIGHT_DEEPSPEED_SITE") or None


@functools.cache
def _import_deepspeed_entry():
    """``DS4Sci_EvoformerAttention``, importing DeepSpeed from :func:`deepspeed_site`
    (once per process: :func:`attention` is timed).

    OpenFold 0.0.1 imports DeepSpeed at its own import whenever it can, then calls
    ``deepspeed.utils.is_initialized``, which DeepSpeed 0.19 no longer has: every OpenFold
    forward would fail. So OpenFold (when installed) is imported first, while DeepSpeed is
    not importable, and DeepSpeed's folder is appended to ``sys.path`` only afterwards."""
    import importlib.util

    if os.environ.get("TORCH_CUDA_ARCH_LIST"):  # the op's load() parses it again in this process
        os.environ["TORCH_CUDA_ARCH_LIST"] = plain_arch_list(os.environ["TORCH_CUDA_ARCH_LIST"])
    site = deepspeed_site()
    if site and site not in sys.path:
        if importlib.util.find_spec("openfold") is not None:
            import openfold.model.primitives  # noqa: F401 - decides "no DeepSpeed" now
            import openfold.utils.checkpointing  # noqa: F401
        sys.path.append(site)
    from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention

    return DS4Sci_EvoformerAttention


def availability() -> str | None:
    """``None`` when DS4Sci_EvoformerAttention can run now, else why not."""
    import torch

    if not torch.cuda.is_available():
        return "DS4Sci_EvoformerAttention needs a CUDA GPU"
    try:
        _import_deepspeed_entry()
    except Exception as exc:  # noqa: BLE001 - any import failure means absent
        return (f"DeepSpeed is not importable ({type(exc).__name__}: {str(exc)[:200]}); "
                "scripts/gpu_fetch.sh --deepspeed carries it, gpu_run.sh --deepspeed installs it")
    if built_library() is None:
        return ("DS4Sci_EvoformerAttention's CUDA op is not built in this machine's TORCH_EXTENSIONS_DIR "
                "(run the run_all.sh part ds4sci-build first, about 9 minutes)")
    return None


def attention(q, k, v, biases):
    """``DS4Sci_EvoformerAttention(q, k, v, biases)``: q, k, v ``[B, N, L, H, c]`` in bf16 or
    fp16, biases ``[B, N, 1, 1, L]`` and ``[B, 1, H, L, L]`` (either may be ``None``); the
    scale ``c ** -0.5`` is applied inside. Returns ``[B, N, L, H, c]``."""
    return _import_deepspeed_entry()(q, k, v, list(biases))


PART_BYTES = 15 * 2**20  # a file coming back from the GPU machine holds at most 16 MiB


def pack(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The op's build folder as an xz-compressed tar in ``out_dir``, cut into parts of at
    most :data:`PART_BYTES` (``<name>.xz.part00``, ...); ``cat`` joins them again."""
    import shutil
    import subprocess

    library = built_library()
    folder = library.parent if library is not None else extensions_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{PACK_NAME}.xz.part*"):
        old.unlink()
    whole = out_dir / f"{PACK_NAME}.xz"
    with tarfile.open(out_dir / PACK_NAME, "w") as tar:
        tar.add(folder, arcname=folder.name)
    if shutil.which("xz"):
        subprocess.run(["xz", "-T0", "-6", "-f", str(out_dir / PACK_NAME)], check=True)
    else:
        import lzma

        whole.write_bytes(lzma.compress((out_dir / PACK_NAME).read_bytes()))
        (out_dir / PACK_NAME).unlink()
    parts = []
    with open(whole, "rb") as src:
        while chunk := src.read(PART_BYTES):
            parts.append(out_dir / f"{whole.name}.part{len(parts):02d}")
            parts[-1].write_bytes(chunk)
    whole.unlink()
    return parts


BUILD_SCRIPT = "from deepspeed.ops.op_builder import EvoformerAttnBuilder; EvoformerAttnBuilder().load()"


def plain_arch_list(archs: str) -> str:
    """``TORCH_CUDA_ARCH_LIST`` without letter suffixes (``9.0a`` -> ``9.0``): DeepSpeed's
    builder reads each architecture as two numbers, at the build and at every ``load()``."""
    import re

    return re.sub(r"(\d+\.\d+)[a-z]+", r"\1", archs)


def _build_env() -> dict[str, str]:
    """The build's environment: DeepSpeed's folder on ``PYTHONPATH`` (the build imports
    nothing of OpenFold), and :func:`plain_arch_list`."""
    env = dict(os.environ)
    site = deepspeed_site()
    if site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), site) if p)
    if env.get("TORCH_CUDA_ARCH_LIST"):
        env["TORCH_CUDA_ARCH_LIST"] = plain_arch_list(env["TORCH_CUDA_ARCH_LIST"])
    return env


def build(max_s: float) -> int:
    """Build (or find) the op; 0 when it loads, 1 when the build failed, 3 when the time
    ran out first (ninja resumes from the objects already built on this machine).

    The build runs in its own process group, stopped with SIGTERM (ninja removes the
    half-written objects) ``max_s`` seconds in, so the call ends cleanly."""
    import signal
    import subprocess

    import torch

    if not torch.cuda.is_available():
        print("bench.ds4sci: no CUDA GPU; nothing to build", flush=True)
        return 1
    if built_library() is not None:
        print(f"bench.ds4sci: already built: {built_library()}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], start_new_session=True, env=_build_env())
    try:
        status = proc.wait(timeout=max(max_s - 15, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        print(f"bench.ds4sci: the build ran {time.monotonic() - t0:.0f} s, all this call had; run again on this "
              "machine and it continues (TORCH_EXTENSIONS_DIR keeps what was built)", flush=True)
        return 3
    if status != 0 or built_library() is None:
        print(f"bench.ds4sci: the build failed after {time.monotonic() - t0:.0f} s (status {status}; its output "
              "is above)", flush=True)
        return 1
    print(f"bench.ds4sci: op ready in {time.monotonic() - t0:.0f} s: {built_library()}", flush=True)
    out = os.environ.get("FLASHLIGHT_GPU_OUT")
    if out:
        parts = pack(pathlib.Path(out))
        size = sum(p.stat().st_size for p in parts) / 2**20
        print(f"bench.ds4sci: packed the build into {len(parts)} parts, {size:.1f} MiB: "
              f"{', '.join(p.name for p in parts)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from bench.common import budget_from_env

    p = argparse.ArgumentParser(prog="python -m bench.ds4sci", description=__doc__.split("\n\n")[0])
    p.add_argument("--build", action="store_true")
    p.add_argument("--status", action="store_true")
    p.add_argument("--max-minutes", type=float, default=9.5)
    args = p.parse_args(argv)
    if args.build:
        return build(budget_from_env(args.max_minutes))
    why = availability()
    print(why or f"DS4Sci_EvoformerAttention is ready: {built_library()}")
    return 0 if why is None else 1


if __name__ == "__main__":
    sys.exit(main())
