import triton
import triton.language as tl


@triton.jit
def flashlight_3cd2c385d270(in0, in1, in2, in3, out, in0_s0, in1_s0, in1_s1, in1_s2, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    idx4 = offs_m
    x9 = tl.load(in1 + (g0) * in1_s0 + (offs_m[:, None]) * in1_s1 + (offs_e0[None, :]) * in1_s2, mask=(offs_m[:, None] < 35), other=0)
    x10 = x9.to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 35) - 1
    lv35 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    lo36 = tl.min(tl.where((offs_m < 35), lv35, 9223372036854775807))
    hi37 = tl.max(tl.where((offs_m < 35), lv35, -9223372036854775807))
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lv38 = tl.load(in0 + (offs_coarse) * in0_s0, mask=(offs_coarse < 35), other=0)
        lo39 = tl.min(tl.where((offs_coarse < 35), lv38, 9223372036854775807))
        hi40 = tl.max(tl.where((offs_coarse < 35), lv38, -9223372036854775807))
        may41 = (lo36 <= hi40) & (lo39 <= hi37)
        may42 = (lo36 == hi37) & (lo39 == hi40) & (lo36 == lo39)
        may43 = may42 == 0
        may44 = col_lo <= row_hi
        may45 = col_hi > row_lo
        may46 = (may41) & (may44)
        may47 = (may43) | (may45)
        coarse_first = tl.minimum(coarse_first, tl.where(may46, start_n, N_SIZE))
        coarse_end = tl.where(may46, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lv48 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        lo49 = tl.min(tl.where((offs_n < 35), lv48, 9223372036854775807))
        hi50 = tl.max(tl.where((offs_n < 35), lv48, -9223372036854775807))
        may51 = (lo36 <= hi50) & (lo49 <= hi37)
        may52 = (lo36 == hi37) & (lo49 == hi50) & (lo36 == lo49)
        may53 = may52 == 0
        may54 = col_lo <= row_hi
        may55 = col_hi > row_lo
        may56 = (may51) & (may54)
        may57 = (may53) | (may55)
        tiles_first = tl.minimum(tiles_first, tl.where(may56, start_n, N_SIZE))
        tiles_end = tl.where(may56, start_n + BLOCK_N, tiles_end)
        is_full = ((may57) == 0) & (start_n + BLOCK_N <= N_SIZE)
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
        v14 = (dot13 * 0.25)
        v15 = tl.where(v8, float("-inf"), v14)
        bmax16 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v15, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax16, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp(m1 - m_safe1)
        v17 = (v15 - m_safe1[:, None])
        v18 = tl.exp(v17)
        x19 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x20 = x19.to(tl.float32)
        dot21 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.bfloat16), x19.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot21
        part22 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part22
        m1 = m_new1
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x23 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2)
        x24 = x23.to(tl.float32)
        dot25 = tl.dot(x9.to(tl.bfloat16), tl.trans(x23).to(tl.bfloat16))
        v26 = (dot25 * 0.25)
        bmax27 = tl.max(v26, axis=1)
        m_new1 = tl.maximum(m1, bmax27, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp(m1 - m_safe1)
        v28 = (v26 - m_safe1[:, None])
        v29 = tl.exp(v28)
        x30 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2)
        x31 = x30.to(tl.float32)
        dot32 = tl.dot(v29.to(tl.bfloat16), x30.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot32
        part33 = tl.sum(v29, axis=1)
        acc2 = acc2 * alpha1 + part33
        m1 = m_new1
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
        v14 = (dot13 * 0.25)
        v15 = tl.where(v8, float("-inf"), v14)
        bmax16 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v15, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax16, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp(m1 - m_safe1)
        v17 = (v15 - m_safe1[:, None])
        v18 = tl.exp(v17)
        x19 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x20 = x19.to(tl.float32)
        dot21 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.bfloat16), x19.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot21
        part22 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part22
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v34 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v34).to(tl.bfloat16), mask=(offs_m[:, None] < 35))
