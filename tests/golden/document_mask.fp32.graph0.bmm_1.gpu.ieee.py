import triton
import triton.language as tl


@triton.jit
def flashlight_863e135dc4ca(in0, in1, in2, in3, out, in0_s0, in1_s0, in1_s1, in1_s2, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    x9 = tl.load(in1 + (g0) * in1_s0 + (offs_m[:, None]) * in1_s1 + (offs_e0[None, :]) * in1_s2, mask=(offs_m[:, None] < 35), other=0).to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 35) - 1
    lv34 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    lo35 = tl.min(tl.where((offs_m < 35), lv34, 9223372036854775807))
    hi36 = tl.max(tl.where((offs_m < 35), lv34, -9223372036854775807))
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lv37 = tl.load(in0 + (offs_coarse) * in0_s0, mask=(offs_coarse < 35), other=0)
        lo38 = tl.min(tl.where((offs_coarse < 35), lv37, 9223372036854775807))
        hi39 = tl.max(tl.where((offs_coarse < 35), lv37, -9223372036854775807))
        may40 = (lo35 <= hi39) & (lo38 <= hi36)
        may41 = (lo35 == hi36) & (lo38 == hi39) & (lo35 == lo38)
        may42 = may41 == 0
        may43 = col_lo <= row_hi
        may44 = col_hi > row_lo
        may45 = (may40) & (may43)
        may46 = (may42) | (may44)
        coarse_first = tl.minimum(coarse_first, tl.where(may45, start_n, N_SIZE))
        coarse_end = tl.where(may45, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lv47 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        lo48 = tl.min(tl.where((offs_n < 35), lv47, 9223372036854775807))
        hi49 = tl.max(tl.where((offs_n < 35), lv47, -9223372036854775807))
        may50 = (lo35 <= hi49) & (lo48 <= hi36)
        may51 = (lo35 == hi36) & (lo48 == hi49) & (lo35 == lo48)
        may52 = may51 == 0
        may53 = col_lo <= row_hi
        may54 = col_hi > row_lo
        may55 = (may50) & (may53)
        may56 = (may52) | (may54)
        tiles_first = tl.minimum(tiles_first, tl.where(may55, start_n, N_SIZE))
        tiles_end = tl.where(may55, start_n + BLOCK_N, tiles_end)
        is_full = ((may56) == 0) & (start_n + BLOCK_N <= N_SIZE)
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
        x10 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot11 = tl.dot(x9.to(tl.float32), tl.trans(x10).to(tl.float32), input_precision="ieee")
        v12 = tl.where(v8, float("-inf"), dot11)
        bmax13 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v12, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        grow14 = mt1 > m1 + 22.18070977791825
        if tl.max(grow14.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v15 = (v12 * 0.36067376022224085)
        v16 = (m_safe1 * 0.36067376022224085)
        v17 = (v15 - v16[:, None])
        v18 = tl.exp2(v17)
        x19 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot20 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.float32), x19.to(tl.float32), input_precision="ieee")
        acc0 = acc0 + dot20
        part21 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 + part21
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x22 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2).to(tl.float32)
        dot23 = tl.dot(x9.to(tl.float32), tl.trans(x22).to(tl.float32), input_precision="ieee")
        bmax24 = tl.max(dot23, axis=1)
        mt1 = tl.maximum(mt1, bmax24, propagate_nan=tl.PropagateNan.ALL)
        grow25 = mt1 > m1 + 22.18070977791825
        if tl.max(grow25.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v26 = (dot23 * 0.36067376022224085)
        v27 = (m_safe1 * 0.36067376022224085)
        v28 = (v26 - v27[:, None])
        v29 = tl.exp2(v28)
        x30 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2).to(tl.float32)
        dot31 = tl.dot(v29.to(tl.float32), x30.to(tl.float32), input_precision="ieee")
        acc0 = acc0 + dot31
        part32 = tl.sum(v29, axis=1)
        acc2 = acc2 + part32
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x2 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        v3 = (x1[:, None] == x2[None, :])
        idx5 = offs_n
        v6 = (idx4[:, None] >= idx5[None, :])
        v7 = (v3 & v6)
        v8 = (v7 == 0)
        x10 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot11 = tl.dot(x9.to(tl.float32), tl.trans(x10).to(tl.float32), input_precision="ieee")
        v12 = tl.where(v8, float("-inf"), dot11)
        bmax13 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v12, float("-inf")), axis=1)
        mt1 = tl.maximum(mt1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        grow14 = mt1 > m1 + 22.18070977791825
        if tl.max(grow14.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v15 = (v12 * 0.36067376022224085)
        v16 = (m_safe1 * 0.36067376022224085)
        v17 = (v15 - v16[:, None])
        v18 = tl.exp2(v17)
        x19 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot20 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.float32), x19.to(tl.float32), input_precision="ieee")
        acc0 = acc0 + dot20
        part21 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 + part21
    res1 = mt1
    res0 = acc0
    res2 = acc2
    v33 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v33).to(tl.float32), mask=(offs_m[:, None] < 35))
