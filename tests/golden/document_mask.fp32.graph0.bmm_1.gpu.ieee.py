import triton
import triton.language as tl


@triton.jit
def flashlight_499053d91fed(in0, in1, in2, in3, out, in0_s0, in1_s0, in1_s1, in1_s2, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
    pid = tl.program_id(0)
    if INDEX_BITS == 64:
        pid = pid.to(tl.int64)
    index0 = pid * 0
    num_m = tl.cdiv(35, BLOCK_M)
    pid_m = pid % num_m
    rest = pid // num_m
    g0 = rest % 2
    rest = rest // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_e0 = index0 + tl.arange(0, 16)
    offs_f = index0 + tl.arange(0, 16)
    N_SIZE = 35
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    acc0 = tl.zeros([BLOCK_M, 16], tl.float32)
    acc2 = tl.zeros([BLOCK_M], tl.float32)
    x1 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    idx4 = offs_m
    x9 = tl.load(in1 + (g0) * in1_s0 + (offs_m[:, None]) * in1_s1 + (offs_e0[None, :]) * in1_s2, mask=(offs_m[:, None] < 35), other=0).to(tl.float32)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 35) - 1
    row_lo_t = row_lo + tl.zeros([16], tl.int32)
    row_hi_t = row_hi + tl.zeros([16], tl.int32)
    lv32 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    lo33 = tl.min(tl.where((offs_m < 35), lv32, 9223372036854775807))
    hi34 = tl.max(tl.where((offs_m < 35), lv32, -9223372036854775807))
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = N_SIZE + tl.zeros([], tl.int32)
    first_t = N_SIZE + tl.zeros([16], tl.int32)
    end_t = tl.zeros([16], tl.int32)
    for start_n in range(0, N_SIZE, BLOCK_N * 16):
        tile_n = start_n + tl.arange(0, 16) * BLOCK_N
        offs_scan = index0 + tile_n[:, None] + tl.arange(0, BLOCK_N)[None, :]
        col_lo = tile_n
        col_hi = tl.minimum(tile_n + BLOCK_N, N_SIZE) - 1
        lv35 = tl.load(in0 + (offs_scan) * in0_s0, mask=(offs_scan < 35), other=0)
        lo36 = tl.min(tl.where((offs_scan < 35), lv35, 9223372036854775807), axis=1)
        hi37 = tl.max(tl.where((offs_scan < 35), lv35, -9223372036854775807), axis=1)
        may38 = (lo33 <= hi37) & (lo36 <= hi34)
        may39 = (lo33 == hi34) & (lo36 == hi37) & (lo33 == lo36)
        may40 = may39 == 0
        may41 = col_lo <= row_hi_t
        may42 = col_hi > row_lo_t
        may43 = (may38) & (may41)
        may44 = (may40) | (may42)
        live_tile = (may43) & (tile_n < N_SIZE)
        first_t = tl.minimum(first_t, tl.where(live_tile, tile_n, N_SIZE))
        end_t = tl.maximum(end_t, tl.where(live_tile, tile_n + BLOCK_N, 0))
        is_full = ((may44) == 0) & (tile_n + BLOCK_N <= N_SIZE)
        full_first = tl.minimum(full_first, tl.min(tl.where(is_full, tile_n, N_SIZE)))
        cut = tl.min(tl.where((is_full == 0) & (tile_n > full_first), tile_n, N_SIZE))
        full_end = tl.minimum(full_end, cut)
    tiles_first = tl.min(first_t)
    tiles_end = tl.max(end_t)
    full_first = tl.minimum(tl.maximum(full_first, tiles_first), tiles_end)
    full_end = tl.maximum(tl.minimum(full_end, tiles_end), full_first)
    for start_n in range(tiles_first, full_first, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
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
        m_new1 = tl.maximum(m1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v14 = (v12 * 0.36067376022224085)
        v15 = (m_safe1 * 0.36067376022224085)
        v16 = (v14 - v15[:, None])
        v17 = tl.exp2(v16)
        x18 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot19 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0).to(tl.float32), x18.to(tl.float32), input_precision="ieee")
        acc0 = acc0 * alpha1[:, None] + dot19
        part20 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part20
        m1 = m_new1
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x21 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2).to(tl.float32)
        dot22 = tl.dot(x9.to(tl.float32), tl.trans(x21).to(tl.float32), input_precision="ieee")
        bmax23 = tl.max(dot22, axis=1)
        m_new1 = tl.maximum(m1, bmax23, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v24 = (dot22 * 0.36067376022224085)
        v25 = (m_safe1 * 0.36067376022224085)
        v26 = (v24 - v25[:, None])
        v27 = tl.exp2(v26)
        x28 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2).to(tl.float32)
        dot29 = tl.dot(v27.to(tl.float32), x28.to(tl.float32), input_precision="ieee")
        acc0 = acc0 * alpha1[:, None] + dot29
        part30 = tl.sum(v27, axis=1)
        acc2 = acc2 * alpha1 + part30
        m1 = m_new1
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
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
        m_new1 = tl.maximum(m1, bmax13, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v14 = (v12 * 0.36067376022224085)
        v15 = (m_safe1 * 0.36067376022224085)
        v16 = (v14 - v15[:, None])
        v17 = tl.exp2(v16)
        x18 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0).to(tl.float32)
        dot19 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0).to(tl.float32), x18.to(tl.float32), input_precision="ieee")
        acc0 = acc0 * alpha1[:, None] + dot19
        part20 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v17, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part20
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v31 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v31).to(tl.float32), mask=(offs_m[:, None] < 35))
