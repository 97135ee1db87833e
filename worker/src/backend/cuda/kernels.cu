// The CUDA backend's element-wise kernels. NVRTC compiles this file at first use for the
// device's architecture (see cuda/mod.rs); the PTX is cached per device. No headers: the
// half-precision conversions are PTX instructions or bit arithmetic, so the file compiles with
// NVRTC alone.
//
// Every kernel takes its element counts as arguments and guards every index with them; the
// host side checks the buffers' lengths against the same counts before a launch.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// NVRTC compiles without the C library's headers, where these two come from.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)(n); \
         i += (long long)blockDim.x * gridDim.x)

extern "C" __global__ void add_row_bias(float* x, const float* bias, int rows, int cols) {
    GRID_STRIDE(i, (long long)rows * cols) { x[i] += bias[i % cols]; }
}

// out[c] += sum over rows of x[r, c]: one thread per column, reading along rows (coalesced
// across the threads of a warp).
extern "C" __global__ void sum_rows_into(const float* x, float* out, int rows, int cols) {
    GRID_STRIDE(c, cols) {
        float s = 0.0f;
        for (int r = 0; r < rows; ++r) s += x[(long long)r * cols + c];
        out[c] += s;
    }
}

extern "C" __global__ void relu(float* x, long long n) {
    GRID_STRIDE(i, n) { x[i] = fmaxf(x[i], 0.0f); }
}

extern "C" __global__ void relu_backward(const float* y, float* dy, long long n) {
    GRID_STRIDE(i, n) {
        if (y[i] <= 0.0f) dy[i] = 0.0f;
    }
}

extern "C" __global__ void add(float* x, const float* y, long long n) {
    GRID_STRIDE(i, n) { x[i] += y[i]; }
}

extern "C" __global__ void scale(float* x, float alpha, long long n) {
    GRID_STRIDE(i, n) { x[i] *= alpha; }
}

// One thread per row: the row's loss and whether its arg-max is the label; with grad,
// grad = scale * (softmax - onehot). Labels were checked on the host.
extern "C" __global__ void softmax_xent(const float* logits, const u32* labels, int rows,
                                        int classes, float scale, float* grad, float* loss,
                                        u32* correct) {
    GRID_STRIDE(r, rows) {
        const float* row = logits + r * classes;
        float mx = -INFINITY;
        int arg = 0;
        for (int i = 0; i < classes; ++i) {
            if (row[i] > mx) {
                mx = row[i];
                arg = i;
            }
        }
        float z = 0.0f;
        for (int i = 0; i < classes; ++i) z += expf(row[i] - mx);
        u32 label = labels[r];
        loss[r] = logf(z) - (row[label] - mx);
        correct[r] = (u32)(arg == (int)label);
        if (grad) {
            float* g = grad + r * classes;
            for (int i = 0; i < classes; ++i) {
                g[i] = scale * (expf(row[i] - mx) / z - (i == (int)label ? 1.0f : 0.0f));
            }
        }
    }
}

// Logistic loss per row, the probability, and with grad scale * (p - y).
extern "C" __global__ void sigmoid_xent(const float* logits, const u32* labels, int n,
                                        float scale, float* grad, float* loss, float* probs) {
    GRID_STRIDE(i, n) {
        float z = logits[i];
        float y = (float)labels[i];
        float softplus = fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
        loss[i] = softplus - y * z;
        float p = 1.0f / (1.0f + expf(-z));
        probs[i] = p;
        if (grad) grad[i] = scale * (p - y);
    }
}

// out[b, d] = sum over bag b's positions j of weights[j] * table[rows[j], d].
extern "C" __global__ void bag_forward(const float* table, int dim, const u32* offsets,
                                       const u32* rows, const float* weights, int bags,
                                       float* out) {
    GRID_STRIDE(i, (long long)bags * dim) {
        int b = (int)(i / dim), d = (int)(i % dim);
        float s = 0.0f;
        for (u32 j = offsets[b]; j < offsets[b + 1]; ++j) {
            s += weights[j] * table[(long long)rows[j] * dim + d];
        }
        out[i] = s;
    }
}

// The scatter-add: dtable[rows[j], d] += weights[j] * dout[b, d]. Rows repeat across bags, so
// the adds are atomic.
extern "C" __global__ void bag_backward(const float* dout, int dim, const u32* offsets,
                                        const u32* rows, const float* weights, int bags,
                                        float* dtable) {
    GRID_STRIDE(i, (long long)bags * dim) {
        int b = (int)(i / dim), d = (int)(i % dim);
        float g = dout[i];
        for (u32 j = offsets[b]; j < offsets[b + 1]; ++j) {
            atomicAdd(&dtable[(long long)rows[j] * dim + d], weights[j] * g);
        }
    }
}

// ---- Compression on the device -------------------------------------------------------------
//
// The encoders write the same bytes as the host codecs of ps-codec (little-endian, the same
// layouts), so a shard decodes a device-encoded payload like any other. Each one also writes
// the decoded value back over its input when `residual` is given: residual = input - decoded,
// the error feedback kept on the device for the next step.

__device__ __forceinline__ u16 f32_to_f16_bits(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float f16_bits_to_f32(u16 h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}

// Round to nearest even; a NaN stays a quiet NaN (as ps-codec's bf16_bits).
__device__ __forceinline__ u16 f32_to_bf16_bits(float x) {
    u32 b = __float_as_uint(x);
    if (isnan(x)) return (u16)((b >> 16) | 0x40);
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// fp16 (kind 0) or bf16 (kind 1) casts, two bytes per value; residual = x - decoded.
extern "C" __global__ void encode_half(const float* x, long long n, int kind, u16* out,
                                       float* residual) {
    GRID_STRIDE(i, n) {
        float v = x[i];
        u16 h = kind == 0 ? f32_to_f16_bits(v) : f32_to_bf16_bits(v);
        out[i] = h;
        if (residual) {
            float back = kind == 0 ? f16_bits_to_f32(h) : __uint_as_float(((u32)h) << 16);
            residual[i] = v - back;
        }
    }
}

// The largest magnitude of each block (NaN when the block holds a NaN or an infinity), as the
// magnitude bits' integer max: one block of the grid per block of values.
extern "C" __global__ void block_max_abs(const float* x, long long n, int block, float* out) {
    __shared__ u32 m;
    if (threadIdx.x == 0) m = 0;
    __syncthreads();
    long long start = (long long)blockIdx.x * block;
    u32 local = 0;
    for (long long i = start + threadIdx.x; i < start + block && i < n; i += blockDim.x) {
        local = max(local, __float_as_uint(x[i]) & 0x7fffffffu);
    }
    atomicMax(&m, local);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = m >= 0x7f800000u ? NAN : __uint_as_float(m) / 127.0f;
}

// int8 with per-block scales (computed by block_max_abs into `scales`): q = round(x / scale)
// ties to even; residual = x - q * scale.
extern "C" __global__ void encode_int8(const float* x, long long n, int block,
                                       const float* scales, u8* q, float* residual) {
    GRID_STRIDE(i, n) {
        float s = scales[i / block];
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        float v = x[i];
        float r = isnan(v) ? 0.0f : rintf(v * inv);
        signed char c = (signed char)r;
        q[i] = (u8)c;
        if (residual) residual[i] = v - (float)c * s;
    }
}

// The mean magnitude of each block (NaN when it holds a NaN or an infinity).
extern "C" __global__ void block_mean_abs(const float* x, long long n, int block, float* out) {
    __shared__ double sum;
    __shared__ int bad;
    if (threadIdx.x == 0) {
        sum = 0.0;
        bad = 0;
    }
    __syncthreads();
    long long start = (long long)blockIdx.x * block;
    long long end = min(start + block, n);
    double local = 0.0;
    int lbad = 0;
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        float v = x[i];
        lbad |= !isfinite(v);
        local += (double)fabsf(v);
    }
    atomicAdd(&sum, local);
    if (lbad) atomicOr(&bad, 1);
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = bad ? NAN : (float)(sum / (double)(end - start));
}

// One bit per value (set = negative), eight values per byte; residual = x - (+-scale).
extern "C" __global__ void encode_sign(const float* x, long long n, int block,
                                       const float* scales, u8* bits, float* residual) {
    GRID_STRIDE(byte, (n + 7) / 8) {
        u8 b = 0;
        for (int k = 0; k < 8; ++k) {
            long long i = byte * 8 + k;
            if (i >= n) break;
            float v = x[i];
            int neg = signbit(v) ? 1 : 0;
            b |= (u8)(neg << k);
            if (residual) {
                float s = scales[i / block];
                residual[i] = v - (neg ? -s : s);
            }
        }
        bits[byte] = b;
    }
}

// Top-k selects by threshold: the k-th largest magnitude key (the f32 bits without the sign,
// which order like the magnitudes, NaN above infinity) is found with two histogram passes of 12
// bits each (the host reads the 4096 counts and walks them down from the top), then one ordered
// compaction keeps every entry at or above it. Ties inside the last bucket (keys equal in their
// top 24 bits) can keep a few more than k.

#define HIST_BINS 4096

// Histogram of the keys' top 12 bits (shift 19), or, with `sel` given, of the next 12 bits
// (shift 7) of the keys whose top 12 bits are sel[0] (the bin select_bin chose). Per-block
// counts in shared memory, merged into `hist` once per block.
extern "C" __global__ void magnitude_histogram(const float* x, long long n, const u32* sel,
                                               u32* hist) {
    __shared__ u32 local[HIST_BINS];
    for (int b = threadIdx.x; b < HIST_BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();
    int prefix = sel ? (int)sel[0] : -1;
    GRID_STRIDE(i, n) {
        u32 key = __float_as_uint(x[i]) & 0x7fffffffu;
        if (prefix < 0) {
            atomicAdd(&local[key >> 19], 1u);
        } else if ((int)(key >> 19) == prefix) {
            atomicAdd(&local[(key >> 7) & 0xfffu], 1u);
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < HIST_BINS; b += blockDim.x) {
        if (local[b]) atomicAdd(&hist[b], local[b]);
    }
}

// Walks a histogram down from its top bin until `need` keys are covered, on the device (one
// block of 1024 threads, four bins each: a suffix sum over the threads finds the one holding
// the crossing, which walks its bins). Stage 0 (need = k, the top 12 bits) writes the bin to
// sel[0] and the keys still needed inside it to sel[1]; stage 1 (need = sel[1], the next 12
// bits) writes the threshold key (sel[0] << 19 | bin << 7) to sel[2].
extern "C" __global__ void select_bin(const u32* hist, u32 k, int stage, u32* sel) {
    __shared__ u32 sums[1024];
    int t = threadIdx.x;
    u32 need = stage == 0 ? k : sel[1];
    u32 mine = 0;
    for (int b = 4 * t; b < 4 * t + 4; ++b) mine += hist[b];
    sums[t] = mine;
    __syncthreads();
    // Inclusive suffix sums: sums[t] = the keys in thread t's bins and every bin above them.
    for (int d = 1; d < 1024; d <<= 1) {
        u32 v = t + d < 1024 ? sums[t + d] : 0;
        __syncthreads();
        sums[t] += v;
        __syncthreads();
    }
    u32 above = sums[t] - mine;
    int found = -1;
    u32 left = 0;
    if (above < need && sums[t] >= need) {
        u32 acc = above;
        for (int b = 4 * t + 3; b >= 4 * t; --b) {
            if (acc + hist[b] >= need) {
                found = b;
                left = need - acc;
                break;
            }
            acc += hist[b];
        }
    }
    // Fewer keys than needed (not reached: the caller asks for k < n) leaves bin 0.
    if (t == 0 && sums[0] < need) {
        found = 0;
        left = need - sums[0];
    }
    if (found >= 0) {
        if (stage == 0) {
            sel[0] = (u32)found;
            sel[1] = left;
        } else {
            sel[2] = (sel[0] << 19) | ((u32)found << 7);
        }
    }
}

#define TILE 4096

// Compaction, pass 1: how many keys of each tile of TILE values are at least the threshold
// sel[2].
extern "C" __global__ void count_above(const float* x, long long n, const u32* sel, u32* counts) {
    __shared__ u32 c;
    u32 threshold = sel[2];
    if (threadIdx.x == 0) c = 0;
    __syncthreads();
    long long start = (long long)blockIdx.x * TILE;
    u32 local = 0;
    for (long long i = start + threadIdx.x; i < start + TILE && i < n; i += blockDim.x) {
        local += (__float_as_uint(x[i]) & 0x7fffffffu) >= threshold;
    }
    atomicAdd(&c, local);
    __syncthreads();
    if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

// Compaction, pass 2: exclusive prefix sums of the tile counts, by one block of 1024 threads;
// offsets[tiles] is the total.
extern "C" __global__ void exclusive_scan(const u32* counts, int tiles, u32* offsets) {
    __shared__ u32 sums[1024];
    int t = threadIdx.x;
    int per = (tiles + blockDim.x - 1) / blockDim.x;
    int lo = min(t * per, tiles), hi = min(lo + per, tiles);
    u32 s = 0;
    for (int i = lo; i < hi; ++i) s += counts[i];
    sums[t] = s;
    __syncthreads();
    for (int d = 1; d < (int)blockDim.x; d <<= 1) {
        u32 v = t >= d ? sums[t - d] : 0;
        __syncthreads();
        sums[t] += v;
        __syncthreads();
    }
    u32 run = sums[t] - s;
    for (int i = lo; i < hi; ++i) {
        offsets[i] = run;
        run += counts[i];
    }
    if (t == (int)blockDim.x - 1) offsets[tiles] = sums[t];
}

// Compaction, pass 3: each tile writes its kept entries at its offset, in index order (a warp
// ballot and the warps' counts order them inside each round of blockDim values), as the index
// and the value (write_sparse writes it as f16 when `f16`, rounding as this kernel does). Entries past
// `cap` are not sent. The residual keeps what is not sent: the value where nothing is sent, the
// f16 rounding error where an entry is sent as f16.
extern "C" __global__ void compact_above(const float* x, long long n, const u32* sel,
                                         const u32* offsets, u32 cap, int f16, u32* idx,
                                         float* vals, float* residual) {
    __shared__ u32 warp_counts[32];
    u32 threshold = sel[2];
    __shared__ u32 round_base;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    long long start = (long long)blockIdx.x * TILE;
    if (threadIdx.x == 0) round_base = offsets[blockIdx.x];
    __syncthreads();
    for (long long base = start; base < start + TILE && base < n; base += blockDim.x) {
        long long i = base + threadIdx.x;
        bool in = i < n && i < start + TILE;
        float v = in ? x[i] : 0.0f;
        bool keep = in && (__float_as_uint(v) & 0x7fffffffu) >= threshold;
        unsigned ballot = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        u32 before = 0;
        for (int w = 0; w < warp; ++w) before += warp_counts[w];
        u32 slot = round_base + before + __popc(ballot & ((1u << lane) - 1u));
        bool sent = keep && slot < cap;
        float back = 0.0f;
        if (sent) {
            idx[slot] = (u32)i;
            vals[slot] = v;
            back = f16 ? f16_bits_to_f32(f32_to_f16_bits(v)) : v;
        }
        if (in && residual) residual[i] = v - back;
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 total = 0;
            for (int w = 0; w < warps; ++w) total += warp_counts[w];
            round_base += total;
        }
        __syncthreads();
    }
}

// The wire layout of the kept entries (ps-codec's sparse payload: the values, f16 or f32, then
// each index's gap from the one before as an LEB128 varint), written on the device so that one
// copy brings the payload to the host. kept = min(offsets[tiles], cap).

__device__ __forceinline__ u32 index_gap(const u32* idx, long long j) {
    return j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1;
}

__device__ __forceinline__ u32 varint_len(u32 v) {
    return v < (1u << 7) ? 1 : v < (1u << 14) ? 2 : v < (1u << 21) ? 3 : v < (1u << 28) ? 4 : 5;
}

// Pass 1: each kept entry's varint length (0 past the kept ones), for exclusive_scan.
extern "C" __global__ void gap_lengths(const u32* idx, const u32* offsets, int tiles, u32 cap,
                                       u32* lens) {
    u32 kept = min(offsets[tiles], cap);
    GRID_STRIDE(j, cap) { lens[j] = j < kept ? varint_len(index_gap(idx, j)) : 0; }
}

// Pass 2: the values and the varints at their scanned offsets (after the kept * 2 or 4 bytes of
// values); meta[0] = kept, meta[1] = the payload's length in bytes.
extern "C" __global__ void write_sparse(const u32* idx, const float* vals, const u32* offsets,
                                        int tiles, u32 cap, int f16, const u32* var_offsets,
                                        u8* out, u32* meta) {
    u32 kept = min(offsets[tiles], cap);
    u32 vbytes = kept * (f16 ? 2u : 4u);
    GRID_STRIDE(j, kept) {
        float v = vals[j];
        // Whole-value stores (the values start the buffer, so they are aligned): storing the
        // f16 bits byte by byte lost the low byte under one NVRTC (13.0).
        if (f16) {
            ((u16*)out)[j] = f32_to_f16_bits(v);
        } else {
            ((u32*)out)[j] = __float_as_uint(v);
        }
        u32 g = index_gap(idx, j);
        u8* p = out + vbytes + var_offsets[j];
        while (g >= 0x80u) {
            *p++ = (u8)(g | 0x80u);
            g >>= 7;
        }
        *p = (u8)g;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        meta[0] = kept;
        meta[1] = vbytes + var_offsets[cap];
    }
}

// out = a + b (the gradient plus the error-feedback residual).
extern "C" __global__ void add_into(const float* a, const float* b, float* out, long long n) {
    GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}
