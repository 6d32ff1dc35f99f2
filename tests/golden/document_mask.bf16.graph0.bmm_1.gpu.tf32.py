import triton
import triton.language as tl


@triton.jit
def flashlight_1892c63b0ddd(in0, in1, in2, in3, out, in0_s0, in1_s0, in1_s1, in1_s2, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(35, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g0 = rest % 2
    rest = rest // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = tl.arange(0, 16)
    offs_f = tl.arange(0, 16)
    N_SIZE = 35
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mt1 = m1
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    idx4 = offs_m
    x9 = tl.load(in1 + (g0) * in1_s0 + (offs_m[:, None]) * in1_s1 + (offs_e0[None, :]) * in1_s2, mask=(offs_m[:, None] < 35), other=0)
    x10 = x9.to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 35) - 1
    lv39 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    lo40 = tl.min(tl.where((offs_m < 35), lv39, 9223372036854775807))
    hi41 = tl.max(tl.where((offs_m < 35), lv39, -9223372036854775807))
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lv42 = tl.load(in0 + (offs_coarse) * in0_s0, mask=(offs_coarse < 35), other=0)
        lo43 = tl.min(tl.where((offs_coarse < 35), lv42, 9223372036854775807))
        hi44 = tl.max(tl.where((offs_coarse < 35), lv42, -9223372036854775807))
        may45 = (lo40 <= hi44) & (lo43 <= hi41)
        may46 = (lo40 == hi41) & (lo43 == hi44) & (lo40 == lo43)
        may47 = may46 == 0
        may48 = col_lo <= row_hi
        may49 = col_hi > row_lo
        may50 = (may45) & (may48)
        may51 = (may47) | (may49)
        coarse_first = tl.minimum(coarse_first, tl.where(may50, start_n, N_SIZE))
        coarse_end = tl.where(may50, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lv52 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        lo53 = tl.min(tl.where((offs_n < 35), lv52, 9223372036854775807))
        hi54 = tl.max(tl.where((offs_n < 35), lv52, -9223372036854775807))
        may55 = (lo40 <= hi54) & (lo53 <= hi41)
        may56 = (lo40 == hi41) & (lo53 == hi54) & (lo40 == lo53)
        may57 = may56 == 0
        may58 = col_lo <= row_hi
        may59 = col_hi > row_lo
        may60 = (may55) & (may58)
        may61 = (may57) | (may59)
        tiles_first = tl.minimum(tiles_first, tl.where(may60, start_n, N_SIZE))
        tiles_end = tl.where(may60, start_n + BLOCK_N, tiles_end)
        is_full = ((may61) == 0) & (start_n + BLOCK_N <= N_SIZE)
        run_starts = is_full & (full_first == N_SIZE)
        run_grows = is_full & (full_end == start_n)
        full_first = tl.where(run_starts, start_n, full_first)
        full_end = tl.where(run_starts | run_grows, start_n + BLOCK_N, full_end)
    full_first = tl.minimum(tl.maximum(full_first, tiles_first), tiles_end)
    full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)
    for start_n in range(tiles_first, full_first, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x2 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        v3 = (x1[:, None] == x2[None, :])
        idx5 = offs_n
        v6 = (idx4[:, None] >= idx5[None, :])
        v7 = (v3 & v6)
        v8 = (v7 == 0)
        x11 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0)
        x12 = x11.to(tl.float32)
        dot13 = tl.dot(x9.to(tl.bfloat16), tl.trans(x11).to(tl.bfloat16))
        v14 = tl.where(v8, float("-inf"), dot13)
        bmax15 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v14, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax15, propagate_nan=tl.PropagateNan.ALL)
        grow16 = mt1 > m1 + 22.18070977791825
        if tl.max(grow16.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v17 = (v14 * 0.36067376022224085)
        v18 = (m_safe1 * 0.36067376022224085)
        v19 = (v17 - v18[:, None])
        v20 = tl.exp2(v19)
        x21 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x22 = x21.to(tl.float32)
        dot23 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v20, 0.0).to(tl.bfloat16), x21.to(tl.bfloat16))
        acc0 = acc0 + dot23
        part24 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v20, 0.0), axis=1)
        acc2 = acc2 + part24
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x25 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2)
        x26 = x25.to(tl.float32)
        dot27 = tl.dot(x9.to(tl.bfloat16), tl.trans(x25).to(tl.bfloat16))
        bmax28 = tl.max(dot27, axis=1)
        mt1 = tl.maximum(mt1, bmax28, propagate_nan=tl.PropagateNan.ALL)
        grow29 = mt1 > m1 + 22.18070977791825
        if tl.max(grow29.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v30 = (dot27 * 0.36067376022224085)
        v31 = (m_safe1 * 0.36067376022224085)
        v32 = (v30 - v31[:, None])
        v33 = tl.exp2(v32)
        x34 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2)
        x35 = x34.to(tl.float32)
        dot36 = tl.dot(v33.to(tl.bfloat16), x34.to(tl.bfloat16))
        acc0 = acc0 + dot36
        part37 = tl.sum(v33, axis=1)
        acc2 = acc2 + part37
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x2 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        v3 = (x1[:, None] == x2[None, :])
        idx5 = offs_n
        v6 = (idx4[:, None] >= idx5[None, :])
        v7 = (v3 & v6)
        v8 = (v7 == 0)
        x11 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0)
        x12 = x11.to(tl.float32)
        dot13 = tl.dot(x9.to(tl.bfloat16), tl.trans(x11).to(tl.bfloat16))
        v14 = tl.where(v8, float("-inf"), dot13)
        bmax15 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v14, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax15, propagate_nan=tl.PropagateNan.ALL)
        grow16 = mt1 > m1 + 22.18070977791825
        if tl.max(grow16.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v17 = (v14 * 0.36067376022224085)
        v18 = (m_safe1 * 0.36067376022224085)
        v19 = (v17 - v18[:, None])
        v20 = tl.exp2(v19)
        x21 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x22 = x21.to(tl.float32)
        dot23 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v20, 0.0).to(tl.bfloat16), x21.to(tl.bfloat16))
        acc0 = acc0 + dot23
        part24 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v20, 0.0), axis=1)
        acc2 = acc2 + part24
    res1 = mt1
    res0 = acc0
    res2 = acc2
    v38 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v38).to(tl.bfloat16), mask=(offs_m[:, None] < 35))
