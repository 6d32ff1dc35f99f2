import triton
import triton.language as tl


@triton.jit
def flashlight_23d6cbae263e(in0, in1, in2, out, in0_s0, in0_s1, in0_s2, in0_s3, in1_s0, in1_s1, in1_s2, in1_s3, in2_s0, in2_s1, in2_s2, in2_s3, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(37, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g0 = rest % 3
    rest = rest // 3
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = tl.arange(0, 16)
    offs_f = tl.arange(0, 16)
    N_SIZE = 37
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mt1 = m1
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    idx2 = offs_m
    x7 = tl.load(in0 + (g0) * in0_s1 + (offs_m[:, None]) * in0_s2 + (offs_e0[None, :]) * in0_s3, mask=(offs_m[:, None] < 37), other=0)
    x8 = x7.to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 37) - 1
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lo37 = col_lo - row_hi
        hi38 = col_hi - row_lo
        may39 = lo37 <= 0
        may40 = hi38 > 0
        may41 = ((may39) & (True)) | ((may40) & (False))
        may42 = ((may39) & (False)) | ((may40) & (True))
        coarse_first = tl.minimum(coarse_first, tl.where(may41, start_n, N_SIZE))
        coarse_end = tl.where(may41, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lo43 = col_lo - row_hi
        hi44 = col_hi - row_lo
        may45 = lo43 <= 0
        may46 = hi44 > 0
        may47 = ((may45) & (True)) | ((may46) & (False))
        may48 = ((may45) & (False)) | ((may46) & (True))
        tiles_first = tl.minimum(tiles_first, tl.where(may47, start_n, N_SIZE))
        tiles_end = tl.where(may47, start_n + BLOCK_N, tiles_end)
        is_full = ((may48) == 0) & (start_n + BLOCK_N <= N_SIZE)
        run_starts = is_full & (full_first == N_SIZE)
        run_grows = is_full & (full_end == start_n)
        full_first = tl.where(run_starts, start_n, full_first)
        full_end = tl.where(run_starts | run_grows, start_n + BLOCK_N, full_end)
    full_first = tl.minimum(tl.maximum(full_first, tiles_first), tiles_end)
    full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)
    for start_n in range(tiles_first, full_first, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        idx1 = offs_n
        v3 = (idx1[None, :] - idx2[:, None])
        v4 = (v3 <= 0)
        v5 = (tl.where(v4, 1, 0) != 0)
        v6 = (v5 == 0)
        x9 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0)
        x10 = x9.to(tl.float32)
        dot11 = tl.dot(x7.to(tl.bfloat16), tl.trans(x9).to(tl.bfloat16))
        v12 = tl.where(v6, float("-inf"), dot11)
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
        x19 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0)
        x20 = x19.to(tl.float32)
        dot21 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.bfloat16), x19.to(tl.bfloat16))
        acc0 = acc0 + dot21
        part22 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 + part22
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        x23 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3)
        x24 = x23.to(tl.float32)
        dot25 = tl.dot(x7.to(tl.bfloat16), tl.trans(x23).to(tl.bfloat16))
        bmax26 = tl.max(dot25, axis=1)
        mt1 = tl.maximum(mt1, bmax26, propagate_nan=tl.PropagateNan.ALL)
        grow27 = mt1 > m1 + 22.18070977791825
        if tl.max(grow27.to(tl.int32), axis=0) > 0:
            m_up1 = tl.where(mt1 == float("-inf"), 0.0, mt1)
            alpha1 = tl.exp2((m1 - m_up1) * 0.36067376022224085)
            acc0 = acc0 * alpha1[:, None]
            acc2 = acc2 * alpha1
            m1 = mt1
        m_safe1 = tl.where(m1 == float("-inf"), 0.0, m1)
        v28 = (dot25 * 0.36067376022224085)
        v29 = (m_safe1 * 0.36067376022224085)
        v30 = (v28 - v29[:, None])
        v31 = tl.exp2(v30)
        x32 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3)
        x33 = x32.to(tl.float32)
        dot34 = tl.dot(v31.to(tl.bfloat16), x32.to(tl.bfloat16))
        acc0 = acc0 + dot34
        part35 = tl.sum(v31, axis=1)
        acc2 = acc2 + part35
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        idx1 = offs_n
        v3 = (idx1[None, :] - idx2[:, None])
        v4 = (v3 <= 0)
        v5 = (tl.where(v4, 1, 0) != 0)
        v6 = (v5 == 0)
        x9 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0)
        x10 = x9.to(tl.float32)
        dot11 = tl.dot(x7.to(tl.bfloat16), tl.trans(x9).to(tl.bfloat16))
        v12 = tl.where(v6, float("-inf"), dot11)
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
        x19 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0)
        x20 = x19.to(tl.float32)
        dot21 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0).to(tl.bfloat16), x19.to(tl.bfloat16))
        acc0 = acc0 + dot21
        part22 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v18, 0.0), axis=1)
        acc2 = acc2 + part22
    res1 = mt1
    res0 = acc0
    res2 = acc2
    v36 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v36).to(tl.bfloat16), mask=(offs_m[:, None] < 37))
