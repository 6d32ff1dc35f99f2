import triton
import triton.language as tl


@triton.jit
def flashlight_9431e65e54ae(in0, in1, in2, out, in0_s0, in0_s1, in0_s2, in0_s3, in1_s0, in1_s1, in1_s2, in1_s3, in2_s0, in2_s1, in2_s2, in2_s3, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(29, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g1 = rest % 2
    rest = rest // 2
    g0 = rest % 2
    rest = rest // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = tl.arange(0, 16)
    offs_f = tl.arange(0, 16)
    N_SIZE = 29
    N_FULL = N_SIZE - N_SIZE % BLOCK_N
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mt1 = m1
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (g0) * in0_s0 + (g1) * in0_s1 + (offs_m[:, None]) * in0_s2 + (offs_e0[None, :]) * in0_s3, mask=(offs_m[:, None] < 29), other=0)
    x2 = x1.to(tl.float32)
    for start_n in range(0, N_FULL, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x16 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3)
        x17 = x16.to(tl.float32)
        dot18 = tl.dot(x1.to(tl.bfloat16), tl.trans(x16).to(tl.bfloat16))
        bmax19 = tl.max(dot18, axis=1)
        mt1 = tl.maximum(mt1, bmax19, propagate_nan=tl.PropagateNan.ALL)
        grow20 = mt1 > m1 + 22.18070977791825
        if tl.max(grow20.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v21 = (dot18 * 0.36067376022224085)
        v22 = (m_safe1 * 0.36067376022224085)
        v23 = (v21 - v22[:, None])
        v24 = tl.exp2(v23)
        x25 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3)
        x26 = x25.to(tl.float32)
        dot27 = tl.dot(v24.to(tl.bfloat16), x25.to(tl.bfloat16))
        acc0 = acc0 + dot27
        part28 = tl.sum(v24, axis=1)
        acc2 = acc2 + part28
    for start_n in range(N_FULL, N_SIZE, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x3 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 29), other=0)
        x4 = x3.to(tl.float32)
        dot5 = tl.dot(x1.to(tl.bfloat16), tl.trans(x3).to(tl.bfloat16))
        bmax6 = tl.max(tl.where(offs_n[None, :] < N_SIZE, dot5, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax6, propagate_nan=tl.PropagateNan.ALL)
        grow7 = mt1 > m1 + 22.18070977791825
        if tl.max(grow7.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v8 = (dot5 * 0.36067376022224085)
        v9 = (m_safe1 * 0.36067376022224085)
        v10 = (v8 - v9[:, None])
        v11 = tl.exp2(v10)
        x12 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 29), other=0)
        x13 = x12.to(tl.float32)
        dot14 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v11, 0.0).to(tl.bfloat16), x12.to(tl.bfloat16))
        acc0 = acc0 + dot14
        part15 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v11, 0.0), axis=1)
        acc2 = acc2 + part15
    res1 = mt1
    res0 = acc0
    res2 = acc2
    v29 = (res0 / res2[:, None])
    tl.store(out + ((g0) * 2 + g1) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v29).to(tl.bfloat16), mask=(offs_m[:, None] < 29))
