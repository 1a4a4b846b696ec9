/* C kernels exported to Python through cffi.  This header is the single source of build.py's
 * cdef (its '#' lines are dropped there).  Float32, row-major, NCHW.  Sizes are checked by the
 * Python wrappers in optimized/kernels.py before any call.
 *
 * Sizes and offsets are 64-bit (int64_t, size_t) in every kernel.  Arguments typed int are the
 * BLAS's (scipy-openblas32 takes 32-bit dimensions) or small codes and flags; the wrappers
 * refuse a value past 2^31 - 1 there with an error naming it. */
#ifndef KERNELS_H
#define KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* Activation fused into the output step of gemm, conv2d and binary ops, or run on its own. */
enum kernel_activation {
    ACT_NONE = 0,
    ACT_RELU = 1,
    ACT_LEAKY_RELU = 2, /* alpha: negative slope */
    ACT_SIGMOID = 3,
    ACT_TANH = 4,
    ACT_CLIP = 5,       /* alpha: min, beta: max */
    ACT_GELU = 6,       /* erf form */
    ACT_GELU_TANH = 7,  /* tanh approximation */
    ACT_HARD_SIGMOID = 8, /* max(0, min(1, alpha * x + beta)) */
    ACT_HARD_SWISH = 9    /* x * HardSigmoid(x) with alpha 1/6, beta 0.5 */
};

enum kernel_binary_op { BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3, BIN_MAX = 4, BIN_MIN = 5 };

enum kernel_reduction { RED_SUM = 0, RED_MEAN = 1, RED_MAX = 2 };

/* One thread count for both the BLAS and the OpenMP loops.  kernels_get_num_threads is what
 * a kernel's team gets now: 1 while the machine is oversubscribed (threads.c), else the
 * configured count, which kernels_configured_threads gives. */
void kernels_set_num_threads(int n);
int kernels_get_num_threads(void);
int kernels_configured_threads(void);
/* Kernel calls since load that ran on the calling thread alone because the machine counted
 * as oversubscribed (threads.c). */
long long kernels_busy_fallbacks(void);

/* The widest vector instructions the kernels use: the best this CPU runs, capped by
 * kernels_limit_isa (tests run every path on one machine) or at load by ONNX_PARITY_MAX_ISA
 * (portable, avx2 or avx512).  kernels_limit_isa returns the level now in force. */
enum kernel_isa { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
int kernels_isa(void);
int kernels_limit_isa(int level);

/* y[i] = max(x[i], 0); NaN passes through.  x and y may alias. */
void relu_f32(const float *x, float *y, size_t n);

/* y = act(x).  x and y may alias. */
void activation_f32(const float *x, float *y, size_t n, int act, float alpha, float beta);

/* y = act(a op b) over a collapsed 4-D shape; strides are in elements (0 = broadcast), y is
 * contiguous.  y may alias a or b when that operand is not broadcast. */
void binary_f32(int op, const float *a, const int64_t *a_strides, const float *b,
                const int64_t *b_strides, float *y, const int64_t *shape,
                int act, float alpha, float beta);

/* y (m x n) = act(alpha * op(a) @ op(b) + beta * c).  op(a) is m x k (a stored k x m when
 * trans_a), op(b) is k x n (b stored n x k when trans_b).  c may be NULL; otherwise
 * c[i * c_row_stride + j * c_col_stride] (strides 0 broadcast). */
void gemm_f32(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
              const float *b, float beta, const float *c, int64_t c_row_stride,
              int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta);

/* A chain of elementwise ops on one value, run block by block so that the value stays in
 * cache: for op k (3 ints: kind, code, swapped), kind CHAIN_ACTIVATION applies activation
 * `code` with params[2k], params[2k+1]; kind CHAIN_BINARY applies binary op `code` with
 * sides[k] (acc op side, or side op acc when swapped).  Side k is indexed by output element i
 * as sides[k][(i / inner) % period] with (period, inner) = geometry[2k], geometry[2k+1]: a
 * full tensor is (n, 1), a scalar (1, 1), a channel vector (C, H*W).  y may alias x. */
enum kernel_chain_kind { CHAIN_ACTIVATION = 0, CHAIN_BINARY = 1 };
void chain_f32(const float *x, float *y, int64_t n, int n_ops, const int32_t *ops,
               const float *params, const float *const *sides, const int64_t *geometry);

/* y[i] (m x n) = alpha * op(a[i]) @ op(b[i]) for i < batch, with a[i] = a + i * a_batch_stride
 * and b[i] = b + i * b_batch_stride (stride 0 shares one operand across the batch); y is
 * contiguous (batch, m, n). */
void gemm_batched_f32(int trans_a, int trans_b, int batch, int m, int n, int k, float alpha,
                      const float *a, int64_t a_batch_stride, const float *b,
                      int64_t b_batch_stride, float *y);

/* GEMM over constant weights packed once (csrc/gemm_packed.c).  gemm_pack_b copies b (k x n,
 * or n x k when trans_b) into `packed`, gemm_packed_b_floats(k, n) floats: panels of 16
 * columns, each k rows of 16 floats, the last padded with zeros.  gemm_packed_f32: y (m x n,
 * contiguous) = act(alpha * a @ B + beta * c), a's rows lda apart, c NULL or
 * c[i * c_row_stride + j * c_col_stride] (strides 0 broadcast).  Threads split the panels, so
 * the result does not depend on the thread count.  allow_simd 0 forces the portable code. */
int64_t gemm_packed_b_floats(int64_t k, int64_t n);
void gemm_pack_b(const float *b, int trans_b, int64_t k, int64_t n, float *packed);
void gemm_packed_f32(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *packed, float beta, const float *c, int64_t c_row_stride,
                     int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta,
                     int allow_simd);

/* GEMV for decoding (csrc/gemv.c): y (m x n, contiguous) = act(alpha * a @ op(b) +
 * beta * c) for 1 <= m <= GEMV_F32_MAX_ROWS, a's rows lda apart, b contiguous, stored n x k
 * when trans_b, else k x n.  c may be NULL, else c[i * c_row_stride + j * c_col_stride]
 * (strides 0 broadcast).  Threads split n only, so the result does not depend on the thread
 * count.  allow_simd 0 forces the portable code.  Returns 0, or -1 for m out of range. */
enum { GEMV_F32_MAX_ROWS = 4 };
int gemv_f32(int trans_b, int m, int64_t n, int64_t k, float alpha, const float *a,
             int64_t lda, const float *b, float beta, const float *c, int64_t c_row_stride,
             int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta,
             int allow_simd);

/* y = act(conv(x, w) + bias + residual), NCHW; w is (out_c, in_c / group, k_h, k_w).  bias
 * (out_c) and residual (shaped like y) may be NULL.  Returns 0, or -1 when out of memory. */
int conv2d_f32(const float *x, int64_t batch, int64_t in_c, int64_t in_h, int64_t in_w,
               const float *w, int64_t out_c, int64_t k_h, int64_t k_w, int64_t group,
               int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
               int64_t dil_h, int64_t dil_w, const float *bias, const float *residual, float *y,
               int64_t out_h, int64_t out_w, int act, float act_alpha, float act_beta);

/* Max over each window's cells inside the input (NaN propagates; -inf for an empty window).
 * Returns 0, or -1 when out of memory. */
int maxpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t dil_h,
                  int64_t dil_w);

/* Mean over each window: the divisor counts the cells inside the input, or with
 * count_include_pad the cells inside the input plus its pads (never the ceil-mode overhang).
 * Returns 0, or -1 when out of memory. */
int avgpool2d_f32(const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
                  int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
                  int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
                  int64_t pad_right, int64_t dil_h, int64_t dil_w, int count_include_pad);

/* maxpool2d_f32 (kind POOL_MAX; pad_bottom, pad_right and count_include_pad unused) or
 * avgpool2d_f32 (POOL_AVERAGE) in one signature, for the plan.  Returns 0, or -1 when out of
 * memory. */
enum pool_kind { POOL_MAX = 0, POOL_AVERAGE = 1 };
int pool2d_f32(int kind, const float *x, int64_t planes, int64_t in_h, int64_t in_w, float *y,
               int64_t out_h, int64_t out_w, int64_t k_h, int64_t k_w, int64_t stride_h,
               int64_t stride_w, int64_t pad_top, int64_t pad_left, int64_t pad_bottom,
               int64_t pad_right, int64_t dil_h, int64_t dil_w, int count_include_pad);

/* y[r] = sum / mean / max of row r of x (rows x cols); accumulates in double. */
void reduce_last_f32(int kind, const float *x, float *y, size_t rows, size_t cols);

/* Softmax of each row of x (rows x cols).  x and y may alias. */
void softmax_last_f32(const float *x, float *y, size_t rows, size_t cols);

/* y = (x - mean) / sqrt(var + epsilon) * scale + bias per row; bias, mean and inv_std (one
 * value per row) may be NULL.  x and y may alias. */
void layernorm_last_f32(const float *x, const float *scale, const float *bias, float *y,
                        float *mean, float *inv_std, size_t rows, size_t cols, float epsilon);

/* y = softmax(q k^T * scale + mask) v for each (batch, head): q (B, H, Sq, D), k (B, H, Sk, D),
 * v (B, H, Sk, Dv), y (B, H, Sq, Dv).  mask may be NULL, else mask[b*s0 + h*s1 + i*s2 + j*s3].
 * With causal, query i sees keys j <= i + causal_offset.  A query that sees no key gets zeros.
 * Returns 0, or -1 when out of memory. */
int attention_f32(const float *q, const float *k, const float *v, float *y, int batch,
                  int heads, int q_len, int kv_len, int head_size, int v_head_size, float scale,
                  const float *mask, const int64_t *mask_strides, int causal, int causal_offset);

/* com.microsoft MatMulNBits: y (m x n) = a (m x k) @ w^T + bias, w[j, i] = (q[j, i] - zp) * s
 * per block of block_size values along k.  b: n rows of ceil(k / block_size) blocks of
 * block_size * bits / 8 bytes, codes packed least significant bits first; scales (n x blocks).
 * Zero points: zp_packed (bytes packed like b, each row padded to whole bytes), or zp_float
 * (n x blocks), or neither (2^(bits-1)).  bits 2, 4 or 8; block_size a power of 2 >= 16.
 * bias may be NULL.  allow_simd 0 forces the portable code.  Returns 0, or -1 when out of
 * memory. */
int matmul_nbits_f32(const float *a, const uint8_t *b, const float *scales,
                     const uint8_t *zp_packed, const float *zp_float, const float *bias, float *y,
                     int m, int n, int k, int bits, int block_size, int allow_simd);

/* The plan step of matmul_nbits_f32 (csrc/plan.c), no bias, allow_simd 1: in a, b, scales,
 * zero points (flags bit 0: float ones, else packed); n[0..3] m, n, k, bits, g[0] block_size;
 * fails where matmul_nbits_f32 does. */
enum { PLAN_MATMUL_NBITS = 40 };

/* A DequantizeLinear weight's 4- or 8-bit codes as MatMulNBits's b (the layout above, bits 4
 * or 8): src holds k x n codes (n x k when transposed), 8-bit one a byte, 4-bit two a byte,
 * the first in the low nibble.  Codes past k in a row's last block are 0.  flip_sign XORs each
 * code with 2^(bits-1): a signed code c becomes the unsigned c + 2^(bits-1). */
void matmul_nbits_pack(const uint8_t *src, uint8_t *dst, int k, int n, int bits, int block_size,
                       int transposed, int flip_sign);

/* A DequantizeLinear's scales [blocks, n] as MatMulNBits's [n, blocks] (a float transpose, in
 * AVX2 registers where it runs: csrc/nbits_pack.c). */
void matmul_nbits_scales(const float *src, float *dst, int blocks, int n);

/* Per row of x (rows x cols): s = x, or x + skip (+ bias) when skip is not NULL (skip shaped
 * like x, bias one row); y = s / sqrt(mean(s^2) + epsilon) * scale.  sum (the s of the skip
 * form) and inv_rms (one value per row) may be NULL.  y may alias x; sum may not alias y. */
void rmsnorm_last_f32(const float *x, const float *skip, const float *bias, const float *scale,
                      float *y, float *sum, float *inv_rms, size_t rows, size_t cols,
                      float epsilon);

/* y (rows x cols) = gate * sigmoid(gate) * up, row r of gate and up starting at r * in_stride:
 * in_stride = cols for two arrays, 2 * cols for the halves of one (up = gate + cols). */
void silu_mul_f32(const float *gate, const float *up, float *y, size_t rows, size_t cols,
                  size_t in_stride);

/* Rotary embedding of x (d0, d1, d2, head), contiguous, into y (may alias x): the first rot
 * values of each row turn in pairs (j, j + rot/2), or (2j, 2j + 1) when interleaved; the rest
 * pass through.  Row (i0, i1, i2) reads cos/sin at i0 * s0 + i1 * s1 + i2 * s2 (strides 0
 * broadcast): rot values (full_width) or rot/2 (one per pair). */
void rotary_f32(const float *x, const float *cos, const float *sin, float *y, int64_t d0,
                int64_t d1, int64_t d2, int64_t head, int64_t rot, const int64_t *cos_strides,
                int full_width, int interleaved);

/* Grouped-query attention: y (B, S, N, Dv) = softmax(q k^T * scale + mask) v, query head h
 * reading K/V head kv_head_of[h] (K and V are never repeated).  q element (b, h, i, d) at
 * b * q_strides[0] + h * q_strides[1] + i * q_strides[2] + d; k (B, KV, T, D) and
 * v (B, KV, T, Dv) contiguous.  mask (additive) may be NULL, else
 * mask[b*s0 + h*s1 + i*s2 + j*s3].  Query i of batch b sees keys j < kv_valid[b] (all when
 * kv_valid is NULL), with causal also j <= q_pos[b] + i (q_pos NULL: 0), with window > 0 also
 * j > q_pos[b] + i - window.  A row that sees no key gets zeros, or NaN with empty_nan.
 * Returns 0, or -1 when out of memory. */
int gqa_f32(const float *q, const int64_t *q_strides, const float *k, const float *v, float *y,
            int batch, int heads, int kv_heads, int q_len, int kv_len, int head_size,
            int v_head_size, const int32_t *kv_head_of, float scale, const float *mask,
            const int64_t *mask_strides, const int64_t *kv_valid, const int64_t *q_pos,
            int causal, int64_t window, int empty_nan);

/* The plan's step table (csrc/plan.c).  One step is one kernel call, its buffers named by slot
 * (in/out: indices into the slots table, -1 for none); the other fields hold the kernel's
 * arguments as optimized/kernels.py works them out:
 *   PLAN_ACTIVATION   activation_f32: n[0] size, code act, f[0..1] alpha, beta
 *   PLAN_BINARY       binary_f32: code op, g[0..3] shape, g[4..7] a strides, g[8..11] b strides,
 *                     act with f[0..1]
 *   PLAN_GEMM         gemm_f32: flags bit 0 trans_a, bit 1 trans_b, n[0..2] m, n, k, f[0] alpha,
 *                     f[1] beta, in[2] c with strides g[0..1], act with f[2..3]
 *   PLAN_MATMUL       gemm_batched_f32: flags as PLAN_GEMM, n[0..3] m, n, k, batch, f[0] alpha,
 *                     g[0..1] batch strides of a and b
 *   PLAN_SOFTMAX      softmax_last_f32: n[0] rows, n[1] cols
 *   PLAN_LAYERNORM    layernorm_last_f32: in scale, bias; out y, mean, inv_std; n rows, cols;
 *                     f[0] epsilon
 *   PLAN_RMSNORM      rmsnorm_last_f32: in x, skip, bias, scale; out y, sum, inv_rms; n rows,
 *                     cols; f[0] epsilon
 *   PLAN_SILU_MUL     silu_mul_f32: n[0] rows, n[1] cols, n[2] row stride of gate and up (0:
 *                     n[1]), up n[3] floats past in[1] (a fused gate_up: in[0] = in[1])
 *   PLAN_REDUCE_LAST  reduce_last_f32: code kind, n[0] rows, n[1] cols
 *   PLAN_COPY         n[0] bytes from in[0] to out[0] (no overlap)
 *   PLAN_STRIDED_COPY out[0] (contiguous) = in[0][n[0] + sum i_d * g[6 + d]] over shape g[0..5],
 *                     elements of n[1] bytes
 *   PLAN_GATHER       rows of in[0] (n[0] blocks of n[1] rows of n[3] bytes) picked by the n[2]
 *                     int64 indices in in[1]; fails on an index out of range
 *   PLAN_ROWS_COPY    n[0] rows of n[1] bytes from in[0] + g[0] bytes, rows g[1] bytes apart, to
 *                     out[0] + n[2] bytes, rows n[3] bytes apart (a Concat input, a Split output)
 *   PLAN_CHAIN        chain_f32 of in[0] into out[0]: n[0] elements, n[1] ops (at most
 *                     PLAN_CHAIN_MAX_OPS), the arrays below
 *   PLAN_GEMV         gemv_f32: flags bit 1 trans_b, n[0..2] m, n, k (a's rows k apart),
 *                     f[0] alpha, f[1] beta, in[2] c with strides g[0..1], act with f[2..3]
 *   PLAN_CONV         conv2d_f32: in x, w, bias, residual; n[0..3] batch, in_c, in_h, in_w,
 *                     g[0..11] out_c, k_h, k_w, group, strides, pads (top, left), dilations,
 *                     out_h, out_w; act with f[0..1]; fails where conv2d_f32 does
 *   PLAN_ONEDNN_CONV  onednn_conv_run(handle): in x, residual; fails where it does
 *   PLAN_ROTARY       rotary_f32: in x, cos, sin; n[0..3] d0, d1, d2, head, g[0] rot,
 *                     g[1..3] cos strides, flags bit 0 full_width, bit 1 interleaved
 *   PLAN_GQA          gqa_f32 (bnsh q, no kv_valid/q_pos/causal/window): in q, k, v, mask;
 *                     n[0..3] batch, heads, kv_heads, q_len, g[0..2] q strides, g[3..5]
 *                     kv_len, head_size, v_head_size, g[6..9] mask strides, f[0] scale,
 *                     flags bit 0 empty_nan, kv_head_of the int32 table below
 *   PLAN_CAST         n[0] elements of in[0] converted to out[0]: code (from << 4) | to, of bool
 *                     0, int32 1, int64 2, float32 3, float64 4 (never float to int)
 *   PLAN_SELECT       code Where 0 (in cond, x, y; n[0] bytes an element), And 1, Or 2, Xor 3
 *                     (in a, b; bool) over the broadcast shape in geometry: rank, shape[6],
 *                     then 6 element strides per input
 *   PLAN_TIED_CHANNELS out[0] (n[0] images of n[1] float32 channels of n[2] values) in place:
 *                     channel c = channel geometry[c], each such source its own (<= c)
 *   PLAN_GEMM_PACKED  gemm_packed_f32: handle the packed B, in[0] a (rows g[2] apart),
 *                     n[0..2] m, n, k, f[0] alpha, f[1] beta, in[2] c with strides g[0..1],
 *                     act with f[2..3]
 *   PLAN_ONEDNN_REGION onednn_region_run_slots(handle): side_slots its inputs then outputs
 *   PLAN_POOL         pool2d_f32: code kind, n[0..3] planes, in_h, in_w, out_h, g[0] out_w,
 *                     g[1..2] kernel, g[3..4] strides, g[5..8] pads (top, left, bottom, right),
 *                     g[9..10] dilations, flags bit 0 count_include_pad; fails where it does */
enum plan_kind {
    PLAN_ACTIVATION = 0, PLAN_BINARY = 1, PLAN_GEMM = 2, PLAN_MATMUL = 3, PLAN_SOFTMAX = 4,
    PLAN_LAYERNORM = 5, PLAN_RMSNORM = 6, PLAN_SILU_MUL = 7, PLAN_REDUCE_LAST = 8,
    PLAN_COPY = 9, PLAN_STRIDED_COPY = 10, PLAN_GATHER = 11, PLAN_ROWS_COPY = 12,
    PLAN_CHAIN = 13, PLAN_CHAIN_MAX_OPS = 256, PLAN_GEMV = 14, PLAN_CONV = 15,
    PLAN_ONEDNN_CONV = 16, PLAN_ROTARY = 17, PLAN_GQA = 18, PLAN_POOL = 19, PLAN_CAST = 20,
    PLAN_SELECT = 21, PLAN_TIED_CHANNELS = 22, PLAN_GEMM_PACKED = 23,
    PLAN_ONEDNN_REGION = 24
};
typedef struct {
    int32_t kind, code, act, flags;
    int32_t in[4];
    int32_t out[3];
    float f[4];
    int64_t n[4];
    int64_t g[12];
    /* PLAN_CHAIN only (NULL elsewhere): chain_f32's ops, params and geometry, and the slot of
     * each op's side operand (-1 for an activation) */
    const int32_t *ops;
    const float *params;
    const int64_t *geometry;
    const int32_t *side_slots;
    /* PLAN_GQA only: one KV head per query head; PLAN_ONEDNN_CONV only: its onednn_conv;
     * PLAN_GEMM_PACKED only: the packed B */
    const int32_t *kv_head_of;
    void *handle;
} plan_step;

/* Runs steps[0..count) in order.  Returns -1, or the index of the step that failed (its
 * kernel ran out of memory or refused its input) with the steps before it done. */
int64_t plan_run(const plan_step *steps, int64_t count, void *const *slots);
/* plan_run, for profiling: times[0] (count + 1 int64) the clock before the first step,
 * times[i + 1] after step i, in ns of CLOCK_MONOTONIC (Python's time.perf_counter_ns on
 * Linux); times past a failed step are left unwritten. */
int64_t plan_run_timed(const plan_step *steps, int64_t count, void *const *slots,
                       int64_t *times);

/* optimized/passes/gqa_fusion.py's CausalPaddingMask (csrc/causal_mask.c): y (batch, 1, q_len,
 * keys) float32, 0 where key j <= *start + i and mask[b, j] (batch x keys, of mask_type) is not
 * 0, else fill.  Returns -1 (nothing written) unless *end == keys and *start == keys - q_len.
 * Its plan step: in mask, start, end (int64 scalars); code mask_type, n[0..2] batch, q_len,
 * keys, f[0] fill. */
enum { CAUSAL_MASK_BOOL = 0, CAUSAL_MASK_I32 = 1, CAUSAL_MASK_I64 = 2, CAUSAL_MASK_F32 = 3,
       CAUSAL_MASK_F64 = 4 };
enum { PLAN_CAUSAL_MASK = 41 };
int causal_padding_mask_f32(const void *mask, int mask_type, const int64_t *start,
                            const int64_t *end, float *y, int64_t batch, int64_t q_len,
                            int64_t keys, float fill);

/* Convolution through oneDNN (csrc/onednn_conv.c), opened at run time.  onednn_open loads the
 * library at `path` once (0, or -1 with onednn_last_error() saying why).  A plan is made per
 * node, input shape and thread count: geometry holds batch, in_c, in_h, in_w, out_c, k_h, k_w,
 * group, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right, dil_h, dil_w, out_h,
 * out_w; w (out_c, in_c / group, k_h, k_w) and bias (out_c, may be NULL) are copied.  layout
 * ONEDNN_LAYOUT_BLOCKED lets the library pick its source and destination layout (nChw8c and
 * the like; runs reorder from and to NCHW), ONEDNN_LAYOUT_PLAIN keeps NCHW.  Returns NULL
 * with onednn_last_error() set on failure.  run: y = act(conv(x) + bias + residual) in NCHW,
 * residual may be NULL or y itself; 0, or -1 on failure.  run_native: x and y already in the
 * plan's layout (native_bytes: 0 source, 1 destination), a residual being y's prior content. */
typedef struct onednn_conv onednn_conv;
enum onednn_layout { ONEDNN_LAYOUT_BLOCKED = 0, ONEDNN_LAYOUT_PLAIN = 1 };
int onednn_open(const char *path);
const char *onednn_last_error(void);
onednn_conv *onednn_conv_create(const int64_t *geometry, const float *w, const float *bias,
                                int has_residual, int act, float alpha, float beta, int layout);
int onednn_conv_run(onednn_conv *c, const float *x, const float *residual, float *y);
int onednn_conv_run_native(onednn_conv *c, const float *x, float *y);
size_t onednn_conv_native_bytes(const onednn_conv *c, int which);
const char *onednn_conv_implementation(const onednn_conv *c);
void onednn_conv_destroy(onednn_conv *c);

/* Blocked regions (csrc/onednn_region.c): convolutions, activations, adds, channel concats and
 * pools over buffers in oneDNN's layouts, reordered from and to NCHW only at the region's
 * entries and exits.  Values are numbered 0..values-1, each defined once (entry or an op's
 * output) before it is read; entries and exits are numbered in the order they are added.
 * Every call returns 0, or -1 (NULL) with onednn_region_last_error() saying why.  conv's
 * geometry is onednn_conv_create's, residual -1 where absent; pool kind 0 max, 1 average
 * without padding cells, 2 average with them, geometry k_h, k_w, stride_h, stride_w,
 * pad_top, pad_left, out_h, out_w.  conv's ties: NULL, or per output channel the channel
 * whose values it copies after the activation (no residual then).  run_slots: inputs then
 * outputs named by slot ids. */
typedef struct onednn_region onednn_region;
onednn_region *onednn_region_create(int64_t values);
const char *onednn_region_last_error(void);
int onednn_region_entry(onednn_region *r, int64_t value, const int64_t *dims);
int onednn_region_conv(onednn_region *r, int64_t src, int64_t residual, int64_t dst,
                       const int64_t *geometry, const float *w, const float *bias, int act,
                       float alpha, float beta, const int64_t *ties);
int onednn_region_activation(onednn_region *r, int64_t src, int64_t dst, int act, float alpha,
                             float beta);
int onednn_region_add(onednn_region *r, int64_t a, int64_t b, int64_t dst);
int onednn_region_concat(onednn_region *r, const int64_t *srcs, int64_t count, int64_t dst);
int onednn_region_pool(onednn_region *r, int64_t src, int64_t dst, int kind,
                       const int64_t *geometry);
int onednn_region_exit(onednn_region *r, int64_t value);
int onednn_region_set_threads(onednn_region *r, int threads);
int onednn_region_attach_single(onednn_region *r, onednn_region *single);
long long onednn_region_single_runs(const onednn_region *r);
int onednn_region_finish(onednn_region *r);
int onednn_region_run(onednn_region *r, const float *const *inputs, float *const *outputs);
int onednn_region_run_slots(onednn_region *r, void *const *slots, const int32_t *slot_ids);
void onednn_region_destroy(onednn_region *r);

#endif
