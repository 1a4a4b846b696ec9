/* com.microsoft MatMulNBits: y (m x n) = a (m x k) @ dequant(b)^T + bias, with b holding n rows
 * of k values quantized block by block along k: w = (q - zero_point) * scale per block.
 *
 * Decode and small batches (m <= 8 on the 4-bit vector paths, else m <= 3): one pass over the
 * packed weights per 4 rows of a (per row off those paths), dequantized in registers
 * (AVX-512 or AVX2+FMA when the CPU has it, else portable C), split over n in chunks across
 * the OpenMP threads.
 * Prefill: each thread dequantizes a panel of weight rows into float32 and runs it against all of
 * a, so no full float copy of the weights ever exists: with AVX2 (blocks of whole 8-byte
 * groups of codes: 2 bits from blocks of 32, 4 bits from 16, 8 bits) as 16 columns packed for a
 * 6 x 16 register tile, a chunk of k at a time (gemm_packed_avx2), each output summed in one
 * order whatever the thread count; else through a single-threaded BLAS GEMM a panel.
 * Where the CPU has AVX-512 (checked at run time, have_avx512), decode takes 16 codes a vector
 * (4 bits: the code bytes index a table of code - zero point with vpermps, a laid out evens then
 * odds per 32 values to match) and prefill runs the same panels two at a time under a tile of
 * up to 12 rows.  Measured against the AVX2 paths in one process, alternating, 1 thread, CPU
 * time, medians of 7 (load average 8 on 2 cores): decode m = 1, 4 bits, blocks of 32, packed
 * zero points: K 512 -> N 1536 97 -> 74 us, 2048 -> 8192 2688 -> 2086, 512 -> 32000 1875 ->
 * 1440; 8 bits 2048 -> 8192 1336 -> 1293; prefill m = 128, 512 -> 1408 and 1408 -> 512: 1-4%. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "kernels.h"
#include "internal.h"

/* Rows of a up to which decode streams the weights once per row (off the 4-bit vector paths,
 * which serve 2 * A_ROWS_PER_PASS rows so) rather than dequantizing panels for a GEMM.
 * A prefill panel holds PANEL_BYTES of dequantized weights, but at least PANEL_MIN_ROWS weight
 * rows: each GEMM packs all of a again, and at m = 128, k = 1408 panels of 46 rows ran the GEMMs
 * at 55-65 GFLOP/s against 65-78 with 186 (one thread, CPU time). */
enum { GEMV_MAX_ROWS = 3, PANEL_BYTES = 256 * 1024, PANEL_MIN_ROWS = 128, PANEL_ROW_STEP = 16 };

typedef struct {
    const uint8_t *b;
    const float *scales;
    const uint8_t *zp_packed;
    const float *zp_float;
    int n, k, bits, block_size, n_blocks, blob, zp_row_bytes;
} nbits_weights;

/* The zero points of weight row `row`, one per block, as floats. */
static inline __attribute__((always_inline)) void row_zero_points(const nbits_weights *w,
                                                                   int row, float *zps)
{
    if (w->zp_float != NULL) {
        memcpy(zps, w->zp_float + (size_t)row * w->n_blocks, (size_t)w->n_blocks * sizeof(float));
        return;
    }
    if (w->zp_packed == NULL) {
        for (int blk = 0; blk < w->n_blocks; ++blk) zps[blk] = (float)(1 << (w->bits - 1));
        return;
    }
    const uint8_t *packed = w->zp_packed + (size_t)row * w->zp_row_bytes;
    if (w->bits == 8)
        for (int blk = 0; blk < w->n_blocks; ++blk) zps[blk] = (float)packed[blk];
    else if (w->bits == 4)
        for (int blk = 0; blk < w->n_blocks; ++blk)
            zps[blk] = (float)((packed[blk >> 1] >> ((blk & 1) * 4)) & 15);
    else
        for (int blk = 0; blk < w->n_blocks; ++blk)
            zps[blk] = (float)((packed[blk >> 2] >> ((blk & 3) * 2)) & 3);
}

/* The zero point of weight row `row`, block `blk`, as a float. */
static inline float block_zero_point(const nbits_weights *w, int row, int blk)
{
    if (w->zp_float != NULL)
        return w->zp_float[(size_t)row * w->n_blocks + blk];
    if (w->zp_packed == NULL)
        return (float)(1 << (w->bits - 1));
    const uint8_t *packed = w->zp_packed + (size_t)row * w->zp_row_bytes;
    if (w->bits == 8)
        return (float)packed[blk];
    if (w->bits == 4)
        return (float)((packed[blk >> 1] >> ((blk & 1) * 4)) & 15);
    return (float)((packed[blk >> 2] >> ((blk & 3) * 2)) & 3);
}

/* codes[i] of one block as (code - zp) * s, for a constant `bits` (so the loops unroll). */
static inline __attribute__((always_inline)) void dequant_block(const uint8_t *q, int blob,
                                                                int bits, float zp, float s,
                                                                float *out)
{
    int per_byte = 8 / bits, mask = (1 << bits) - 1;
    for (int i = 0; i < blob; ++i)
        for (int j = 0; j < per_byte; ++j)
            out[i * per_byte + j] = ((float)((q[i] >> (j * bits)) & mask) - zp) * s;
}

/* Weight row `row` as floats into out[0 .. n_blocks * block_size), the tail past k zeros (it
 * meets zeros in a: padding codes times an inf scale would make NaN where y is inf);
 * zps: scratch for n_blocks floats. */
VECTOR_CLONES
static void dequant_row(const nbits_weights *w, int row, float *out, float *zps)
{
    const uint8_t *q = w->b + (size_t)row * w->n_blocks * w->blob;
    const float *sc = w->scales + (size_t)row * w->n_blocks;
    row_zero_points(w, row, zps);
    for (int blk = 0; blk < w->n_blocks; ++blk) {
        const uint8_t *qb = q + (size_t)blk * w->blob;
        float *o = out + (size_t)blk * w->block_size;
        if (w->bits == 4)
            dequant_block(qb, w->blob, 4, zps[blk], sc[blk], o);
        else if (w->bits == 8)
            dequant_block(qb, w->blob, 8, zps[blk], sc[blk], o);
        else
            dequant_block(qb, w->blob, 2, zps[blk], sc[blk], o);
    }
    for (int i = w->k; i < w->n_blocks * w->block_size; ++i) out[i] = 0.0f;
}

/* --- decode: one row of a against every weight row -------------------------------------- */

VECTOR_CLONES
static float dot_portable(const float *x, const float *y, int len)
{
    float s = 0.0f;
    #pragma omp simd reduction(+ : s)
    for (int i = 0; i < len; ++i) s += x[i] * y[i];
    return s;
}

/* Portable: dequantize one weight row into `scratch`, then a dot product. */
static void gemv_portable(const nbits_weights *w, const float *a_pad, float *y, int row0,
                          int row1, float *scratch, float *zps)
{
    int padded = w->n_blocks * w->block_size;
    for (int r = row0; r < row1; ++r) {
        dequant_row(w, r, scratch, zps);
        y[r] = dot_portable(a_pad, scratch, padded);
    }
}

#if defined(__x86_64__)
AVX2 static inline __m256 bytes_to_ps(__m128i bytes8)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8));
}

/* acc += p * scale for block blk, lane by lane; but a last block that runs past k is summed
 * first and then scaled, into *tail: its lanes that hold only padding (zeros of a) are 0, and
 * 0 times an inf scale would make NaN where the reference's sum over k is inf. */
AVX2 static inline __attribute__((always_inline)) void scale_block_avx2(
    const nbits_weights *w, int blk, __m256 p, float scale, __m256 *acc, float *tail)
{
    if (blk == w->n_blocks - 1 && w->k % w->block_size != 0)
        *tail = hsum256(p) * scale;
    else
        *acc = _mm256_fmadd_ps(p, _mm256_set1_ps(scale), *acc);
}

/* 4-bit codes, block_size a multiple of 8, a in its own order: each 4 bytes broadcast to the
 * 8 lanes, shifted by 4 * lane and masked, give 8 codes in order; OR-ing them into the
 * exponent of 2^23 makes the floats 2^23 + code exactly, so one subtraction of 2^23 + zero
 * point gives code - zero point (integer zero points; float ones take one more).  ROWS weight
 * rows at a time share the loads of a. */
AVX2 static inline __attribute__((always_inline)) void gemv4_block_rows(
    const nbits_weights *w, const float *a, float *y, int r, float *zps, int integer_zp,
    const int rows)
{
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i mask = _mm256_set1_epi32(0x0F), magic = _mm256_set1_epi32(0x4B000000);
    const float two23 = 8388608.0f;
    size_t row_bytes = (size_t)w->n_blocks * w->blob;
    const uint8_t *q[4];
    const float *sc[4];
    __m256 acc[4];
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < rows; ++i) {
        q[i] = w->b + (size_t)(r + i) * row_bytes;
        sc[i] = w->scales + (size_t)(r + i) * w->n_blocks;
        row_zero_points(w, r + i, zps + (size_t)i * w->n_blocks);
        acc[i] = _mm256_setzero_ps();
    }
    for (int blk = 0; blk < w->n_blocks; ++blk) {
        __m256 offset[4], zp[4], p[4];
        for (int i = 0; i < rows; ++i) {
            float z = zps[(size_t)i * w->n_blocks + blk];
            offset[i] = _mm256_set1_ps(integer_zp ? two23 + z : two23);
            zp[i] = _mm256_set1_ps(integer_zp ? 0.0f : z);
            p[i] = _mm256_setzero_ps();
        }
        const float *ap = a + (size_t)blk * w->block_size;
        for (int j = 0; j < w->block_size; j += 8) {
            __m256 av = _mm256_loadu_ps(ap + j);
            for (int i = 0; i < rows; ++i) {
                int32_t word;
                memcpy(&word, q[i] + j / 2, 4);
                __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts),
                                             mask);
                __m256 f = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, magic)),
                                         offset[i]);
                if (!integer_zp)
                    f = _mm256_sub_ps(f, zp[i]);
                p[i] = _mm256_fmadd_ps(f, av, p[i]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            scale_block_avx2(w, blk, p[i], sc[i][blk], &acc[i], &tail[i]);
            q[i] += w->blob;
        }
    }
    for (int i = 0; i < rows; ++i) y[r + i] = hsum256(acc[i]) + tail[i];
}

/* Weight row r against a_rows (<= 4) rows of a at once (a row i at a + i * a_stride, its
 * result at y + i * y_stride + r): each code is dequantized once for all of them. */
AVX2 static inline __attribute__((always_inline)) void gemv4_a_rows(
    const nbits_weights *w, const float *a, size_t a_stride, float *y, size_t y_stride, int r,
    float *zps, int integer_zp, const int a_rows)
{
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i mask = _mm256_set1_epi32(0x0F), magic = _mm256_set1_epi32(0x4B000000);
    const float two23 = 8388608.0f;
    const uint8_t *q = w->b + (size_t)r * w->n_blocks * w->blob;
    const float *sc = w->scales + (size_t)r * w->n_blocks;
    __m256 acc[4];
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    row_zero_points(w, r, zps);
    for (int i = 0; i < a_rows; ++i) acc[i] = _mm256_setzero_ps();
    for (int blk = 0; blk < w->n_blocks; ++blk, q += w->blob) {
        __m256 offset = _mm256_set1_ps(integer_zp ? two23 + zps[blk] : two23);
        __m256 zp = _mm256_set1_ps(integer_zp ? 0.0f : zps[blk]);
        __m256 p[4];
        for (int i = 0; i < a_rows; ++i) p[i] = _mm256_setzero_ps();
        const float *ap = a + (size_t)blk * w->block_size;
        for (int j = 0; j < w->block_size; j += 8) {
            int32_t word;
            memcpy(&word, q + j / 2, 4);
            __m256i c = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), mask);
            __m256 f = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, magic)), offset);
            if (!integer_zp)
                f = _mm256_sub_ps(f, zp);
            for (int i = 0; i < a_rows; ++i)
                p[i] = _mm256_fmadd_ps(f, _mm256_loadu_ps(ap + i * a_stride + j), p[i]);
        }
        for (int i = 0; i < a_rows; ++i) scale_block_avx2(w, blk, p[i], sc[blk], &acc[i], &tail[i]);
    }
    for (int i = 0; i < a_rows; ++i) y[i * y_stride + r] = hsum256(acc[i]) + tail[i];
}

/* gemv4_a_rows over weight rows [row0, row1) for 2 to 4 rows of a. */
AVX2 static void gemv4_avx2_a_rows(const nbits_weights *w, const float *a, size_t a_stride,
                                   int a_rows, float *y, size_t y_stride, int row0, int row1,
                                   float *zps)
{
#define GEMV4_A_ROWS(ROWS)                                                                    \
    for (int r = row0; r < row1; ++r) {                                                      \
        if (w->zp_float == NULL)                                                              \
            gemv4_a_rows(w, a, a_stride, y, y_stride, r, zps, 1, ROWS);                       \
        else                                                                                  \
            gemv4_a_rows(w, a, a_stride, y, y_stride, r, zps, 0, ROWS);                       \
    }
    if (a_rows == 2) {
        GEMV4_A_ROWS(2)
    } else if (a_rows == 3) {
        GEMV4_A_ROWS(3)
    } else {
        GEMV4_A_ROWS(4)
    }
#undef GEMV4_A_ROWS
}

AVX2 static void gemv4_avx2(const nbits_weights *w, const float *a, float *y, int row0,
                            int row1, float *zps)
{
    int r = row0;
    if (w->zp_float == NULL) {
        for (; r + 4 <= row1; r += 4) gemv4_block_rows(w, a, y, r, zps, 1, 4);
        for (; r < row1; ++r) gemv4_block_rows(w, a, y, r, zps, 1, 1);
    } else {
        for (; r + 4 <= row1; r += 4) gemv4_block_rows(w, a, y, r, zps, 0, 4);
        for (; r < row1; ++r) gemv4_block_rows(w, a, y, r, zps, 0, 1);
    }
}

/* 8-bit codes, block_size a multiple of 16; a in its own order. */
AVX2 static void gemv8_avx2(const nbits_weights *w, const float *a_pad, float *y, int row0,
                            int row1, float *zps)
{
    int chunks = w->block_size / 16;
    for (int r = row0; r < row1; ++r) {
        const uint8_t *q = w->b + (size_t)r * w->n_blocks * w->blob;
        const float *sc = w->scales + (size_t)r * w->n_blocks;
        row_zero_points(w, r, zps);
        __m256 acc = _mm256_setzero_ps();
        float tail = 0.0f;
        const float *ap = a_pad;
        for (int blk = 0; blk < w->n_blocks; ++blk) {
            __m256 zp = _mm256_set1_ps(zps[blk]);
            __m256 p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
            for (int c = 0; c < chunks; ++c, q += 16, ap += 16) {
                __m128i bytes = _mm_loadu_si128((const __m128i *)q);
                p0 = _mm256_fmadd_ps(_mm256_sub_ps(bytes_to_ps(bytes), zp), _mm256_loadu_ps(ap), p0);
                p1 = _mm256_fmadd_ps(_mm256_sub_ps(bytes_to_ps(_mm_srli_si128(bytes, 8)), zp),
                                     _mm256_loadu_ps(ap + 8), p1);
            }
            scale_block_avx2(w, blk, _mm256_add_ps(p0, p1), sc[blk], &acc, &tail);
        }
        y[r] = hsum256(acc) + tail;
    }
}
#endif

#if defined(__x86_64__)
/* --- decode on AVX-512: 16 codes a vector ------------------------------------------------- */

/* The 16 4-bit codes in the 8 bytes of bytes8 (low nibble first) as floats, in order: the
 * nibbles interleaved into 16 bytes, widened to dwords, OR-ed into the exponent of 2^23 and
 * 2^23 taken off again (exact). */
AVX512 static inline __m512 codes16_avx512(__m128i bytes8)
{
    const __m128i low_nibbles = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(bytes8, low_nibbles);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes8, 4), low_nibbles);
    __m512i codes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    return _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(codes, _mm512_set1_epi32(0x4B000000))),
                         _mm512_set1_ps(8388608.0f));
}

/* code - zero point for codes 0..15, as a table for vpermps, which reads only the low 4 bits
 * of each index: the one float subtraction the reference makes per weight. */
AVX512 static inline __m512 code_table_avx512(float zero_point)
{
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_sub_ps(codes, _mm512_set1_ps(zero_point));
}

/* Blocks of 32 or more: 16 code bytes widened to one byte a lane, whose low nibble (code 2j)
 * and, shifted down, high nibble (code 2j + 1) index the table: a is laid out to match, each
 * 32 values as its 16 even ones then its 16 odd ones (arrange_a_split), so no shuffle puts
 * the codes in order.  even/odd: the two sums, added into. */
AVX512 static inline __attribute__((always_inline)) void dot32_split_avx512(
    const uint8_t *q, __m512 table, __m512 a_even, __m512 a_odd, __m512 *even, __m512 *odd)
{
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    *even = _mm512_fmadd_ps(_mm512_permutexvar_ps(bytes, table), a_even, *even);
    *odd = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table), a_odd,
                           *odd);
}

/* A block of 16 (8 bytes): the codes put in order in registers (codes16_avx512). */
AVX512 static inline __attribute__((always_inline)) __m512 block16_dot_avx512(
    const uint8_t *q, const float *a, float zero_point)
{
    __m512 f = _mm512_sub_ps(codes16_avx512(_mm_loadl_epi64((const __m128i *)q)),
                             _mm512_set1_ps(zero_point));
    return _mm512_mul_ps(f, _mm512_loadu_ps(a));
}

/* acc += p * scale for block blk, lane by lane; but a last block that runs past k is summed
 * first and then scaled, into *tail: its lanes that hold only padding (zeros of a) are 0, and
 * 0 times an inf scale would make NaN where the reference's sum over k is inf. */
AVX512 static inline __attribute__((always_inline)) void scale_block_avx512(
    const nbits_weights *w, int blk, __m512 p, float scale, __m512 *acc, float *tail)
{
    if (blk == w->n_blocks - 1 && w->k % w->block_size != 0)
        *tail = _mm512_reduce_add_ps(p) * scale;
    else
        *acc = _mm512_fmadd_ps(p, _mm512_set1_ps(scale), *acc);
}

/* ROWS (1 or 4) weight rows from r against one row of a (laid out by arrange_a_split where
 * blocks are 32 or more), block by block. */
AVX512 static inline __attribute__((always_inline)) void gemv4_512_block_rows(
    const nbits_weights *w, const float *a, float *y, int r, const int rows)
{
    size_t row_bytes = (size_t)w->n_blocks * w->blob;
    const uint8_t *q[4];
    const float *sc[4];
    __m512 acc[4];
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < rows; ++i) {
        q[i] = w->b + (size_t)(r + i) * row_bytes;
        sc[i] = w->scales + (size_t)(r + i) * w->n_blocks;
        acc[i] = _mm512_setzero_ps();
    }
    for (int blk = 0; blk < w->n_blocks; ++blk) {
        const float *ap = a + (size_t)blk * w->block_size;
        __m512 p[4];
        if (w->block_size == 16) {
            for (int i = 0; i < rows; ++i)
                p[i] = block16_dot_avx512(q[i] + (size_t)blk * w->blob, ap,
                                          block_zero_point(w, r + i, blk));
        } else {
            __m512 table[4], odd[4];
            for (int i = 0; i < rows; ++i) {
                table[i] = code_table_avx512(block_zero_point(w, r + i, blk));
                p[i] = odd[i] = _mm512_setzero_ps();
            }
            for (int j = 0; j < w->block_size; j += 32) {
                __m512 a_even = _mm512_loadu_ps(ap + j), a_odd = _mm512_loadu_ps(ap + j + 16);
                for (int i = 0; i < rows; ++i)
                    dot32_split_avx512(q[i] + (size_t)blk * w->blob + j / 2, table[i], a_even,
                                       a_odd, &p[i], &odd[i]);
            }
            for (int i = 0; i < rows; ++i) p[i] = _mm512_add_ps(p[i], odd[i]);
        }
        for (int i = 0; i < rows; ++i)
            scale_block_avx512(w, blk, p[i], sc[i][blk], &acc[i], &tail[i]);
    }
    for (int i = 0; i < rows; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]) + tail[i];
}

AVX512 static void gemv4_avx512(const nbits_weights *w, const float *a, float *y, int row0,
                                int row1)
{
    int r = row0;
    for (; r + 4 <= row1; r += 4) gemv4_512_block_rows(w, a, y, r, 4);
    for (; r < row1; ++r) gemv4_512_block_rows(w, a, y, r, 1);
}

/* Weight row r against a_rows (<= 4) rows of a (as gemv4_a_rows, a laid out as for
 * gemv4_512_block_rows): each vector of codes looked up once for all of them. */
AVX512 static inline __attribute__((always_inline)) void gemv4_512_a_rows(
    const nbits_weights *w, const float *a, size_t a_stride, float *y, size_t y_stride, int r,
    const int a_rows)
{
    const uint8_t *q = w->b + (size_t)r * w->n_blocks * w->blob;
    const float *sc = w->scales + (size_t)r * w->n_blocks;
    __m512 acc[4];
    float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < a_rows; ++i) acc[i] = _mm512_setzero_ps();
    for (int blk = 0; blk < w->n_blocks; ++blk, q += w->blob) {
        const float *ap = a + (size_t)blk * w->block_size;
        __m512 p[4];
        if (w->block_size == 16) {
            for (int i = 0; i < a_rows; ++i)
                p[i] = block16_dot_avx512(q, ap + i * a_stride, block_zero_point(w, r, blk));
        } else {
            __m512 table = code_table_avx512(block_zero_point(w, r, blk)), odd[4];
            for (int i = 0; i < a_rows; ++i) p[i] = odd[i] = _mm512_setzero_ps();
            for (int j = 0; j < w->block_size; j += 32) {
                __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + j / 2)));
                __m512 f_even = _mm512_permutexvar_ps(bytes, table);
                __m512 f_odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
                for (int i = 0; i < a_rows; ++i) {
                    p[i] = _mm512_fmadd_ps(f_even, _mm512_loadu_ps(ap + i * a_stride + j), p[i]);
                    odd[i] = _mm512_fmadd_ps(f_odd, _mm512_loadu_ps(ap + i * a_stride + j + 16),
                                             odd[i]);
                }
            }
            for (int i = 0; i < a_rows; ++i) p[i] = _mm512_add_ps(p[i], odd[i]);
        }
        for (int i = 0; i < a_rows; ++i)
            scale_block_avx512(w, blk, p[i], sc[blk], &acc[i], &tail[i]);
    }
    for (int i = 0; i < a_rows; ++i)
        y[i * y_stride + r] = _mm512_reduce_add_ps(acc[i]) + tail[i];
}

/* gemv4_512_a_rows over weight rows [row0, row1) for 2 to 4 rows of a. */
AVX512 static void gemv4_avx512_a_rows(const nbits_weights *w, const float *a, size_t a_stride,
                                       int a_rows, float *y, size_t y_stride, int row0,
                                       int row1)
{
    for (int r = row0; r < row1; ++r) {
        if (a_rows == 2)
            gemv4_512_a_rows(w, a, a_stride, y, y_stride, r, 2);
        else if (a_rows == 3)
            gemv4_512_a_rows(w, a, a_stride, y, y_stride, r, 3);
        else
            gemv4_512_a_rows(w, a, a_stride, y, y_stride, r, 4);
    }
}

/* 8-bit codes, block_size a multiple of 16: 16 bytes widened to one vector of floats. */
AVX512 static void gemv8_avx512(const nbits_weights *w, const float *a_pad, float *y, int row0,
                                int row1, float *zps)
{
    int chunks = w->block_size / 16;
    for (int r = row0; r < row1; ++r) {
        const uint8_t *q = w->b + (size_t)r * w->n_blocks * w->blob;
        const float *sc = w->scales + (size_t)r * w->n_blocks;
        row_zero_points(w, r, zps);
        __m512 acc = _mm512_setzero_ps();
        float tail = 0.0f;
        const float *ap = a_pad;
        for (int blk = 0; blk < w->n_blocks; ++blk) {
            __m512 zp = _mm512_set1_ps(zps[blk]);
            __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
            int c = 0;
            for (; c + 2 <= chunks; c += 2, q += 32, ap += 32) {
                __m512 f0 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)));
                __m512 f1 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
                p0 = _mm512_fmadd_ps(_mm512_sub_ps(f0, zp), _mm512_loadu_ps(ap), p0);
                p1 = _mm512_fmadd_ps(_mm512_sub_ps(f1, zp), _mm512_loadu_ps(ap + 16), p1);
            }
            if (c < chunks) {
                __m512 f0 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)));
                p0 = _mm512_fmadd_ps(_mm512_sub_ps(f0, zp), _mm512_loadu_ps(ap), p0);
                q += 16;
                ap += 16;
            }
            scale_block_avx512(w, blk, _mm512_add_ps(p0, p1), sc[blk], &acc, &tail);
        }
        y[r] = _mm512_reduce_add_ps(acc) + tail;
    }
}
#endif

enum gemv_path {
    PATH_PORTABLE = 0, PATH_AVX2_4BIT = 1, PATH_AVX2_8BIT = 2, PATH_AVX512_4BIT = 3,
    PATH_AVX512_8BIT = 4
};

static int gemv_path(const nbits_weights *w, int allow_simd)
{
#if defined(__x86_64__)
    if (allow_simd && have_avx512()) {
        if (w->bits == 4 && w->block_size % 16 == 0)
            return PATH_AVX512_4BIT;
        if (w->bits == 8 && w->block_size % 16 == 0)
            return PATH_AVX512_8BIT;
    }
    if (allow_simd && have_avx2()) {
        if (w->bits == 4 && w->block_size % 8 == 0)
            return PATH_AVX2_4BIT;
        if (w->bits == 8 && w->block_size % 16 == 0)
            return PATH_AVX2_8BIT;
    }
#else
    (void)w;
    (void)allow_simd;
#endif
    return PATH_PORTABLE;
}

/* a's row, zero-padded to whole blocks. */
static void arrange_a(const float *a, int k, int padded, float *out)
{
    memcpy(out, a, (size_t)k * sizeof(float));
    for (int i = k; i < padded; ++i) out[i] = 0.0f;
}

/* a's row for the AVX-512 4-bit path with blocks of 32 or more (dot32_split_avx512):
 * zero-padded to whole blocks, each 32 values as the 16 at even places, then the 16 at odd. */
static void arrange_a_split(const float *a, int k, int padded, float *out)
{
    for (int c = 0; c < padded; c += 32)
        for (int j = 0; j < 16; ++j) {
            int even = c + 2 * j, odd = even + 1;
            out[c + j] = even < k ? a[even] : 0.0f;
            out[c + 16 + j] = odd < k ? a[odd] : 0.0f;
        }
}

/* Rows of a that one pass over the weights serves (the 4-bit vector paths take several). */
enum { A_ROWS_PER_PASS = 4 };

static int gemv_rows(const nbits_weights *w, const float *a, int m, float *y, int allow_simd)
{
    int padded = w->n_blocks * w->block_size, path = gemv_path(w, allow_simd);
    int per_pass = path == PATH_AVX2_4BIT || path == PATH_AVX512_4BIT ? A_ROWS_PER_PASS : 1;
    float *a_arranged = malloc((size_t)per_pass * padded * sizeof(float));
    if (a_arranged == NULL)
        return -1;
    int status = 0;
    int threads = threads_for((size_t)w->n * padded / 4);
    /* about 8 chunks a thread, each a multiple of 4 rows (the 4-row kernel's step) */
    int64_t chunk_rows = ((int64_t)w->n / (8 * threads) + 3) / 4 * 4;
    chunk_rows = chunk_rows < 16 ? 16 : chunk_rows;
    int64_t chunks = ((int64_t)w->n + chunk_rows - 1) / chunk_rows;
    for (int i = 0; i < m && status == 0; i += per_pass) {
        int a_rows = m - i < per_pass ? m - i : per_pass;
        for (int j = 0; j < a_rows; ++j) {
            const float *row = a + (size_t)(i + j) * w->k;
            float *to = a_arranged + (size_t)j * padded;
            if (path == PATH_AVX512_4BIT && w->block_size % 32 == 0)
                arrange_a_split(row, w->k, padded, to);
            else
                arrange_a(row, w->k, padded, to);
        }
        float *yi = y + (size_t)i * w->n;
        #pragma omp parallel num_threads(threads)
        {
            float *zps = malloc((size_t)4 * w->n_blocks * sizeof(float));
            float *scratch = path == PATH_PORTABLE ? malloc((size_t)padded * sizeof(float)) : zps;
            if (zps == NULL || scratch == NULL) {
                #pragma omp atomic write
                status = -1;
            }
            /* chunks taken as threads come free: a thread the OS runs late takes fewer */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t c = 0; c < chunks; ++c) {
                int row0 = (int)(c * chunk_rows);
                int row1 = (int)(row0 + chunk_rows < w->n ? row0 + chunk_rows : w->n);
                if (zps == NULL || scratch == NULL)
                    continue;
#if defined(__x86_64__)
                if (path == PATH_AVX512_4BIT && a_rows > 1)
                    gemv4_avx512_a_rows(w, a_arranged, (size_t)padded, a_rows, yi,
                                        (size_t)w->n, row0, row1);
                else if (path == PATH_AVX512_4BIT)
                    gemv4_avx512(w, a_arranged, yi, row0, row1);
                else if (path == PATH_AVX512_8BIT)
                    gemv8_avx512(w, a_arranged, yi, row0, row1, zps);
                else if (path == PATH_AVX2_4BIT && a_rows > 1)
                    gemv4_avx2_a_rows(w, a_arranged, (size_t)padded, a_rows, yi, (size_t)w->n,
                                      row0, row1, zps);
                else if (path == PATH_AVX2_4BIT)
                    gemv4_avx2(w, a_arranged, yi, row0, row1, zps);
                else if (path == PATH_AVX2_8BIT)
                    gemv8_avx2(w, a_arranged, yi, row0, row1, zps);
                else
#endif
                    gemv_portable(w, a_arranged, yi, row0, row1, scratch, zps);
            }
            if (scratch != zps)
                free(scratch);
            free(zps);
        }
    }
    free(a_arranged);
    return status;
}

/* --- prefill: dequantized panels of weight rows, one BLAS GEMM each -------------------- */

static int gemm_panels(const nbits_weights *w, const float *a, int m, float *y)
{
    int padded = w->n_blocks * w->block_size;
    /* 64-bit: a padded row of more than 2^29 floats is more than 2^31 bytes */
    int64_t row_bytes = (int64_t)padded * (int64_t)sizeof(float);
    int64_t rows = PANEL_BYTES / row_bytes;
    rows = rows < PANEL_MIN_ROWS ? PANEL_MIN_ROWS : rows;
    int threads = kernels_get_num_threads();
    /* no fewer panels than threads where the weights have rows enough (n = 128 was one panel) */
    int64_t share = ((int64_t)w->n + threads - 1) / threads;
    share = (share + PANEL_ROW_STEP - 1) / PANEL_ROW_STEP * PANEL_ROW_STEP;
    rows = rows < share ? rows : share;
    int panels = (int)(((int64_t)w->n + rows - 1) / rows);
    double flops = 2.0 * m * w->n * w->k;
    if (flops < (1 << 20) || panels < 2)
        threads = 1;
    else if (panels < threads)
        threads = panels;
    int status = 0;
    #pragma omp parallel num_threads(threads)
    {
        float *panel = malloc((size_t)rows * padded * sizeof(float));
        float *zps = malloc((size_t)w->n_blocks * sizeof(float));
        if (panel == NULL || zps == NULL) {
            #pragma omp atomic write
            status = -1;
        }
        /* panels taken as threads come free, as in gemv_rows: a thread the OS runs late
         * takes fewer (a panel is a whole GEMM, so taking one from the queue costs little).
         * Every thread meets the omp for, as OpenMP requires of a team, buffers or not. */
        #pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < panels; ++p) {
            if (panel == NULL || zps == NULL)
                continue;
            int row0 = p * rows, count = w->n - row0 < rows ? w->n - row0 : rows;
            for (int r = 0; r < count; ++r)
                dequant_row(w, row0 + r, panel + (size_t)r * padded, zps);
            /* y[:, row0:row0+count] = a (m x k) @ panel^T; panel rows are padded past k */
            gemm_block(0, 1, m, count, w->k, 1.0f, a, w->k, panel, padded, 0.0f,
                       y + row0, w->n);
        }
        free(panel);
        free(zps);
    }
    return status;
}

/* --- prefill on AVX2: dequantized weights packed for a register tile ------------------- */
#if defined(__x86_64__)
/* Weight rows (output columns) are taken PACK_COLS at a time.  Their codes are dequantized in
 * registers, 8 rows by 8 values of k, and transposed there into a panel of k rows of PACK_COLS
 * floats; tiles of TILE_ROWS rows of a then run over it, 12 vector accumulators of outputs (a
 * broadcast, two panel loads, twelve FMAs a step of k).  k is taken in chunks of about K_CHUNK
 * (whole blocks), so that a chunk of panel stays in L1 and a chunk of a in L2 while a group of
 * panels uses it; each output is one sum in k order, whatever the chunks or the thread count.
 * (Dequantizing whole rows into a buffer and transposing them afterwards took about 12% of
 * the time at m = 128, k = 512: 64 KiB of buffers in a 32 KiB L1.)  Chunks of 512 rather
 * than 256 (k = 512 in one chunk, no partial sums carried), the K loop unrolled by 4 and the
 * rows of a spread evenly over the tiles (128 rows: 18 tiles of 6 and 4 of 5, not 21 of 6 and
 * one of 2, which costs about a full tile) gave 2-5% at m = 128 on every decoder shape
 * (K 512 -> N 512, 768, 2816, 32000; K 1408 -> N 512; best of 5 alternating processes, one
 * thread, CPU time, a loaded machine). */
enum { PACK_COLS = 16, TILE_ROWS = 6, K_CHUNK = 512, GROUP_PANELS = 8 };

/* The code bytes at q[r] + at of 8 weight rows r, 4 * dwords of them (dwords 4 or 2), as
 * `dwords` vectors of one dword per row: out[d] lane r = dword d of row r. */
AVX2 static inline __attribute__((always_inline)) void dwords_by_row(
    const uint8_t *const q[8], size_t at, const int dwords, __m256i out[4])
{
    __m256i y[4], t[4];
    for (int r = 0; r < 4; ++r) {
        __m128i low = dwords == 4 ? _mm_loadu_si128((const __m128i *)(q[r] + at))
                                  : _mm_loadl_epi64((const __m128i *)(q[r] + at));
        __m128i high = dwords == 4 ? _mm_loadu_si128((const __m128i *)(q[r + 4] + at))
                                   : _mm_loadl_epi64((const __m128i *)(q[r + 4] + at));
        y[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
    }
    t[0] = _mm256_unpacklo_epi32(y[0], y[1]);
    t[2] = _mm256_unpacklo_epi32(y[2], y[3]);
    out[0] = _mm256_unpacklo_epi64(t[0], t[2]);
    out[1] = _mm256_unpackhi_epi64(t[0], t[2]);
    if (dwords == 4) {
        t[1] = _mm256_unpackhi_epi32(y[0], y[1]);
        t[3] = _mm256_unpackhi_epi32(y[2], y[3]);
        out[2] = _mm256_unpacklo_epi64(t[1], t[3]);
        out[3] = _mm256_unpackhi_epi64(t[1], t[3]);
    }
}

/* Dequantized steps of k for the `dwords` dwords of codes of 8 weight rows (dwords_by_row),
 * stored a half row of the panel (PACK_COLS apart) each: (code - zero point) * scale, as the
 * reference's float32 does. */
AVX2 static inline __attribute__((always_inline)) void dequant_dwords(
    const __m256i d[4], const int dwords, const int bits, __m256 zp, __m256 scale, float *dst)
{
    const int per_dword = 32 / bits;
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int i = 0; i < dwords; ++i)
        for (int s = 0; s < per_dword; ++s) {
            __m256i codes = _mm256_and_si256(_mm256_srli_epi32(d[i], s * bits), mask);
            __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(codes), zp), scale);
            _mm256_storeu_ps(dst + (size_t)(i * per_dword + s) * PACK_COLS, v);
        }
}

/* panel[(kk - blk0 * block_size) * PACK_COLS + j] = w[row0 + j][kk] for kk in blocks
 * [blk0, blk1) and j < PACK_COLS: zeros for j >= count (their codes read from row0, times a
 * zero scale) and for kk >= k (padding codes may meet an inf scale, and a's zeros there).
 * 16 code bytes (or a block's last 8) of 8 weight rows at a time become one dword per row in
 * each of 4 (or 2) vectors (dwords_by_row), so that each shift and mask gives one step of k
 * across the 8 rows (dequant_dwords). */
AVX2 static inline __attribute__((always_inline)) void pack_chunk(
    const nbits_weights *w, int row0, int count, int blk0, int blk1, float *panel,
    const int bits)
{
    size_t row_bytes = (size_t)w->n_blocks * w->blob;
    for (int g = 0; g < PACK_COLS; g += 8) {
        const uint8_t *q[8];
        for (int r = 0; r < 8; ++r)
            q[r] = w->b + (size_t)(g + r < count ? row0 + g + r : row0) * row_bytes;
        for (int blk = blk0; blk < blk1; ++blk) {
            float zps[8], scs[8];
            for (int r = 0; r < 8; ++r) {
                int present = g + r < count, row = row0 + g + r;
                zps[r] = present ? block_zero_point(w, row, blk) : 0.0f;
                scs[r] = present ? w->scales[(size_t)row * w->n_blocks + blk] : 0.0f;
            }
            __m256 zp = _mm256_loadu_ps(zps), scale = _mm256_loadu_ps(scs);
            float *dst = panel + (size_t)(blk - blk0) * w->block_size * PACK_COLS + g;
            __m256i d[4];
            int at = 0;
            for (; at + 16 <= w->blob; at += 16, dst += (size_t)128 / bits * PACK_COLS) {
                dwords_by_row(q, (size_t)blk * w->blob + at, 4, d);
                dequant_dwords(d, 4, bits, zp, scale, dst);
            }
            if (at < w->blob) { /* 8 bytes left: a block of 16 4-bit or 32 2-bit codes */
                dwords_by_row(q, (size_t)blk * w->blob + at, 2, d);
                dequant_dwords(d, 2, bits, zp, scale, dst);
            }
        }
    }
    int end = blk1 * w->block_size;
    if (end > w->k)
        memset(panel + (size_t)(w->k - blk0 * w->block_size) * PACK_COLS, 0,
               (size_t)(end - w->k) * PACK_COLS * sizeof(float));
}

AVX2 static void pack_chunk_avx2(const nbits_weights *w, int row0, int count, int blk0,
                                 int blk1, float *panel)
{
    if (w->bits == 4)
        pack_chunk(w, row0, count, blk0, blk1, panel, 4);
    else if (w->bits == 8)
        pack_chunk(w, row0, count, blk0, blk1, panel, 8);
    else
        pack_chunk(w, row0, count, blk0, blk1, panel, 2);
}

/* to[i * ldt + j] = from[i * PACK_COLS + j] (zero where from is NULL) + sum over kk < len of
 * a[i * lda + kk] * panel[kk * PACK_COLS + j], for i < rows and j < PACK_COLS. */
AVX2 static inline __attribute__((always_inline)) void panel_tile(
    const float *a, size_t lda, const float *panel, int len, const float *from, float *to,
    size_t ldt, const int rows)
{
    __m256 acc[TILE_ROWS][2];
    for (int i = 0; i < rows; ++i) {
        acc[i][0] = from == NULL ? _mm256_setzero_ps() : _mm256_loadu_ps(from + i * PACK_COLS);
        acc[i][1] = from == NULL ? _mm256_setzero_ps()
                                 : _mm256_loadu_ps(from + i * PACK_COLS + 8);
    }
    #pragma GCC unroll 4
    for (int kk = 0; kk < len; ++kk) {
        __m256 b0 = _mm256_loadu_ps(panel + kk * PACK_COLS);
        __m256 b1 = _mm256_loadu_ps(panel + kk * PACK_COLS + 8);
        for (int i = 0; i < rows; ++i) {
            __m256 ai = _mm256_broadcast_ss(a + i * lda + kk);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    for (int i = 0; i < rows; ++i) {
        _mm256_storeu_ps(to + i * ldt, acc[i][0]);
        _mm256_storeu_ps(to + i * ldt + 8, acc[i][1]);
    }
}

/* to (m rows, ldt apart, of PACK_COLS) = from (m rows of PACK_COLS, or zeros where NULL)
 * + a[:, k0 : k0 + len] (rows lda apart) @ the panel chunk. */
AVX2 static void panel_product_avx2(const float *a, size_t lda, int m, int k0, int len,
                                    const float *panel, const float *from, float *to,
                                    size_t ldt)
{
    int tiles = (m + TILE_ROWS - 1) / TILE_ROWS;
    int rows_per_tile = m / tiles, longer = m % tiles;
    for (int t = 0; t < tiles; ++t) {
        int i = t * rows_per_tile + (t < longer ? t : longer);
        const float *ai = a + (size_t)i * lda + k0;
        const float *fi = from == NULL ? NULL : from + (size_t)i * PACK_COLS;
        float *ti = to + (size_t)i * ldt;
        switch (rows_per_tile + (t < longer)) {
        case 1: panel_tile(ai, lda, panel, len, fi, ti, ldt, 1); break;
        case 2: panel_tile(ai, lda, panel, len, fi, ti, ldt, 2); break;
        case 3: panel_tile(ai, lda, panel, len, fi, ti, ldt, 3); break;
        case 4: panel_tile(ai, lda, panel, len, fi, ti, ldt, 4); break;
        case 5: panel_tile(ai, lda, panel, len, fi, ti, ldt, 5); break;
        default: panel_tile(ai, lda, panel, len, fi, ti, ldt, TILE_ROWS); break;
        }
    }
}

/* Weight rows [row0, row0 + cols) (at most GROUP_PANELS panels) against all of a: chunk by
 * chunk of k, each panel's chunk dequantized once and run against every row of a, so that
 * the chunk of a stays in cache for the whole group.  Sums carried between chunks wait in c
 * (m * PACK_COLS floats a panel); the last chunk's go straight to y where the panel is whole.
 * panel: scratch of chunk_blocks * block_size * PACK_COLS floats. */
AVX2 static void group_product_avx2(const nbits_weights *w, const float *a, size_t lda, int m,
                                    int row0, int cols, int chunk_blocks, float *panel,
                                    float *c, float *y)
{
    int panels = (cols + PACK_COLS - 1) / PACK_COLS;
    for (int blk0 = 0; blk0 < w->n_blocks; blk0 += chunk_blocks) {
        int blk1 = w->n_blocks - blk0 < chunk_blocks ? w->n_blocks : blk0 + chunk_blocks;
        int k0 = blk0 * w->block_size, len = (blk1 - blk0) * w->block_size;
        for (int p = 0; p < panels; ++p) {
            int first = row0 + p * PACK_COLS;
            int count = cols - p * PACK_COLS < PACK_COLS ? cols - p * PACK_COLS : PACK_COLS;
            float *cp = c + (size_t)p * m * PACK_COLS;
            pack_chunk_avx2(w, first, count, blk0, blk1, panel);
            const float *from = blk0 == 0 ? NULL : cp;
            if (blk1 == w->n_blocks && count == PACK_COLS) {
                panel_product_avx2(a, lda, m, k0, len, panel, from, y + first, (size_t)w->n);
                continue;
            }
            panel_product_avx2(a, lda, m, k0, len, panel, from, cp, PACK_COLS);
            if (blk1 == w->n_blocks)
                for (int i = 0; i < m; ++i)
                    memcpy(y + (size_t)i * w->n + first, cp + (size_t)i * PACK_COLS,
                           (size_t)count * sizeof(float));
        }
    }
}


/* --- prefill on AVX-512: the same panels, two at a time under a tile of up to 12 rows ------
 * 24 accumulators (12 rows of a by 2 panels of 16 columns), so that per step of k two panel
 * loads and 12 broadcasts of a feed 24 FMAs of 16 lanes, as in csrc/gemm_packed.c. */
enum { TILE_ROWS_512 = 12 };

/* One panel's side of a pair: its chunk of dequantized weights, the partial sums to start
 * from (NULL: zeros; rows PACK_COLS apart) and where its sums go (rows ldt apart). */
typedef struct {
    const float *panel, *from;
    float *to;
    size_t ldt;
} panel_side;

AVX512 static inline __attribute__((always_inline)) void pair_tile_avx512(
    const float *a, size_t lda, const panel_side side[2], int i0, int len, const int rows,
    const int panels)
{
    __m512 acc[TILE_ROWS_512][2];
    for (int h = 0; h < panels; ++h)
        for (int i = 0; i < rows; ++i)
            acc[i][h] = side[h].from == NULL
                            ? _mm512_setzero_ps()
                            : _mm512_loadu_ps(side[h].from + (size_t)(i0 + i) * PACK_COLS);
    const float *p0 = side[0].panel, *p1 = panels > 1 ? side[1].panel : side[0].panel;
    const float *ai = a + (size_t)i0 * lda;
    #pragma GCC unroll 2
    for (int kk = 0; kk < len; ++kk) {
        __m512 b0 = _mm512_loadu_ps(p0 + kk * PACK_COLS);
        __m512 b1 = _mm512_loadu_ps(p1 + kk * PACK_COLS);
        for (int i = 0; i < rows; ++i) {
            __m512 av = _mm512_set1_ps(ai[i * lda + kk]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            if (panels > 1)
                acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    for (int h = 0; h < panels; ++h)
        for (int i = 0; i < rows; ++i)
            _mm512_storeu_ps(side[h].to + (size_t)(i0 + i) * side[h].ldt, acc[i][h]);
}

#define PAIR_TILE_CASES(PANELS)                                                               \
    switch (rows) {                                                                           \
    case 12: pair_tile_avx512(a, lda, side, i0, len, 12, PANELS); break;                      \
    case 11: pair_tile_avx512(a, lda, side, i0, len, 11, PANELS); break;                      \
    case 10: pair_tile_avx512(a, lda, side, i0, len, 10, PANELS); break;                      \
    case 9: pair_tile_avx512(a, lda, side, i0, len, 9, PANELS); break;                        \
    case 8: pair_tile_avx512(a, lda, side, i0, len, 8, PANELS); break;                        \
    case 7: pair_tile_avx512(a, lda, side, i0, len, 7, PANELS); break;                        \
    case 6: pair_tile_avx512(a, lda, side, i0, len, 6, PANELS); break;                        \
    case 5: pair_tile_avx512(a, lda, side, i0, len, 5, PANELS); break;                        \
    case 4: pair_tile_avx512(a, lda, side, i0, len, 4, PANELS); break;                        \
    case 3: pair_tile_avx512(a, lda, side, i0, len, 3, PANELS); break;                        \
    case 2: pair_tile_avx512(a, lda, side, i0, len, 2, PANELS); break;                        \
    default: pair_tile_avx512(a, lda, side, i0, len, 1, PANELS); break;                       \
    }

/* Every row of a (columns k0 .. k0 + len, rows lda apart) against one or two panels, the
 * rows spread evenly over tiles of at most TILE_ROWS_512. */
AVX512 static void pair_product_avx512(const float *a, size_t lda, int m, int k0, int len,
                                       const panel_side side[2], int panels)
{
    int tiles = (m + TILE_ROWS_512 - 1) / TILE_ROWS_512;
    int rows_per_tile = m / tiles, longer = m % tiles;
    a += k0;
    for (int t = 0; t < tiles; ++t) {
        int i0 = t * rows_per_tile + (t < longer ? t : longer);
        int rows = rows_per_tile + (t < longer);
        if (panels == 2) {
            PAIR_TILE_CASES(2)
        } else {
            PAIR_TILE_CASES(1)
        }
    }
}
#undef PAIR_TILE_CASES

/* As group_product_avx2, two panels at a time (panel: scratch for two chunks). */
AVX512 static void group_product_avx512(const nbits_weights *w, const float *a, size_t lda,
                                        int m, int row0, int cols, int chunk_blocks,
                                        float *panel, float *c, float *y)
{
    int panels = (cols + PACK_COLS - 1) / PACK_COLS;
    size_t chunk_floats = (size_t)chunk_blocks * w->block_size * PACK_COLS;
    for (int blk0 = 0; blk0 < w->n_blocks; blk0 += chunk_blocks) {
        int blk1 = w->n_blocks - blk0 < chunk_blocks ? w->n_blocks : blk0 + chunk_blocks;
        int k0 = blk0 * w->block_size, len = (blk1 - blk0) * w->block_size;
        for (int p = 0; p < panels; p += 2) {
            int pair = panels - p >= 2 ? 2 : 1;
            panel_side side[2];
            int first[2], count[2];
            for (int h = 0; h < pair; ++h) {
                first[h] = row0 + (p + h) * PACK_COLS;
                int left = cols - (p + h) * PACK_COLS;
                count[h] = left < PACK_COLS ? left : PACK_COLS;
                float *cp = c + (size_t)(p + h) * m * PACK_COLS, *chunk = panel + h * chunk_floats;
                pack_chunk_avx2(w, first[h], count[h], blk0, blk1, chunk);
                int direct = blk1 == w->n_blocks && count[h] == PACK_COLS;
                side[h] = (panel_side){chunk, blk0 == 0 ? NULL : cp, direct ? y + first[h] : cp,
                                       direct ? (size_t)w->n : PACK_COLS};
            }
            pair_product_avx512(a, lda, m, k0, len, side, pair);
            for (int h = 0; h < pair; ++h)
                if (blk1 == w->n_blocks && count[h] != PACK_COLS)
                    for (int i = 0; i < m; ++i)
                        memcpy(y + (size_t)i * w->n + first[h], side[h].to + (size_t)i * PACK_COLS,
                               (size_t)count[h] * sizeof(float));
        }
    }
}

/* Prefill on the AVX2 dequantizing path (blocks of whole 8-byte groups of codes): a read in
 * place when k is whole blocks, else copied once with zeros past k; threads taking groups of
 * panels as they come free. */
static int gemm_packed_avx2(const nbits_weights *w, const float *a, int m, float *y)
{
    int padded = w->n_blocks * w->block_size;
    float *a_pad = NULL;
    if (padded != w->k) {
        a_pad = malloc((size_t)m * padded * sizeof(float));
        if (a_pad == NULL)
            return -1;
        for (int i = 0; i < m; ++i)
            arrange_a(a + (size_t)i * w->k, w->k, padded, a_pad + (size_t)i * padded);
    }
    const float *a_rows = a_pad != NULL ? a_pad : a;
    int chunk_blocks = K_CHUNK / w->block_size > 0 ? K_CHUNK / w->block_size : 1;
    int panels = (w->n + PACK_COLS - 1) / PACK_COLS;
    int threads = threads_for((size_t)m * w->n * padded / 4);
    threads = threads < panels ? threads : panels;
    /* about 8 groups a thread, so that threads taking them as they come free stay level */
    int group = panels / (8 * threads);
    group = group < 1 ? 1 : group > GROUP_PANELS ? GROUP_PANELS : group;
    int groups = (panels + group - 1) / group;
    int status = 0, wide = have_avx512();
    #pragma omp parallel num_threads(threads)
    {
        float *panel = malloc((size_t)(wide ? 2 : 1) * chunk_blocks * w->block_size * PACK_COLS *
                              sizeof(float));
        float *c = malloc((size_t)m * group * PACK_COLS * sizeof(float));
        if (panel == NULL || c == NULL) {
            #pragma omp atomic write
            status = -1;
        }
        /* every thread meets the omp for, as OpenMP requires of a team, buffers or not */
        #pragma omp for schedule(dynamic, 1)
        for (int g = 0; g < groups; ++g) {
            if (panel == NULL || c == NULL)
                continue;
            int row0 = g * group * PACK_COLS;
            int cols = w->n - row0 < group * PACK_COLS ? w->n - row0 : group * PACK_COLS;
            if (wide)
                group_product_avx512(w, a_rows, (size_t)padded, m, row0, cols, chunk_blocks,
                                     panel, c, y);
            else
                group_product_avx2(w, a_rows, (size_t)padded, m, row0, cols, chunk_blocks,
                                   panel, c, y);
        }
        free(panel);
        free(c);
    }
    free(a_pad);
    return status;
}
#endif

int matmul_nbits_f32(const float *a, const uint8_t *b, const float *scales,
                     const uint8_t *zp_packed, const float *zp_float, const float *bias, float *y,
                     int m, int n, int k, int bits, int block_size, int allow_simd)
{
    nbits_weights w = {b, scales, zp_packed, zp_float, n, k, bits, block_size, 0, 0, 0};
    w.n_blocks = (k + block_size - 1) / block_size;
    w.blob = block_size * bits / 8;
    w.zp_row_bytes = (w.n_blocks * bits + 7) / 8;
    if (m == 0 || n == 0)
        return 0;
    if (k == 0) {
        for (size_t i = 0; i < (size_t)m * n; ++i) y[i] = 0.0f;
    } else {
        int path = gemv_path(&w, allow_simd);
        int gemv_max = path == PATH_AVX2_4BIT || path == PATH_AVX512_4BIT ? 2 * A_ROWS_PER_PASS
                                                                          : GEMV_MAX_ROWS;
        int status;
        if (m <= gemv_max)
            status = gemv_rows(&w, a, m, y, allow_simd);
#if defined(__x86_64__)
        else if (allow_simd && have_avx2() && w.blob % 8 == 0)
            status = gemm_packed_avx2(&w, a, m, y);
#endif
        else
            status = gemm_panels(&w, a, m, y);
        if (status != 0)
            return status;
    }
    if (bias != NULL)
        for (size_t i = 0; i < (size_t)m; ++i)
            for (int j = 0; j < n; ++j) y[i * n + j] += bias[j];
    return 0;
}

/* --- weights of a DequantizeLinear -> MatMul pair, laid out as MatMulNBits's B ----------- */

/* Tiles of PACK_TILE_K source rows by PACK_CHUNK_N weight rows (an even number) stay in cache
 * while they are repacked: at 4 bits, whole 64-byte lines of the source and of each weight row
 * (so rows a multiple of 4 KiB apart, which share cache sets, are each read and written once). */
enum { PACK_TILE_K = 128, PACK_CHUNK_N = 256 };

static inline uint8_t source_code(const uint8_t *src, size_t i, int bits)
{
    return bits == 8 ? src[i] : (uint8_t)((src[i >> 1] >> ((i & 1) * 4)) & 15);
}

/* Any layout, code by code: weight rows [j0, j1). */
static void pack_codes(const uint8_t *src, uint8_t *dst, int k, int n, int bits,
                       size_t row_bytes, int transposed, uint8_t flip, int j0, int j1)
{
    for (int k0 = 0; k0 < k; k0 += PACK_TILE_K) {
        int k1 = k - k0 < PACK_TILE_K ? k : k0 + PACK_TILE_K;
        for (int j = j0; j < j1; ++j) {
            uint8_t *row = dst + (size_t)j * row_bytes;
            for (int i = k0; i < k1; ++i) {
                size_t at = transposed ? (size_t)j * k + i : (size_t)i * n + j;
                uint8_t code = source_code(src, at, bits) ^ flip;
                if (bits == 8)
                    row[i] = code;
                else
                    row[i >> 1] |= (uint8_t)(code << ((i & 1) * 4));
            }
        }
    }
}

/* [n, k] codes whose rows start on whole bytes (8-bit, or k even): each weight row is its
 * source row, signs flipped. */
static void pack_rows(const uint8_t *restrict src, uint8_t *restrict dst, int k, int bits,
                      size_t row_bytes, uint8_t flip, int j0, int j1)
{
    size_t src_row = (size_t)k * bits / 8;
    uint8_t flip_byte = bits == 8 ? flip : (uint8_t)(flip | flip << 4);
    for (int j = j0; j < j1; ++j) {
        const uint8_t *restrict in = src + (size_t)j * src_row;
        uint8_t *restrict out = dst + (size_t)j * row_bytes;
        for (size_t b = 0; b < src_row; ++b)
            out[b] = in[b] ^ flip_byte;
    }
}

void matmul_nbits_pack(const uint8_t *src, uint8_t *dst, int k, int n, int bits, int block_size,
                       int transposed, int flip_sign)
{
    size_t n_blocks = ((size_t)k + block_size - 1) / block_size;
    size_t row_bytes = n_blocks * (size_t)block_size * bits / 8;
    uint8_t flip = flip_sign ? (uint8_t)(1 << (bits - 1)) : 0;
    int pairs = bits == 4 && !transposed && n % 2 == 0;
    int whole_rows = transposed && (bits == 8 || k % 2 == 0);
    int bytes8 = bits == 8 && !transposed;
    size_t code_bytes = ((size_t)k * bits + 7) / 8;  /* of a row; the rest is padding */
    if (pairs || whole_rows || bytes8) {
        for (int j = 0; j < n; ++j)
            memset(dst + (size_t)j * row_bytes + code_bytes, 0, row_bytes - code_bytes);
    } else {
        memset(dst, 0, (size_t)n * row_bytes);  /* pack_codes ORs codes into place */
    }
    if (pairs) { /* a byte transpose, in registers where AVX2 runs (csrc/nbits_pack.c) */
        matmul_nbits_pack4_pairs(src, dst, k, n, row_bytes, flip);
        return;
    }
    if (bytes8) { /* a byte transpose, in registers where AVX2 runs (csrc/nbits_pack.c) */
        matmul_nbits_pack8_rows(src, dst, k, n, row_bytes, flip);
        return;
    }
    /* one thread: it runs once, while a session loads, and two threads on a busy machine took
     * longer than one (a thread waiting at the barrier for a core) */
    for (int j0 = 0; j0 < n; j0 += PACK_CHUNK_N) {
        int j1 = n - j0 < PACK_CHUNK_N ? n : j0 + PACK_CHUNK_N;
        if (whole_rows)
            pack_rows(src, dst, k, bits, row_bytes, flip, j0, j1);
        else
            pack_codes(src, dst, k, n, bits, row_bytes, transposed, flip, j0, j1);
    }
}
