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
``$FLASHLIGHT_GPU_OUT/ds4sci-evoformer-attn.tar`` when that variable names a folder
that comes back from the machine. Carried back as ``.gpu/peers/deepspeed/prebuilt.tar``,
``gpu_run.sh --deepspeed`` unpacks it into ``TORCH_EXTENSIONS_DIR`` and touches the
products after DeepSpeed's install, so ninja finds them up to date and ``load()``
links nothing (same interpreter, torch and paths: ``/tmp/site``). Where that fails
(another torch, another path), the op is simply built again by this part.

:func:`availability` says whether the op is ready without building it (a kernel cell
must not start a nine-minute build), :func:`attention` calls the public
``DS4Sci_EvoformerAttention``.
"""
from __future__ import annotations

import argparse
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


def availability() -> str | None:
    """``None`` when DS4Sci_EvoformerAttention can run now, else why not."""
    import torch

    if not torch.cuda.is_available():
        return "DS4Sci_EvoformerAttention needs a CUDA GPU"
    try:
        from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention  # noqa: F401
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
    from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention

    return DS4Sci_EvoformerAttention(q, k, v, list(biases))


def pack(out_dir: pathlib.Path) -> pathlib.Path:
    """Tar the op's build folder into ``out_dir`` (for carrying to a fresh machine)."""
    library = built_library()
    folder = library.parent if library is not None else extensions_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / PACK_NAME
    with tarfile.open(target, "w") as tar:
        tar.add(folder, arcname=folder.name)
    return target


BUILD_SCRIPT = "from deepspeed.ops.op_builder import EvoformerAttnBuilder; EvoformerAttnBuilder().load()"


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
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], start_new_session=True)
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
        target = pack(pathlib.Path(out))
        print(f"bench.ds4sci: packed the build into {target} ({target.stat().st_size / 2**20:.1f} MiB)", flush=True)
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
