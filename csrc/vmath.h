/* Vectorisable float32 exp, tanh, sigmoid and Gelu: plain arithmetic and selects, so that a
 * loop over them becomes SIMD code, where libm's expf/tanhf/erff are a scalar call per element.
 * Accuracy: exp within 2 ulp, subnormal results included (0 below the smallest subnormal,
 * inf above FLT_MAX); tanh, sigmoid and Gelu within a few 1e-7; NaN propagates.  Horner steps
 * are explicit fused multiply-adds (vm_fma): erf Gelu over bert's 128 x 1024 took 420 us with
 * separate multiplies and adds, 274 us with them (one thread, the AVX2 clone). */
#ifndef KERNELS_VMATH_H
#define KERNELS_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* a * b + c rounded once.  Written out, since -std=c11 turns off the compiler's contraction:
 * each Horner step is then one instruction in the AVX2+FMA clones, and every build gives the
 * same bits (without FMA hardware it is libm's fmaf, correctly rounded alike, but slow). */
static inline __attribute__((always_inline)) float vm_fma(float a, float b, float c)
{
    return fmaf(a, b, c);
}

static inline __attribute__((always_inline)) float vm_exp(float x)
{
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f,
                ln2_lo = 1.428606765330187e-06f, lo = -86.5f, hi = 88.72283f,
                zero_below = -103.972084f, ln2_times_64 = 44.361419555836500f;
    /* results below FLT_MIN (subnormal): computed 2^64 larger, then scaled down */
    float tiny = (float)(x < lo); /* 0 or 1: arithmetic, not a select (see below) */
    float c = x + tiny * ln2_times_64;
    c = c > hi ? hi : c;
    c = c < lo ? lo : c;
    /* round to nearest by the 1.5 * 2^23 trick: vectorises on any x86-64, where floorf needs
     * SSE4.1 */
    const float round_magic = 12582912.0f;
    float n = vm_fma(c, log2e, round_magic) - round_magic; /* in [-125, 128] */
    float r = vm_fma(-n, ln2_lo, vm_fma(-n, ln2_hi, c)); /* |r| <= ln2 / 2 */
    float p = 1.0f / 5040.0f;
    p = vm_fma(p, r, 1.0f / 720.0f);
    p = vm_fma(p, r, 1.0f / 120.0f);
    p = vm_fma(p, r, 1.0f / 24.0f);
    p = vm_fma(p, r, 1.0f / 6.0f);
    p = vm_fma(p, r, 0.5f);
    p = vm_fma(p, r, 1.0f);
    p = vm_fma(p, r, 1.0f);
    /* 2^(n-1): 2^n itself overflows at n = 128 */
    uint32_t bits = (uint32_t)((int32_t)n + 126) << 23;
    float half_scale;
    memcpy(&half_scale, &bits, sizeof half_scale);
    /* the edge cases as factors made by arithmetic on comparisons: GCC does not vectorise a
     * loop whose selects pile up into one PHI of more than 4 arguments.  NaN x: underflow is 0
     * and overflow inf, and p is NaN already, so the product stays NaN. */
    float subnormal = tiny * 5.42101086242752217e-20f + (1.0f - tiny); /* 2^-64 or 1 */
    float underflow = (float)(x >= zero_below);
    float overflow = 1.0f / (float)(x <= hi);
    return p * half_scale * 2.0f * subnormal * underflow * overflow;
}

static inline __attribute__((always_inline)) float vm_sigmoid(float x)
{
    return 1.0f / (1.0f + vm_exp(-x));
}

static inline __attribute__((always_inline)) float vm_tanh(float x)
{
    float a = fabsf(x), a2 = a * a;
    /* near 0, 1 - 2 / (e^2a + 1) cancels: the odd series there instead; for large a, e^2a is
     * inf and the formula gives 1; NaN passes through both */
    float series = a * (1.0f + a2 * (-1.0f / 3.0f + a2 * (2.0f / 15.0f + a2 * (-17.0f / 315.0f))));
    float t = a < 0.0625f ? series : 1.0f - 2.0f / (vm_exp(2.0f * a) + 1.0f);
    return copysignf(t, x);
}

/* erfc(a) for a >= 0 by the Chebyshev fit of Numerical Recipes' erfcc (fractional error below
 * 1.2e-7 everywhere), so tails stay accurate where 1 - erf(a) would cancel. */
static inline __attribute__((always_inline)) float vm_erfc_nonneg(float a)
{
    float t = 1.0f / (1.0f + 0.5f * a);
    float p = 0.17087277f;
    p = vm_fma(p, t, -0.82215223f);
    p = vm_fma(p, t, 1.48851587f);
    p = vm_fma(p, t, -1.13520398f);
    p = vm_fma(p, t, 0.27886807f);
    p = vm_fma(p, t, -0.18628806f);
    p = vm_fma(p, t, 0.09678418f);
    p = vm_fma(p, t, 0.37409196f);
    p = vm_fma(p, t, 1.00002368f);
    p = vm_fma(p, t, -1.26551223f);
    return t * vm_exp(vm_fma(-a, a, p));
}

/* x * Phi(x), with Phi(x) = erfc(-x / sqrt 2) / 2 taken from the side where it is small. */
static inline __attribute__((always_inline)) float vm_gelu_erf(float x)
{
    float tail = 0.5f * vm_erfc_nonneg(fabsf(x) * 0.70710678118654752f);
    float phi = x < 0.0f ? tail : 1.0f - tail;
    return x * phi;
}

/* 0.5 x (1 + tanh u) = x / (1 + e^(-2u)): the same value without the cancellation at x < 0. */
static inline __attribute__((always_inline)) float vm_gelu_tanh(float x)
{
    float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return x / (1.0f + vm_exp(-2.0f * u));
}
#if defined(__x86_64__)
#include <immintrin.h>

/* The same functions 16 lanes at a time, for AVX-512 (F, BW, DQ, VL: the target of internal.h's
 * AVX512 macro, repeated here so that this header stands alone).  exp reduces x as vm_exp does
 * (n = round(x log2 e), r = x - n ln 2 in two steps, the same degree-7 polynomial) but scales by
 * 2^n with vscalefps, which overflows to inf, rounds a subnormal result once and underflows to
 * 0 by itself: 13 instructions where the AVX2 form needs about 35 (its edge-case factors and a
 * division).  Normal results are bit for bit vm_exp's; subnormal ones within 1 ulp of them. */
#define VM512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"), always_inline))

VM512 static inline __m512 vm512_exp(__m512 x)
{
    /* below -110 every result is 0 and above 89 inf either way; max/min return their second
     * operand when one is NaN, so NaN passes through the clamp */
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

VM512 static inline __m512 vm512_sigmoid(__m512 x)
{
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, vm512_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

VM512 static inline __m512 vm512_abs(__m512 x)
{
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

/* |t| with the sign of x */
VM512 static inline __m512 vm512_copysign(__m512 t, __m512 x)
{
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(vm512_abs(t)), sign));
}

VM512 static inline __m512 vm512_tanh(__m512 x)
{
    __m512 a = vm512_abs(x), a2 = _mm512_mul_ps(a, a);
    __m512 series = _mm512_mul_ps(a2, _mm512_set1_ps(-17.0f / 315.0f));
    series = _mm512_mul_ps(a2, _mm512_add_ps(_mm512_set1_ps(2.0f / 15.0f), series));
    series = _mm512_mul_ps(a2, _mm512_add_ps(_mm512_set1_ps(-1.0f / 3.0f), series));
    series = _mm512_mul_ps(a, _mm512_add_ps(_mm512_set1_ps(1.0f), series));
    __m512 e = vm512_exp(_mm512_add_ps(a, a));
    __m512 two_over = _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
    __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f), two_over);
    __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.0625f), _CMP_LT_OQ);
    return vm512_copysign(_mm512_mask_blend_ps(small, t, series), x);
}

VM512 static inline __m512 vm512_erfc_nonneg(__m512 a)
{
    __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f),
                             _mm512_fmadd_ps(_mm512_set1_ps(0.5f), a, _mm512_set1_ps(1.0f)));
    static const float c[10] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                                -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f};
    __m512 p = _mm512_set1_ps(c[0]);
    for (int i = 1; i < 10; ++i) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(c[i]));
    return _mm512_mul_ps(t, vm512_exp(_mm512_fnmadd_ps(a, a, p)));
}

VM512 static inline __m512 vm512_gelu_erf(__m512 x)
{
    __m512 tail = _mm512_mul_ps(
        _mm512_set1_ps(0.5f),
        vm512_erfc_nonneg(_mm512_mul_ps(vm512_abs(x), _mm512_set1_ps(0.70710678118654752f))));
    __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 phi = _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0f), tail), tail);
    return _mm512_mul_ps(x, phi);
}

VM512 static inline __m512 vm512_gelu_tanh(__m512 x)
{
    __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), x), x);
    __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f), _mm512_add_ps(x, cube));
    __m512 e = vm512_exp(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* The first n (< 16) lanes. */
VM512 static inline __mmask16 vm512_head(size_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* y[i] = F(x[i]) for F one of the vm512_ functions above, the tail under a mask; y may be x. */
#define VM512_MAP(F, x, y, n)                                                                \
    do {                                                                                     \
        size_t vm_i_ = 0;                                                                    \
        for (; vm_i_ + 16 <= (n); vm_i_ += 16)                                               \
            _mm512_storeu_ps((y) + vm_i_, F(_mm512_loadu_ps((x) + vm_i_)));                  \
        if (vm_i_ < (n)) {                                                                   \
            __mmask16 vm_m_ = vm512_head((n) - vm_i_);                                       \
            __m512 vm_v_ = F(_mm512_maskz_loadu_ps(vm_m_, (x) + vm_i_));                     \
            _mm512_mask_storeu_ps((y) + vm_i_, vm_m_, vm_v_);                                \
        }                                                                                    \
    } while (0)

/* The largest of x[0..n), NaN when one is NaN, -inf when n is 0. */
VM512 static inline float vm512_row_max(const float *x, size_t n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_loadu_ps(x + j);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    if (j < n) {
        __mmask16 h = vm512_head(n - j);
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), h, x + j);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    return nan ? NAN : _mm512_reduce_max_ps(m);
}

/* y[j] = exp(x[j] - m) for j < n; returns their sum.  y may be x. */
VM512 static inline float vm512_exp_shifted_sum(const float *x, float *y, size_t n, float m)
{
    __m512 shift = _mm512_set1_ps(m), s = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = vm512_exp(_mm512_sub_ps(_mm512_loadu_ps(x + j), shift));
        _mm512_storeu_ps(y + j, e);
        s = _mm512_add_ps(s, e);
    }
    if (j < n) {
        __mmask16 h = vm512_head(n - j);
        __m512 e = vm512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(h, x + j), shift));
        _mm512_mask_storeu_ps(y + j, h, e);
        s = _mm512_add_ps(s, _mm512_maskz_mov_ps(h, e));
    }
    return _mm512_reduce_add_ps(s);
}

/* y[j] *= factor for j < n. */
VM512 static inline void vm512_scale(float *y, size_t n, float factor)
{
    __m512 f = _mm512_set1_ps(factor);
    size_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_mul_ps(_mm512_loadu_ps(y + j), f));
    if (j < n) {
        __mmask16 h = vm512_head(n - j);
        _mm512_mask_storeu_ps(y + j, h, _mm512_mul_ps(_mm512_maskz_loadu_ps(h, y + j), f));
    }
}

/* A softmax row, y = exp(x - max) / sum, as softmax_last_f32 defines it (NaN anywhere: NaN
 * everywhere; all -inf: NaN, 0/0).  y may be x. */
VM512 static inline void vm512_softmax_row(const float *x, float *y, size_t n)
{
    float m = vm512_row_max(x, n);
    float total = vm512_exp_shifted_sum(x, y, n, m);
    vm512_scale(y, n, 1.0f / total);
}
#endif
#endif
