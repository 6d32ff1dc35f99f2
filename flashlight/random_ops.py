"""Random numbers a kernel can draw again: dropout on attention probabilities.

[Note: dropout inside a kernel]
``F.dropout(softmax(s), p) @ v`` multiplies the probabilities by a random mask of the
scores' shape. Drawn by PyTorch (``aten.rand`` of that shape), the mask is a tensor over
queries and keys per head: written by the forward, saved for the backward, the very
memory a fused attention exists never to use. Here the mask is a function instead:
``torch.ops.flashlight.uniform(seed, shape)`` gives each element of ``shape`` a float32
in [0, 1) computed from a seed (one int64 drawn from PyTorch's generator per call) and
the element's position, by the counter-based Philox generator in Triton's
``tl.random`` (10 rounds, 32-bit counters: ``c0`` the position within the last two
dims, ``c1`` the position over the dims before them, so every element of a tensor up to
2^31 x 2^31 elements has its own counter). Being a function, it is computed where it is
used: Flashlight lowers it to an elementwise op of the loop-nest IR over the nest's
indices (``uniform`` in :mod:`flashlight.vocabulary`), the online softmax and the tiling
treat it like any elementwise factor, and the backward recomputes it tile by tile from
the saved seed (it is loop-local, [Note: what the backward saves] in
:mod:`flashlight.partition`), so nothing of the scores' size is written or saved.

The op's own implementation, which runs where the op is not inside a kernel (the unfused
graph a kernel is timed against, the eager remainder, Inductor's call of it), launches a
Triton kernel printing the same Philox expression (:data:`PHILOX_UNIFORM`), so the same
seed gives the same numbers in and out of a kernel, on the GPU and in the interpreter;
on CPU tensors without the interpreter, where no Triton kernel runs, the same Philox
in PyTorch arithmetic (:func:`philox_uniform`), equal bit for bit.

Every mask is drawn this way, also one that no kernel absorbs (dropout on a transition's
output, OpenFold's ``DropoutRowwise`` masks): there the op writes its float32 values
once for Inductor to read, where ``torch.compile`` would draw inside its own kernel. A
mask must not depend on which graph draws it: OpenFold's checkpointing runs a block as
an inference graph and again as a training graph, whose kernels may absorb different
values, and both runs must draw the same masks.

:func:`native_dropout` is the decomposition Flashlight's AOTAutograd table uses for
``aten.native_dropout`` in training mode: keep where ``uniform >= p``, scaled by
``1 / (1 - p)``, as PyTorch's dropout keeps and scales, with other draws than eager's
(as ``torch.compile``'s dropout also draws other values than eager's).

Before lowering, :func:`draw_seeds_first` moves these seed draws to the top of the graph
(they read no tensor), in their order: drawn where the dropout was, the seed would come
after the softmax's row statistics, and a kernel computing the statistics and the
output together, which reads the seed, would have no place in the graph.
"""
from __future__ import annotations

import math

import torch

# The value at one element: ``seed`` an int64 scalar, ``c0``/``c1`` int32 counters.
PHILOX_UNIFORM = ("tl.random.uint_to_uniform_float(tl.random.philox({seed}, tl.cast({c0}, tl.int32), "
                  "tl.cast({c1}, tl.int32), 0, 0)[0])")
SEED_HIGH = 2 ** 62  # seeds are drawn in [0, SEED_HIGH)

_LIBRARY = torch.library.Library("flashlight", "FRAGMENT")  # noqa: TOR901 - one definition per process
_LIBRARY.define("uniform(Tensor seed, SymInt[] shape) -> Tensor")


def counters(shape) -> tuple[int, int]:
    """``(lead, trail)``: how many values the dims before the last two hold, and the last two."""
    return math.prod(shape[:-2]), math.prod(shape[-2:])


def uniform(seed: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Float32 values in [0, 1) of ``shape`` on ``seed``'s device, a function of the
    int64 ``seed`` and each element's position ([Note: dropout inside a kernel])."""
    if seed.device.type == "cpu" and not _interpreting():
        return philox_uniform(seed, shape)  # no Triton on CPU tensors without the interpreter
    out = torch.empty(shape, dtype=torch.float32, device=seed.device)
    if not out.numel():
        return out
    lead, trail = counters(shape)
    block = 1024
    tiles = (trail + block - 1) // block
    _uniform_kernel()[(lead * tiles,)](seed, out, trail, tiles, BLOCK=block)  # one grid dim: up to 2^31 - 1
    return out


def _interpreting() -> bool:
    from flashlight import settings

    return bool(settings.get("interpret"))


_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B, _ROUND_A, _ROUND_B = 0x9E3779B9, 0xBB67AE85, 0xD2511F53, 0xCD9E8D57


def philox_uniform(seed: torch.Tensor, shape) -> torch.Tensor:
    """:func:`uniform` in PyTorch arithmetic (Philox-4x32, 10 rounds, as ``tl.random``
    computes it: the 32-bit words held in int64, whose products wrap modulo 2^64 and
    keep their low 64 bits exact), for CPU tensors where Triton does not run; equal bit
    for bit to the kernels' values."""
    lead, trail = counters(shape)
    device = seed.device
    c0 = torch.arange(trail, dtype=torch.int64, device=device).expand(lead, trail)  # [lead, trail]
    c1 = torch.arange(lead, dtype=torch.int64, device=device)[:, None].expand(lead, trail)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    value = int(seed)
    k0, k1 = value & _MASK32, (value >> 32) & _MASK32
    for _ in range(10):
        hi_b = ((_ROUND_B * c2) >> 32) & _MASK32
        hi_a = ((_ROUND_A * c0) >> 32) & _MASK32
        c0, c1, c2, c3 = (hi_b ^ c1 ^ k0, (_ROUND_B * c2) & _MASK32,
                          hi_a ^ c3 ^ k1, (_ROUND_A * c0) & _MASK32)
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    x = torch.where(c0 >= 2 ** 31, c0 - 2 ** 32, c0)  # the word as an int32
    x = torch.where(x < 0, -x - 1, x).to(torch.int32)
    return (x.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)).reshape(shape)


def _uniform_fake(seed: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return seed.new_empty(shape, dtype=torch.float32)


_LIBRARY.impl("uniform", uniform, "CompositeExplicitAutograd")
torch.library.register_fake("flashlight::uniform", _uniform_fake, lib=_LIBRARY)

_KERNEL = []


def _uniform_kernel():
    """The Triton kernel of :func:`uniform`: program ``c1 * tiles + tile`` fills ``BLOCK``
    values of the ``c1``-th ``[..., X, Y]`` slice, at ``c0`` positions ``tile * BLOCK + lane``."""
    if not _KERNEL:
        from flashlight.runtime import load_source

        value = PHILOX_UNIFORM.format(seed="tl.load(seed)", c0="c0", c1="c1")
        _KERNEL.append(load_source("flashlight_uniform", (
            "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
            "def flashlight_uniform(seed, out, trail, tiles, BLOCK: tl.constexpr):\n"
            "    c1 = tl.program_id(0) // tiles\n"
            "    c0 = (tl.program_id(0) % tiles) * BLOCK + tl.arange(0, BLOCK)\n"
            f"    value = {value}\n"
            "    tl.store(out + c1.to(tl.int64) * trail + c0, value, mask=c0 < trail)\n")))
    return _KERNEL[0]


def draw_seeds_first(gm) -> int:
    """Move each seed draw of :func:`native_dropout` (an ``aten.randint`` of no tensor
    argument feeding ``flashlight.uniform``, and saved for a backward) before the first
    computing node of ``gm``, keeping their order; returns how many moved."""
    graph = gm.graph
    seeds = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.randint.low
             and not n.all_input_nodes and n.users
             and all(u.target is torch.ops.flashlight.uniform.default or u.op == "output" for u in n.users)]
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    moved = 0
    for seed in seeds:
        if seed is first:
            first = seed.next
            continue
        first.prepend(seed)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def draw_seed(device) -> torch.Tensor:
    """One seed of :func:`uniform` from PyTorch's generator of ``device`` (the draw each
    dropout makes)."""
    return torch.randint(0, SEED_HIGH, (), dtype=torch.int64, device=device)


def native_dropout(x: torch.Tensor, p: float, train: bool | None):
    """``aten.native_dropout`` in training mode with a mask :func:`uniform` draws
    ([Note: dropout inside a kernel]); other cases are PyTorch's."""
    if not train or not 0 < p < 1:
        return NotImplemented
    keep = torch.ops.flashlight.uniform(draw_seed(x.device), list(x.shape)) >= p
    return x * keep * (1.0 / (1.0 - p)), keep


def native_dropout_backward(grad: torch.Tensor, keep: torch.Tensor, scale: float):
    """The gradient of :func:`native_dropout` (autograd records this op for it), written
    out so that it fuses with the mask recomputed in the backward's kernels."""
    return grad * keep * scale
