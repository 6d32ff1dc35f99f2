"""``patch_openfold``: run OpenFold's gated self-attention through Flashlight kernels.

What is patched
---------------
OpenFold computes all of its Evoformer attentions with one module,
``openfold.model.primitives.Attention``, owned by

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
=====================================  =============================  ==================

:func:`patch_openfold` sets one instance attribute, ``forward``, on each of those
``Attention`` instances (and a small record, ``_flashlight_openfold``, of what it did).
The new ``forward`` computes the same thing as OpenFold's: projections with the module's
own ``linear_q/k/v/g/o`` layers (the parameters themselves, so ``state_dict()`` is
unchanged and weights loaded later take effect), then the core of
:mod:`flashlight.integrations.openfold_core` compiled by Flashlight into one kernel that
applies the scale, both biases, the softmax, ``@ v`` and the sigmoid gate.
:func:`unpatch_openfold` deletes the attribute; the class's own ``forward`` is back,
bit for bit. Nothing in torch, Triton or OpenFold is modified. The ``forward`` attribute
is a small picklable object (:class:`PatchedForward`) and the record a dataclass, so a
patched model goes through ``copy.deepcopy`` and ``torch.save`` / ``torch.load(...,
weights_only=False)`` and comes back patched, with its options (loading it needs
Flashlight importable; unpatch before saving to write a file that loads without it). Modules are found by type,
not by path, so the same patch covers OpenFold 0.0.1 (``blocks[i].core.tri_att_start``)
and 2.x (``blocks[i].pair_stack.tri_att_start``).

Not patched: the extra-MSA stack's column attention (``MSAColumnGlobalAttention``, a
different computation), ``TemplatePointwiseAttention`` and the structure module's IPA.

OpenFold's flags
----------------
The owners keep computing the mask and pair biases and keep chunking; only the
attention itself changes. Flags the owners pass on to ``Attention.forward``:

- ``use_memory_efficient_kernel``, ``use_lma`` (with ``lma_q_chunk_size`` /
  ``lma_kv_chunk_size``), and upstream 2.x's ``use_deepspeed_evo_attention`` and
  ``use_cuequivariance_attention`` choose another implementation of the same attention;
  the Flashlight kernel replaces all of them, so they are accepted and ignored.
- ``use_flash`` with ``flash_mask``: the key mask becomes the usual mask bias
  ``inf * (mask - 1)`` (``inf`` taken from the owner module), computed by the kernel like
  the other biases.
- Any other keyword is accepted and ignored with a one-time warning.

``chunk_size`` never reaches ``Attention``: the owners split the batch of rows into
chunks before calling it and reassemble the result. The fused kernel does not need this
for memory (it never materialises ``[*, H, Q, K]``), but the patch leaves the owners
untouched, so a model run with ``chunk_size`` set still chunks; the patched forward
works on those chunked inputs, whose batch dimensions are flattened to one and whose pair
bias stays ``[1, H, Q, K]``. For speed, run patched models with ``chunk_size=None``.

When the stock forward runs instead
-----------------------------------
The stock ``Attention.forward`` handles the call (with a one-time warning naming the
reason) when: tensors are on the CPU and ``TRITON_INTERPRET`` is not set (or raise, with
``fallback_on_cpu=False``); the dtype is neither float32 nor bfloat16; autograd is
recording (Flashlight kernels are forward-only: wrap inference in ``torch.no_grad()``);
more than two biases are passed. OpenFold's training-time ``_chunk_logits`` path of
``MSAAttention`` never calls ``Attention.forward`` and is unaffected.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import warnings
from typing import Any, Iterable, Iterator, Mapping

import torch

from flashlight.integrations import openfold_core

KINDS = (
    "msa_row_attention_with_pair_bias",
    "msa_column_attention",
    "triangle_attention_start",
    "triangle_attention_end",
)
STACKS = ("evoformer", "extra_msa", "template_pair", "other")

_STATE_ATTR = "_flashlight_openfold"

# Flags that select another implementation of the same attention: ignored silently.
_IGNORED_FLAGS = frozenset(
    {
        "use_memory_efficient_kernel",
        "use_lma",
        "lma_q_chunk_size",
        "lma_kv_chunk_size",
        "use_deepspeed_evo_attention",
        "use_cuequivariance_attention",
    }
)
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def reset_warnings() -> None:
    """Let every one-time warning of this module be given again."""
    with _warned_lock:
        _warned.clear()


@dataclasses.dataclass
class PatchReport:
    """What :func:`patch_openfold` replaced.

    ``counts[stack][kind]`` is the number of patched attention modules of each kind in
    each stack (``evoformer``, ``extra_msa``, ``template_pair``, or ``other`` for modules
    outside OpenFold's stack classes); ``paths`` names them; ``already_patched`` counts
    those that a previous call had patched (their options are updated).
    """

    counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    paths: list[str] = dataclasses.field(default_factory=list)
    already_patched: int = 0
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

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
        return "\n".join(lines)


@dataclasses.dataclass
class _Options:
    fallback_on_cpu: bool = True
    compile_options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _PatchState:
    """Per-module record of a patch: stored on the ``Attention`` instance."""

    kind: str
    stack: str
    path: str
    inf: float  # the owner's mask value, for ``flash_mask``
    stock_params: tuple[str, ...]  # parameter names of the class's forward after ``self``
    options: _Options


# -- finding modules -----------------------------------------------------------------


def _openfold_classes() -> dict[str, type]:
    try:
        from openfold.model.evoformer import EvoformerStack, ExtraMSAStack
        from openfold.model.msa import MSAAttention, MSAColumnAttention
        from openfold.model.primitives import Attention
        from openfold.model.template import TemplatePairStack
        from openfold.model.triangular_attention import TriangleAttention
    except ImportError as err:
        raise ImportError(
            f"patch_openfold needs OpenFold's model package (openfold.model): {err}"
        ) from err
    return {
        "Attention": Attention,
        "MSAAttention": MSAAttention,
        "MSAColumnAttention": MSAColumnAttention,
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
        if kind is None:
            continue
        attention = getattr(module, "mha", None)
        if not isinstance(attention, cls["Attention"]) or id(attention) in seen:
            continue
        seen.add(id(attention))
        stack = "other"
        for ancestor in reversed(ancestors):
            names = [name for name, t in stack_types if isinstance(ancestor, t)]
            if names:
                stack = names[0]
                break
        mha_path = f"{path}.mha" if path else "mha"
        targets.append(_Target(mha_path, kind, stack, module, attention))
    return targets


def _stock_params(attention: torch.nn.Module) -> tuple[str, ...]:
    """Names of the class ``forward``'s parameters after ``self``."""
    params = inspect.signature(type(attention).forward).parameters
    names = [
        p.name
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    return tuple(names[1:])


class PatchedForward:
    """The ``forward`` that :func:`patch_openfold` sets on a module instance.

    Calling it calls ``__func__(__self__, *args, **kwargs)``, as a bound method would.
    Unlike a bound method of a function that the module's class lacks, it pickles (by
    reference to a function of this module), so a patched model goes through
    ``torch.save`` / ``torch.load`` and ``copy.deepcopy``, and the copy's forward is
    bound to the copy.
    """

    def __init__(self, module: torch.nn.Module, func):
        self.__self__ = module
        self.__func__ = func

    def __call__(self, *args, **kwargs):
        return self.__func__(self.__self__, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<Flashlight-patched forward of {type(self.__self__).__name__}>"


def is_patched(module: torch.nn.Module) -> bool:
    """Whether ``module`` (an OpenFold ``Attention`` or its owner) carries a Flashlight patch."""
    forward = vars(module).get("forward") if hasattr(module, "__dict__") else None
    return isinstance(forward, PatchedForward) and hasattr(module, _STATE_ATTR)


def _foreign_forward(module: torch.nn.Module) -> bool:
    """Whether ``module`` has an instance ``forward`` that is not this patch's."""
    return "forward" in vars(module) and not is_patched(module)


# -- public API ----------------------------------------------------------------------


def patch_openfold(
    model: torch.nn.Module,
    *,
    kinds: Iterable[str] | None = None,
    fallback_on_cpu: bool = True,
    compile_options: dict[str, Any] | None = None,
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

    Raises:
        ValueError: ``model`` holds no OpenFold attention module (of the chosen kinds),
            ``kinds`` is empty or names an unknown kind, or a module to patch already has
            an instance ``forward`` set by something else (then nothing is patched).
        TypeError: ``model`` is not a module, ``kinds`` is neither a string nor an
            iterable of strings, or ``compile_options`` is not a dict of known options.
        ImportError: OpenFold is not installed.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"patch_openfold expects a torch.nn.Module, not {type(model).__name__}")
    wanted = _kinds_arg(kinds)
    options = _Options(bool(fallback_on_cpu), _compile_options_arg(compile_options))

    targets = _find_targets(model)
    if not targets:
        raise ValueError(
            f"patch_openfold found no OpenFold attention module in {type(model).__name__}: "
            "expected MSARowAttentionWithPairBias, MSAColumnAttention or TriangleAttention "
            "modules from openfold.model (an AlphaFold model, an Evoformer stack or block, "
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
    if taken:
        raise ValueError(
            f"patch_openfold: {taken[0]} already has a forward of its own set on the instance "
            "(by another tool's hook or patch); remove it first, nothing was patched"
        )

    report = PatchReport(options=dataclasses.asdict(options))
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
            attention.forward = PatchedForward(attention, _patched_forward)
        report._add(target.stack, target.kind, target.path)
    return report


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
    """Undo :func:`patch_openfold` on ``model``; returns how many modules were restored.

    The class's own ``forward`` is used again, so outputs are bit-identical to a model
    that was never patched. Unpatching an unpatched model does nothing.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unpatch_openfold expects a torch.nn.Module, not {type(model).__name__}")
    restored = 0
    for module in model.modules():
        if is_patched(module):
            del module.forward
            delattr(module, _STATE_ATTR)
            restored += 1
    return restored


# -- the replacement forward ---------------------------------------------------------


def _bind(state: _PatchState, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Positional flags after ``biases`` named as the installed OpenFold names them."""
    flags = dict(kwargs)
    names = state.stock_params[3:]  # after q_x, kv_x, biases
    if len(args) > len(names):
        raise TypeError(f"Attention.forward takes at most {3 + len(names)} positional arguments")
    for name, value in zip(names, args):
        if name in flags:
            raise TypeError(f"Attention.forward got multiple values for argument {name!r}")
        flags[name] = value
    return flags


def _stock_forward(attention, q_x, kv_x, biases, flags: dict[str, Any]):
    """The class's own forward, with the flags it knows."""
    state: _PatchState = getattr(attention, _STATE_ATTR)
    known = {k: v for k, v in flags.items() if k in state.stock_params}
    return type(attention).forward(attention, q_x, kv_x, biases, **known)


def _fallback_reason(attention, state: _PatchState, q_x, kv_x, biases) -> str | None:
    tensors = [q_x, kv_x, *biases]
    device = q_x.device
    if device.type == "cpu":
        import flashlight

        if not flashlight.settings.get("interpret"):
            if not state.options.fallback_on_cpu:
                raise RuntimeError(
                    "Flashlight-patched OpenFold attention got CPU tensors, and Triton kernels "
                    "run on CPU only with TRITON_INTERPRET=1; move the model to a GPU, set "
                    "TRITON_INTERPRET=1 before importing triton, or patch with "
                    "fallback_on_cpu=True"
                )
            return "cpu"
    elif device.type != "cuda":
        return f"device:{device.type}"
    if q_x.dtype not in _SUPPORTED_DTYPES or kv_x.dtype != q_x.dtype:
        return f"dtype:{q_x.dtype}"
    if len(biases) > openfold_core.MAX_BIASES:
        return "biases"
    if torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors)
        or any(p.requires_grad for p in attention.parameters())
    ):
        return "grad"
    return None


_FALLBACK_MESSAGES = {
    "cpu": "CPU tensors and TRITON_INTERPRET is not set: Flashlight kernels need a GPU or "
    "the Triton interpreter; running OpenFold's stock attention instead",
    "grad": "autograd is recording and Flashlight's OpenFold kernels are forward-only: "
    "running OpenFold's stock attention (wrap inference in torch.no_grad())",
    "biases": f"more than {openfold_core.MAX_BIASES} attention biases: running OpenFold's "
    "stock attention",
}


def _patched_forward(self, q_x, kv_x, biases=None, *args, **kwargs):
    """OpenFold ``Attention.forward`` with the attention core as one Flashlight kernel.

    Args:
        q_x: ``[*, Q, C_q]`` query input; kv_x: ``[*, K, C_k]`` key/value input.
        biases: tensors broadcasting to ``[*, H, Q, K]`` (at most two).
        *args, **kwargs: OpenFold's flags (see the module docstring).
    Returns:
        ``[*, Q, C_q]``, as the stock forward.
    """
    state: _PatchState = getattr(self, _STATE_ATTR)
    flags = _bind(state, args, kwargs)
    biases = [b for b in biases if b is not None] if biases is not None else []

    for name in flags:
        if name not in _IGNORED_FLAGS and name not in ("use_flash", "flash_mask"):
            _warn_once(
                f"flag:{name}",
                f"Flashlight-patched OpenFold attention ignores the unknown argument {name!r}",
            )
    flash_mask = flags.get("flash_mask")
    use_flash = bool(flags.get("use_flash", False))

    reason = _fallback_reason(self, state, q_x, kv_x, biases)
    if reason is not None:
        _warn_once(
            f"fallback:{reason}",
            _FALLBACK_MESSAGES.get(
                reason, f"{reason}: running OpenFold's stock attention instead of Flashlight"
            ),
        )
        return _stock_forward(self, q_x, kv_x, biases or None, flags)

    if use_flash and flash_mask is not None:
        # [*, K] key mask -> [*, 1, 1, K]
        biases.append((state.inf * (flash_mask.to(q_x.dtype) - 1))[..., None, None, :])
        if len(biases) > openfold_core.MAX_BIASES:
            _warn_once("fallback:biases", _FALLBACK_MESSAGES["biases"])
            return _stock_forward(self, q_x, kv_x, biases[:-1] or None, flags)

    fn, core_args = core_call(self, q_x, kv_x, biases, compiled=True)
    # [*, Q, H, C]
    o = fn(*core_args)
    # [*, Q, H * C]
    o = o.reshape(o.shape[:-2] + (-1,))
    # [*, Q, C_q]
    return self.linear_o(o)


def core_call(attention, q_x, kv_x, biases, *, compiled: bool = False):
    """The core function for ``attention`` (an OpenFold ``Attention``) and its arguments.

    Runs the module's projections on ``q_x`` / ``kv_x`` and returns ``(fn, args)`` such
    that ``fn(*args)`` is the gated attention output ``[*, Q, H, C]`` before
    ``linear_o``. ``fn`` is the plain PyTorch function, or with ``compiled=True`` its
    Flashlight-compiled form. Handy with :func:`flashlight.explain`::

        fn, args = core_call(block.msa_att_row.mha, m, m, [mask_bias, pair_bias])
        print(flashlight.explain(fn, *args))
    """
    biases = list(biases or [])
    heads = attention.no_heads
    # [*, Q/K, H * C]
    q = attention.linear_q(q_x)
    k = attention.linear_k(kv_x)
    v = attention.linear_v(kv_x)
    # [*, H, Q/K, C]
    q = q.view(q.shape[:-1] + (heads, -1)).transpose(-2, -3)
    k = k.view(k.shape[:-1] + (heads, -1)).transpose(-2, -3)
    v = v.view(v.shape[:-1] + (heads, -1)).transpose(-2, -3)
    args = [q, k, v, *biases]
    gated = attention.linear_g is not None
    if gated:
        g = attention.linear_g(q_x)
        # [*, Q, H, C] gate logits; the sigmoid is part of the core
        args.append(g.view(g.shape[:-1] + (heads, -1)))
    if compiled:
        state = getattr(attention, _STATE_ATTR, None)
        options = state.options.compile_options if state is not None else {}
        fn = openfold_core.compiled_core(
            len(biases), gated, heads, q.shape[-1], q.dtype, options
        )
    else:
        fn = openfold_core.attention_core(len(biases), gated)
    return fn, tuple(args)
