import triton
import triton.language as tl


@triton.jit
def flashlight_32dcc1eaa1cb(in0, in1, in2, out, in0_s0, in0_s1, in0_s2, in0_s3, in1_s0, in1_s1, in1_s2, in1_s3, in2_s0, in2_s1, in2_s2, in2_s3, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
    pid = tl.program_id(0)
    if INDEX_BITS == 64:
        pid = pid.to(tl.int64)
    index0 = pid * 0
    num_m = tl.cdiv(29, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g1 = rest % 2
    rest = rest // 2
    g0 = rest % 2
    rest = rest // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = index0 + tl.arange(0, 16)
    offs_f = index0 + tl.arange(0, 16)
    N_SIZE = 29
    N_FULL = N_SIZE - N_SIZE % BLOCK_N
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (g0) * in0_s0 + (g1) * in0_s1 + (offs_m[:, None]) * in0_s2 + (offs_e0[None, :]) * in0_s3, mask=(offs_m[:, None] < 29), other=0)
    x2 = (x1.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    for start_n in range(0, N_FULL, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x15 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3)
        x16 = (x15.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot17 = tl.dot(x1.to(tl.bfloat16), tl.trans(x15).to(tl.bfloat16))
        bmax18 = tl.max(dot17, axis=1)
        m_new1 = tl.maximum(m1, bmax18, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v19 = (dot17 * 0.36067376022224085)
        v20 = (m_safe1 * 0.36067376022224085)
        v21 = (v19 - v20[:, None])
        v22 = tl.exp2(v21)
        x23 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3)
        x24 = (x23.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot25 = tl.dot(v22.to(tl.bfloat16), x23.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot25
        part26 = tl.sum(v22, axis=1)
        acc2 = acc2 * alpha1 + part26
        m1 = m_new1
    for start_n in range(N_FULL, N_SIZE, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x3 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 29), other=0)
        x4 = (x3.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot5 = tl.dot(x1.to(tl.bfloat16), tl.trans(x3).to(tl.bfloat16))
        bmax6 = tl.max(tl.where(offs_n[None, :] < N_SIZE, dot5, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax6, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v7 = (dot5 * 0.36067376022224085)
        v8 = (m_safe1 * 0.36067376022224085)
        v9 = (v7 - v8[:, None])
        v10 = tl.exp2(v9)
        x11 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 29), other=0)
        x12 = (x11.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot13 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v10, 0.0).to(tl.bfloat16), x11.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot13
        part14 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v10, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part14
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v27 = (res0 / res2[:, None])
    tl.store(out + ((g0) * 2 + g1) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v27).to(tl.bfloat16), mask=(offs_m[:, None] < 29))
