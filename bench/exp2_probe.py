"""Does a polynomial ``exp2`` for part of the scores speed attention up at head width 32?

    python -m bench.exp2_probe [--out bench/results/exp2_probe.json]

At head width 32 an attention forward does 128 flops of ``tl.dot`` per score and one
``ex2`` on the multi-function units, which run at a sixteenth of the FMA rate: on an H100
the exponentials alone take about a third of the bf16 core's time (#23). FlashAttention-4
computes part of them as a polynomial on the FMA pipes instead. Before the compiler does
that, this probe asks whether Triton can express it cheaply: one hand-written forward
kernel (bf16, no mask or bias, online softmax in base 2), its score tile's columns split
in halves or quarters (``tl.reshape`` + ``tl.split``, joined back after), one part through
a degree-3 polynomial (``2^x = 2^j * p(f)``: ``j`` rounded by the 1.5 * 2^23 trick, ``p``
a minimax fit on [-0.5, 0.5], ``2^j`` added to the exponent bits), the rest through
``exp2``. The variants run the same tiles and configurations, best of a few; errors are
against float64. The numbers answer a question; they are not a product benchmark.
"""
from __future__ import annotations

import argparse
import math
import pathlib

import torch
import triton
import triton.language as tl

from bench.common import atomic_write_json, environment

SHAPES = {"msa_row N512 L256 H8 c32": (512, 8, 256, 32), "triangle N1024 H4 c32": (1024, 4, 1024, 32)}
VARIANTS = {"exp2": 0, "half polynomial": 1, "quarter polynomial": 2, "all polynomial": 3}
CONFIGS = [(128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]  # BLOCK_M, BLOCK_N, warps, stages


@triton.jit
def _exp2_poly(x):
    """2^x for x <= 0 in FMA and integer operations (relative error below 1e-4)."""
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0  # 1.5 * 2^23: rounds x to an integer in the low mantissa bits
    j = t - 12582912.0
    f = x - j  # in [-0.5, 0.5]
    p = 0.9999289 + f * (0.69327628 + f * (0.24260466 + f * 0.05508877))  # fit to 2^f, 8e-5
    shift = (t.to(tl.int32, bitcast=True) - 0x4B400000) << 23
    return (p.to(tl.int32, bitcast=True) + shift).to(tl.float32, bitcast=True)


@triton.jit
def _exps(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POLY: tl.constexpr):
    if POLY == 0:
        return tl.math.exp2(x)
    elif POLY == 3:
        return _exp2_poly(x)
    elif POLY == 1:
        a, b = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_N // 2, 2]))
        return tl.reshape(tl.join(tl.math.exp2(a), _exp2_poly(b)), [BLOCK_M, BLOCK_N])
    else:
        a, b = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_N // 2, 2]))
        a0, a1 = tl.split(tl.reshape(a, [BLOCK_M, BLOCK_N // 4, 2]))
        a = tl.reshape(tl.join(tl.math.exp2(a0), _exp2_poly(a1)), [BLOCK_M, BLOCK_N // 2])
        return tl.reshape(tl.join(a, tl.math.exp2(b)), [BLOCK_M, BLOCK_N])


@triton.jit
def _online_step(s, v, m_i, l_i, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POLY: tl.constexpr):
    """One key tile of the online softmax on base-2 scores ``s``: the new max, sum and
    accumulator."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = _exps(s - m_new[:, None], BLOCK_M, BLOCK_N, POLY)
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _forward(Q, K, V, O, MASK, PAIR, scale_log2, L, H, D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, POLY: tl.constexpr, BIAS: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    head, row = tl.program_id(1) % H, tl.program_id(1) // H
    base = tl.program_id(1).to(tl.int64) * L * D
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        rows = start_n + offs_n
        k = tl.load(K + base + rows[:, None] * D + offs_d[None, :])
        v = tl.load(V + base + rows[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k)) * scale_log2
        if BIAS:  # the MSA row core's two: a mask bias per row and key, a pair bias per head
            pair = tl.load(PAIR + (head * L + offs_m[:, None]).to(tl.int64) * L + rows[None, :])
            mask = tl.load(MASK + row.to(tl.int64) * L + rows)
            s += (pair.to(tl.float32) + mask.to(tl.float32)[None, :]) * 1.4426950408889634
        m_i, l_i, acc = _online_step(s, v, m_i, l_i, acc, BLOCK_M, BLOCK_N, POLY)
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))


@triton.jit
def _two_rows(Q, K, V, O, MASK, PAIR, scale_log2, L, H, D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """The biased forward for two MSA rows of one head per program: each pair-bias tile is
    read once for both rows (half the bias reads of :func:`_forward`)."""
    start_m = tl.program_id(0) * BLOCK_M
    head, pair_of_rows = tl.program_id(1) % H, tl.program_id(1) // H
    row0 = pair_of_rows * 2
    base0 = (row0 * H + head).to(tl.int64) * L * D
    base1 = base0 + H * L * D  # the next row, same head
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    tile = offs_m[:, None] * D + offs_d[None, :]
    q0, q1 = tl.load(Q + base0 + tile), tl.load(Q + base1 + tile)
    m0 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l0, l1 = tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M], tl.float32)
    acc0, acc1 = tl.zeros([BLOCK_M, D], tl.float32), tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        rows = start_n + offs_n
        keys = rows[:, None] * D + offs_d[None, :]
        pair = tl.load(PAIR + (head * L + offs_m[:, None]).to(tl.int64) * L + rows[None, :]).to(tl.float32)
        for r in tl.static_range(2):
            base = base0 if r == 0 else base1
            k = tl.load(K + base + keys)
            v = tl.load(V + base + keys)
            mask = tl.load(MASK + (row0 + r).to(tl.int64) * L + rows).to(tl.float32)
            s = tl.dot(q0 if r == 0 else q1, tl.trans(k)) * scale_log2 + (pair + mask[None, :]) * 1.4426950408889634
            if r == 0:
                m0, l0, acc0 = _online_step(s, v, m0, l0, acc0, BLOCK_M, BLOCK_N, 0)
            else:
                m1, l1, acc1 = _online_step(s, v, m1, l1, acc1, BLOCK_M, BLOCK_N, 0)
    tl.store(O + base0 + tile, (acc0 / l0[:, None]).to(O.dtype.element_ty))
    tl.store(O + base1 + tile, (acc1 / l1[:, None]).to(O.dtype.element_ty))


def attention_two_rows(q, k, v, config, biases) -> torch.Tensor:
    """:func:`attention` with biases, two rows per program (an even number of rows)."""
    block_m, block_n, warps, stages = config
    batch, length, width = q.shape
    mask, pair = biases
    out = torch.empty_like(q)
    grid = (triton.cdiv(length, block_m), batch // 2)
    _two_rows[grid](q, k, v, out, mask, pair, math.log2(math.e) / math.sqrt(width), length, pair.shape[0],
                    D=width, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
    return out


def attention(q, k, v, poly: int, config, biases=None) -> torch.Tensor:
    """``softmax(q k^T / sqrt(D) + biases) v`` for ``[B, L, D]`` contiguous inputs (L a
    multiple of the tiles); ``biases``: None, or the mask bias ``[B / H, L]`` and the pair
    bias ``[H, L, L]`` of the MSA row core (batch ``B`` = rows x heads)."""
    block_m, block_n, warps, stages = config
    batch, length, width = q.shape
    mask, pair = biases if biases is not None else (q, q)
    out = torch.empty_like(q)
    grid = (triton.cdiv(length, block_m), batch)
    _forward[grid](q, k, v, out, mask, pair, math.log2(math.e) / math.sqrt(width), length,
                   pair.shape[0] if biases is not None else 1, D=width, BLOCK_M=block_m, BLOCK_N=block_n,
                   POLY=poly, BIAS=biases is not None, num_warps=warps, num_stages=stages)
    return out


def _inputs(rows: int, heads: int, length: int, width: int):
    """q, k, v ``[rows x heads, L, c]`` (bf16), the mask bias ``[rows, L]`` (a quarter of the
    keys at -1e9, never a row's first) and the pair bias ``[heads, L, L]``, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(rows * heads, length, width, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    masked = torch.rand(rows, length, device="cuda", generator=gen) < 0.25
    masked[:, 0] = False
    mask = (-1e9 * masked.float()).to(torch.bfloat16)
    pair = torch.randn(heads, length, length, device="cuda", dtype=torch.bfloat16, generator=gen)
    return q, k, v, (mask, pair)


def _reference(q, k, v, biases, heads: int, chunk: int = 256):
    """The float64 attention, ``chunk`` batch entries (a multiple of ``heads``) at a time."""
    outs = []
    for start in range(0, q.shape[0], chunk):
        part = slice(start, start + chunk)
        scores = q[part].double() @ k[part].double().transpose(1, 2) / math.sqrt(q.shape[-1])
        if biases is not None:
            mask, pair = biases
            rows = mask[start // heads:(start + chunk) // heads].double()
            scores = scores.view(len(rows), heads, *scores.shape[1:])
            scores = (scores + rows[:, None, None, :] + pair.double()).flatten(0, 1)
        outs.append(torch.softmax(scores, -1) @ v[part].double())
    return torch.cat(outs)


TWO_ROWS = -1  # the variant run by attention_two_rows


def _run(q, k, v, poly: int, config, biases):
    return attention_two_rows(q, k, v, config, biases) if poly == TWO_ROWS else attention(q, k, v, poly, config, biases)


def _best(q, k, v, poly: int, biases) -> tuple[float, tuple, dict]:
    times = {}
    for config in CONFIGS:
        try:
            times[config] = triton.testing.do_bench(lambda: _run(q, k, v, poly, config, biases), rep=200)
        except Exception as error:  # noqa: BLE001 - a configuration that does not build
            times[config] = f"{type(error).__name__}: {str(error)[:120]}"
    best = min((t, c) for c, t in times.items() if isinstance(t, float))
    return best[0], best[1], {str(c): t for c, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exp2_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/exp2_probe.json")
    parser.add_argument("--biases", action="store_true",
                        help="also time the exp2 kernel with the MSA row core's mask and pair biases")
    args = parser.parse_args(argv)
    rows = []
    for name, (rows_, heads, length, width) in SHAPES.items():
        q, k, v, biases = _inputs(rows_, heads, length, width)
        runs = [(variant, poly, None) for variant, poly in VARIANTS.items()]
        runs += [("exp2 + biases", 0, biases), ("biases, two rows", TWO_ROWS, biases)] if args.biases else []
        for variant, poly, bias in runs:
            ms, config, every = _best(q, k, v, poly, bias)
            want = _reference(q, k, v, bias, heads)
            got = _run(q, k, v, poly, config, bias)
            error = ((got.double() - want).abs().max() / want.abs().max()).item()
            rows.append({"shape": name, "variant": variant, "ms": round(ms, 4), "config": config,
                         "rel_error": error, "all": every})
            print(f"{name:28s} {variant:20s} {ms:.4f} ms  {config}  rel err {error:.1e}", flush=True)
    atomic_write_json(pathlib.Path(args.out), {"environment": environment("cuda"), "rows": rows})
    for row in rows:  # the table last, for a short log tail
        print(f"{row['shape']:28s} {row['variant']:20s} {row['ms']:.4f} ms  {row['config']}  "
              f"rel err {row['rel_error']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
