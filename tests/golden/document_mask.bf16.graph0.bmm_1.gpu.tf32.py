import triton
import triton.language as tl


@triton.jit
def flashlight_6f96c2e23bb6(in0, in1, in2, in3, out, in0_s0, in1_s0, in1_s1, in1_s2, in2_s0, in2_s1, in2_s2, in3_s0, in3_s1, in3_s2, out_s0, out_s1, out_s2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_BITS: tl.constexpr = 32):
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
    x9 = tl.load(in1 + (g0) * in1_s0 + (offs_m[:, None]) * in1_s1 + (offs_e0[None, :]) * in1_s2, mask=(offs_m[:, None] < 35), other=0)
    x10 = (x9.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    row_lo = pid_m * BLOCK_M
    row_hi = tl.minimum(row_lo + BLOCK_M, 35) - 1
    row_lo_t = row_lo + tl.zeros([16], tl.int32)
    row_hi_t = row_hi + tl.zeros([16], tl.int32)
    lv37 = tl.load(in0 + (offs_m) * in0_s0, mask=(offs_m < 35), other=0)
    lo38 = tl.min(tl.where((offs_m < 35), lv37, 9223372036854775807))
    hi39 = tl.max(tl.where((offs_m < 35), lv37, -9223372036854775807))
    full_first = N_SIZE + tl.zeros([], tl.int32)
    full_end = N_SIZE + tl.zeros([], tl.int32)
    first_t = N_SIZE + tl.zeros([16], tl.int32)
    end_t = tl.zeros([16], tl.int32)
    for start_n in range(0, N_SIZE, BLOCK_N * 16):
        tile_n = start_n + tl.arange(0, 16) * BLOCK_N
        offs_scan = index0 + tile_n[:, None] + tl.arange(0, BLOCK_N)[None, :]
        col_lo = tile_n
        col_hi = tl.minimum(tile_n + BLOCK_N, N_SIZE) - 1
        lv40 = tl.load(in0 + (offs_scan) * in0_s0, mask=(offs_scan < 35), other=0)
        lo41 = tl.min(tl.where((offs_scan < 35), lv40, 9223372036854775807), axis=1)
        hi42 = tl.max(tl.where((offs_scan < 35), lv40, -9223372036854775807), axis=1)
        may43 = (lo38 <= hi42) & (lo41 <= hi39)
        may44 = (lo38 == hi39) & (lo41 == hi42) & (lo38 == lo41)
        may45 = may44 == 0
        may46 = col_lo <= row_hi_t
        may47 = col_hi > row_lo_t
        may48 = (may43) & (may46)
        may49 = (may45) | (may47)
        live_tile = (may48) & (tile_n < N_SIZE)
        first_t = tl.minimum(first_t, tl.where(live_tile, tile_n, N_SIZE))
        end_t = tl.maximum(end_t, tl.where(live_tile, tile_n + BLOCK_N, 0))
        is_full = ((may49) == 0) & (tile_n + BLOCK_N <= N_SIZE)
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
        x11 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0)
        x12 = (x11.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot13 = tl.dot(x9.to(tl.bfloat16), tl.trans(x11).to(tl.bfloat16))
        v14 = tl.where(v8, float("-inf"), dot13)
        bmax15 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v14, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax15, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v16 = (v14 * 0.36067376022224085)
        v17 = (m_safe1 * 0.36067376022224085)
        v18 = (v16 - v17[:, None])
        v19 = tl.exp2(v18)
        x20 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x21 = (x20.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot22 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0).to(tl.bfloat16), x20.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot22
        part23 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part23
        m1 = m_new1
    for start_n in range(full_first, full_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x24 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2)
        x25 = (x24.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot26 = tl.dot(x9.to(tl.bfloat16), tl.trans(x24).to(tl.bfloat16))
        bmax27 = tl.max(dot26, axis=1)
        m_new1 = tl.maximum(m1, bmax27, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v28 = (dot26 * 0.36067376022224085)
        v29 = (m_safe1 * 0.36067376022224085)
        v30 = (v28 - v29[:, None])
        v31 = tl.exp2(v30)
        x32 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2)
        x33 = (x32.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot34 = tl.dot(v31.to(tl.bfloat16), x32.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot34
        part35 = tl.sum(v31, axis=1)
        acc2 = acc2 * alpha1 + part35
        m1 = m_new1
    for start_n in range(full_end, tiles_end, BLOCK_N):
        offs_n = index0 + start_n + tl.arange(0, BLOCK_N)
        x2 = tl.load(in0 + (offs_n) * in0_s0, mask=(offs_n < 35), other=0)
        v3 = (x1[:, None] == x2[None, :])
        idx5 = offs_n
        v6 = (idx4[:, None] >= idx5[None, :])
        v7 = (v3 & v6)
        v8 = (v7 == 0)
        x11 = tl.load(in2 + (g0) * in2_s0 + (offs_n[:, None]) * in2_s1 + (offs_e0[None, :]) * in2_s2, mask=(offs_n[:, None] < 35), other=0)
        x12 = (x11.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot13 = tl.dot(x9.to(tl.bfloat16), tl.trans(x11).to(tl.bfloat16))
        v14 = tl.where(v8, float("-inf"), dot13)
        bmax15 = tl.max(tl.where(offs_n[None, :] < N_SIZE, v14, float("-inf")), axis=1)
        m_new1 = tl.maximum(m1, bmax15, propagate_nan=tl.PropagateNan.ALL)
        m_safe1 = tl.where(m_new1 == float("-inf"), 0.0, m_new1)
        alpha1 = tl.exp2((m1 - m_safe1) * 0.36067376022224085)
        v16 = (v14 * 0.36067376022224085)
        v17 = (m_safe1 * 0.36067376022224085)
        v18 = (v16 - v17[:, None])
        v19 = tl.exp2(v18)
        x20 = tl.load(in3 + (g0) * in3_s0 + (offs_n[:, None]) * in3_s1 + (offs_f[None, :]) * in3_s2, mask=(offs_n[:, None] < 35), other=0)
        x21 = (x20.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        dot22 = tl.dot(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0).to(tl.bfloat16), x20.to(tl.bfloat16))
        acc0 = acc0 * alpha1[:, None] + dot22
        part23 = tl.sum(tl.where(offs_n[None, :] < N_SIZE, v19, 0.0), axis=1)
        acc2 = acc2 * alpha1 + part23
        m1 = m_new1
    res1 = m1
    res0 = acc0
    res2 = acc2
    v36 = (res0 / res2[:, None])
    tl.store(out + (g0) * out_s0 + (offs_m[:, None]) * out_s1 + (offs_f[None, :]) * out_s2, (v36).to(tl.bfloat16), mask=(offs_m[:, None] < 35))
