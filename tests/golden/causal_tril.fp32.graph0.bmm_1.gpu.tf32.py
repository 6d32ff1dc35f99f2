import triton
import triton.language as tl


@triton.jit
def flashlight_dff215824792(in0, in1, in2, out, in0_s0, in0_s1, in0_s2, in0_s3, in1_s0, in1_s1, in1_s2, in1_s3, in2_s0, in2_s1, in2_s2, in2_s3, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
    pid = tl.program_id(0)
    if INDEX_BITS == 64:
        pid = pid.to(tl.int64)
    index0 = pid * 0
    num_m = tl.cdiv(37, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g0 = rest % 3
    rest = rest // 3
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = index0 + tl.arange(0, 16)
    offs_f = index0 + tl.arange(0, 16)
    N_SIZE = 37
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    idx2 = offs_m
    x7 = tl.load(in0 + (g0) * in0_s1 + (offs_m[:, None]) * in0_s2 + (offs_e0[None, :]) * in0_s3, mask=(offs_m[:, None] < 37), other=0).to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 37) - 1
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = index0 + start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lo30 = col_lo - row_hi
        hi31 = col_hi - row_lo
        may32 = lo30 <= 0
        may33 = hi31 > 0
        may34 = ((may32) & (True)) | ((may33) & (False))
        may35 = ((may32) & (False)) | ((may33) & (True))
        coarse_first = tl.minimum(coarse_first, tl.where(may34, start_n, N_SIZE))
        coarse_end = tl.where(may34, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lo36 = col_lo - row_hi
        hi37 = col_hi - row_lo
        may38 = lo36 <= 0
        may39 = hi37 > 0
        may40 = ((may38) & (True)) | ((may39) & (False))
        may41 = ((may38) & (False)) | ((may39) & (True))
        tiles_first = tl.minimum(tiles_first, tl.where(may40, start_n, N_SIZE))
        tiles_end = tl.where(may40, start_n + BLOCK_N, tiles_end)
        is_full = ((may41) == 0) & (start_n + BLOCK_N <= N_SIZE)
        run_starts = is_full & (full_first == N_SIZE)
        run_grows = is_full & (full_end == start_n)
        full_first = tl.where(run_starts, start_n, full_first)
        full_end = tl.where(run_starts | run_grows, start_n + BLOCK_N, full_end)
    full_first = tl.minimum(tl.maximum(full_first, tiles_first), tiles_end)
    full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)
    for start_n in range(tiles_first, full_first, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        idx1 = offs_n
        v3 = (idx1[None, :] - idx2[:, None])
        v4 = (v3 <= 0)
        v5 = (tl.where(v4, 1, 0) != 0)
        v6 = (v5 == 0)
        x8 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0).to(tl.float32)
        dot9 = tl.dot(x7.to(tl.float32), tl.trans(x8).to(tl.float32), input_precision="tf32")
        v10 = tl.where(v6, float("-inf"), dot9)
        bmax11 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v10, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax11, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v12 = (v10 * 0.36067376022224085)
        v13 = (m_safe1 * 0.36067376022224085)
        v14 = (v12 - v13[:, None])
        v15 = tl.exp2(v14)
        x16 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0).to(tl.float32)
        dot17 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v15, 0.0).to(tl.float32), x16.to(tl.float32), input_precision="tf32")
        acc0 = acc0 * alpha1[:, None] + dot17
        part18 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v15, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part18
        m1 = m_new1
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x19 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3).to(tl.float32)
        dot20 = tl.dot(x7.to(tl.float32), tl.trans(x19).to(tl.float32), input_precision="tf32")
        bmax21 = tl.max(dot20, axis=1)
        m_new1 = tl.maximum(m1, bmax21, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v22 = (dot20 * 0.36067376022224085)
        v23 = (m_safe1 * 0.36067376022224085)
        v24 = (v22 - v23[:, None])
        v25 = tl.exp2(v24)
        x26 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3).to(tl.float32)
        dot27 = tl.dot(v25.to(tl.float32), x26.to(tl.float32), input_precision="tf32")
        acc0 = acc0 * alpha1[:, None] + dot27
        part28 = tl.sum(v25, axis=1)
        acc2 = acc2 * alpha1 + part28
        m1 = m_new1
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        idx1 = offs_n
        v3 = (idx1[None, :] - idx2[:, None])
        v4 = (v3 <= 0)
        v5 = (tl.where(v4, 1, 0) != 0)
        v6 = (v5 == 0)
        x8 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0).to(tl.float32)
        dot9 = tl.dot(x7.to(tl.float32), tl.trans(x8).to(tl.float32), input_precision="tf32")
        v10 = tl.where(v6, float("-inf"), dot9)
        bmax11 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v10, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax11, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v12 = (v10 * 0.36067376022224085)
        v13 = (m_safe1 * 0.36067376022224085)
        v14 = (v12 - v13[:, None])
        v15 = tl.exp2(v14)
        x16 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0).to(tl.float32)
        dot17 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v15, 0.0).to(tl.float32), x16.to(tl.float32), input_precision="tf32")
        acc0 = acc0 * alpha1[:, None] + dot17
        part18 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v15, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part18
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v29 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v29).to(tl.float32), mask=(offs_m[:, None] < 37))
