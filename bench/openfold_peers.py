"""Stock OpenFold with its attentions computed by a hand-written peer, for the end-to-end rows.

:func:`patch_attention` sets an instance ``forward`` on every
``openfold.model.primitives.Attention`` of a model (the modules Flashlight's
``patch_openfold`` replaces), which computes the module's projections with its own
layers, the attention with the peer, then the gate and output projection as OpenFold
does; :func:`unpatch_attention` deletes those attributes, leaving the class's forward.
Nothing in OpenFold is modified, and a module that already has an instance forward
(patched by something else) is left alone.

Peers:

- ``ds4sci``: DeepSpeed's ``DS4Sci_EvoformerAttention`` (:mod:`bench.ds4sci`): q, k, v as
  ``[B, N, L, H, c]`` (OpenFold's batch dims merged into two), a mask bias
  ``[B, N, 1, 1, K]`` and a pair bias ``[B, 1, H, Q, K]``; bf16 and fp16 only, head
  widths up to 64;
- ``cueq``: cuEquivariance's ``triangle_attention``: q, k, v ``[B, N, H, Q, c]``, one bias
  ``[B, 1, H, Q, K]`` and a bool keep-mask ``[B, N, 1, 1, K]`` (from OpenFold's
  ``inf * (mask - 1)`` bias: kept where the bias is 0).

OpenFold's owners pass biases that broadcast to ``[*, H, Q, K]``: a mask bias with size-1
head and query dims and, for MSA row and triangle attention, a pair bias with a size-1
dim for the rows it is shared by. A call the peer cannot take (self-attention with more
than two such biases, another bias shape, fewer than 17 positions for DS4Sci, a dtype it
does not compute in, or an error the peer raises) runs the class's own forward instead;
the patch counts those calls by reason (``PeerForward.fallbacks``), and the benchmark
records them, so a row that silently ran stock shows it.
"""
from __future__ import annotations

import torch

from bench.peers import DS4SCI_HEAD_LIMIT, DS4SCI_MAX_HEAD

PEERS = ("ds4sci", "cueq")


class Unsupported(Exception):
    """This call is not one the peer computes (the stock forward runs instead)."""


def _rows(t: torch.Tensor, lead: tuple) -> torch.Tensor:
    """``[*lead, X, Y, Z]`` -> ``[B, N, X, Y, Z]``: the leading dims merged into two."""
    if len(lead) == 0:
        return t.reshape(1, 1, *t.shape[-3:])
    if len(lead) == 1:
        return t.reshape(1, lead[0], *t.shape[-3:])
    return t.reshape(-1, lead[-1], *t.shape[-3:])


def split_biases(biases, lead: tuple, heads: int, q_len: int, k_len: int):
    """OpenFold's biases -> (mask bias ``[B, N, 1, 1, K]`` or None, pair bias
    ``[B, 1, H, Q, K]`` or None), summing biases of the same kind."""
    mask, pair = None, None
    rank = len(lead) + 3
    for b in biases:
        b = b.reshape((1,) * (rank - b.dim()) + tuple(b.shape))
        if b.shape[-3] == 1 and b.shape[-2] == 1:
            b = _rows(b.expand(*lead, 1, 1, k_len), lead)
            mask = b if mask is None else mask + b
        elif len(lead) >= 1 and b.shape[len(lead) - 1] == 1:
            b = b.expand(*lead[:-1], 1, heads, q_len, k_len)
            b = b.reshape(-1, 1, heads, q_len, k_len) if len(lead) >= 2 else b.reshape(1, 1, heads, q_len, k_len)
            pair = b if pair is None else pair + b
        else:
            raise Unsupported(f"a bias of shape {tuple(b.shape)}")
    return mask, pair


def ds4sci_attention(q, k, v, biases):
    """q, k, v ``[*, Q, H, c]`` (unscaled) -> ``[*, Q, H, c]`` through DS4Sci."""
    from bench import ds4sci

    lead, (q_len, heads, _) = q.shape[:-3], q.shape[-3:]
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise Unsupported(f"DS4Sci computes in bf16 and fp16, not {q.dtype}")
    if q_len <= 16 or k.shape[-3] != q_len:
        raise Unsupported("DS4Sci needs more than 16 positions and as many keys as queries")
    if q.shape[-1] > DS4SCI_MAX_HEAD:
        raise Unsupported(DS4SCI_HEAD_LIMIT)
    mask, pair = split_biases(biases, lead, heads, q_len, k.shape[-3])
    o = ds4sci.attention(_rows(q, lead), _rows(k, lead), _rows(v, lead), [mask, pair])
    return o.reshape(q.shape)


def cueq_attention(q, k, v, biases):
    """q, k, v ``[*, Q, H, c]`` (unscaled) -> ``[*, Q, H, c]`` through cuEquivariance."""
    from cuequivariance_torch import triangle_attention

    lead, (q_len, heads, c) = q.shape[:-3], q.shape[-3:]
    mask, pair = split_biases(biases, lead, heads, q_len, k.shape[-3])
    qt, kt, vt = (_rows(t, lead).transpose(-2, -3) for t in (q, k, v))  # [B, N, H, Q, c]
    if pair is None:
        pair = qt.new_zeros(qt.shape[0], 1, heads, q_len, k.shape[-3])
    keep = None if mask is None else mask == 0  # [B, N, 1, 1, K]
    o = triangle_attention(qt, kt, vt, pair, keep, scale=c ** -0.5)  # [B, N, H, Q, c]
    return o.transpose(-2, -3).reshape(q.shape)


ATTENTION = {"ds4sci": ds4sci_attention, "cueq": cueq_attention}


class PeerForward:
    """An ``Attention`` module's instance forward computing its attention with a peer."""

    def __init__(self, module, peer: str, attention=None):
        self.module = module
        self.peer = peer
        self.attention = attention or ATTENTION[peer]
        self.calls = 0
        self.fallbacks: dict[str, int] = {}

    def __call__(self, q_x, kv_x, biases=None, **flags):
        m = self.module
        try:
            o = self._peer(q_x, kv_x, list(biases or []))
        except Unsupported as why:
            self.fallbacks[str(why)] = self.fallbacks.get(str(why), 0) + 1
            return type(m).forward(m, q_x, kv_x, biases, **flags)
        self.calls += 1
        if m.linear_g is not None:
            g = torch.sigmoid(m.linear_g(q_x))
            o = o * g.view(*g.shape[:-1], m.no_heads, -1)  # [*, Q, H, c]
        return m.linear_o(o.reshape(*o.shape[:-2], -1))

    def _peer(self, q_x, kv_x, biases):
        m = self.module
        if q_x is not kv_x:
            raise Unsupported("cross-attention")
        q, k, v = (lin(q_x) for lin in (m.linear_q, m.linear_k, m.linear_v))
        q, k, v = (t.view(*t.shape[:-1], m.no_heads, -1) for t in (q, k, v))  # [*, Q, H, c]
        try:
            return self.attention(q, k, v, biases)
        except (RuntimeError, AssertionError, ValueError) as exc:  # a case the kernel rejects: recorded
            raise Unsupported(f"{self.peer} failed: {type(exc).__name__}: {str(exc)[:160]}") from exc


def patch_attention(model, peer: str, attention=None) -> list[PeerForward]:
    """Route every ``openfold.model.primitives.Attention`` of ``model`` through ``peer``."""
    from openfold.model.primitives import Attention

    if peer not in ATTENTION and attention is None:
        raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    patched = []
    for module in model.modules():
        if isinstance(module, Attention) and "forward" not in vars(module):
            module.forward = PeerForward(module, peer, attention)
            patched.append(module.forward)
    return patched


def unpatch_attention(model) -> int:
    """Remove the forwards :func:`patch_attention` set; returns how many."""
    n = 0
    for module in model.modules():
        if isinstance(vars(module).get("forward"), PeerForward):
            del module.forward
            n += 1
    return n


def summary(patched: list[PeerForward]) -> dict:
    """Modules patched, calls the peer computed and calls that ran stock, by reason."""
    fallbacks: dict[str, int] = {}
    for p in patched:
        for why, n in p.fallbacks.items():
            fallbacks[why] = fallbacks.get(why, 0) + n
    return {"modules": len(patched), "peer_calls": sum(p.calls for p in patched), "stock_calls": fallbacks}


class PeerAbsent(Exception):
    """The peer of a mode is not installed or cannot run here (a cell ``unavailable``)."""


def availability(mode: str, dtype_name: str = "tf32") -> str | None:
    """Why the peer of an end-to-end ``mode`` cannot run here, or None (also for the
    modes that are not peers)."""
    if mode == "ds4sci":
        from bench import ds4sci

        if dtype_name != "bf16":
            return "DS4Sci_EvoformerAttention computes in bf16 and fp16 only"
        return ds4sci.availability()
    if mode == "cueq":
        from bench import peers

        return peers.availability("cuequivariance")
    return None


def record_summary(rec: dict) -> None:
    """Replace the patched forwards a benchmark cell kept (``_peer_forwards``) by
    :func:`summary` of them (``peer``)."""
    forwards = rec.pop("_peer_forwards", None)
    if forwards is not None:
        rec["peer"] = summary(forwards)
        if rec["peer"]["peer_calls"] == 0 and rec.get("status", "ok") == "ok":
            # every call ran stock: the times are stock's, not the peer's
            rec["status"] = "error"
            rec["message"] = "the peer computed no call: " + "; ".join(rec["peer"]["stock_calls"])[:400]
