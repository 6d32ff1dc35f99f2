"""``patch_openfold``: run OpenFold's MSA and triangle attention through Flashlight kernels.

What is patched
---------------
OpenFold computes its Evoformer attentions with one module,
``openfold.model.primitives.Attention``, and the extra-MSA column attention with
``GlobalAttention``, owned by

=====================================  =============================  ==================
owner (found by type)                  kind in the report             biases
=====================================  =============================  ==================
``MSARowAttentionWithPairBias``        ``msa_row_attention_with_      mask, pair
(Evoformer and extra-MSA stacks)       pair_bias``
``MSAColumnAttention`` (Evoformer;     ``msa_column_attention``       mask
it wraps an ``MSAAttention`` on the
transposed MSA)
``TriangleAttention`` with             ``triangle_attention_start``   mask, triangle
``starting=True`` (Evoformer,
extra-MSA and template pair stacks)
``TriangleAttention`` with             ``triangle_attention_end``     mask, triangle
``starting=False`` (input transposed),
or named ``*end*`` (0.0.1's Evoformer
transposes around a starting node)
``MSAColumnGlobalAttention`` (extra-   ``msa_global_column_           mask; mean-pooled
MSA stack; its ``GlobalAttention``)    attention``                    query, one shared
                                                                      key/value head
=====================================  =============================  ==================

:func:`patch_openfold` sets one instance attribute, ``forward``, on each of those
``Attention`` instances and on their owners (see "Chunking"), and a small record,
``_flashlight_openfold``, of what it did (the forwards are in
:mod:`flashlight.integrations.openfold_forward`). The new ``forward`` computes the same
thing as OpenFold's: projections with the module's own ``linear_q/k/v/g/o`` layers (the
parameters themselves, so ``state_dict()`` is unchanged and weights loaded later take
effect), then the core of :mod:`flashlight.integrations.openfold_core` compiled by
Flashlight into one kernel that applies the scale, both biases, the softmax, ``@ v`` and
the sigmoid gate. :func:`unpatch_openfold` deletes the attributes; the classes' own
``forward`` is back, bit for bit. Nothing in torch, Triton or OpenFold is modified.
Modules are found by type, not by path, so the same patch covers OpenFold 0.0.1
(``blocks[i].core.tri_att_start``) and 2.x (``blocks[i].pair_stack.tri_att_start``).

The ``forward`` attribute is a small picklable object (:class:`PatchedForward`) and the
record a dataclass, so a patched model goes through ``copy.deepcopy`` and ``torch.save``
/ ``torch.load(..., weights_only=False)`` and comes back patched, with its options
(loading it needs Flashlight importable; unpatch before saving to write a file that
loads without it). ``torch.nn.DataParallel`` replicas share the original's forward
attributes and are not supported.

``GlobalAttention`` is patched the same way: its pooled query and projections keep the
module's layers, the attention over the sequences is one kernel, and the gate, a product
over every sequence, runs after it in PyTorch (see [Note: global column attention] in
:mod:`flashlight.integrations.openfold_core`). Not patched: ``TemplatePointwiseAttention``
and the structure module's IPA.

OpenFold's flags
----------------
The owners keep computing the mask and pair biases; only the attention itself changes.
Flags the owners pass on to ``Attention.forward``:

- ``use_memory_efficient_kernel``, ``use_lma`` (with ``lma_q_chunk_size`` /
  ``lma_kv_chunk_size``), and upstream 2.x's ``use_deepspeed_evo_attention`` and
  ``use_cuequivariance_attention`` choose another implementation of the same attention;
  the Flashlight kernel replaces all of them, so they are accepted and ignored.
- ``use_flash`` with ``flash_mask``: the key mask becomes the usual mask bias
  ``inf * (mask - 1)`` (``inf`` taken from the owner module), computed by the kernel like
  the other biases.
- Any other keyword is accepted and ignored with a one-time warning.

Chunking
--------
With ``chunk_size`` set, the owners split their batch of rows into chunks before calling
``Attention`` (OpenFold's ``chunk_layer``), which would launch the kernel once per chunk
of a few rows, each on strided copies of its inputs. The fused kernel never stores the
``[*, H, Q, K]`` scores, so chunking would only add launches: the patch also sets an
instance ``forward`` on each owner that calls the class's ``forward`` with
``chunk_size=None`` (given by position or keyword; other arguments pass through, unknown
keywords are dropped with a one-time warning), so each owner call is one kernel launch.
When the attention will run the stock code instead (see below), the owner chunks as
asked. Unchunked, an owner computes its projections (``q, k, v`` and the gate, each the
size of its input times ``H * C / C_in``) and the layer-normed input for the whole batch
at once, where chunked it held them per chunk; the biases (``[*, 1, H, L, L]``) are
computed whole either way. Other chunked layers (transitions, outer product mean) keep
chunking. Measured on an H200 in bfloat16 with ``chunk_size=4``: MSA row attention over
512 x 256 (H 8, c 32) takes 1.3 ms patched where stock takes 75 (4.2 unchunked), triangle
attention at 256 residues 0.8 ms where stock takes 31 (1.2 unchunked).

CUDA graphs
-----------
With ``cuda_graphs=True`` (the default) each ``EvoformerStack`` and ``ExtraMSAStack``
and the ``StructureModule`` also get an instance ``forward`` that, on a GPU without
autograd, records the module's call into a CUDA graph on the second call of each input
shape and replays it on later calls, so the host's Python of the unpatched modules no
longer paces the device
([Note: CUDA graphs for the stacks] in :mod:`flashlight.integrations.openfold_graphs`).
With the attentions fused, a pass is otherwise bound by the host: ``model_1`` at 256
residues, 512 + 5120 MSA rows, on an H200, 615 ms without graphs and 325 ms with them
in bf16 (stock 926), 568 and 488 ms in TF32 (stock 1184)
(``bench/results/evoformer_peers.json``). ``cuda_graphs=False`` leaves the stacks eager.

When the stock forward runs instead
-----------------------------------
The stock ``Attention.forward`` (or ``GlobalAttention.forward``) handles the call (with
a one-time warning naming the reason) when: tensors are on the CPU and ``TRITON_INTERPRET`` is not set (or raise, with
``fallback_on_cpu=False``); the dtype is neither float32 nor bfloat16; more than two
biases are passed. Under autograd (training, fine-tuning) the patched modules run
Flashlight's kernels forward and backward: the backward kernels are derived by the
compiler from the same attention, and the forward saves no score-sized tensor for them
(see [Note: what the backward saves] in :mod:`flashlight.partition`). OpenFold's training-time ``_chunk_logits`` path of
``MSAAttention`` never calls ``Attention.forward`` and is unaffected.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Iterable, Iterator, Mapping

import torch

from flashlight import prepare
from flashlight.integrations import openfold_blocks, openfold_core, openfold_graphs
from flashlight.integrations.openfold_blocks import SCOPES
from flashlight.integrations.openfold_forward import (  # noqa: F401 - public names
    _STATE_ATTR,
    PatchedForward,
    _foreign_forward,
    _global_forward,
    _OwnerState,
    _Options,
    _owner_forward,
    _patched_forward,
    _PatchState,
    _stock_params,
    core_call,
    global_core_call,
    is_patched,
    reset_warnings,
)

KINDS = (
    "msa_row_attention_with_pair_bias",
    "msa_column_attention",
    "triangle_attention_start",
    "triangle_attention_end",
    "msa_global_column_attention",
)
_GLOBAL = "msa_global_column_attention"
STACKS = ("evoformer", "extra_msa", "template_pair", "other")

@dataclasses.dataclass
class PatchReport:
    """What :func:`patch_openfold` replaced.

    ``counts[stack][kind]`` is the number of patched attention modules of each kind in
    each stack (``evoformer``, ``extra_msa``, ``template_pair``, or ``other`` for modules
    outside OpenFold's stack classes); ``paths`` names them; ``already_patched`` counts
    those that a previous call had patched (their options are updated). ``scope`` is
    ``"attention"`` or ``"block"``; with ``"block"``, ``blocks[stack]`` counts the blocks
    compiled whole (:mod:`~flashlight.integrations.openfold_blocks`). ``cuda_graphs``:
    how many modules (stacks, structure module) replay CUDA graphs (:mod:`~flashlight.integrations.openfold_graphs`).
    """

    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    paths: list[str] = dataclasses.field(default_factory=list)
    already_patched: int = 0
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    scope: str = "attention"
    blocks: dict[str, int] = dataclasses.field(default_factory=dict)
    cuda_graphs: int = 0

    @property
    def total(self) -> int:
        """Number of patched attention modules."""
        return sum(n for kinds in self.counts.values() for n in kinds.values())

    @property
    def by_kind(self) -> dict[str, int]:
        """Counts per kind, summed over stacks."""
        out: dict[str, int] = {}
        for kinds in self.counts.values():
            for kind, n in kinds.items():
                out[kind] = out.get(kind, 0) + n
        return out

    def _add(self, stack: str, kind: str, path: str) -> None:
        kinds = self.counts.setdefault(stack, {})
        kinds[kind] = kinds.get(kind, 0) + 1
        self.paths.append(path)

    def __str__(self) -> str:
        lines = [f"Flashlight patched {self.total} OpenFold attention module(s)"]
        if self.already_patched:
            lines[0] += f" ({self.already_patched} already patched)"
        for stack in STACKS:
            for kind in KINDS:
                n = self.counts.get(stack, {}).get(kind, 0)
                if n:
                    lines.append(f"  {stack:<14} {kind:<34} {n}")
        if self.scope == "block":
            blocks = ", ".join(f"{n} {stack}" for stack, n in self.blocks.items())
            lines.append(f"  whole blocks compiled: {sum(self.blocks.values())} ({blocks or 'none'})")
        if self.cuda_graphs:
            lines.append(f"  modules replayed as CUDA graphs: {self.cuda_graphs}")
        return "\n".join(lines)


# -- finding modules -----------------------------------------------------------------


def _openfold_classes() -> dict[str, type]:
    try:
        from openfold.model.evoformer import EvoformerStack, ExtraMSAStack
        from openfold.model.msa import (
            MSAAttention,
            MSAColumnAttention,
            MSAColumnGlobalAttention,
        )
        from openfold.model.primitives import Attention, GlobalAttention
        from openfold.model.template import TemplatePairStack
        from openfold.model.triangular_attention import TriangleAttention
    except ImportError as err:
        raise ImportError(
            f"patch_openfold needs OpenFold's model package (openfold.model): {err}"
        ) from err
    return {
        "Attention": Attention,
        "GlobalAttention": GlobalAttention,
        "MSAAttention": MSAAttention,
        "MSAColumnAttention": MSAColumnAttention,
        "MSAColumnGlobalAttention": MSAColumnGlobalAttention,
        "TriangleAttention": TriangleAttention,
        "EvoformerStack": EvoformerStack,
        "ExtraMSAStack": ExtraMSAStack,
        "TemplatePairStack": TemplatePairStack,
    }


@dataclasses.dataclass
class _Target:
    path: str  # of the Attention instance
    kind: str
    stack: str
    owner: torch.nn.Module
    attention: torch.nn.Module
    attribute: str = "mha"  # the attention's name in the owner


def _walk(
    module: torch.nn.Module, prefix: str, ancestors: tuple[torch.nn.Module, ...]
) -> Iterator[tuple[str, torch.nn.Module, tuple[torch.nn.Module, ...]]]:
    yield prefix, module, ancestors
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        yield from _walk(child, path, ancestors + (module,))


def _find_targets(model: torch.nn.Module) -> list[_Target]:
    """Every OpenFold gated self-attention in ``model``, in module order."""
    cls = _openfold_classes()
    stack_types = (
        ("evoformer", cls["EvoformerStack"]),
        ("extra_msa", cls["ExtraMSAStack"]),
        ("template_pair", cls["TemplatePairStack"]),
    )
    targets: list[_Target] = []
    seen: set[int] = set()
    for path, module, ancestors in _walk(model, "", ()):
        kind = None
        if isinstance(module, cls["TriangleAttention"]):
            # OpenFold 0.0.1's Evoformer builds its ending-node attention as a starting
            # node module and transposes the pair representation around the call, so
            # the attribute name tells the kind too.
            ending = not module.starting or "end" in path.rsplit(".", 1)[-1]
            kind = "triangle_attention_end" if ending else "triangle_attention_start"
        elif isinstance(module, cls["MSAAttention"]):
            if getattr(module, "pair_bias", False):
                kind = "msa_row_attention_with_pair_bias"
            elif ancestors and isinstance(ancestors[-1], cls["MSAColumnAttention"]):
                kind = "msa_column_attention"
        elif isinstance(module, cls["MSAColumnGlobalAttention"]):
            kind = _GLOBAL
        if kind is None:
            continue
        attribute, expected = ("mha", "Attention")
        if kind == _GLOBAL:
            attribute, expected = ("global_attention", "GlobalAttention")
        attention = getattr(module, attribute, None)
        if not isinstance(attention, cls[expected]) or id(attention) in seen:
            continue
        seen.add(id(attention))
        stack = "other"
        for ancestor in reversed(ancestors):
            names = [name for name, t in stack_types if isinstance(ancestor, t)]
            if names:
                stack = names[0]
                break
        mha_path = f"{path}.{attribute}" if path else attribute
        targets.append(_Target(mha_path, kind, stack, module, attention, attribute))
    return targets


# -- public API ----------------------------------------------------------------------


def patch_openfold(
    model: torch.nn.Module,
    *,
    kinds: Iterable[str] | None = None,
    fallback_on_cpu: bool = True,
    compile_options: dict[str, Any] | None = None,
    scope: str = "attention",
    cuda_graphs: bool = True,
) -> PatchReport:
    """Make every OpenFold gated self-attention in ``model`` run as a Flashlight kernel.

    Patches ``model`` (an ``AlphaFold`` model or any module containing OpenFold's
    attention modules) in place and returns a :class:`PatchReport`. Calling it again is
    harmless: already patched modules are counted and get the new options (modules
    patched earlier and not of the kinds asked for now stay patched).

    Args:
        model: the module to patch.
        kinds: which module kinds to patch: one name of :data:`KINDS` or an iterable of
            them (default: all).
        fallback_on_cpu: for CPU tensors when ``TRITON_INTERPRET`` is not set, run the
            stock attention with a one-time warning (True) or raise (False).
        compile_options: passed to :func:`flashlight.compile`, e.g.
            ``{"autotune": False}``.
        scope: ``"attention"``: compile the attention cores only; ``"block"``: also
            compile each Evoformer, extra-MSA and template pair block whole (see
            :mod:`~flashlight.integrations.openfold_blocks`). Patching again with
            ``"attention"`` removes the block patches.
        cuda_graphs: also replay each Evoformer and extra-MSA stack and the structure
            module in ``model`` as a CUDA graph, recorded on the second call of each input shape, when it runs on
            a GPU without autograd (:mod:`~flashlight.integrations.openfold_graphs`;
            on by default: ``model_1`` at 256 residues on an H200 runs a pass in 325 ms
            instead of 615 in bf16, 488 instead of 568 in TF32). A recorded graph keeps its
            memory pool, about the eager call's working memory, until the module records
            again or is unpatched. Patching again with ``cuda_graphs=False`` removes it.

    Raises:
        ValueError: ``model`` holds no OpenFold attention module (of the chosen kinds),
            ``kinds`` is empty or names an unknown kind, ``scope`` is unknown, or a module
            to patch already has an instance ``forward`` set by something else (then
            nothing is patched).
        TypeError: ``model`` is not a module, ``kinds`` is neither a string nor an
            iterable of strings, or ``compile_options`` is not a dict of known options.
        ImportError: OpenFold is not installed.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"patch_openfold expects a torch.nn.Module, not {type(model).__name__}")
    wanted = _kinds_arg(kinds)
    if scope not in SCOPES:
        raise ValueError(f"patch_openfold: unknown scope {scope!r}; choose from {list(SCOPES)}")
    options = _Options(bool(fallback_on_cpu), _compile_options_arg(compile_options))

    targets = _find_targets(model)
    if not targets:
        raise ValueError(
            f"patch_openfold found no OpenFold attention module in {type(model).__name__}: "
            "expected MSARowAttentionWithPairBias, MSAColumnAttention, TriangleAttention or "
            "MSAColumnGlobalAttention modules from openfold.model (an AlphaFold model, an Evoformer stack or block, "
            "or the modules themselves)"
        )
    chosen = [t for t in targets if t.kind in wanted]
    if not chosen:
        found = sorted({t.kind for t in targets})
        raise ValueError(
            f"patch_openfold: {type(model).__name__} has OpenFold attention modules of kinds "
            f"{found}, none of the requested kinds {list(wanted)}"
        )

    taken = [t.path for t in chosen if _foreign_forward(t.attention)]
    taken += [t.path.rsplit(".", 1)[0] for t in chosen if _foreign_forward(t.owner)]
    blocks = openfold_blocks.find_blocks(model) if scope == "block" else []
    taken += [path for path, block, _ in blocks if _foreign_forward(block)]
    if taken:
        raise ValueError(
            f"patch_openfold: {taken[0]} already has a forward of its own set on the instance "
            "(by another tool's hook or patch); remove it first, nothing was patched"
        )

    report = PatchReport(options=dataclasses.asdict(options), scope=scope)
    for target in chosen:
        attention = target.attention
        if is_patched(attention):
            getattr(attention, _STATE_ATTR).options = options
            report.already_patched += 1
        else:
            state = _PatchState(
                kind=target.kind,
                stack=target.stack,
                path=target.path,
                inf=float(getattr(target.owner, "inf", 1e9)),
                stock_params=_stock_params(attention),
                options=options,
            )
            setattr(attention, _STATE_ATTR, state)
            # An instance attribute shadows the class's forward; nn.Module.__call__
            # (hooks included) then calls it.
            forward = _global_forward if target.kind == _GLOBAL else _patched_forward
            attention.forward = PatchedForward(attention, forward)
        _patch_owner(target)
        report._add(target.stack, target.kind, target.path)
    if scope == "attention":
        openfold_blocks.unpatch_blocks(model)
    for path, block, stack in blocks:
        openfold_blocks.patch_block(block, path, stack, options)
        report.blocks[stack] = report.blocks.get(stack, 0) + 1
    if cuda_graphs:
        openfold_graphs.install(model)
    else:
        openfold_graphs.uninstall(model)
    report.cuda_graphs = len(openfold_graphs.installed(model))
    prepare.start()  # [Note: a process's one-time costs], while the caller loads its inputs
    # [Note: preloading the cores] in openfold_core, on a thread as well
    if scope == "attention":  # a block compiled whole calls the plain cores inside its graph
        openfold_core.preload_listed(_core_shapes(chosen), options.compile_options)
    return report


def _core_shapes(targets) -> set[tuple[int, int, torch.dtype]]:
    """(heads, head width, dtype) of the patched attentions whose weights are on a GPU."""
    shapes = set()
    for target in targets:
        weight = getattr(getattr(target.attention, "linear_q", None), "weight", None)
        heads, width = getattr(target.attention, "no_heads", None), getattr(target.attention, "c_hidden", None)
        if isinstance(weight, torch.Tensor) and weight.is_cuda and heads and width:
            shapes.add((int(heads), int(width), weight.dtype))
    return shapes


def _patch_owner(target: _Target) -> None:
    """Make ``target.owner`` skip its chunking while its attention runs fused."""
    owner = target.owner
    if is_patched(owner):
        return
    params = inspect.signature(type(owner).forward).parameters
    if "chunk_size" not in params:
        return
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params.values())
    setattr(owner, _STATE_ATTR, _OwnerState(target.attribute, _stock_params(owner), var_keyword))
    owner.forward = PatchedForward(owner, _owner_forward)


def _kinds_arg(kinds: Iterable[str] | str | None) -> tuple[str, ...]:
    """``kinds`` checked: a tuple of known kind names (one string is one kind)."""
    if kinds is None:
        return KINDS
    if isinstance(kinds, str):
        kinds = (kinds,)
    try:
        wanted = tuple(kinds)
    except TypeError:
        raise TypeError(
            f"patch_openfold: kinds must be a kind name or an iterable of kind names, "
            f"not {type(kinds).__name__}"
        ) from None
    for kind in wanted:
        if not isinstance(kind, str):
            raise TypeError(f"patch_openfold: kinds must be strings, not {kind!r}")
    if not wanted:
        raise ValueError(f"patch_openfold: kinds is empty; choose from {list(KINDS)}")
    unknown = sorted(set(wanted) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown OpenFold attention kinds {unknown}; choose from {list(KINDS)}")
    return wanted


def _compile_options_arg(compile_options) -> dict[str, Any]:
    """``compile_options`` checked now, not at the first forward."""
    if compile_options is None:
        return {}
    if not isinstance(compile_options, Mapping):
        raise TypeError(
            f"patch_openfold: compile_options must be a dict, not {type(compile_options).__name__}"
        )
    from flashlight.backend import KNOWN_OPTIONS

    unknown = sorted(set(compile_options) - KNOWN_OPTIONS)
    if unknown:
        raise TypeError(
            f"patch_openfold: unknown compile_options {unknown}; known: {sorted(KNOWN_OPTIONS)}"
        )
    return dict(compile_options)


def unpatch_openfold(model: torch.nn.Module) -> int:
    """Undo :func:`patch_openfold` on ``model``; returns how many attention modules were
    restored (their owners, in ``model``, are restored with them).

    The classes' own ``forward`` is used again, so outputs are bit-identical to a model
    that was never patched; blocks compiled whole (``scope="block"``) are restored too.
    Unpatching an unpatched model does nothing.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unpatch_openfold expects a torch.nn.Module, not {type(model).__name__}")
    restored = 0
    openfold_graphs.uninstall(model)
    for module in model.modules():
        if is_patched(module):
            restored += isinstance(getattr(module, _STATE_ATTR), _PatchState)
            del module.forward
            delattr(module, _STATE_ATTR)
    return restored


