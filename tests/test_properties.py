"""Property tests: random attention programs through Flashlight, against float64 eager.

Hypothesis draws a program, the way users compose attention by hand:

- shapes: 0-2 batch dims, query and key lengths 1-40 (independent), head dims 4-32
  (value head dim independent of the key's);
- the scale applied to q before the product or to the scores after it; q and k as given
  or first shifted / squashed elementwise (so neither operand of ``q @ k^T`` is a plain
  load, and head dims that are not powers of two leave padding lanes to keep at zero);
- score modifications in random order: scaling, tanh soft-capping, additive and
  multiplicative tensors of random broadcast shapes, ALiBi-like index terms
  (``slope * (j - i)``, ``-slope * |i - j|``, slopes a constant or per head), the
  scores mixed over heads by a learned matrix (talking heads, for two or more queries
  and keys);
- masks: causal (index comparison, ``tril``, or aligned to the bottom-right), a window,
  random bool masks of random broadcast shapes (each row keeps at least one key),
  applied with ``masked_fill``, ``torch.where`` or an additive ``-inf`` bias; when the
  combination leaves a row with no key, the program also keeps key 0 (an attention sink)
  so every row has one;
- the softmax as ``torch.softmax``, the method, ``F.softmax``, written out with
  ``amax``/``max`` (also with a temperature applied after the max: ``exp((s - m) / T)``),
  or in log space (``exp(log_softmax(s))``, ``exp(s - logsumexp(s))``);
- the probabilities used as they are or mixed with a uniform prior
  (``(1 - a) * p + a / L_kv``) before ``@ v``.

Each program must become exactly one Flashlight kernel with no fallback op, and match
the program evaluated in float64 on the same float32 inputs.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashlight

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@dataclasses.dataclass(frozen=True)
class Program:
    batch: tuple[int, ...]
    lq: int
    lkv: int
    d: int
    dv: int
    scale: float
    prescale: bool  # scale q (True) or the scores (False)
    mods: tuple  # ("scale", c) | ("cap", c) | ("bias", shape) | ("mul", shape) | ("alibi", slope, per_head)
    #              | ("alibi_abs", slope, per_head) | ("mix",): over the last batch dim, the heads
    masks: tuple  # ("causal", form) | ("window", w) | ("bool", shape)
    mask_form: str  # masked_fill | where | additive
    softmax_form: str  # torch | method | functional | amax | max | amax_temperature | log_softmax | logsumexp
    #                    | softmax_one (an extra zero logit: the max clamped at 0)
    seed: int
    qk_form: str = "plain"  # plain | shift_q | shift_both | tanh_k
    prior: float = 0.0  # weight of the uniform prior mixed into the probabilities

    @property
    def score_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.lq, self.lkv)


@st.composite
def broadcast_shapes(draw, full: tuple[int, ...], keep_last: bool = False) -> tuple[int, ...]:
    """A shape that broadcasts to ``full``: each dim kept or 1, some leading dims dropped."""
    dims = [n if draw(st.booleans()) else 1 for n in full]
    if keep_last:
        dims[-1] = full[-1]
    drop = draw(st.integers(0, len(dims) - 1))
    return tuple(dims[drop:])


@st.composite
def programs(draw) -> Program:
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    lq, lkv = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    d, dv = draw(st.integers(4, 32)), draw(st.integers(4, 32))
    full = (*batch, lq, lkv)
    scale = draw(st.sampled_from([d ** -0.5, 1.0, 0.3, 0.125]))
    mod = st.one_of(
        st.tuples(st.just("scale"), st.floats(0.25, 2.0)),
        st.tuples(st.just("cap"), st.floats(1.0, 50.0)),
        st.tuples(st.just("bias"), broadcast_shapes(full)),
        st.tuples(st.just("mul"), broadcast_shapes(full)),
        st.tuples(st.sampled_from(["alibi", "alibi_abs"]), st.floats(0.01, 0.5),
                  st.booleans() if batch else st.just(False)),
        # scores of one query or one key mixed over heads are as small as the output: a
        # matmul outside the kernel computes them ([Note: inner loops] wants a tl.dot)
        *([st.just(("mix",))] if batch and lq > 1 and lkv > 1 else []),
    )
    mask = st.one_of(
        st.tuples(st.just("causal"), st.sampled_from(["index", "tril", "bottom_right"])),
        st.tuples(st.just("window"), st.integers(1, 16)),
        st.tuples(st.just("bool"), broadcast_shapes(full, keep_last=True)),
    )
    return Program(
        batch=batch, lq=lq, lkv=lkv, d=d, dv=dv, scale=scale,
        prescale=draw(st.booleans()),
        mods=tuple(draw(st.lists(mod, max_size=3))),
        masks=tuple(draw(st.lists(mask, max_size=2))),
        mask_form=draw(st.sampled_from(["masked_fill", "where", "additive"])),
        softmax_form=draw(st.sampled_from(["torch", "method", "functional", "amax", "max", "amax_temperature",
                                           "log_softmax", "logsumexp", "softmax_one"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        qk_form=draw(st.sampled_from(["plain", "shift_q", "shift_both", "tanh_k"])),
        prior=draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])),
    )


# ----------------------------------------------------------------------------------------
# Inputs and the program as a plain PyTorch function
# ----------------------------------------------------------------------------------------


def make_inputs(prog: Program) -> tuple[torch.Tensor, ...]:
    """q, k, v, then one tensor per tensor-valued mod and per bool mask, in order."""
    gen = torch.Generator().manual_seed(prog.seed)
    q = torch.randn(*prog.batch, prog.lq, prog.d, generator=gen)
    k = torch.randn(*prog.batch, prog.lkv, prog.d, generator=gen)
    v = torch.randn(*prog.batch, prog.lkv, prog.dv, generator=gen)
    extras = []
    for mod in prog.mods:
        if mod[0] in ("bias", "mul"):
            extras.append(torch.randn(mod[1], generator=gen))
        elif mod[0] == "mix":  # [H, H], near the identity
            extras.append(torch.eye(prog.batch[-1]) + 0.3 * torch.randn(prog.batch[-1], prog.batch[-1], generator=gen))
        elif mod[0] in ("alibi", "alibi_abs") and mod[2]:
            # per-head slopes over the last batch dim: [H, 1, 1]
            extras.append(mod[1] * (0.5 + torch.rand(prog.batch[-1], 1, 1, generator=gen)))
    for mask in prog.masks:
        if mask[0] == "bool":
            keep = torch.rand(mask[1], generator=gen) < 0.6
            rows = keep.reshape(-1, keep.shape[-1])
            rows[torch.arange(rows.shape[0]), torch.randint(0, rows.shape[-1], (rows.shape[0],), generator=gen)] = True
            extras.append(keep)
    return (q, k, v, *extras)


def _keep(prog: Program, extras: list, device, sink: bool):
    """The combined bool mask of ``prog`` (None when it has none), from its index masks
    and bool tensors; ``sink`` also keeps key 0 for every query."""
    i = torch.arange(prog.lq, device=device)[:, None]
    j = torch.arange(prog.lkv, device=device)[None, :]
    keep = None
    for mask in prog.masks:
        if mask[0] == "causal" and mask[1] == "index":
            m = j <= i
        elif mask[0] == "causal" and mask[1] == "tril":
            m = torch.ones(prog.lq, prog.lkv, dtype=torch.bool, device=device).tril()
        elif mask[0] == "causal":  # bottom-right aligned, as for a query chunk at the end
            m = j <= i + (prog.lkv - prog.lq)
        elif mask[0] == "window":
            m = (i - j).abs() < mask[1]
        else:
            m = extras.pop(0)
        keep = m if keep is None else keep & m
    if keep is not None and sink:
        keep = keep | (j == 0)
    return keep


def make_fn(prog: Program, sink: bool):
    n_mod_tensors = sum(
        1 for m in prog.mods if m[0] in ("bias", "mul", "mix") or (m[0] in ("alibi", "alibi_abs") and m[2])
    )

    def attention(q, k, v, *extras):
        mod_tensors, mask_tensors = list(extras[:n_mod_tensors]), list(extras[n_mod_tensors:])
        if prog.qk_form in ("shift_q", "shift_both"):
            q = q + 0.5
        if prog.qk_form == "shift_both":
            k = k - 0.25
        elif prog.qk_form == "tanh_k":
            k = 2.0 * torch.tanh(k)
        if prog.prescale:
            q = q * prog.scale
        s = q @ k.transpose(-2, -1)
        if not prog.prescale:
            s = s * prog.scale
        i = torch.arange(prog.lq, device=q.device)[:, None]
        j = torch.arange(prog.lkv, device=q.device)[None, :]
        for mod in prog.mods:
            if mod[0] == "scale":
                s = s * mod[1]
            elif mod[0] == "cap":
                s = mod[1] * torch.tanh(s / mod[1])
            elif mod[0] == "bias":
                s = s + mod_tensors.pop(0)
            elif mod[0] == "mul":
                s = s * mod_tensors.pop(0)
            elif mod[0] == "mix":  # [..., H, Lq, Lkv] mixed over H
                s = torch.einsum("...hij,hg->...gij", s, mod_tensors.pop(0))
            else:
                slope = mod_tensors.pop(0) if mod[2] else mod[1]
                dist = (j - i) if mod[0] == "alibi" else -(i - j).abs()
                s = s + slope * dist
        keep = _keep(prog, mask_tensors, q.device, sink)
        if keep is not None:
            if prog.mask_form == "masked_fill":
                s = s.masked_fill(~keep, float("-inf"))
            elif prog.mask_form == "where":
                s = torch.where(keep, s, float("-inf"))
            else:
                s = s + torch.zeros(keep.shape, dtype=s.dtype, device=s.device).masked_fill(~keep, float("-inf"))
        if prog.softmax_form == "torch":
            p = torch.softmax(s, dim=-1)
        elif prog.softmax_form == "method":
            p = s.softmax(-1)
        elif prog.softmax_form == "functional":
            p = F.softmax(s, dim=-1)
        elif prog.softmax_form == "log_softmax":
            p = torch.exp(torch.log_softmax(s, dim=-1))
        elif prog.softmax_form == "logsumexp":
            p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
        elif prog.softmax_form == "softmax_one":
            m = s.amax(dim=-1, keepdim=True).clamp_min(0.0)
            e = torch.exp(s - m)
            p = e / (torch.exp(-m) + e.sum(dim=-1, keepdim=True))
        else:
            m = s.max(dim=-1, keepdim=True).values if prog.softmax_form == "max" else s.amax(dim=-1, keepdim=True)
            e = torch.exp((s - m) / 1.7) if prog.softmax_form == "amax_temperature" else torch.exp(s - m)
            p = e / e.sum(dim=-1, keepdim=True)
        if prog.prior:
            p = (1.0 - prog.prior) * p + prog.prior / prog.lkv
        return p @ v

    return attention


def _needs_sink(prog: Program, inputs) -> bool:
    n_mod_tensors = len(inputs) - 3 - sum(1 for m in prog.masks if m[0] == "bool")
    keep = _keep(prog, list(inputs[3 + n_mod_tensors:]), "cpu", sink=False)
    if keep is None:
        return False
    keep = keep.expand(*torch.broadcast_shapes(keep.shape, prog.score_shape))
    return not bool(keep.any(-1).all())


# ----------------------------------------------------------------------------------------
# The property
# ----------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(prog=programs())
def test_random_attention_programs_match_float64(prog: Program):
    torch.compiler.reset()  # every example compiles afresh, never out of a stale cache
    inputs = make_inputs(prog)
    sink = _needs_sink(prog, inputs)
    fn = make_fn(prog, sink)
    context = f"{prog} (sink={sink})"

    report = flashlight.explain(fn, *inputs)
    assert len(report.kernels) == 1, f"{context}: expected one Flashlight kernel\n{report}"
    assert report.fallback_ops == [], f"{context}: operations left outside the kernel\n{report}"

    torch.compiler.reset()
    with torch.no_grad():
        out = flashlight.compile(fn)(*inputs)
        ref = fn(*[x.to(torch.float64) if x.is_floating_point() else x for x in inputs])
    assert torch.isfinite(ref).all(), f"{context}: the float64 reference is not finite"
    assert out.shape == ref.shape and out.dtype == torch.float32, f"{context}: {out.shape} {out.dtype}"
    assert torch.isfinite(out).all(), f"{context}: {int((~torch.isfinite(out)).sum())} non-finite outputs"
    torch.testing.assert_close(out.to(torch.float64), ref, **TOLERANCE, msg=lambda m: f"{context}\n{m}")
