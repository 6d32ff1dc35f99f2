"""The forwards that :func:`flashlight.integrations.openfold.patch_openfold` installs.

A patched module carries two instance attributes: ``forward``, a :class:`PatchedForward`
calling one of the functions below with the module, and ``_flashlight_openfold``, a
dataclass recording the patch. Both pickle, so patched models survive ``torch.save``.
See :mod:`flashlight.integrations.openfold` for what is patched and when the stock code
runs instead.
"""
from __future__ import annotations

import dataclasses
import inspect
import threading
import warnings
from typing import Any

import torch

from flashlight.integrations import openfold_choice, openfold_core

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
class _Options:
    fallback_on_cpu: bool = True
    compile_options: dict[str, Any] = dataclasses.field(default_factory=dict)


class FusedProjections:
    """The projections of one OpenFold ``Attention`` that read the same input, as one
    weight matrix: one GEMM instead of two to four (see [Note: fused projections]).

    [Note: fused projections]
    ``linear_q``, ``linear_k``, ``linear_v`` and ``linear_g`` are plain linear layers;
    those applied to the same tensor (all four in self-attention, where ``q_x is kv_x``;
    ``q``/``g`` and ``k``/``v`` otherwise) are computed as one ``F.linear`` with their
    weights stacked along the output dim (and their biases, zeros where a layer has
    none). Each output column is the same dot product as before, so the results are the
    stock ones up to the GEMM's rounding; the outputs are column slices of one tensor,
    which the kernel reads in place (the head width stays contiguous). One GEMM reads
    the input once instead of once per layer, and issues one launch instead of several:
    at N_res 256 the patched attentions are bound by the host's launch rate.

    Under autograd (training) the stacked weights are built on every call, inside
    autograd's graph, so gradients reach each layer's own parameters. Otherwise they
    are cached on the module's patch and rebuilt when any layer's
    weight or bias changes (another tensor, or an in-place update, which bumps the
    tensor's version counter), so loading weights or fine-tuning keeps them right. The
    cache is not pickled or copied: a copy of the module builds its own.
    """

    def __init__(self):
        self._cache: dict[tuple[str, ...], tuple[tuple, torch.Tensor, torch.Tensor | None]] = {}

    def __reduce__(self):
        return (FusedProjections, ())

    def __deepcopy__(self, memo):
        return FusedProjections()

    def weights(self, attention, names: tuple[str, ...]):
        """``(weight, bias)`` of the layers ``names`` of ``attention`` stacked: ``weight``
        ``[sum of outputs, C_in]``, ``bias`` ``[sum of outputs]`` or None."""
        layers = [getattr(attention, name) for name in names]
        params = [p for layer in layers for p in (layer.weight, layer.bias) if p is not None]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            # training: the stacked weight is part of autograd's graph, built every call
            return _stacked(layers)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device, tuple(p.shape)) for p in params)
        cached = self._cache.get(names)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        with torch.no_grad():
            weight, bias = _stacked(layers)
        self._cache[names] = (key, weight, bias)
        return weight, bias


def _stacked(layers):
    """The weights ``[sum of outputs, C_in]`` and biases ``[sum of outputs]`` (or None) of
    ``layers`` stacked along their outputs; zeros for a layer without a bias."""
    weight = torch.cat([layer.weight for layer in layers], dim=0)
    bias = None
    if any(layer.bias is not None for layer in layers):
        bias = torch.cat([
            layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.weight.shape[0])
            for layer in layers
        ])
    return weight, bias


@dataclasses.dataclass
class _PatchState:
    """Per-module record of a patch: stored on the ``Attention`` instance."""

    kind: str
    stack: str
    path: str
    inf: float  # the owner's mask value, for ``flash_mask``
    stock_params: tuple[str, ...]  # parameter names of the class's forward after ``self``
    options: _Options
    projections: FusedProjections = dataclasses.field(default_factory=FusedProjections)


@dataclasses.dataclass
class _OwnerState:
    """Record of a patch on an owner module (the module that holds the attention)."""

    attention: str  # attribute name of the patched attention in the owner
    stock_params: tuple[str, ...]  # parameter names of the class's forward after ``self``
    var_keyword: bool  # the class's forward takes ``**kwargs``


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


# -- the replacement forward ---------------------------------------------------------


def _bind(module, args: tuple, kwargs: dict, skip: int) -> dict[str, Any]:
    """Positional flags after the first ``skip`` arguments (``q_x, kv_x, biases`` or
    ``m, mask``) named as the installed OpenFold names them."""
    state: _PatchState = getattr(module, _STATE_ATTR)
    what = f"{type(module).__name__}.forward"
    flags = dict(kwargs)
    names = state.stock_params[skip:]
    if len(args) > len(names):
        raise TypeError(f"{what} takes at most {skip + len(names)} positional arguments")
    for name, value in zip(names, args):
        if name in flags:
            raise TypeError(f"{what} got multiple values for argument {name!r}")
        flags[name] = value
    for name in flags:
        if name not in _IGNORED_FLAGS and name not in ("use_flash", "flash_mask"):
            _warn_once(
                f"flag:{name}",
                f"Flashlight-patched OpenFold attention ignores the unknown argument {name!r}",
            )
    return flags


def _owner_forward(self, *args, **kwargs):
    """The owner's class ``forward`` with ``chunk_size=None`` while its attention runs
    as a Flashlight kernel (see "Chunking" in the module docstring); otherwise, or when
    that attention was unpatched on its own, with the arguments as given."""
    state: _OwnerState = getattr(self, _STATE_ATTR)
    names = state.stock_params
    if not state.var_keyword:
        for name in [n for n in kwargs if n not in names]:
            _warn_once(
                f"owner-flag:{type(self).__name__}:{name}",
                f"Flashlight-patched OpenFold {type(self).__name__} ignores the unknown "
                f"argument {name!r}",
            )
            del kwargs[name]
    args = list(args)
    at = names.index("chunk_size")
    chunk_size = kwargs.get("chunk_size", args[at] if at < len(args) else None)
    x = args[0] if args else kwargs.get(names[0])
    if chunk_size is not None and _runs_fused(self, state, x, [*args, *kwargs.values()]):
        if at < len(args):
            args[at] = None
        else:
            kwargs["chunk_size"] = None
    if torch.compiler.is_compiling():
        bound = {**dict(zip(names, args)), **kwargs}
        if _loop_free_row_attention(self, state, bound):
            return _msa_row_attention(self, getattr(self, state.attention), bound)
    return type(self).forward(self, *args, **kwargs)


def _loop_free_row_attention(owner, state: _OwnerState, bound: dict[str, Any]) -> bool:
    """Whether ``owner`` is an MSA row attention with pair bias on its unchunked path,
    which :func:`_msa_row_attention` computes without OpenFold's Python loop (its
    attention is called as the stock forward calls it, patched or not)."""
    layers = ("layer_norm_m", "layer_norm_z", "linear_z")
    return (
        getattr(owner, "pair_bias", False)
        and all(getattr(owner, name, None) is not None for name in layers)
        and isinstance(bound.get("m"), torch.Tensor)
        and isinstance(bound.get("z"), torch.Tensor)
        and all(bound.get(name) is None for name in ("chunk_size", "_chunk_logits"))
        and not bound.get("use_flash", False)
        and isinstance(getattr(owner, state.attention, None), torch.nn.Module)
    )


def _msa_row_attention(owner, attention, bound: dict[str, Any]):
    """OpenFold ``MSAAttention.forward`` (row attention with pair bias, unchunked), as
    traced inside a compiled block.

    OpenFold computes the pair bias in a Python loop over 256-row slices of ``z``, which
    Dynamo unrolls with ``N_res`` as a constant (every length would compile again); here
    it is one layer norm and projection of the whole ``z``.
    """
    m, z, mask = bound["m"], bound["z"], bound.get("mask")
    if mask is None:
        # [*, N_seq, N_res]
        mask = m.new_ones(m.shape[:-1])
    # [*, N_seq, 1, 1, N_res]
    mask_bias = (owner.inf * (mask - 1))[..., :, None, None, :]
    # [*, N_res, N_res, H] -> [*, 1, H, N_res, N_res]
    pair_bias = owner.linear_z(owner.layer_norm_z(z)).movedim(-1, -3).unsqueeze(-4)
    m = owner.layer_norm_m(m)
    return attention(
        q_x=m,
        kv_x=m,
        biases=[mask_bias, pair_bias],
        use_memory_efficient_kernel=bound.get("use_memory_efficient_kernel", False),
        use_lma=bound.get("use_lma", False),
        use_flash=False,
        flash_mask=mask,
    )


def _runs_fused(owner, state: _OwnerState, x, arguments: list) -> bool:
    """Whether the owner's patched attention will run the Flashlight kernel for input ``x``."""
    attention = getattr(owner, state.attention, None)
    if not isinstance(x, torch.Tensor) or attention is None or not is_patched(attention):
        return False
    options = getattr(attention, _STATE_ATTR).options
    tensors = [t for t in arguments if isinstance(t, torch.Tensor)]
    return _fallback_reason(owner, options, [x], tensors) is None


def _stock_forward(attention, *inputs, flags: dict[str, Any]):
    """The class's own forward, with the flags it knows."""
    state: _PatchState = getattr(attention, _STATE_ATTR)
    known = {k: v for k, v in flags.items() if k in state.stock_params}
    return type(attention).forward(attention, *inputs, **known)


def _fallback_reason(module, options: _Options, inputs: list, others=()) -> str | None:
    """Why ``module`` runs OpenFold's stock code on these tensors, or None.

    ``inputs`` must share a supported dtype; ``others`` (biases, masks) only count for
    autograd, as do ``module``'s parameters.
    """
    device = inputs[0].device
    if device.type == "cpu":
        import flashlight

        if not flashlight.settings.get("interpret"):
            if not options.fallback_on_cpu:
                raise RuntimeError(
                    "Flashlight-patched OpenFold attention got CPU tensors, and Triton kernels "
                    "run on CPU only with TRITON_INTERPRET=1; move the model to a GPU, set "
                    "TRITON_INTERPRET=1 before importing triton, or patch with "
                    "fallback_on_cpu=True"
                )
            return "cpu"
    elif device.type != "cuda":
        return f"device:{device.type}"
    dtype = inputs[0].dtype
    if dtype not in _SUPPORTED_DTYPES or any(t.dtype != dtype for t in inputs):
        return f"dtype:{dtype}"
    return None


def records_grad(module, tensors) -> bool:
    """Whether autograd records a call of ``module`` on ``tensors``."""
    return torch.is_grad_enabled() and (
        any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
        or any(p.requires_grad for p in module.parameters())
    )


_FALLBACK_MESSAGES = {
    "cpu": "CPU tensors and TRITON_INTERPRET is not set: Flashlight kernels need a GPU or "
    "the Triton interpreter; running OpenFold's stock attention instead",
    "biases": f"more than {openfold_core.MAX_BIASES} attention biases: running OpenFold's "
    "stock attention",
}


def _warn_fallback(reason: str) -> None:
    _warn_once(
        f"fallback:{reason}",
        _FALLBACK_MESSAGES.get(
            reason, f"{reason}: running OpenFold's stock attention instead of Flashlight"
        ),
    )


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
    flags = _bind(self, args, kwargs, skip=3)
    biases = [b for b in biases if b is not None] if biases is not None else []
    flash_mask = flags.get("flash_mask")
    use_flash = bool(flags.get("use_flash", False))
    # traced inside a compiled region (a block of scope="block"): the plain core joins
    # that graph, whose backend fuses it (see "Whole blocks" in openfold_blocks)
    tracing = torch.compiler.is_compiling()

    reason = None if tracing else _fallback_reason(self, state.options, [q_x, kv_x], biases)
    if reason is None and len(biases) > openfold_core.MAX_BIASES:
        reason = "biases"
    if reason is not None:
        _warn_fallback(reason)
        return _stock_forward(self, q_x, kv_x, biases or None, flags=flags)

    if use_flash and flash_mask is not None:
        # [*, K] key mask -> [*, 1, 1, K]
        biases.append((state.inf * (flash_mask.to(q_x.dtype) - 1))[..., None, None, :])
        if len(biases) > openfold_core.MAX_BIASES:
            _warn_once("fallback:biases", _FALLBACK_MESSAGES["biases"])
            return _stock_forward(self, q_x, kv_x, biases[:-1] or None, flags=flags)

    def patched():
        fn, core_args = core_call(self, q_x, kv_x, biases, compiled=not tracing)
        # [*, Q, H, C]
        o = fn(*core_args)
        # [*, Q, C_q] from [*, Q, H * C]
        return self.linear_o(o.reshape(o.shape[:-2] + (-1,)))

    if tracing or use_flash or q_x.device.type not in openfold_choice.TIMED_DEVICES \
            or records_grad(self, [q_x, kv_x, *biases]):
        return patched()
    # [Note: the faster of stock and patched attention] in openfold_choice; the key is
    # built only for the small calls that use it
    n_scores = openfold_choice.scores(q_x, kv_x, self.no_heads)
    key = None if n_scores > openfold_choice.SMALL_SCORES else (
        state.kind, self.no_heads, getattr(self, "c_hidden", None), q_x.dtype, q_x.device, q_x.is_contiguous(),
        tuple(q_x.shape), tuple(kv_x.shape), q_x is kv_x, tuple((tuple(b.shape), b.stride()) for b in biases))
    return openfold_choice.run(key, n_scores, patched,
                               lambda: _stock_forward(self, q_x, kv_x, biases or None, flags=flags))


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
    gated = attention.linear_g is not None
    state = getattr(attention, _STATE_ATTR, None)
    # [*, Q/K, H * C] each
    projections = getattr(state, "projections", None)  # None: a patch pickled before it had them
    if compiled and projections is not None and _plain_linears(attention, gated):
        q, k, v, g = _fused_projections(attention, projections, q_x, kv_x, gated)
    else:
        q = attention.linear_q(q_x)
        k = attention.linear_k(kv_x)
        v = attention.linear_v(kv_x)
        g = attention.linear_g(q_x) if gated else None
    # [*, H, Q/K, C]
    q = q.view(q.shape[:-1] + (heads, -1)).transpose(-2, -3)
    k = k.view(k.shape[:-1] + (heads, -1)).transpose(-2, -3)
    v = v.view(v.shape[:-1] + (heads, -1)).transpose(-2, -3)
    # a bias shared by the heads (a mask bias, [*, Q or 1, 1, 1, K]) is passed contiguous:
    # the triangle attention around the ending node builds it from a transposed mask,
    # whose other strides would make the same core compile a second time, and its keys
    # would be read with a stride
    biases = [b.contiguous() if b.dim() >= 3 and b.shape[-3] == 1 else b for b in biases]
    args = [q, k, v, *biases]
    if gated:
        # [*, Q, H, C] gate logits; the sigmoid is part of the core
        args.append(g.view(g.shape[:-1] + (heads, -1)))
    if compiled:
        options = state.options.compile_options if state is not None else {}
        fn = openfold_core.compiled_core(
            len(biases), gated, heads, q.shape[-1], q.dtype, options
        )
    else:
        fn = openfold_core.attention_core(len(biases), gated)
    return fn, tuple(args)


def _plain_linears(attention, gated: bool) -> bool:
    """Whether the projections are linear layers computing ``F.linear`` (OpenFold's ``Linear``
    adds only initialisers), so that they can be stacked ([Note: fused projections])."""
    names = ("linear_q", "linear_k", "linear_v", "linear_g") if gated else ("linear_q", "linear_k", "linear_v")
    layers = [getattr(attention, name, None) for name in names]
    return all(_plain_linear(layer) and layer.out_features == layers[0].out_features for layer in layers)


def _plain_linear(layer) -> bool:
    """Whether ``layer`` computes ``F.linear`` with its own parameters and nothing else
    (no hooks, no overridden forward): its weights can be passed to a compiled core."""
    return (isinstance(layer, torch.nn.Linear) and type(layer).forward is torch.nn.Linear.forward
            and not layer._forward_hooks and not layer._forward_pre_hooks)


def _fused_projections(attention, projections: FusedProjections, q_x, kv_x, gated: bool):
    """``q, k, v, g`` (``g`` None when ungated), each ``[*, Q/K, H * C]``, from one GEMM per
    distinct input ([Note: fused projections])."""
    width = attention.linear_q.weight.shape[0]
    if q_x is kv_x:
        names = ("linear_q", "linear_k", "linear_v", "linear_g") if gated else ("linear_q", "linear_k", "linear_v")
        # [*, Q, (3 or 4) * H * C]
        out = torch.nn.functional.linear(q_x, *projections.weights(attention, names))
        parts = out.split(width, dim=-1)
        return (*parts, None) if not gated else parts
    # [*, Q, (1 or 2) * H * C] and [*, K, 2 * H * C]
    q_names = ("linear_q", "linear_g") if gated else ("linear_q",)
    qg = torch.nn.functional.linear(q_x, *projections.weights(attention, q_names)).split(width, dim=-1)
    k, v = torch.nn.functional.linear(kv_x, *projections.weights(attention, ("linear_k", "linear_v"))).split(width, dim=-1)
    return qg[0], k, v, (qg[1] if gated else None)


def _global_forward(self, m, mask, *args, **kwargs):
    """OpenFold ``GlobalAttention.forward`` with the attention over the sequences as one
    Flashlight kernel (see [Note: global column attention] in
    :mod:`flashlight.integrations.openfold_core`).

    Args:
        m: ``[*, R, S, C_in]`` the layer-normed MSA, a column per ``R``.
        mask: ``[*, R, S]`` sequence mask of each column.
        *args, **kwargs: OpenFold's flags (``use_lma``: replaced by the kernel, ignored).
    Returns:
        ``[*, R, S, C_in]``, as the stock forward.
    """
    state: _PatchState = getattr(self, _STATE_ATTR)
    flags = _bind(self, args, kwargs, skip=2)
    others = [mask] if isinstance(mask, torch.Tensor) else []
    tracing = torch.compiler.is_compiling()  # as in _patched_forward
    reason = None if tracing else _fallback_reason(self, state.options, [m], others)
    if reason is not None:
        _warn_fallback(reason)
        return _stock_forward(self, m, mask, flags=flags)
    gated = _plain_gate(self)
    fn, core_args = global_core_call(self, m, mask, compiled=not tracing, gated=gated)
    if gated:
        # [*, R, S, C_in]: attention, gate and output projection
        return fn(*core_args)
    # [*, R, H, C]
    o = fn(*core_args)
    # [*, R, S, H, C]: the gate, per sequence, outside the kernel
    g = torch.sigmoid(self.linear_g(m))
    o = o.unsqueeze(-3) * g.view(g.shape[:-1] + (self.no_heads, -1))
    # [*, R, S, C_in]
    return self.linear_o(o.reshape(o.shape[:-2] + (-1,)))


def _plain_gate(attention) -> bool:
    """Whether ``linear_g`` and ``linear_o`` compute ``F.linear`` with a bias (OpenFold's
    ``Linear``), so that the compiled core can take their weights."""
    return all(_plain_linear(layer) and layer.bias is not None
               for layer in (attention.linear_g, attention.linear_o))


def global_core_call(attention, m, mask, *, compiled: bool = False, gated: bool = False):
    """:func:`openfold_core.global_attention` for ``attention`` (an OpenFold
    ``GlobalAttention``) and its arguments ``(q, k, v, mask_bias)``; with ``gated``,
    :func:`openfold_core.gated_global_attention` and ``(q, k, v, mask_bias, m, w_g, b_g,
    w_o, b_o)``.

    Pools the query (OpenFold's masked mean over the sequences) and runs the module's
    query, key and value projections; ``fn(*args)`` is the attention output
    ``[*, R, H, C]`` before the gate, or with ``gated`` the module's output
    ``[*, R, S, C_in]``. ``fn`` is the plain function, or with ``compiled=True`` its
    Flashlight-compiled form.
    """
    heads = attention.no_heads
    # [*, R, C_in]
    q = torch.sum(m * mask.unsqueeze(-1), dim=-2) / (
        torch.sum(mask, dim=-1)[..., None] + attention.eps
    )
    # [*, R, H, C]
    q = attention.linear_q(q)
    q = q.view(q.shape[:-1] + (heads, -1))
    # [*, R, S, C]: one key/value head
    k = attention.linear_k(m)
    v = attention.linear_v(m)
    # [*, R, 1, S]
    bias = (attention.inf * (mask - 1))[..., :, None, :]
    args = (q, k, v, bias)
    if gated:
        args += (m, attention.linear_g.weight, attention.linear_g.bias,
                 attention.linear_o.weight, attention.linear_o.bias)
    if compiled:
        state = getattr(attention, _STATE_ATTR, None)
        options = state.options.compile_options if state is not None else {}
        fn = openfold_core.compiled_global_core(heads, q.shape[-1], q.dtype, options, gated=gated)
    else:
        fn = openfold_core.gated_global_attention if gated else openfold_core.global_attention
    return fn, args
