"""``F.scaled_dot_product_attention`` as its math, so that it fuses like written-out attention.

``scaled_dot_product_attention`` is a composite op: when AOTAutograd traces it, PyTorch
has already picked one of its kernels for the device, and the graph holds that kernel's
op (``_scaled_dot_product_flash_attention_for_cpu`` on the CPU;
``_scaled_dot_product_flash_attention``, ``_scaled_dot_product_efficient_attention`` or
``_scaled_dot_product_cudnn_attention`` on CUDA, or the math form, already plain ops).
The decompositions here rewrite each of those into plain ops Flashlight lowers::

    s = q @ k^T * scale                    # [..., H, L, S]; scale = 1 / sqrt(E) by default
    s = where(i >= j, s, -inf)             # is_causal: the top-left-aligned lower triangle
    s = where(mask, s, -inf) | s + mask    # a bool mask keeps True; a float mask is added
    o = softmax(s) @ v                     # [..., H, L, Ev]
    o = where(max_j s == -inf, 0, o)       # with a mask: rows it removes whole give 0, as SDPA does

Grouped-query attention (``enable_gqa``: ``H`` query heads, ``H / G`` key heads) reads
each key head for its ``G`` query heads through views (``[..., H/G, G, L, E]`` queries
against ``[..., H/G, 1, S, E]`` keys), never a repeated copy.

They are used only for graphs that need no gradients (the backend picks the table per
graph): the kernels' other outputs (log-sum-exp, random state) are what their backward
ops read, and here they are placeholders a forward graph never uses. A call with
``dropout_p > 0`` is left as it is (the op runs in PyTorch, with the reason in
``explain()``): its random dropout has no decomposition that draws the same numbers.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

aten = torch.ops.aten


def _grouped(x: torch.Tensor, heads: int, groups: int) -> torch.Tensor:
    """``x`` of [..., heads * groups or 1, L, X] (or fewer dims) as [..., heads, groups or 1, L, X]."""
    if x.dim() < 3:
        return x
    if x.size(-3) == 1:
        return x.unsqueeze(-3)
    return x.unflatten(-3, (heads, groups))


def attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                   is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """SDPA's value: q [..., H, L, E], k [..., Hk, S, E], v [..., Hk, S, Ev] with H a multiple
    of Hk (Hk < H: grouped-query attention); attn_mask broadcasts to [..., H, L, S]."""
    L, S = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    grouped = q.dim() >= 3 and k.dim() >= 3 and q.size(-3) != k.size(-3)
    if grouped:
        heads, groups = k.size(-3), q.size(-3) // k.size(-3)
        q = q.unflatten(-3, (heads, groups))  # [..., Hk, G, L, E]
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)  # [..., Hk, 1, S, E]
        if attn_mask is not None:
            attn_mask = _grouped(attn_mask, heads, groups)
    s = (q @ k.transpose(-2, -1)) * scale  # [..., L, S]
    if is_causal:
        rows = torch.arange(L, device=s.device).unsqueeze(-1)  # [L, 1]
        s = s.masked_fill(rows < torch.arange(S, device=s.device), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    out = torch.softmax(s, dim=-1) @ v  # [..., L, Ev]
    if attn_mask is not None:
        # SDPA gives 0 where the mask removes a whole row (softmax alone: NaN)
        empty = s.amax(dim=-1, keepdim=True) == float("-inf")  # [..., L, 1]
        out = out.masked_fill(empty, 0.0)
    if grouped:
        out = out.flatten(-4, -3)  # [..., H, L, Ev]
    return out.to(q.dtype)


def _arguments(op, args, kwargs) -> dict:
    """The op's arguments by their schema names, defaults filled in (the kernels' schemas
    differ between PyTorch releases: names, not positions, are read)."""
    schema = op._schema.arguments
    bound = {a.name: a.default_value for a in schema if a.has_default_value()}
    bound.update(zip((a.name for a in schema), args))
    bound.update(kwargs)
    return bound


def _decomposition(op):
    """The math of SDPA kernel ``op``, returning its outputs: the attention, then
    placeholders for what only backward ops read (log-sum-exp as zeros [..., H, L] in
    float32, random state and sequence bookkeeping empty, max lengths as the lengths)."""
    returns = op._schema.returns

    def decompose(*args, **kwargs):
        a = _arguments(op, args, kwargs)
        if a.get("dropout_p", 0.0) > 0 or a.get("return_debug_mask", False):
            return NotImplemented
        q, k = a["query"], a["key"]
        mask = a.get("attn_mask", a.get("attn_bias"))
        out = attention_math(q, k, a["value"], mask, bool(a.get("is_causal", False)), a.get("scale"))
        rest = []
        for ret in returns[1:]:
            if ret.name in ("logsumexp", "log_sumexp"):
                rest.append(out.new_zeros(out.shape[:-1], dtype=torch.float32))
            elif str(ret.type) in ("SymInt", "int"):
                rest.append(q.size(-2) if ret.name == "max_q" else k.size(-2))
            else:
                rest.append(q.new_empty((0,), dtype=torch.int64))
        return (out, *rest)

    return decompose


# the SDPA kernels PyTorch may pick while it traces F.scaled_dot_product_attention
SDPA_OPS = tuple(getattr(aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    if hasattr(aten, name))
SDPA_DECOMPOSITIONS = {op: _decomposition(op) for op in SDPA_OPS}


def left_to_pytorch(node: fx.Node) -> str | None:
    """Why an SDPA kernel's op is still in the graph (it runs in PyTorch), or None if
    ``node`` is not one."""
    if node.op != "call_function" or node.target not in SDPA_DECOMPOSITIONS:
        return None
    dropout = _arguments(node.target, node.args, node.kwargs).get("dropout_p", 0.0)
    if isinstance(dropout, (int, float)) and dropout > 0:
        return f"SDPA with dropout_p={dropout}: its random dropout runs in PyTorch"
    return "SDPA in a graph that needs gradients runs in PyTorch (only inference graphs decompose it)"
