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
#endif
