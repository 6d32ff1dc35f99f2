"""Whole blocks of OpenFold's stacks compiled with Flashlight: ``patch_openfold(model, scope="block")``.

Whole blocks
------------
With ``scope="attention"`` (the default) only the attention cores are compiled; the
rest of each block (layer norms, projections, transitions, the outer product mean,
triangle multiplications) runs eagerly, one PyTorch call after another. With
``scope="block"`` the attention modules are patched as with ``"attention"`` and, in
addition, each

==============================  ==============================  =======================
block (found by type)           stack in the report             input
==============================  ==============================  =======================
``EvoformerBlock``              ``evoformer``                   ``m, z``
``ExtraMSABlock``               ``extra_msa``                   ``m, z``
``TemplatePairStackBlock``      ``template_pair``               ``z`` (the templates)
==============================  ==============================  =======================

gets an instance ``forward`` that runs the class's forward through one
``torch.compile`` with Flashlight's backend: Dynamo traces the whole block into one
graph, in which the patched attention modules (traced, see
``torch.compiler.is_compiling`` in :mod:`~flashlight.integrations.openfold_forward`)
contribute the plain attention cores; Flashlight fuses those into its kernels and the
rest of the graph goes to Inductor (``FLASHLIGHT_REMAINDER``, or ``compile_options``'
``remainder``).

[Note: one compile for all blocks]
The compiled function is one small function per block class, dtype and compile options
(a fresh code object, named e.g. ``evoformer_block_float32``, so that the signatures do
not compete for Dynamo's per-code-object cache limit). Dynamo inlines ``nn.Module``
calls, so a block's parameters are inputs of the graph, not constants: the 48 Evoformer
blocks of a model pass the same guards and share one graph. Lengths work as in the
attention cores (``dynamic=None``): the first length compiles a static graph, a second
one a graph with symbolic ``N_res`` / ``N_seq``, and later lengths compile nothing.

Flags forced in a compiled block
--------------------------------
- ``inplace_safe=False``. OpenFold's inference path (``inplace_safe=True``, which the
  ``AlphaFold`` model passes under ``no_grad``) adds updates in place and computes the
  triangle multiplications in Python loops over chunks of ``N_res`` (``_inference_forward``):
  Dynamo unrolls those loops with the length as a constant, so every length would
  compile again, and Inductor plans the buffers of a functional graph itself. The block
  returns new tensors instead of writing into its inputs; OpenFold's stacks use the
  returned values.
- ``chunk_size=None`` and ``_attn_chunk_size=None``: the block runs compiled only when
  the caller asked for no chunking (``flashlight-fold``'s default). With a chunk size
  set, OpenFold's ``chunk_layer`` loops would also unroll per length, and dropping them
  would materialise the transitions' and the outer product mean's full intermediates,
  which the caller chunked to bound memory: such calls run the block's eager forward,
  with its attention patched as in scope ``"attention"`` (unchunked attention, chunked
  transitions), so memory is what that scope gives.

Which scope ``flashlight-fold`` uses
------------------------------------
``"attention"``, measured on an H200 (torch 2.11, Triton 3.6, TF32,
``bench/results/block_scope``): whole blocks are faster once compiled (the 48-block
Evoformer stack at 256 residues in 267 ms against 395-567 ms with the attention cores
alone, 773 ms at 512 against 1628 ms for ``torch.compile`` per block; ``model_1`` one
pass at 256 in 365 ms against 574 ms), but their first call takes 34-40 s against
4-7 s: Inductor compiles each block graph from scratch. In a fold the stacks replay
CUDA graphs after the first iteration, so the gain left is the difference in GPU time
(the kernel profiles of the two stacks at 256 residues: 388 ms against 254 ms, about
0.13 s per iteration), far less than that first call for a typical fold of one record. ``--patch-scope block`` is for long runs
over many records of one length, where Inductor's on-disk caches pay it back.

When the eager block runs instead
---------------------------------
The class's own forward (its attention still patched, and falling back by its own rules)
runs when: a chunk size is set (above); ``_offload_inference`` is set (it moves tensors
between devices and counts references); the attention would not run Flashlight's
kernels (CPU tensors without ``TRITON_INTERPRET``, a dtype other than float32 and
bfloat16: see :mod:`~flashlight.integrations.openfold`); the block has no compiled form
for its class. None of these depends on whether autograd records the call.

[Note: compiled blocks in training]
Under autograd (``model.train()``, fine-tuning) the block compiles as a training graph:
AOTAutograd's joint graph, split by Flashlight's partition ([Note: what the backward
saves] in :mod:`flashlight.partition`), the attention cores' forward and backward as
Flashlight kernels, the rest of both graphs through Inductor. OpenFold's dropout masks
are then drawn by Flashlight's counter-based generator from seeds PyTorch's generator
gives ([Note: dropout inside a kernel] in :mod:`flashlight.random_ops`): the same
distribution as eager PyTorch's masks, other values. OpenFold checkpoints each block in
training (``blocks_per_ckpt``): PyTorch's reentrant checkpoint runs the block once
without autograd, then again with it during the backward pass, from the same generator
state. Both runs must draw the same masks, so both take the compiled block (an inference
graph, then a training graph, which draw their seeds in the same order); the rules above
never depend on whether autograd records the call. (A compiled first run and an eager
second one would draw different masks, and the backward would differentiate another
function than the one whose output the model used.)

Memory
------
Unchunked, the compiled block materialises what OpenFold's functional
(``inplace_safe=False``) path does, with Inductor freeing each buffer after its last
use. Its largest intermediates are those of the eager patched block (the MSA
transition's ``[*, S, R, 4 C_m]``, the outer product's ``[*, R, R, c^2]``); the triangle
multiplications hold both projections ``a, b`` (``[*, R, R, c_mul]``) at once where the
in-place path holds ``a`` and a chunk of ``b``.

[Note: a compiled block updates its inputs in place]
A functional block returns new ``m`` and ``z`` while the caller still holds the old ones:
one MSA- and one pair-sized buffer more than OpenFold's in-place path, which adds each
update into ``m`` and ``z`` (the extra-MSA stack's ``m`` at 5120 rows and 256 residues is
320 MiB in float32). Where the caller allows that path (``inplace_safe=True``, as
OpenFold's stacks pass at inference) and Inductor compiles the rest of the block, the
compiled function copies its results into
``m`` and ``z`` and returns them, as the in-place path does; AOTAutograd keeps those
copies in the graph, and Flashlight then stores the residual updates themselves in the
inputs' buffers ([Note: writing into an input the graph overwrites] in
:mod:`flashlight.inductor`), so no second ``m`` or ``z`` is allocated.
"""
from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Callable, Iterator

import torch

from flashlight import settings
from flashlight.integrations import openfold_core
from flashlight.integrations.openfold_forward import (
    _STATE_ATTR,
    PatchedForward,
    _fallback_reason,
    _Options,
    is_patched,
    _stock_params,
)

SCOPES = ("attention", "block")

# the block classes by name, in openfold.model.evoformer and openfold.model.template
_BLOCK_STACKS = {
    "EvoformerBlock": "evoformer",
    "ExtraMSABlock": "extra_msa",
    "TemplatePairStackBlock": "template_pair",
}
# the arguments each block class returns updated, in the order it returns them
_UPDATED = {"EvoformerBlock": ("m", "z"), "ExtraMSABlock": ("m", "z"), "TemplatePairStackBlock": ("z",)}
# arguments that make the compiled block unsuitable when set (see "When the eager block...")
_EAGER_WHEN_SET = ("chunk_size", "_attn_chunk_size", "_offload_inference")


@dataclasses.dataclass
class _BlockState:
    """Record of a ``scope="block"`` patch: stored on the block instance."""

    stack: str
    path: str
    stock_params: tuple[str, ...]  # parameter names of the class's forward after ``self``
    options: _Options


def block_classes() -> dict[type, str]:
    """OpenFold's block classes and the stack each belongs to."""
    from openfold.model import evoformer, template

    found = {}
    for name, stack in _BLOCK_STACKS.items():
        cls = getattr(evoformer, name, None) or getattr(template, name, None)
        if cls is not None:
            found[cls] = stack
    return found


def find_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """``(path, block, stack)`` for every OpenFold block in ``model``, in module order."""
    classes = block_classes()
    return [
        (path, module, classes[type(module)])
        for path, module in model.named_modules()
        if type(module) in classes
    ]


def patch_block(block: torch.nn.Module, path: str, stack: str, options: _Options) -> bool:
    """Give ``block`` its compiled forward (or new options); returns whether it already had one."""
    state = vars(block).get(_STATE_ATTR)
    if isinstance(state, _BlockState) and isinstance(vars(block).get("forward"), PatchedForward):
        state.options = options
        return True
    setattr(block, _STATE_ATTR, _BlockState(stack, path, _stock_params(block), options))
    block.forward = PatchedForward(block, _block_forward)
    return False


def unpatch_blocks(model: torch.nn.Module) -> int:
    """Remove every block patch in ``model``; returns how many blocks were restored."""
    restored = 0
    for module in model.modules():
        if isinstance(vars(module).get(_STATE_ATTR), _BlockState):
            vars(module).pop("forward", None)
            delattr(module, _STATE_ATTR)
            restored += 1
    return restored


def _block_forward(self, *args, **kwargs):
    """The block's class ``forward`` compiled whole (see the module docstring), or as is."""
    state: _BlockState = getattr(self, _STATE_ATTR)
    bound = dict(zip(state.stock_params, args))
    bound.update(kwargs)
    wrong = len(args) > len(state.stock_params) or set(bound) - set(state.stock_params)
    if wrong or len(bound) < len(args) + len(kwargs):
        return type(self).forward(self, *args, **kwargs)  # the class raises the TypeError
    if torch.compiler.is_compiling() or _eager_reason(self, state, bound) is not None:
        return type(self).forward(self, *args, **kwargs)
    # [Note: a compiled block updates its inputs in place]
    options = _block_options(state.options.compile_options)
    in_place = bound.get("inplace_safe") and options["remainder"] == "inductor"
    updated = _UPDATED.get(type(self).__name__, ()) if in_place else ()
    bound.update(chunk_size=None, _attn_chunk_size=None, inplace_safe=False)
    bound = {k: v for k, v in bound.items() if k in state.stock_params}
    tensors = [v for v in bound.values() if isinstance(v, torch.Tensor)]
    fn = compiled_block(type(self), tensors[0].dtype, options)
    with _traceable_forwards(self):
        return fn(self, bound, updated)


@contextlib.contextmanager
def _traceable_forwards(block: torch.nn.Module) -> Iterator[None]:
    """The patched forwards inside ``block`` as bound methods while it runs compiled.

    Dynamo guards an instance ``forward`` by the object's identity, unless it is a bound
    method, which it guards by its function (see [Note: one compile for all blocks]):
    with the picklable :class:`PatchedForward` objects every block would compile its own
    graph. Each is put back, as a new :class:`PatchedForward` of the same function,
    however the call ends.
    """
    swapped = []
    for module in block.modules():
        forward = vars(module).get("forward")
        if module is not block and isinstance(forward, PatchedForward) and is_patched(module):
            vars(module)["forward"] = types.MethodType(forward.__func__, module)
            swapped.append((module, forward.__func__))
    try:
        yield
    finally:
        for module, func in swapped:
            vars(module)["forward"] = PatchedForward(module, func)


def _eager_reason(block, state: _BlockState, bound: dict[str, Any]) -> str | None:
    """Why ``block`` runs its eager forward for these arguments, or None."""
    for name in _EAGER_WHEN_SET:
        if bound.get(name):
            return name
    first = state.stock_params[0]
    x = bound.get(first)
    if not isinstance(x, torch.Tensor):
        return f"{first} is not a tensor"
    others = [v for v in bound.values() if isinstance(v, torch.Tensor) and v is not x]
    # never whether autograd records the call: [Note: compiled blocks in training]
    return _fallback_reason(block, state.options, [x], others)


def _run_block(block, kwargs, updated=()):
    """The block's class forward on keyword arguments: the function that is compiled.
    With ``updated`` (the names of the inputs the block returns updated, in order), the
    results are written into those inputs, which are returned, as OpenFold's in-place
    path does ([Note: a compiled block updates its inputs in place])."""
    out = type(block).forward(block, **kwargs)
    if not updated:
        return out
    results = out if isinstance(out, tuple) else (out,)
    targets = [kwargs[name] for name in updated]
    if len(results) != len(targets) or any(r.shape != t.shape or r.dtype != t.dtype
                                           for r, t in zip(results, targets)):
        return out
    for target, result in zip(targets, results):
        target.copy_(result)
    return tuple(targets) if isinstance(out, tuple) else targets[0]


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


_compiled = openfold_core.CompiledFunctions()


def compiled_block(cls: type, dtype: torch.dtype, options: dict[str, Any]) -> Callable:
    """The Flashlight-compiled :func:`_run_block` for blocks of class ``cls`` in ``dtype``
    with ``options`` (from :func:`_block_options`; see [Note: one compile for all
    blocks]), compiled on first request and cached."""
    name = f"{_snake(cls.__name__)}_{str(dtype).replace('torch.', '')}"
    return _compiled.get((cls, dtype), _run_block, name, options)


def _block_options(compile_options: dict[str, Any]) -> dict[str, Any]:
    """``compile_options`` with the remainder a block compiles with: the caller's, else
    ``FLASHLIGHT_REMAINDER`` (Inductor by default), not the attention cores' eager one
    ([Note: the cores' remainder] in :mod:`~flashlight.integrations.openfold_core`)."""
    return {"remainder": settings.get("remainder"), **compile_options}


def compiled_names() -> list[str]:
    """Names of the compiled block functions so far, e.g. ``evoformer_block_float32``."""
    return _compiled.names()


def clear_compiled() -> None:
    """Forget every compiled block function (the next call compiles again)."""
    _compiled.clear()
