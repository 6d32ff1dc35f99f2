import triton
import triton.language as tl


@triton.jit
def flashlight_4aa5683c9d19(in0, in1, in2, in3, in4, in5, out, in0_s0, in0_s1, in0_s2, in0_s3, in0_s4, in1_s0, in1_s1, in1_s2, in1_s3, in1_s4, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, in3_s3, in3_s4, in4_s0, in4_s1, in4_s2, in4_s3, in4_s4, in5_s0, in5_s1, in5_s2, in5_s3, in5_s4, out_s0, out_s1, out_s2, out_s3, out_s4, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
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
    offs_e0 = tl.arange(0, 16)
    offs_f = tl.arange(0, 16)
    N_SIZE = 23
    N_FULL = N_SIZE - N_SIZE % BLOCK_N
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mt1 = m1
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (g0) * in0_s0 + (g1) * in0_s1 + (g2) * in0_s2 + (offs_m[:, None]) * in0_s3 + (offs_e0[None, :]) * in0_s4, mask=(offs_m[:, None] < 23), other=0)
    x2 = x1.to(tl.float32)
    for start_n in range(0, N_FULL, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x24 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4)
        x25 = x24.to(tl.float32)
        dot26 = tl.dot(x1.to(tl.bfloat16), tl.trans(x24).to(tl.bfloat16))
        x27 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2)
        x28 = x27.to(tl.float32)
        v29 = (x28 - 1)
        v30 = (v29 * 1000000000.0)
        v31 = (dot26 + v30[None, :])
        x32 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23), other=0)
        x33 = x32.to(tl.float32)
        v34 = (v31 + x33)
        bmax35 = tl.max(v34, axis=1)
        mt1 = tl.maximum(mt1, bmax35, propagate_nan=tl.PropagateNan.ALL)
        grow36 = mt1 > m1 + 5.545177444479562
        if tl.max(grow36.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 1.4426950408889634)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v37 = (v34 * 1.4426950408889634)
        v38 = (m_safe1 * 1.4426950408889634)
        v39 = (v37 - v38[:, None])
        v40 = tl.exp2(v39)
        x41 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4)
        x42 = x41.to(tl.float32)
        dot43 = tl.dot(v40.to(tl.bfloat16), x41.to(tl.bfloat16))
        acc0 = acc0 + dot43
        part44 = tl.sum(v40, axis=1)
        acc2 = acc2 + part44
    for start_n in range(N_FULL, N_SIZE, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x3 = tl.load(in1 + (g0) * in1_s0 + (g1) * in1_s1 + (g2) * in1_s2 + (offs_n[:, None]) * in1_s3 + (offs_e0[None, :]) * in1_s4, mask=(offs_n[:, None] < 23), other=0)
        x4 = x3.to(tl.float32)
        dot5 = tl.dot(x1.to(tl.bfloat16), tl.trans(x3).to(tl.bfloat16))
        x6 = tl.load(in2 + (g0) * in2_s0 + (g1) * in2_s1 + (offs_n) * in2_s2, mask=(offs_n < 23), other=0)
        x7 = x6.to(tl.float32)
        v8 = (x7 - 1)
        v9 = (v8 * 1000000000.0)
        v10 = (dot5 + v9[None, :])
        x11 = tl.load(in3 + (g0) * in3_s0 + (g2) * in3_s2 + (offs_m[:, None]) * in3_s3 + (offs_n[None, :]) * in3_s4, mask=(offs_m[:, None] < 23) & (offs_n[None, :] < 23), other=0)
        x12 = x11.to(tl.float32)
        v13 = (v10 + x12)
        bmax14 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v13, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax14, propagate_nan=tl.PropagateNan.ALL)
        grow15 = mt1 > m1 + 5.545177444479562
        if tl.max(grow15.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 1.4426950408889634)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v16 = (v13 * 1.4426950408889634)
        v17 = (m_safe1 * 1.4426950408889634)
        v18 = (v16 - v17[:, None])
        v19 = tl.exp2(v18)
        x20 = tl.load(in4 + (g0) * in4_s0 + (g1) * in4_s1 + (g2) * in4_s2 + (offs_n[:, None]) * in4_s3 + (offs_f[None, :]) * in4_s4, mask=(offs_n[:, None] < 23), other=0)
        x21 = x20.to(tl.float32)
        dot22 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0).to(tl.bfloat16), x20.to(tl.bfloat16))
        acc0 = acc0 + dot22
        part23 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0), axis=1)
        acc2 = acc2 + part23
    res1 = mt1
    res0 = acc0
    res2 = acc2
    v45 = (res0 / res2[:, None])
    x46 = tl.load(in5 + (g0) * in5_s0 + (g1) * in5_s1 + (offs_m[:, None]) * in5_s2 + (g2) * in5_s3 + (offs_f[None, :]) * in5_s4, mask=(offs_m[:, None] < 23), other=0)
    x47 = x46.to(tl.float32)
    v48 = tl.sigmoid(x47)
    v49 = (v45 * v48)
    tl.store(out + (g0) * out_s0 + (g1) * out_s1 + (offs_m[:, None]) * out_s2 + (g2) * out_s3 + (offs_f[None, :]) * out_s4, (v49).to(tl.bfloat16), mask=(offs_m[:, None] < 23))
