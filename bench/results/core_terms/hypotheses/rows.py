"""Does reading the pair bias bound the bf16 core? One program per (query tile, head,
row n) against one program per two rows of n sharing each pair-bias tile (half the
bias's reads from L2). The kernels compute the catalog core (``evoformer_core``) the way
Flashlight's generated kernel does (scores in base 2, the accumulator rescaled every key
tile). Run on the GPU as ``python rows.py``; prints one line per shape and tile."""
import torch, triton, triton.language as tl
from triton.testing import do_bench

@triton.jit
def k1(q, k, mb, pb, v, out, L: tl.constexpr, H: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
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
    m = tl.full([BM], float("-inf"), tl.float32)
    acc = tl.zeros([BM, C], tl.float32)
    l = tl.zeros([BM], tl.float32)
    for s in range(0, L, BN):
        offs_n = s + tl.arange(0, BN)
        kt = tl.load(k + base + offs_n[:, None] * C + offs_c[None, :])
        sc = tl.dot(qt, tl.trans(kt)) * 0.1767766952966369
        sc = sc + tl.load(mb + n * L + offs_n).to(tl.float32)[None, :]
        sc = sc + tl.load(pb + (h * L + offs_m[:, None]) * L + offs_n[None, :]).to(tl.float32)
        mn = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp2((m - mn) * 1.4426950408889634)
        p = tl.exp2(sc * 1.4426950408889634 - (mn * 1.4426950408889634)[:, None])
        vt = tl.load(v + base + offs_n[:, None] * C + offs_c[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vt)
        l = l * alpha + tl.sum(p, axis=1)
        m = mn
    tl.store(out + base + offs_m[:, None] * C + offs_c[None, :], (acc / l[:, None]).to(tl.bfloat16))

@triton.jit
def k2(q, k, mb, pb, v, out, L: tl.constexpr, H: tl.constexpr, C: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, N: tl.constexpr):
    # two rows of the batch dim n per program, sharing each pair-bias tile
    pid = tl.program_id(0)
    num_m = L // BM
    pid_m = pid % num_m
    rest = pid // num_m
    h = rest % H
    n0 = rest // H
    n1 = n0 + N // 2
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_c = tl.arange(0, C)
    base0 = (n0 * H + h) * L * C
    base1 = (n1 * H + h) * L * C
    q0 = tl.load(q + base0 + offs_m[:, None] * C + offs_c[None, :])
    q1 = tl.load(q + base1 + offs_m[:, None] * C + offs_c[None, :])
    m0 = tl.full([BM], float("-inf"), tl.float32)
    m1 = tl.full([BM], float("-inf"), tl.float32)
    acc0 = tl.zeros([BM, C], tl.float32)
    acc1 = tl.zeros([BM, C], tl.float32)
    l0 = tl.zeros([BM], tl.float32)
    l1 = tl.zeros([BM], tl.float32)
    for s in range(0, L, BN):
        offs_n = s + tl.arange(0, BN)
        bias = tl.load(pb + (h * L + offs_m[:, None]) * L + offs_n[None, :]).to(tl.float32)
        kt = tl.load(k + base0 + offs_n[:, None] * C + offs_c[None, :])
        sc = tl.dot(q0, tl.trans(kt)) * 0.1767766952966369
        sc = sc + tl.load(mb + n0 * L + offs_n).to(tl.float32)[None, :] + bias
        mn = tl.maximum(m0, tl.max(sc, axis=1))
        alpha = tl.exp2((m0 - mn) * 1.4426950408889634)
        p = tl.exp2(sc * 1.4426950408889634 - (mn * 1.4426950408889634)[:, None])
        vt = tl.load(v + base0 + offs_n[:, None] * C + offs_c[None, :])
        acc0 = acc0 * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vt)
        l0 = l0 * alpha + tl.sum(p, axis=1)
        m0 = mn
        kt = tl.load(k + base1 + offs_n[:, None] * C + offs_c[None, :])
        sc = tl.dot(q1, tl.trans(kt)) * 0.1767766952966369
        sc = sc + tl.load(mb + n1 * L + offs_n).to(tl.float32)[None, :] + bias
        mn = tl.maximum(m1, tl.max(sc, axis=1))
        alpha = tl.exp2((m1 - mn) * 1.4426950408889634)
        p = tl.exp2(sc * 1.4426950408889634 - (mn * 1.4426950408889634)[:, None])
        vt = tl.load(v + base1 + offs_n[:, None] * C + offs_c[None, :])
        acc1 = acc1 * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vt)
        l1 = l1 * alpha + tl.sum(p, axis=1)
        m1 = mn
    tl.store(out + base0 + offs_m[:, None] * C + offs_c[None, :], (acc0 / l0[:, None]).to(tl.bfloat16))
    tl.store(out + base1 + offs_m[:, None] * C + offs_c[None, :], (acc1 / l1[:, None]).to(tl.bfloat16))

def ref(q, k, v, mb, pb):
    a = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5 + mb.double() + pb.double()
    return torch.softmax(a, -1) @ v.double()

for (N, L, H) in [(512, 256, 8), (512, 1024, 8), (1024, 1024, 4)]:
    C = 32
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(N, H, L, C, device="cuda", generator=g).bfloat16() for _ in range(3))
    mb = torch.where(torch.rand(N, 1, 1, L, device="cuda", generator=g) < 0.2, -1e9, 0.0).bfloat16()
    pb = torch.randn(1, H, L, L, device="cuda", generator=g).bfloat16()
    r = ref(q, k, v, mb, pb)
    out = torch.empty_like(q)
    for BM, BN, w, st in [(128, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)]:
        f1 = lambda: k1[(L // BM * H * N,)](q, k, mb, pb, v, out, L, H, C, BM, BN, num_warps=w, num_stages=st)
        f1(); e1 = (out.double() - r).abs().max().item(); t1 = do_bench(f1, warmup=25, rep=200, return_mode="median")
        f2 = lambda: k2[(L // BM * H * N // 2,)](q, k, mb, pb, v, out, L, H, C, BM, BN, N, num_warps=w, num_stages=st)
        out.zero_(); f2(); e2 = (out.double() - r).abs().max().item(); t2 = do_bench(f2, warmup=25, rep=200, return_mode="median")
        print(f"N{N} L{L} H{H} {BM}x{BN} w{w} s{st}: rows1 {t1:.4f} ms (err {e1:.3g})  rows2 {t2:.4f} ms (err {e2:.3g})  gain {t1/t2:.3f}", flush=True)
