"""Is the bf16 core bound by its address arithmetic and by running the softmax in the
same warps as the tensor-core work? The core of ``accumulator.py``'s m0 (today's score
arithmetic) in four forms, otherwise identical: P its pointer loads; T q, k, v and the pair
bias read through host-built TMA descriptors (``TensorDescriptor``: one instruction per
tile, no per-element addresses); PW / TW the same with the key loop warp-specialized
(``tl.range(..., warp_specialize=True)``: producer warps load, consumer warps compute),
where Triton supports it on this GPU. FlexAttention (compiled, biases in ``score_mod``) in
the same process. Run on the GPU as ``python tma_ws.py``; one line per shape and tile:
ms (max error vs float64), or the error raised. ``python tma_ws.py P,T`` runs only those
forms (a warp-specialized kernel that hangs takes the others with it)."""
import sys
import torch, triton, triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def kern(q, k, mb, pb, v, out, qd, kd, vd, pd, L: tl.constexpr, H: tl.constexpr, C: tl.constexpr,
         BM: tl.constexpr, BN: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr, SCALE: tl.constexpr):
    pid = tl.program_id(0)
    num_m = L // BM
    pid_m = pid % num_m
    rest = pid // num_m
    h = rest % H
    n = rest // H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_c = tl.arange(0, C)
    row0 = (n * H + h) * L
    base = row0 * C
    if TMA:
        qt = qd.load([row0 + pid_m * BM, 0])
    else:
        qt = tl.load(q + base + offs_m[:, None] * C + offs_c[None, :])
    m = tl.full([BM], float("-inf"), tl.float32)
    acc = tl.zeros([BM, C], tl.float32)
    l = tl.zeros([BM], tl.float32)
    for s in tl.range(0, L, BN, warp_specialize=WS):
        offs_n = s + tl.arange(0, BN)
        mk = tl.load(mb + n * L + offs_n).to(tl.float32)
        if TMA:
            kt = kd.load([row0 + s, 0])
            bias = pd.load([h * L + pid_m * BM, s]).to(tl.float32)
        else:
            kt = tl.load(k + base + offs_n[:, None] * C + offs_c[None, :])
            bias = tl.load(pb + (h * L + offs_m[:, None]) * L + offs_n[None, :]).to(tl.float32)
        sc = tl.dot(qt, tl.trans(kt)) * SCALE + mk[None, :] + bias
        mn = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp2((m - mn) * 1.4426950408889634)
        p = tl.exp2(sc * 1.4426950408889634 - (mn * 1.4426950408889634)[:, None])
        if TMA:
            vt = vd.load([row0 + s, 0])
        else:
            vt = tl.load(v + base + offs_n[:, None] * C + offs_c[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), vt)
        l = l * alpha + tl.sum(p, axis=1)
        m = mn
    tl.store(out + base + offs_m[:, None] * C + offs_c[None, :], (acc / l[:, None]).to(tl.bfloat16))


def ref(q, k, v, mb, pb):
    a = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5 + mb.double() + pb.double()
    return torch.softmax(a, -1) @ v.double()


def flex_fn():
    from torch.nn.attention.flex_attention import flex_attention

    @torch.compile
    def f(q, k, v, mb, pb):
        def score_mod(score, b, h, i, j):
            return score + mb[b, 0, 0, j] + pb[0, h, i, j]
        return flex_attention(q, k, v, score_mod=score_mod)
    return f


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
flex = flex_fn()
for (N, L, H) in [(512, 256, 8), (256, 256, 4), (1024, 1024, 4), (512, 1024, 8)]:
    C = 32
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(N, H, L, C, device="cuda", generator=g).bfloat16() for _ in range(3))
    mb = torch.where(torch.rand(N, 1, 1, L, device="cuda", generator=g) < 0.2, -1e9, 0.0).bfloat16()
    pb = torch.randn(1, H, L, L, device="cuda", generator=g).bfloat16()
    r = ref(q, k, v, mb, pb)
    o = flex(q, k, v, mb, pb)
    t = do_bench(lambda: flex(q, k, v, mb, pb), warmup=25, rep=200, return_mode="median")
    print(f"N{N} L{L} H{H} flex {t:.4f} ({(o.double() - r).abs().max().item():.2g})", flush=True)
    out = torch.empty_like(q)
    q2, k2, v2, p2 = q.view(-1, C), k.view(-1, C), v.view(-1, C), pb.view(-1, L)
    for BM, BN, w, st in [(128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 2),
                          (128, 128, 8, 2), (64, 128, 4, 3)]:
        descs = (TensorDescriptor.from_tensor(q2, [BM, C]), TensorDescriptor.from_tensor(k2, [BN, C]),
                 TensorDescriptor.from_tensor(v2, [BN, C]), TensorDescriptor.from_tensor(p2, [BM, BN]))
        line = f"N{N} L{L} H{H} {BM}x{BN} w{w} s{st}:"
        forms = (("P", 0, 0), ("T", 1, 0), ("PW", 0, 1), ("TW", 1, 1))
        for name, tma, ws in (f for f in forms if len(sys.argv) < 2 or f[0] in sys.argv[1].split(",")):
            f = lambda: kern[(L // BM * H * N,)](q, k, mb, pb, v, out, *descs, L, H, C, BM, BN, tma, ws, C ** -0.5,
                                                 num_warps=w, num_stages=st)
            try:
                out.zero_(); f(); e = (out.double() - r).abs().max().item()
                t = do_bench(f, warmup=25, rep=200, return_mode="median")
                line += f"  {name} {t:.4f} ({e:.2g})"
            except Exception as error:  # noqa: BLE001
                line += f"  {name} {type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''}"
        print(line, flush=True)
