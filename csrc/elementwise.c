#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "internal.h"
#include "vmath.h"

void relu_f32(const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        float v = x[i];
        /* Written as a comparison that is false for NaN, so NaN propagates as in the spec. */
        y[i] = (v < 0.0f) ? 0.0f : v;
    }
}

/* The activations as plain loops the compiler vectorises for whatever target includes them. */
#define ACTIVATION_LOOP(EXPR)                                                                \
    do {                                                                                     \
        for (size_t i = 0; i < n; ++i) { float v = x[i]; y[i] = (EXPR); }                    \
    } while (0)

/* Comparisons that are false for NaN, so NaN propagates as in the reference's np.clip. */
static inline __attribute__((always_inline)) float unit_clamp(float v)
{
    return (v < 0.0f) ? 0.0f : (v > 1.0f) ? 1.0f : v;
}

/* y[i] = act(x[i]), y either x or apart from it.  Relu and Clip as comparisons that are false
 * for NaN, so NaN propagates as in the spec; HardSwish is x * clamp(x / 6 + 1/2) with the
 * division as the reference writes it (x * (1/6) rounds differently), so results agree to the
 * ulp the product allows. */
static inline __attribute__((always_inline)) void activate_loops(const float *x, float *y,
                                                                 size_t n, int act, float alpha,
                                                                 float beta)
{
    switch (act) {
    case ACT_RELU: ACTIVATION_LOOP((v < 0.0f) ? 0.0f : v); break;
    case ACT_LEAKY_RELU: ACTIVATION_LOOP((v < 0.0f) ? v * alpha : v); break;
    case ACT_SIGMOID: ACTIVATION_LOOP(vm_sigmoid(v)); break;
    case ACT_TANH: ACTIVATION_LOOP(vm_tanh(v)); break;
    case ACT_CLIP: ACTIVATION_LOOP((v < alpha) ? alpha : (v > beta) ? beta : v); break;
    case ACT_GELU: ACTIVATION_LOOP(vm_gelu_erf(v)); break;
    case ACT_GELU_TANH: ACTIVATION_LOOP(vm_gelu_tanh(v)); break;
    case ACT_HARD_SIGMOID: ACTIVATION_LOOP(unit_clamp(alpha * v + beta)); break;
    case ACT_HARD_SWISH: ACTIVATION_LOOP(v * unit_clamp(v / 6.0f + 0.5f)); break;
    default: break;
    }
}

static void activate_portable(const float *x, float *y, size_t n, int act, float alpha,
                              float beta)
{
    activate_loops(x, y, n, act, alpha, beta);
}

#if defined(__x86_64__)
AVX2 static void activate_avx2(const float *x, float *y, size_t n, int act, float alpha,
                               float beta)
{
    activate_loops(x, y, n, act, alpha, beta);
}

/* The transcendental ones through vmath.h's 16-lane functions; the rest are the same loops
 * built for AVX-512. */
AVX512 static void activate_avx512(const float *x, float *y, size_t n, int act, float alpha,
                                   float beta)
{
    switch (act) {
    case ACT_SIGMOID: VM512_MAP(vm512_sigmoid, x, y, n); break;
    case ACT_TANH: VM512_MAP(vm512_tanh, x, y, n); break;
    case ACT_GELU: VM512_MAP(vm512_gelu_erf, x, y, n); break;
    case ACT_GELU_TANH: VM512_MAP(vm512_gelu_tanh, x, y, n); break;
    default: activate_loops(x, y, n, act, alpha, beta); break;
    }
}
#endif

/* y[i] = act(x[i]); y may be x. */
static void activate_into(const float *x, float *y, size_t n, int act, float alpha, float beta)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        activate_avx512(x, y, n, act, alpha, beta);
        return;
    }
    if (have_avx2()) {
        activate_avx2(x, y, n, act, alpha, beta);
        return;
    }
#endif
    activate_portable(x, y, n, act, alpha, beta);
}

void activate_inplace(float *y, size_t n, int act, float alpha, float beta)
{
    activate_into(y, y, n, act, alpha, beta);
}

enum { CHUNK = 4096 };

void activation_f32(const float *x, float *y, size_t n, int act, float alpha, float beta)
{
    size_t chunks = (n + CHUNK - 1) / CHUNK;
    PARALLEL_FOR(threads_for(n),
        for (size_t c = 0; c < chunks; ++c) {
            size_t start = c * CHUNK, len = (n - start < CHUNK) ? n - start : CHUNK;
            activate_into(x + start, y + start, len, act, alpha, beta);
        });
}

/* NaN-propagating max and min, as numpy's maximum/minimum and ONNX Max/Min. */
/* NaN propagates; of two equal values the sign bits are ANDed (max) or ORed (min), so that
 * Max(+0, -0) = +0 and Min(+0, -0) = -0 (IEEE 754-2019 maximum and minimum), in either order. */
static inline float zero_signs(float a, float b, int max) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    x = max ? (x & y) : (x | y);
    memcpy(&a, &x, 4);
    return a;
}
static inline float max_nan(float a, float b) {
    if (a != a || b != b) return a != a ? a : b;
    return a == b ? zero_signs(a, b, 1) : (a > b ? a : b);
}
static inline float min_nan(float a, float b) {
    if (a != a || b != b) return a != a ? a : b;
    return a == b ? zero_signs(a, b, 0) : (a < b ? a : b);
}

/* One innermost row: the strides are 0 or 1 in nearly every call, so those get loops the
 * compiler vectorises. */
#define BINARY_ROW(EXPR)                                                                   \
    do {                                                                                    \
        if (sa == 1 && sb == 1)                                                             \
            for (int64_t i = 0; i < n; ++i) { float x = a[i], z = b[i]; y[i] = (EXPR); }    \
        else if (sa == 1 && sb == 0)                                                        \
            for (int64_t i = 0; i < n; ++i) { float x = a[i], z = b[0]; y[i] = (EXPR); }    \
        else if (sa == 0 && sb == 1)                                                        \
            for (int64_t i = 0; i < n; ++i) { float x = a[0], z = b[i]; y[i] = (EXPR); }    \
        else                                                                                \
            for (int64_t i = 0; i < n; ++i) {                                               \
                float x = a[i * sa], z = b[i * sb];                                         \
                y[i] = (EXPR);                                                              \
            }                                                                               \
    } while (0)

static inline __attribute__((always_inline)) void binary_loops(
    int op, const float *a, int64_t sa, const float *b, int64_t sb, float *y, int64_t n)
{
    switch (op) {
    case BIN_ADD: BINARY_ROW(x + z); break;
    case BIN_SUB: BINARY_ROW(x - z); break;
    case BIN_MUL: BINARY_ROW(x * z); break;
    case BIN_DIV: BINARY_ROW(x / z); break;
    case BIN_MAX: BINARY_ROW(max_nan(x, z)); break;
    case BIN_MIN: BINARY_ROW(min_nan(x, z)); break;
    default: break;
    }
}

static void binary_portable(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                            float *y, int64_t n)
{
    binary_loops(op, a, sa, b, sb, y, n);
}

#if defined(__x86_64__)
AVX2 static void binary_avx2(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                             float *y, int64_t n)
{
    binary_loops(op, a, sa, b, sb, y, n);
}

AVX512 static void binary_avx512(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                                 float *y, int64_t n)
{
    binary_loops(op, a, sa, b, sb, y, n);
}
#endif

/* y[i] = a[i * sa] op b[i * sb] for i < n, built for the ISA level kernels_isa() allows. */
static void binary_row(int op, const float *a, int64_t sa, const float *b, int64_t sb,
                       float *y, int64_t n)
{
#if defined(__x86_64__)
    if (have_avx512()) {
        binary_avx512(op, a, sa, b, sb, y, n);
        return;
    }
    if (have_avx2()) {
        binary_avx2(op, a, sa, b, sb, y, n);
        return;
    }
#endif
    binary_portable(op, a, sa, b, sb, y, n);
}

void binary_f32(int op, const float *a, const int64_t *a_strides, const float *b,
                const int64_t *b_strides, float *y, const int64_t *shape,
                int act, float alpha, float beta)
{
    /* tasks: CHUNK-long pieces of each innermost row, so one long row still splits */
    int64_t rows = shape[0] * shape[1] * shape[2], n = shape[3];
    int64_t pieces = (n + CHUNK - 1) / CHUNK, tasks = rows * pieces;
    PARALLEL_FOR(threads_for((size_t)(rows * n)),
        for (int64_t t = 0; t < tasks; ++t) {
            int64_t r = t / pieces, start = (t % pieces) * CHUNK;
            int64_t len = n - start < CHUNK ? n - start : CHUNK;
            int64_t i0 = r / (shape[1] * shape[2]), i1 = (r / shape[2]) % shape[1], i2 = r % shape[2];
            const float *ar = a + i0 * a_strides[0] + i1 * a_strides[1] + i2 * a_strides[2];
            const float *br = b + i0 * b_strides[0] + i1 * b_strides[1] + i2 * b_strides[2];
            float *yr = y + r * n + start;
            binary_row(op, ar + start * a_strides[3], a_strides[3], br + start * b_strides[3],
                       b_strides[3], yr, len);
            activate_inplace(yr, (size_t)len, act, alpha, beta);
        });
}

enum { CHAIN_BLOCK = 1024 };

/* acc[i] = src[i] op side (or side op src when swapped) for chain elements [start, start + len),
 * walked in runs over which the side value is one scalar (inner > 1: a channel of H*W values)
 * or a contiguous stretch of the side (inner == 1: a row vector, or the whole tensor). */
static void chain_binary(int op, int swapped, const float *src, float *acc, int64_t len,
                         int64_t start, const float *side, int64_t period, int64_t inner)
{
    for (int64_t i = 0; i < len;) {
        int64_t g = start + i, run, step;
        const float *s;
        if (period == 1) {
            s = side, step = 0, run = len - i;
        } else if (inner == 1) {
            int64_t offset = g % period;
            s = side + offset, step = 1, run = period - offset;
        } else {
            s = side + (g / inner) % period, step = 0, run = inner - g % inner;
        }
        if (run > len - i) run = len - i;
        if (swapped)
            binary_row(op, s, step, src + i, 1, acc + i, run);
        else
            binary_row(op, src + i, 1, s, step, acc + i, run);
        i += run;
    }
}

/* y[i] = x[i] * s + t, then ReLU when relu (written as relu_f32, so NaN stays): a chain's Mul
 * and Add of channel vectors (an inference BatchNormalization) in one pass over a plane; no
 * FMA contraction (-std=c11), so each result is rounded as the two ops round it.  y may be x. */
VECTOR_CLONES
static void scale_shift_row(const float *x, float *y, int64_t n, float s, float t, int relu)
{
    if (relu)
        for (int64_t i = 0; i < n; ++i) {
            float v = x[i] * s + t;
            y[i] = (v < 0.0f) ? 0.0f : v;
        }
    else
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s + t;
}

/* A chain that starts Mul then Add by sides of one (period, inner) geometry with planes of
 * inner >= 2 elements, followed by activations only. */
static int chain_is_channel_affine(int64_t n, int n_ops, const int32_t *ops,
                                   const int64_t *geometry)
{
    if (n_ops < 2 || ops[0] != CHAIN_BINARY || ops[1] != BIN_MUL || ops[3] != CHAIN_BINARY
        || ops[4] != BIN_ADD)
        return 0;
    if (geometry[0] != geometry[2] || geometry[1] != geometry[3] || geometry[1] < 2
        || n % geometry[1] != 0)
        return 0;
    for (int k = 2; k < n_ops; ++k)
        if (ops[3 * k] != CHAIN_ACTIVATION)
            return 0;
    return 1;
}

/* chain_f32 for chain_is_channel_affine chains: plane by plane, the plane's scale and shift
 * (and a first ReLU) in one pass, any further activations over the block still in cache. */
static void chain_channel_affine(const float *x, float *y, int64_t n, int n_ops,
                                 const int32_t *ops, const float *params,
                                 const float *const *sides, const int64_t *geometry, int threads)
{
    int64_t period = geometry[0], inner = geometry[1], planes = n / inner;
    int relu = n_ops > 2 && ops[7] == ACT_RELU;
    int rest = relu ? 3 : 2;
    PARALLEL_FOR(threads, for (int64_t p = 0; p < planes; ++p) {
        int64_t c = p % period;
        for (int64_t start = 0; start < inner; start += CHAIN_BLOCK) {
            int64_t len = inner - start < CHAIN_BLOCK ? inner - start : CHAIN_BLOCK;
            float *yb = y + p * inner + start;
            scale_shift_row(x + p * inner + start, yb, len, sides[0][c], sides[1][c], relu);
            for (int k = rest; k < n_ops; ++k)
                activate_inplace(yb, (size_t)len, ops[3 * k + 1], params[2 * k],
                                 params[2 * k + 1]);
        }
    });
}

void chain_f32(const float *x, float *y, int64_t n, int n_ops, const int32_t *ops,
               const float *params, const float *const *sides, const int64_t *geometry)
{
    if (chain_is_channel_affine(n, n_ops, ops, geometry)) {
        chain_channel_affine(x, y, n, n_ops, ops, params, sides, geometry,
                             threads_for((size_t)n * (size_t)n_ops));
        return;
    }
    int64_t blocks = (n + CHAIN_BLOCK - 1) / CHAIN_BLOCK;
    size_t work = (size_t)n * (size_t)(n_ops > 0 ? n_ops : 1);
    PARALLEL_FOR(threads_for(work),
        for (int64_t blk = 0; blk < blocks; ++blk) {
            int64_t start = blk * CHAIN_BLOCK, len = n - start < CHAIN_BLOCK ? n - start : CHAIN_BLOCK;
            /* the first op reads x into y's block, the rest work there in place, in cache */
            float *acc = y + start;
            const float *src = x + start;
            if (n_ops == 0 && acc != src)
                for (int64_t i = 0; i < len; ++i) acc[i] = src[i];
            for (int k = 0; k < n_ops; ++k, src = acc) {
                const int32_t *op = ops + 3 * k;
                if (op[0] == CHAIN_ACTIVATION) {
                    activate_into(src, acc, (size_t)len, op[1], params[2 * k], params[2 * k + 1]);
                    continue;
                }
                chain_binary(op[1], op[2], src, acc, len, start, sides[k], geometry[2 * k],
                             geometry[2 * k + 1]);
            }
        });
}
