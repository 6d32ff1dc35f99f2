"""Compiling generated kernels ahead of time for an NVIDIA GPU, without one.

A child process runs Triton's compiler on a kernel's source for a chosen compute
capability and launch configuration (tests use it to catch code the interpreter
tolerates but the real compiler rejects, and to read shared memory, registers and
spills); :func:`integer_arguments` gives the sizes and strides a real launch would pass.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
from typing import Sequence

import torch

from flashlight import settings
from flashlight.launch_sizes import integer_arguments as runtime_integer_arguments, read_sizes
from flashlight.runtime import Launcher, load_module
from flashlight.codegen import NARROW_BITS, KernelSource


@dataclasses.dataclass(frozen=True)
class AotResult:
    """What compiling a kernel for a real GPU reported."""

    shared: int  # shared memory, bytes
    n_regs: int  # registers per thread (-1: unknown)
    stack: int  # local-memory stack per thread, bytes: register spills (-1: unknown)
    num_warps: int


_AOT_SCRIPT = """
import importlib.util, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, name, signature, constexprs, capability, num_warps, num_stages, attrs, cubin_path = json.loads(sys.argv[1])
attrs = {(int(k),): v for k, v in attrs.items()}
spec = importlib.util.spec_from_file_location("aot_kernel", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, name)
src = ASTSource(fn, signature, constexprs, attrs)
k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                   options={"num_warps": num_warps, "num_stages": num_stages})
if cubin_path:
    with open(cubin_path, "wb") as f:
        f.write(k.asm["cubin"])
regs = stack = -1
# registers and stack of the cubin, from the cuobjdump that ships with Triton
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
if os.path.exists(tool) and "cubin" in k.asm:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    found = re.search(r"REG:(\\d+) STACK:(\\d+)", usage)
    if found:
        regs, stack = int(found.group(1)), int(found.group(2))
print(json.dumps([k.metadata.shared, regs, stack, k.metadata.num_warps]))
"""


def aot_compile(src: KernelSource, input_dtypes: Sequence[torch.dtype], out_dtype,
                capability: int = 90, block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                num_stages: int = 2, specialize: dict[str, int] | None = None,
                index_bits: int = NARROW_BITS, cubin_path: str | None = None) -> AotResult:
    """Compile generated source ahead of time for an NVIDIA GPU (no GPU needed).

    Runs in a child process without the Triton interpreter (which replaces the
    language in-process). Catches code the interpreter tolerates but the real compiler
    rejects; raises ``RuntimeError`` with the compiler's message. Reports shared memory,
    and registers and spill stack where Triton's ``cuobjdump`` is installed.

    ``specialize``: the values of integer arguments (sizes, strides) of a launch, to build
    what Triton's JIT builds for it: arguments equal to 1 become constants, those
    divisible by 16 are marked so, and tensor pointers are taken 16-byte aligned (as
    PyTorch's allocations are). Without it, nothing is assumed of the arguments.
    ``out_dtype``: the output's dtype, or a sequence of every output's. ``index_bits``:
    32 or 64, the width of the kernel's offsets ([Note: 64-bit offsets] in
    :mod:`flashlight.codegen`). ``cubin_path``: where to keep the built cubin (for
    ``cuobjdump -sass``), if anywhere.
    """
    import json
    import subprocess

    load_module(src)
    path = os.path.join(settings.get("cache_dir"), "kernels",
                        f"{src.name}_{hashlib.sha1(src.source.encode()).hexdigest()[:16]}.py")
    signature, constexprs, attrs = specialization(src, input_dtypes, out_dtype, block_m, block_n, specialize,
                                                  index_bits)
    args = json.dumps([path, src.name, signature, constexprs, capability, num_warps, num_stages, attrs, cubin_path])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"Triton could not compile {src.name} for sm_{capability}:\n{done.stderr[-3000:]}")
    shared, regs, stack, warps = json.loads(done.stdout.strip().splitlines()[-1])
    return AotResult(shared, regs, stack, warps)


def specialization(src: KernelSource, input_dtypes: Sequence[torch.dtype], out_dtype, block_m: int,
                   block_n: int, specialize: dict[str, int] | None = None,
                   index_bits: int = NARROW_BITS) -> tuple[dict, dict, dict]:
    """(signature, constants by name, attributes by argument position as text) of a launch
    of ``src``, built as Triton's JIT builds them (see :func:`aot_compile`)."""
    signature: dict[str, str] = {f"in{k}": "*" + _sig(dtype) for k, dtype in enumerate(input_dtypes)}
    out_dtypes = tuple(out_dtype) if isinstance(out_dtype, (tuple, list)) else (out_dtype,)
    if getattr(src, "split", False):  # float32 partial sums ([Note: split serial loops])
        out_dtypes = (torch.float32,)
    ranks = (src.out_rank, *getattr(src, "extra_out_ranks", ()))
    outs = [f"out{k}" if k else "out" for k in range(len(ranks))]
    signature.update({out: "*" + _sig(dtype) for out, dtype in zip(outs, out_dtypes)})
    signature.update({f"size{k}": "i32" for k in range(len(src.size_args))})
    signature.update({f"in{k}_s{a}": "i32" for k, rank in enumerate(src.input_ranks) for a in range(rank)})
    signature.update({f"{out}_s{a}": "i32" for out, rank in zip(outs, ranks) for a in range(rank)})
    if getattr(src, "split", False):
        signature.update({"SPLITS": "i32", "SPLIT_LEN": "i32", "out_split": "i32"})
    signature.update({"BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "INDEX_BITS": "constexpr"})
    constexprs: dict[str, int] = {"BLOCK_M": block_m, "BLOCK_N": block_n, "INDEX_BITS": index_bits}
    attrs: dict[str, list] = {}
    for k, (arg, kind) in enumerate(list(signature.items())):
        value = None if specialize is None else specialize.get(arg)
        if specialize is not None and kind.startswith("*"):
            attrs[str(k)] = [["tt.divisibility", 16]]
        elif value == 1:
            signature[arg], constexprs[arg] = "constexpr", 1
        elif value is not None and value % 16 == 0:
            attrs[str(k)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def integer_arguments(launcher: Launcher, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
    """The sizes and strides a launch of ``launcher`` on ``tensors`` passes, by argument
    name (``aot_compile``'s ``specialize``), the output contiguous as the launcher makes it."""
    tensors = list(tensors)
    for k, axis in launcher.relayouts:
        if tensors[k].stride(axis) != 1 and tensors[k].shape[axis] > 1:
            tensors[k] = tensors[k].movedim(axis, -1).contiguous().movedim(-1, axis)
    values = read_sizes(launcher.sources, tensors)  # merged size sources divided, as at launch
    size_args = [int(values[text]) for text in launcher.src.size_args]
    shapes = [[math.prod(launcher._size(d, values) for d in axis) for axis in output.axes]
              for output in launcher.kernel.outputs()]
    outs = [torch.empty(shape, device="meta") for shape in shapes]  # each contiguous
    split_args: tuple = ()
    if getattr(launcher.src, "split", False):  # the partial sums' buffer, contiguous
        outs = [torch.empty((1, *shapes[0]), device="meta")]
        split_args = (1, 0, outs[0].stride(0))
    return runtime_integer_arguments(size_args, tensors, outs, split_args)


def _sig(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
            torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.bool: "i1", torch.int8: "i8",
            torch.uint8: "u8"}[dtype]
