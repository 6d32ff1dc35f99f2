import triton
import triton.language as tl


@triton.jit
def flashlight_929ef4338d9b(in0, in1, in2, in3, in4, in5, out, in0_s0, in0_s1, in0_s2, in0_s3, in0_s4, in1_s0, in1_s1, in1_s2, in1_s3, in1_s4, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, in3_s3, in3_s4, in4_s0, in4_s1, in4_s2, in4_s3, in4_s4, in5_s0, in5_s1, in5_s2, in5_s3, in5_s4, out_s0, out_s1, out_s2, out_s3, out_s4, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
    pid = tl.program_id(0)
    if INDEX_BITS == 64:
        pid = pid.to(tl.int64)
    index0 = pid * 0
    num_m = tl.cdiv(23, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g2 = rest % 2
    rest = rest // 2
    g1 = rest % 3
    rest = rest // 3
    g0 = rest % 2
    rest = rest // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = index0 + tl.arange(0, 16)
    offs_f = index0 + tl.arange(0, 16)
    N_SIZE = 23
    N_FULL = N_SIZE - N_SIZE % BLOCK_N
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (g0) * in0_s0 + (g1) * in0_s1 + (g2) * in0_s2 + (offs_m[:, None]) * in0_s3 + (offs_e0[None, :]) * in0_s4, mask=(offs_m[:, None] < 23), other=0)
    x2 = (x1.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    for start_n in range(0, N_FULL, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x23 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4)
        x24 = (x23.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot25 = tl.dot(x1.to(tl.bfloat16), tl.trans(x23).to(tl.bfloat16))
        x26 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2)
        x27 = (x26.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        v28 = (x27 - 1)
        v29 = (v28 * 1000000000.0)
        v30 = (dot25 + v29[None, :])
        x31 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23), other=0)
        x32 = (x31.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        v33 = (v30 + x32)
        bmax34 = tl.max(v33, axis=1)
        m_new1 = tl.maximum(m1, bmax34, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 1.4426950408889634)
        v35 = (v33 * 1.4426950408889634)
        v36 = (m_safe1 * 1.4426950408889634)
        v37 = (v35 - v36[:, None])
        v38 = tl.exp2(v37)
        x39 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4)
        x40 = (x39.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot41 = tl.dot(v38.to(tl.bfloat16), x39.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot41
        part42 = tl.sum(v38, axis=1)
        acc2 = acc2 * alpha1 + part42
        m1 = m_new1
    for start_n in range(N_FULL, N_SIZE, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x3 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4, mask=(offs_n[:, None] < 23), other=0)
        x4 = (x3.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot5 = tl.dot(x1.to(tl.bfloat16), tl.trans(x3).to(tl.bfloat16))
        x6 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2, mask=(offs_n < 23), other=0)
        x7 = (x6.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        v8 = (x7 - 1)
        v9 = (v8 * 1000000000.0)
        v10 = (dot5 + v9[None, :])
        x11 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23) & (offs_n[None, :] < 23), other=0)
        x12 = (x11.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        v13 = (v10 + x12)
        bmax14 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v13, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax14, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 1.4426950408889634)
        v15 = (v13 * 1.4426950408889634)
        v16 = (m_safe1 * 1.4426950408889634)
        v17 = (v15 - v16[:, None])
        v18 = tl.exp2(v17)
        x19 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4, mask=(offs_n[:, None] < 23), other=0)
        x20 = (x19.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot21 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.bfloat16), x19.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot21
        part22 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part22
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v43 = (res0 / res2[:, None])
    x44 = tl.load(in5 + (g0) * in5_s0 + (g1) * in5_s1 + (offs_m[:, None]) * in5_s2 + (g2) * in5_s3 + (offs_f[None, :]) * in5_s4, mask=(offs_m[:, None] < 23), other=0)
    x45 = (x44.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    v46 = tl.sigmoid(x45)
    v47 = (v43 * v46)
    tl.store(out + (g0) * out_s0 + (g1) * out_s1 + (offs_m[:, None]) * out_s2 + (g2) * out_s3 + (offs_f[None, :]) * out_s4, (v47).to(tl.bfloat16), mask=(offs_m[:, None] < 23))
