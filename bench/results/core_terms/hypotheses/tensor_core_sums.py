"""Fewer instructions per score in the bf16 core: two changes to the online softmax's key
step, each in an otherwise identical hand-written kernel (m0: the generated kernel's score
arithmetic, as in accumulator.py).

m3  lazy rescale: the running max moves, and the accumulator, the row sums and the max
    are rescaled, only when some row's max grew by more than TAU (base 2) in this step;
    otherwise the step exponentiates against the stale max (p <= 2**TAU, exact in float32
    and representable in bf16 with the same relative rounding). One block-wide max and a
    branch per step instead of a multiply per accumulator element.
m4  the row sums on the tensor core: l accumulated as p @ ones[BN, 16] beside p @ v.
m5  both.

`python tensor_core_sums.py aot` (no GPU): compiles each for sm_90 and counts the SASS instructions of
the key loop; `python tensor_core_sums.py` on a GPU: ms per mode and tile, max error vs float64."""
import os, re, subprocess, sys, tempfile, collections
import torch, triton, triton.language as tl

TAU = 8.0


@triton.jit
def kern(q, k, mb, pb, v, out, L: tl.constexpr, H: tl.constexpr, C: tl.constexpr, BM: tl.constexpr,
         BN: tl.constexpr, MODE: tl.constexpr, SCALE: tl.constexpr):
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
    lacc = tl.zeros([BM, 16], tl.float32)
    ones = tl.full([BN, 16], 1.0, tl.bfloat16)
    for s in range(0, L, BN):
        offs_n = s + tl.arange(0, BN)
        kt = tl.load(k + base + offs_n[:, None] * C + offs_c[None, :])
        mk = tl.load(mb + n * L + offs_n).to(tl.float32) * 1.4426950408889634
        bias = tl.load(pb + (h * L + offs_m[:, None]) * L + offs_n[None, :]).to(tl.float32)
        # scores in base 2: dot * (scale log2e) + mask log2e + bias log2e
        sc = tl.dot(qt, tl.trans(kt)) * (SCALE * 1.4426950408889634) + mk[None, :] + bias * 1.4426950408889634
        mn = tl.maximum(m, tl.max(sc, axis=1))
        vt = tl.load(v + base + offs_n[:, None] * C + offs_c[None, :])
        if MODE == 0 or MODE == 4:
            alpha = tl.exp2(m - mn)
            p = tl.exp2(sc - mn[:, None])
            pb16 = p.to(tl.bfloat16)
            acc = acc * alpha[:, None] + tl.dot(pb16, vt)
            if MODE == 0:
                l = l * alpha + tl.sum(p, axis=1)
            else:
                lacc = lacc * alpha[:, None] + tl.dot(pb16, ones)
            m = mn
        else:
            grow = tl.max(mn - m, axis=0)
            if grow > 8.0:
                alpha = tl.exp2(m - mn)
                acc = acc * alpha[:, None]
                if MODE == 3:
                    l = l * alpha
                else:
                    lacc = lacc * alpha[:, None]
                m = mn
            p = tl.exp2(sc - m[:, None])
            pb16 = p.to(tl.bfloat16)
            acc += tl.dot(pb16, vt)
            if MODE == 3:
                l += tl.sum(p, axis=1)
            else:
                lacc = tl.dot(pb16, ones, lacc)
    if MODE == 4 or MODE == 5:
        l = tl.sum(lacc, axis=1) * (1.0 / 16)
    tl.store(out + base + offs_m[:, None] * C + offs_c[None, :], (acc / l[:, None]).to(tl.bfloat16))


CONFIGS = [(128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)]
MODES = (0, 3, 4, 5)


def key_step(sass: str) -> tuple[int, int]:
    """Instructions of the key loop's body (from the branch back to its start), and those
    a forward branch inside it skips (the lazy rescale)."""
    labels, ins = {}, []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
        elif re.match(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", line):
            ins.append(line)
    for j, text in enumerate(ins):
        target = re.search(r"BRA\s+`?\(?(\.L_x_\d+)", text)
        if target and labels.get(target.group(1), len(ins)) < j:
            start = labels[target.group(1)]
            inner = [(i, re.search(r"(\.L_x_\d+)", ins[i]).group(1)) for i in range(start, j) if "BRA" in ins[i]]
            skipped = sum(labels[t] - i - 1 for i, t in inner if i < labels[t] <= j)
            return j - start + 1, skipped
    return len(ins), 0


def aot(L=1024, H=8, C=32):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    for BM, BN, w, st in CONFIGS:
        line = f"{BM}x{BN} w{w} s{st}:"
        for mode in MODES:
            sig = {"q": "*bf16", "k": "*bf16", "mb": "*bf16", "pb": "*bf16", "v": "*bf16", "out": "*bf16",
                   "L": "constexpr", "H": "constexpr", "C": "constexpr", "BM": "constexpr", "BN": "constexpr",
                   "MODE": "constexpr", "SCALE": "constexpr"}
            consts = {"L": L, "H": H, "C": C, "BM": BM, "BN": BN, "MODE": mode, "SCALE": C ** -0.5}
            attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
            kk = triton.compile(ASTSource(kern, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": w, "num_stages": st})
            with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                f.write(kk.asm["cubin"])
            sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout
            usage = subprocess.run([tool.replace("nvdisasm", "cuobjdump"), "-res-usage", f.name],
                                   capture_output=True, text=True).stdout
            os.unlink(f.name)
            regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", usage).groups()
            pass
            body, skippable = key_step(sass)
            line += f"  m{mode} {body} per step ({body - skippable} unrescaled), regs {regs}, stack {stack}"
        print(line, flush=True)


def ref(q, k, v, mb, pb):
    a = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5 + mb.double() + pb.double()
    return torch.softmax(a, -1) @ v.double()


def bench():
    from triton.testing import do_bench
    for (N, L, H) in [(512, 256, 8), (512, 1024, 8), (1024, 1024, 4), (256, 256, 4)]:
        C = 32
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(N, H, L, C, device="cuda", generator=g).bfloat16() for _ in range(3))
        mb = torch.where(torch.rand(N, 1, 1, L, device="cuda", generator=g) < 0.2, -1e9, 0.0).bfloat16()
        pb = torch.randn(1, H, L, L, device="cuda", generator=g).bfloat16()
        r = ref(q, k, v, mb, pb)
        out = torch.empty_like(q)
        best = {}
        for BM, BN, w, st in CONFIGS:
            line = f"N{N} L{L} H{H} {BM}x{BN} w{w} s{st}:"
            for mode in MODES:
                f = lambda: kern[(L // BM * H * N,)](q, k, mb, pb, v, out, L, H, C, BM, BN, mode, C ** -0.5,
                                                     num_warps=w, num_stages=st)
                try:
                    out.zero_(); f(); e = (out.double() - r).abs().max().item()
                    t = do_bench(f, warmup=25, rep=200, return_mode="median")
                except Exception as exc:  # a configuration that does not compile
                    line += f"  m{mode} error {type(exc).__name__}"; continue
                best[mode] = min(best.get(mode, 1e9), t)
                line += f"  m{mode} {t:.4f} ({e:.2g})"
            print(line, flush=True)
        print(f"N{N} L{L} H{H} best: " + "  ".join(f"m{k} {t:.4f}" for k, t in sorted(best.items())), flush=True)


if __name__ == "__main__":
    aot() if sys.argv[1:] == ["aot"] else bench()
