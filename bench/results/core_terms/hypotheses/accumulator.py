"""Is the bf16 core bound by the float arithmetic per score? Three forms of the score
arithmetic in otherwise identical kernels: m0 today's (``dot * scale + mask`` in one
FMA, ``+ bias``, max, ``exp2(x * log2e - m * log2e)``); m1 the biases divided by the
scale handed to ``tl.dot`` as its accumulator (the tensor core adds them) and the scale
folded into the exponent's FMA, one float op per score fewer; m2 also q pre-multiplied
by ``scale * log2e`` once per program (in bf16: it rounds q). Run on the GPU as
``python accumulator.py``; prints one line per shape and tile: ms (max error vs float64)."""
import torch, triton, triton.language as tl
from triton.testing import do_bench
LOG2E = 1.4426950408889634

@triton.jit
def kern(q, k, mb, pb, v, out, L: tl.constexpr, H: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         MODE: tl.constexpr, SCALE: tl.constexpr):
    pid = tl.program_id(0)
    num_m = L // BM
    pid_m = pid % num_m
    rest = pid // num_m
    h = rest % H
    n = rest // H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_c = tl.arange(0, C)
    base = (n * H + h) * L * C
    qt = tl.load(q + base + offs_m[:, None] * C + offs_c[None, :])
    if MODE == 2:
        qt = (qt.to(tl.float32) * (SCALE * 1.4426950408889634)).to(tl.bfloat16)
    m = tl.full([BM], float("-inf"), tl.float32)
    acc = tl.zeros([BM, C], tl.float32)
    l = tl.zeros([BM], tl.float32)
    for s in range(0, L, BN):
        offs_n = s + tl.arange(0, BN)
        kt = tl.load(k + base + offs_n[:, None] * C + offs_c[None, :])
        mk = tl.load(mb + n * L + offs_n).to(tl.float32)
        bias = tl.load(pb + (h * L + offs_m[:, None]) * L + offs_n[None, :]).to(tl.float32)
        if MODE == 0:  # today's: scale and mask in one FMA, bias added, max, exp2(x*L - m*L)
            sc = tl.dot(qt, tl.trans(kt)) * SCALE + mk[None, :] + bias
            mn = tl.maximum(m, tl.max(sc, axis=1))
            alpha = tl.exp2((m - mn) * 1.4426950408889634)
            p = tl.exp2(sc * 1.4426950408889634 - (mn * 1.4426950408889634)[:, None])
        elif MODE == 1:  # biases / scale as the dot's accumulator; exp2(u * scale*L - m*scale*L)
            init = bias * (1.0 / SCALE) + (mk * (1.0 / SCALE))[None, :]
            sc = tl.dot(qt, tl.trans(kt), acc=init)
            mn = tl.maximum(m, tl.max(sc, axis=1))
            alpha = tl.exp2((m - mn) * (SCALE * 1.4426950408889634))
            p = tl.exp2(sc * (SCALE * 1.4426950408889634) - (mn * (SCALE * 1.4426950408889634))[:, None])
        else:  # q pre-scaled by scale*L (bf16); biases * L as the accumulator; exp2(u - m)
            init = bias * 1.4426950408889634 + (mk * 1.4426950408889634)[None, :]
            sc = tl.dot(qt, tl.trans(kt), acc=init)
            mn = tl.maximum(m, tl.max(sc, axis=1))
            alpha = tl.exp2(m - mn)
            p = tl.exp2(sc - mn[:, None])
        vt = tl.load(v + base + offs_n[:, None] * C + offs_c[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vt)
        l = l * alpha + tl.sum(p, axis=1)
        m = mn
    tl.store(out + base + offs_m[:, None] * C + offs_c[None, :], (acc / l[:, None]).to(tl.bfloat16))

def ref(q, k, v, mb, pb):
    a = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5 + mb.double() + pb.double()
    return torch.softmax(a, -1) @ v.double()

for (N, L, H) in [(512, 256, 8), (512, 1024, 8), (1024, 1024, 4), (256, 256, 4)]:
    C = 32
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(N, H, L, C, device="cuda", generator=g).bfloat16() for _ in range(3))
    mb = torch.where(torch.rand(N, 1, 1, L, device="cuda", generator=g) < 0.2, -1e9, 0.0).bfloat16()
    pb = torch.randn(1, H, L, L, device="cuda", generator=g).bfloat16()
    r = ref(q, k, v, mb, pb)
    out = torch.empty_like(q)
    for BM, BN, w, st in [(128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)]:
        line = f"N{N} L{L} H{H} {BM}x{BN} w{w} s{st}:"
        for mode in (0, 1, 2):
            f = lambda: kern[(L // BM * H * N,)](q, k, mb, pb, v, out, L, H, C, BM, BN, mode, C ** -0.5, num_warps=w, num_stages=st)
            out.zero_(); f(); e = (out.double() - r).abs().max().item()
            t = do_bench(f, warmup=25, rep=200, return_mode="median")
            line += f"  m{mode} {t:.4f} ({e:.2g})"
        print(line, flush=True)
