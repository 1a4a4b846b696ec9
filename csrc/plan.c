/* The plan's step table: consecutive fast steps of optimized/plan.py run in one call, each a
 * call of the same kernel, with the same arguments, that the Python wrapper would make.  Every
 * buffer is named by its slot; slots[i] is the address the plan bound to slot i (arena,
 * initializer, feed or output), so one table serves every run of one input signature. */
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "internal.h"

#define IN(k) (s->in[k] < 0 ? NULL : slots[s->in[k]])
#define OUT(k) (s->out[k] < 0 ? NULL : slots[s->out[k]])

/* y = x[offset + sum_d i_d * strides[d]] over shape (up to 6 axes, element strides and offset
 * in elements of elem_size bytes); y is contiguous. */
static void strided_copy(const char *x, char *y, const int64_t *shape, const int64_t *strides,
                         int64_t offset, int64_t elem_size)
{
    int64_t total = 1;
    for (int d = 0; d < 6; ++d) total *= shape[d];
    int64_t inner = shape[5], rows = inner ? total / inner : 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t rest = r, at = offset;
        for (int d = 4; d >= 0; --d) {
            at += (rest % shape[d]) * strides[d];
            rest /= shape[d];
        }
        char *dst = y + r * inner * elem_size;
        if (strides[5] == 1) {
            memcpy(dst, x + at * elem_size, (size_t)(inner * elem_size));
            continue;
        }
        for (int64_t i = 0; i < inner; ++i)
            memcpy(dst + i * elem_size, x + (at + i * strides[5]) * elem_size, (size_t)elem_size);
    }
}

/* Rows of a (rows x row_bytes) table picked by int64 indices (negative ones count from the
 * end), as Gather on axis 0 with `outer` leading blocks of (rows x row_bytes).  Returns -1 for
 * an index out of range, before writing anything. */
static int gather_rows(const char *table, const int64_t *indices, char *y, int64_t outer,
                       int64_t rows, int64_t count, int64_t row_bytes)
{
    for (int64_t i = 0; i < count; ++i)
        if (indices[i] < -rows || indices[i] >= rows)
            return -1;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < count; ++i) {
            int64_t row = indices[i] < 0 ? indices[i] + rows : indices[i];
            memcpy(y + (o * count + i) * row_bytes, table + (o * rows + row) * row_bytes,
                   (size_t)row_bytes);
        }
    return 0;
}

/* geometry of PLAN_SELECT: rank (up to 6), the output's shape, then per input (3) its
 * element strides along the output's axes (0 where it broadcasts). */
enum { SELECT_WHERE = 0, SELECT_AND = 1, SELECT_OR = 2, SELECT_XOR = 3 };

static void select_elements(int code, const char *a, const char *b, const char *c, char *y,
                            int64_t itemsize, const int64_t *geometry)
{
    int rank = (int)geometry[0];
    const int64_t *shape = geometry + 1, *strides = geometry + 7;
    int64_t total = 1, index[6] = {0}, at[3] = {0, 0, 0};
    for (int d = 0; d < rank; ++d) total *= shape[d];
    for (int64_t i = 0; i < total; ++i) {
        switch (code) {
        case SELECT_WHERE:
            memcpy(y + i * itemsize, (a[at[0]] ? b + at[1] * itemsize : c + at[2] * itemsize),
                   (size_t)itemsize);
            break;
        case SELECT_AND: y[i] = (char)(a[at[0]] && b[at[1]]); break;
        case SELECT_OR: y[i] = (char)(a[at[0]] || b[at[1]]); break;
        default: y[i] = (char)(!a[at[0]] != !b[at[1]]); break;
        }
        for (int d = rank - 1; d >= 0; --d) {
            for (int k = 0; k < 3; ++k) at[k] += strides[k * 6 + d];
            if (++index[d] < shape[d]) break;
            for (int k = 0; k < 3; ++k) at[k] -= strides[k * 6 + d] * shape[d];
            index[d] = 0;
        }
    }
}

/* Cast between bool (stored as one byte, 0 or 1), int32, int64, float32 and float64, by C's
 * conversions: exact, or rounded to nearest where the target is a float; never float to int. */
enum { CAST_BOOL = 0, CAST_I32 = 1, CAST_I64 = 2, CAST_F32 = 3, CAST_F64 = 4 };

#define CAST_LOOP(FROM, TO, EXPR)                                                            \
    do {                                                                                     \
        const FROM *src = x;                                                                 \
        TO *dst = y;                                                                         \
        for (int64_t i = 0; i < n; ++i) dst[i] = (TO)(EXPR);                                 \
    } while (0)
#define CAST_TO(FROM)                                                                        \
    switch (to) {                                                                            \
    case CAST_BOOL: CAST_LOOP(FROM, unsigned char, src[i] != 0); return 0;                   \
    case CAST_I32: CAST_LOOP(FROM, int32_t, src[i]); return 0;                               \
    case CAST_I64: CAST_LOOP(FROM, int64_t, src[i]); return 0;                               \
    case CAST_F32: CAST_LOOP(FROM, float, src[i]); return 0;                                 \
    case CAST_F64: CAST_LOOP(FROM, double, src[i]); return 0;                                \
    default: return -1;                                                                      \
    }

static int cast_elements(int from, int to, const void *x, void *y, int64_t n)
{
    switch (from) {
    case CAST_BOOL: CAST_TO(unsigned char)
    case CAST_I32: CAST_TO(int32_t)
    case CAST_I64: CAST_TO(int64_t)
    case CAST_F32:
        if (to == CAST_I32 || to == CAST_I64) return -1;
        CAST_TO(float)
    case CAST_F64:
        if (to == CAST_I32 || to == CAST_I64) return -1;
        CAST_TO(double)
    default:
        return -1;
    }
}

static int run_step(const plan_step *s, void *const *slots)
{
    switch (s->kind) {
    case PLAN_ACTIVATION:
        activation_f32(IN(0), OUT(0), (size_t)s->n[0], s->code, s->f[0], s->f[1]);
        return 0;
    case PLAN_BINARY:
        binary_f32(s->code, IN(0), s->g + 4, IN(1), s->g + 8, OUT(0), s->g, s->act, s->f[0],
                   s->f[1]);
        return 0;
    case PLAN_GEMM:
        gemm_f32(s->flags & 1, (s->flags >> 1) & 1, (int)s->n[0], (int)s->n[1], (int)s->n[2],
                 s->f[0], IN(0), IN(1), s->f[1], IN(2), s->g[0], s->g[1], OUT(0), s->act,
                 s->f[2], s->f[3]);
        return 0;
    case PLAN_GEMM_PACKED:
        gemm_packed_f32(s->n[0], s->n[1], s->n[2], s->f[0], IN(0), s->g[2], s->handle, s->f[1],
                        IN(2), s->g[0], s->g[1], OUT(0), s->act, s->f[2], s->f[3], 1);
        return 0;
    case PLAN_MATMUL:
        gemm_batched_f32(s->flags & 1, (s->flags >> 1) & 1, (int)s->n[3], (int)s->n[0],
                         (int)s->n[1], (int)s->n[2], s->f[0], IN(0), s->g[0], IN(1), s->g[1],
                         OUT(0));
        return 0;
    case PLAN_SOFTMAX:
        softmax_last_f32(IN(0), OUT(0), (size_t)s->n[0], (size_t)s->n[1]);
        return 0;
    case PLAN_LAYERNORM:
        layernorm_last_f32(IN(0), IN(1), IN(2), OUT(0), OUT(1), OUT(2), (size_t)s->n[0],
                           (size_t)s->n[1], s->f[0]);
        return 0;
    case PLAN_RMSNORM:
        rmsnorm_last_f32(IN(0), IN(1), IN(2), IN(3), OUT(0), OUT(1), OUT(2), (size_t)s->n[0],
                         (size_t)s->n[1], s->f[0]);
        return 0;
    case PLAN_SILU_MUL:
        silu_mul_f32(IN(0), (const float *)IN(1) + s->n[3], OUT(0), (size_t)s->n[0],
                     (size_t)s->n[1], (size_t)(s->n[2] ? s->n[2] : s->n[1]));
        return 0;
    case PLAN_REDUCE_LAST:
        reduce_last_f32(s->code, IN(0), OUT(0), (size_t)s->n[0], (size_t)s->n[1]);
        return 0;
    case PLAN_COPY:
        memcpy(slots[s->out[0]], slots[s->in[0]], (size_t)s->n[0]);
        return 0;
    case PLAN_STRIDED_COPY:
        strided_copy(slots[s->in[0]], slots[s->out[0]], s->g, s->g + 6, s->n[0], s->n[1]);
        return 0;
    case PLAN_ROWS_COPY:
        for (int64_t r = 0; r < s->n[0]; ++r)
            memcpy((char *)slots[s->out[0]] + s->n[2] + r * s->n[3],
                   (const char *)slots[s->in[0]] + s->g[0] + r * s->g[1], (size_t)s->n[1]);
        return 0;
    case PLAN_CHAIN: {
        const float *sides[PLAN_CHAIN_MAX_OPS];
        if (s->n[1] > PLAN_CHAIN_MAX_OPS)
            return -1;
        for (int64_t k = 0; k < s->n[1]; ++k)
            sides[k] = s->side_slots[k] < 0 ? NULL : slots[s->side_slots[k]];
        chain_f32(IN(0), OUT(0), s->n[0], (int)s->n[1], s->ops, s->params, sides, s->geometry);
        return 0;
    }
    case PLAN_GEMV:
        return gemv_f32((s->flags >> 1) & 1, (int)s->n[0], s->n[1], s->n[2], s->f[0], IN(0),
                        s->n[2], IN(1), s->f[1], IN(2), s->g[0], s->g[1], OUT(0), s->act,
                        s->f[2], s->f[3], 1);
    case PLAN_CONV:
        return conv2d_f32(IN(0), s->n[0], s->n[1], s->n[2], s->n[3], IN(1), s->g[0], s->g[1],
                          s->g[2], s->g[3], s->g[4], s->g[5], s->g[6], s->g[7], s->g[8], s->g[9],
                          IN(2), IN(3), OUT(0), s->g[10], s->g[11], s->act, s->f[0], s->f[1]);
    case PLAN_ONEDNN_CONV:
        return onednn_conv_run((onednn_conv *)s->handle, IN(0), IN(1), OUT(0)) == 0 ? 0 : -1;
    case PLAN_ONEDNN_REGION:
        return onednn_region_run_slots((onednn_region *)s->handle, slots, s->side_slots) == 0 ? 0 : -1;
    case PLAN_ROTARY:
        rotary_f32(IN(0), IN(1), IN(2), OUT(0), s->n[0], s->n[1], s->n[2], s->n[3], s->g[0],
                   s->g + 1, s->flags & 1, (s->flags >> 1) & 1);
        return 0;
    case PLAN_GQA:
        return gqa_f32(IN(0), s->g, IN(1), IN(2), OUT(0), (int)s->n[0], (int)s->n[1],
                       (int)s->n[2], (int)s->n[3], (int)s->g[3], (int)s->g[4], (int)s->g[5],
                       s->kv_head_of, s->f[0], IN(3), s->g + 6, NULL, NULL, 0, -1,
                       s->flags & 1) == 0 ? 0 : -1;
    case PLAN_POOL:
        return pool2d_f32(s->code, IN(0), s->n[0], s->n[1], s->n[2], OUT(0), s->n[3], s->g[0],
                          s->g[1], s->g[2], s->g[3], s->g[4], s->g[5], s->g[6], s->g[7], s->g[8],
                          s->g[9], s->g[10], s->flags & 1);
    case PLAN_TIED_CHANNELS: {
        char *y = OUT(0);
        size_t plane = (size_t)s->n[2] * sizeof(float);
        for (int64_t b = 0; b < s->n[0]; ++b)
            for (int64_t c = 0; c < s->n[1]; ++c)
                if (s->geometry[c] != c)
                    memcpy(y + (b * s->n[1] + c) * plane, y + (b * s->n[1] + s->geometry[c]) * plane,
                           plane);
        return 0;
    }
    case PLAN_CAST:
        return cast_elements(s->code >> 4, s->code & 15, IN(0), OUT(0), s->n[0]);
    case PLAN_SELECT:
        select_elements(s->code, IN(0), IN(1), IN(2), OUT(0), s->n[0], s->geometry);
        return 0;
    case PLAN_GATHER:
        return gather_rows(slots[s->in[0]], slots[s->in[1]], slots[s->out[0]], s->n[0], s->n[1], s->n[2], s->n[3]);
    case PLAN_MATMUL_NBITS:
        return matmul_nbits_f32(IN(0), IN(1), IN(2), (s->flags & 1) ? NULL : IN(3),
                                (s->flags & 1) ? IN(3) : NULL, NULL, OUT(0), (int)s->n[0],
                                (int)s->n[1], (int)s->n[2], (int)s->n[3], (int)s->g[0], 1) == 0
                   ? 0 : -1;
    case PLAN_CAUSAL_MASK:
        return causal_padding_mask_f32(slots[s->in[0]], s->code, IN(1), IN(2), OUT(0), s->n[0],
                                       s->n[1], s->n[2], s->f[0]);
    default:
        return -1;
    }
}

int64_t plan_run(const plan_step *steps, int64_t count, void *const *slots)
{
    for (int64_t i = 0; i < count; ++i)
        if (run_step(steps + i, slots) != 0)
            return i;
    return -1;
}

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t plan_run_timed(const plan_step *steps, int64_t count, void *const *slots,
                       int64_t *times)
{
    times[0] = monotonic_ns();
    for (int64_t i = 0; i < count; ++i) {
        int failed = run_step(steps + i, slots);
        times[i + 1] = monotonic_ns();
        if (failed != 0)
            return i;
    }
    return -1;
}
