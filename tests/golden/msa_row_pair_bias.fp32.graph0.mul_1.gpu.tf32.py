import triton
import triton.language as tl


@triton.jit
def flashlight_30cc235e6d5e(in0, in1, in2, in3, in4, in5, out, in0_s0, in0_s1, in0_s2, in0_s3, in0_s4, in1_s0, in1_s1, in1_s2, in1_s3, in1_s4, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, in3_s3, in3_s4, in4_s0, in4_s1, in4_s2, in4_s3, in4_s4, in5_s0, in5_s1, in5_s2, in5_s3, in5_s4, out_s0, out_s1, out_s2, out_s3, out_s4, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
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
    x1 = tl.load(in0 + (g0) * in0_s0 + (g1) * in0_s1 + (g2) * in0_s2 + (offs_m[:, None]) * in0_s3 + (offs_e0[None, :]) * in0_s4, mask=(offs_m[:, None] < 23), other=0).to(tl.float32)
    for start_n in range(0, N_FULL, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x18 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4).to(tl.float32)
        dot19 = tl.dot(x1.to(tl.float32), tl.trans(x18).to(tl.float32), input_precision="tf32")
        x20 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2).to(tl.float32)
        v21 = (x20 - 1)
        v22 = (v21 * 1000000000.0)
        v23 = (dot19 + v22[None, :])
        x24 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23), other=0).to(tl.float32)
        v25 = (v23 + x24)
        bmax26 = tl.max(v25, axis=1)
        m_new1 = tl.maximum(m1, bmax26, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 1.4426950408889634)
        v27 = (v25 * 1.4426950408889634)
        v28 = (m_safe1 * 1.4426950408889634)
        v29 = (v27 - v28[:, None])
        v30 = tl.exp2(v29)
        x31 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4).to(tl.float32)
        dot32 = tl.dot(v30.to(tl.float32), x31.to(tl.float32), input_precision="tf32")
        acc0 = acc0 * alpha1[:, None] + dot32
        part33 = tl.sum(v30, axis=1)
        acc2 = acc2 * alpha1 + part33
        m1 = m_new1
    for start_n in range(N_FULL, N_SIZE, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x2 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4, mask=(offs_n[:, None] < 23), other=0).to(tl.float32)
        dot3 = tl.dot(x1.to(tl.float32), tl.trans(x2).to(tl.float32), input_precision="tf32")
        x4 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2, mask=(offs_n < 23), other=0).to(tl.float32)
        v5 = (x4 - 1)
        v6 = (v5 * 1000000000.0)
        v7 = (dot3 + v6[None, :])
        x8 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23) & (offs_n[None, :] < 23), other=0).to(tl.float32)
        v9 = (v7 + x8)
        bmax10 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v9, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax10, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 1.4426950408889634)
        v11 = (v9 * 1.4426950408889634)
        v12 = (m_safe1 * 1.4426950408889634)
        v13 = (v11 - v12[:, None])
        v14 = tl.exp2(v13)
        x15 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4, mask=(offs_n[:, None] < 23), other=0).to(tl.float32)
        dot16 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v14, 0.0).to(tl.float32), x15.to(tl.float32), input_precision="tf32")
        acc0 = acc0 * alpha1[:, None] + dot16
        part17 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v14, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part17
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v34 = (res0 / res2[:, None])
    x35 = tl.load(in5 + (g0) * in5_s0 + (g1) * in5_s1 + (offs_m[:, None]) * in5_s2 + (g2) * in5_s3 + (offs_f[None, :]) * in5_s4, mask=(offs_m[:, None] < 23), other=0).to(tl.float32)
    v36 = tl.sigmoid(x35)
    v37 = (v34 * v36)
    tl.store(out + (g0) * out_s0 + (g1) * out_s1 + (offs_m[:, None]) * out_s2 + (g2) * out_s3 + (offs_f[None, :]) * out_s4, (v37).to(tl.float32), mask=(offs_m[:, None] < 23))
