import triton
import triton.language as tl


@triton.jit
def flashlight_d77c94b238a4(in0, in1, in2, out, in0_s0, in0_s1, in0_s2, in0_s3, in1_s0, in1_s1, in1_s2, in1_s3, in2_s0, in2_s1, in2_s2, in2_s3, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
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
    x7 = tl.load(in0 + (g0) * in0_s1 + (offs_m[:, None]) * in0_s2 + (offs_e0[None, :]) * in0_s3, mask=(offs_m[:, None] < 37), other=0)
    x8 = (x7.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 37) - 1
    coarse_first = N_SIZE + tl.zeros([], tl.int32)
    coarse_end = tl.zeros([], tl.int32)
    for start_n in range(0, N_SIZE, (BLOCK_N * 16)):
        offs_coarse = index0 + start_n + tl.arange(0, (BLOCK_N * 16))
        col_lo = start_n
        col_hi = tl.minimum(start_n + (BLOCK_N * 16), N_SIZE) - 1
        lo35 = col_lo - row_hi
        hi36 = col_hi - row_lo
        may37 = lo35 <= 0
        may38 = hi36 > 0
        may39 = ((may37) & (True)) | ((may38) & (False))
        may40 = ((may37) & (False)) | ((may38) & (True))
        coarse_first = tl.minimum(coarse_first, tl.where(may39, start_n, N_SIZE))
        coarse_end = tl.where(may39, tl.minimum(start_n + (BLOCK_N * 16), N_SIZE), coarse_end)
    tiles_first = N_SIZE + tl.zeros([], tl.int32)
    tiles_end = tl.zeros([], tl.int32)
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = tl.zeros([], tl.int32) - 1
    for start_n in range(coarse_first, coarse_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        col_lo = start_n
        col_hi = tl.minimum(start_n + BLOCK_N, N_SIZE) - 1
        lo41 = col_lo - row_hi
        hi42 = col_hi - row_lo
        may43 = lo41 <= 0
        may44 = hi42 > 0
        may45 = ((may43) & (True)) | ((may44) & (False))
        may46 = ((may43) & (False)) | ((may44) & (True))
        tiles_first = tl.minimum(tiles_first, tl.where(may45, start_n, N_SIZE))
        tiles_end = tl.where(may45, start_n + BLOCK_N, tiles_end)
        is_full = ((may46) == 0) & (start_n + BLOCK_N <= N_SIZE)
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
        x9 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0)
        x10 = (x9.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot11 = tl.dot(x7.to(tl.bfloat16), tl.trans(x9).to(tl.bfloat16))
        v12 = tl.where(v6, float("-inf"), dot11)
        bmax13 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v12, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v14 = (v12 * 0.36067376022224085)
        v15 = (m_safe1 * 0.36067376022224085)
        v16 = (v14 - v15[:, None])
        v17 = tl.exp2(v16)
        x18 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0)
        x19 = (x18.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot20 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0).to(tl.bfloat16), x18.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot20
        part21 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part21
        m1 = m_new1
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x22 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3)
        x23 = (x22.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot24 = tl.dot(x7.to(tl.bfloat16), tl.trans(x22).to(tl.bfloat16))
        bmax25 = tl.max(dot24, axis=1)
        m_new1 = tl.maximum(m1, bmax25, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v26 = (dot24 * 0.36067376022224085)
        v27 = (m_safe1 * 0.36067376022224085)
        v28 = (v26 - v27[:, None])
        v29 = tl.exp2(v28)
        x30 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3)
        x31 = (x30.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot32 = tl.dot(v29.to(tl.bfloat16), x30.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot32
        part33 = tl.sum(v29, axis=1)
        acc2 = acc2 * alpha1 + part33
        m1 = m_new1
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        idx1 = offs_n
        v3 = (idx1[None, :] - idx2[:, None])
        v4 = (v3 <= 0)
        v5 = (tl.where(v4, 1, 0) != 0)
        v6 = (v5 == 0)
        x9 = tl.load(in1 + (g0) * in1_s1 + (offs_n[:, None]) * in1_s2 + (offs_e0[None, :]) * in1_s3, mask=(offs_n[:, None] < 37), other=0)
        x10 = (x9.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot11 = tl.dot(x7.to(tl.bfloat16), tl.trans(x9).to(tl.bfloat16))
        v12 = tl.where(v6, float("-inf"), dot11)
        bmax13 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v12, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v14 = (v12 * 0.36067376022224085)
        v15 = (m_safe1 * 0.36067376022224085)
        v16 = (v14 - v15[:, None])
        v17 = tl.exp2(v16)
        x18 = tl.load(in2 + (g0) * in2_s1 + (offs_n[:, None]) * in2_s2 + (offs_f[None, :]) * in2_s3, mask=(offs_n[:, None] < 37), other=0)
        x19 = (x18.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot20 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0).to(tl.bfloat16), x18.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot20
        part21 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part21
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v34 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v34).to(tl.bfloat16), mask=(offs_m[:, None] < 37))
