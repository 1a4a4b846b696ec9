/* 4-bit [k, n] codes (a DequantizeLinear weight, two codes a byte along n, the first in the low
 * nibble) repacked as MatMulNBits's rows: weight row j holds codes (i, j) for i along k, two a
 * byte.  The bytes of source rows i and i + 1 at byte column p make byte i / 2 of weight rows
 * 2p (their low nibbles) and 2p + 1 (their high nibbles), so the repacking is a byte transpose
 * of those pairs.  With AVX2, tiles of 32 source rows by 32 byte columns are transposed in
 * registers (two 16 x 16 byte transposes, one in each 128-bit lane), through small buffers
 * that read and write whole cache lines, in chunks of rows that stay in cache; with AVX-512
 * the tiles are 64 byte columns wide (four transposes a register) and each weight row's line
 * is assembled in registers; the edges go byte by byte.  8-bit [k, n] codes are a plain byte transpose: tiles of 16 source rows by 32 columns,
 * one 16 x 16 transpose in each lane.  The rows' padding past the codes is the caller's. */
#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "kernels.h"

/* Source rows [i0, i1) (i0 even) by byte columns [p0, p1), one byte at a time. */
static void pack4_pairs_bytes(const uint8_t *restrict src, uint8_t *restrict dst, int k,
                              size_t src_row, size_t row_bytes, uint8_t flip, int i0, int i1,
                              size_t p0, size_t p1)
{
    uint8_t flip2 = (uint8_t)(flip | flip << 4);
    for (size_t p = p0; p < p1; ++p) {
        uint8_t *even = dst + 2 * p * row_bytes, *odd = even + row_bytes;
        int i = i0;
        for (; i + 1 < i1; i += 2) {
            uint8_t a = src[(size_t)i * src_row + p], b = src[(size_t)(i + 1) * src_row + p];
            even[i / 2] = (uint8_t)(((a & 15) | (b << 4)) ^ flip2);
            odd[i / 2] = (uint8_t)(((a >> 4) | (b & 0xF0)) ^ flip2);
        }
        if (i < i1 && i < k) { /* k odd: the last code alone in its byte */
            uint8_t a = src[(size_t)i * src_row + p];
            even[i / 2] = (uint8_t)((a & 15) ^ flip);
            odd[i / 2] = (uint8_t)((a >> 4) ^ flip);
        }
    }
}

#if defined(__x86_64__)
/* Each 128-bit lane of r[0..15] transposed as a 16 x 16 byte matrix (row t in r[t]); column c
 * ends in r[bit-reversed c] (four interleaving stages, each halving the row index and doubling
 * the width). */
AVX2 static inline __attribute__((always_inline)) void transpose16_lanes(__m256i r[16])
{
    __m256i t[16];
    for (int m = 0; m < 8; ++m) {
        t[m] = _mm256_unpacklo_epi8(r[2 * m], r[2 * m + 1]);
        t[m + 8] = _mm256_unpackhi_epi8(r[2 * m], r[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        r[m] = _mm256_unpacklo_epi16(t[2 * m], t[2 * m + 1]);
        r[m + 8] = _mm256_unpackhi_epi16(t[2 * m], t[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        t[m] = _mm256_unpacklo_epi32(r[2 * m], r[2 * m + 1]);
        t[m + 8] = _mm256_unpackhi_epi32(r[2 * m], r[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        r[m] = _mm256_unpacklo_epi64(t[2 * m], t[2 * m + 1]);
        r[m + 8] = _mm256_unpackhi_epi64(t[2 * m], t[2 * m + 1]);
    }
}

/* An 8 x 8 block of floats, rows `from` floats apart, written transposed, rows `to` apart. */
AVX2 static inline __attribute__((always_inline)) void transpose8_f32(
    const float *restrict s, size_t from, float *restrict d, size_t to)
{
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(s + i * from);
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; ++i)
        _mm256_storeu_ps(d + i * to, t[i]);
}

/* Rows [0, rows8) by columns [0, cols8) (multiples of 8), 64 columns at a time. */
AVX2 static void transpose_f32_avx2(const float *restrict src, float *restrict dst, size_t rows,
                                    size_t cols, size_t rows8, size_t cols8)
{
    for (size_t c0 = 0; c0 < cols8; c0 += 64) {
        size_t c1 = cols8 - c0 < 64 ? cols8 : c0 + 64;
        for (size_t r0 = 0; r0 < rows8; r0 += 8)
            for (size_t c = c0; c < c1; c += 8)
                transpose8_f32(src + r0 * cols + c, cols, dst + c * rows + r0, rows);
    }
}

static const int BIT_REVERSED[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* 16 rows of the transposed tile, lane 0 to weight rows first + 2c, lane 1 to weight rows
 * first + 32 + 2c, 16 bytes each at byte `at`. */
AVX2 static inline __attribute__((always_inline)) void store_columns(
    const __m256i r[16], uint8_t *restrict first, size_t row_bytes)
{
    for (int c = 0; c < 16; ++c) {
        __m256i v = r[BIT_REVERSED[c]];
        _mm_storeu_si128((__m128i *)(first + 2 * (size_t)c * row_bytes), _mm256_castsi256_si128(v));
        _mm_storeu_si128((__m128i *)(first + (32 + 2 * (size_t)c) * row_bytes),
                         _mm256_extracti128_si256(v, 1));
    }
}

/* Source rows [0, k32) (a multiple of 32) by byte columns [0, p32) (a multiple of 32). */
AVX2 static void pack4_pairs_avx2(const uint8_t *restrict src, uint8_t *restrict dst,
                                  size_t src_row, size_t row_bytes, uint8_t flip, int k32,
                                  size_t p32)
{
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8((char)0xF0);
    const __m256i flip2 = _mm256_set1_epi8((char)(flip | flip << 4));
    for (size_t p0 = 0; p0 < p32; p0 += 32) {
        uint8_t *rows = dst + 2 * p0 * row_bytes;
        for (int i0 = 0; i0 < k32; i0 += 32) {
            __m256i even[16], odd[16];
            const uint8_t *in = src + (size_t)i0 * src_row + p0;
            for (int t = 0; t < 16; ++t) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(in + 2 * (size_t)t * src_row));
                __m256i b = _mm256_loadu_si256((const __m256i *)(in + (2 * (size_t)t + 1) * src_row));
                even[t] = _mm256_xor_si256(
                    _mm256_or_si256(_mm256_and_si256(a, low),
                                    _mm256_and_si256(_mm256_slli_epi16(b, 4), high)), flip2);
                odd[t] = _mm256_xor_si256(
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low),
                                    _mm256_and_si256(b, high)), flip2);
            }
            transpose16_lanes(even);
            store_columns(even, rows + i0 / 2, row_bytes);
            transpose16_lanes(odd);
            store_columns(odd, rows + row_bytes + i0 / 2, row_bytes);
        }
    }
}

/* Source rows [0, k32) (a multiple of 32) by byte columns [0, p64) (a multiple of 64), in
 * chunks of CHUNK_ROWS source rows (all byte columns of one chunk, then the next: its rows stay
 * in cache from one strip of 64 byte columns to the next), each strip in blocks of up to 128
 * source rows: a block's 32-row tiles are first copied whole into `tile` (a source row's 64
 * bytes are one cache line, read once; rows src_row apart share few L1 sets), transposed from
 * there into `out` (128 weight rows by 64 bytes), which then goes to the weight rows as whole
 * lines.  On a 4096 x 4096 weight, 3.6 -> 2.6 ms against pack4_pairs_avx2 alone (cold caches). */
enum { CHUNK_ROWS = 512 };
AVX2 static void pack4_blocks_avx2(const uint8_t *restrict src, uint8_t *restrict dst,
                                   size_t src_row, size_t row_bytes, uint8_t flip, int k32,
                                   size_t p64)
{
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8((char)0xF0);
    const __m256i flip2 = _mm256_set1_epi8((char)(flip | flip << 4));
    _Alignas(64) uint8_t tile[32][64];
    _Alignas(64) uint8_t out[128][64];
    for (int c0 = 0; c0 < k32; c0 += CHUNK_ROWS) {
      int c1 = k32 - c0 < CHUNK_ROWS ? k32 : c0 + CHUNK_ROWS;
      for (size_t p0 = 0; p0 < p64; p0 += 64) {
        uint8_t *rows = dst + 2 * p0 * row_bytes;
        for (int g0 = c0; g0 < c1; g0 += 128) {
            int g1 = c1 - g0 < 128 ? c1 : g0 + 128;
            for (int i0 = g0; i0 < g1; i0 += 32) {
                const uint8_t *in = src + (size_t)i0 * src_row + p0;
                for (int t = 0; t < 32; ++t) {
                    __m256i lo = _mm256_loadu_si256((const __m256i *)(in + (size_t)t * src_row));
                    __m256i hi = _mm256_loadu_si256((const __m256i *)(in + (size_t)t * src_row + 32));
                    _mm256_store_si256((__m256i *)tile[t], lo);
                    _mm256_store_si256((__m256i *)(tile[t] + 32), hi);
                }
                for (int h = 0; h < 2; ++h) {
                    uint8_t *first = out[64 * h] + (i0 - g0) / 2;
                    __m256i r[16];
                    for (int t = 0; t < 16; ++t) {
                        __m256i a = _mm256_load_si256((const __m256i *)(tile[2 * t] + 32 * h));
                        __m256i b = _mm256_load_si256((const __m256i *)(tile[2 * t + 1] + 32 * h));
                        r[t] = _mm256_xor_si256(
                            _mm256_or_si256(_mm256_and_si256(a, low),
                                            _mm256_and_si256(_mm256_slli_epi16(b, 4), high)), flip2);
                    }
                    transpose16_lanes(r);
                    store_columns(r, first, 64);
                    for (int t = 0; t < 16; ++t) {
                        __m256i a = _mm256_load_si256((const __m256i *)(tile[2 * t] + 32 * h));
                        __m256i b = _mm256_load_si256((const __m256i *)(tile[2 * t + 1] + 32 * h));
                        r[t] = _mm256_xor_si256(
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low),
                                            _mm256_and_si256(b, high)), flip2);
                    }
                    transpose16_lanes(r);
                    store_columns(r, first + 64, 64);
                }
            }
            size_t bytes = (size_t)(g1 - g0) / 2;  /* of each weight row: 16, 32, 48 or 64 */
            for (int j = 0; j < 128; ++j) {
                uint8_t *to = rows + (size_t)j * row_bytes + g0 / 2;
                for (size_t b = 0; b < bytes; b += 16)
                    _mm_storeu_si128((__m128i *)(to + b), _mm_load_si128((const __m128i *)(out[j] + b)));
            }
        }
      }
    }
}

/* Each 128-bit lane of r[0..15] transposed as a 16 x 16 byte matrix, as transpose16_lanes. */
AVX512 static inline __attribute__((always_inline)) void transpose16_lanes512(__m512i r[16])
{
    __m512i t[16];
    for (int m = 0; m < 8; ++m) {
        t[m] = _mm512_unpacklo_epi8(r[2 * m], r[2 * m + 1]);
        t[m + 8] = _mm512_unpackhi_epi8(r[2 * m], r[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        r[m] = _mm512_unpacklo_epi16(t[2 * m], t[2 * m + 1]);
        r[m + 8] = _mm512_unpackhi_epi16(t[2 * m], t[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        t[m] = _mm512_unpacklo_epi32(r[2 * m], r[2 * m + 1]);
        t[m + 8] = _mm512_unpackhi_epi32(r[2 * m], r[2 * m + 1]);
    }
    for (int m = 0; m < 8; ++m) {
        r[m] = _mm512_unpacklo_epi64(t[2 * m], t[2 * m + 1]);
        r[m + 8] = _mm512_unpackhi_epi64(t[2 * m], t[2 * m + 1]);
    }
}

/* Lane q of the result is lane `lane` of x[q]: a 4 x 4 transpose of 128-bit lanes. */
AVX512 static inline __attribute__((always_inline)) void transpose4_lanes512(const __m512i x[4],
                                                                            __m512i y[4])
{
    __m512i t0 = _mm512_shuffle_i64x2(x[0], x[1], 0x44), t1 = _mm512_shuffle_i64x2(x[0], x[1], 0xEE);
    __m512i t2 = _mm512_shuffle_i64x2(x[2], x[3], 0x44), t3 = _mm512_shuffle_i64x2(x[2], x[3], 0xEE);
    y[0] = _mm512_shuffle_i64x2(t0, t2, 0x88);
    y[1] = _mm512_shuffle_i64x2(t0, t2, 0xDD);
    y[2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
    y[3] = _mm512_shuffle_i64x2(t1, t3, 0xDD);
}

/* Source rows [0, k32) (a multiple of 32) by byte columns [0, p64) (a multiple of 64), as
 * pack4_blocks_avx2 walks them, a 32-row tile at a time in 512-bit registers: each source row's
 * 64 bytes are one load, the even and odd weight rows' nibble pairs are made in registers
 * (odd ones wait in `odd`), and each 16 x 16 transpose per lane leaves 16 bytes of 64 weight
 * rows.  The 4 tiles of a block of 128 source rows are kept whole in `stage` (tile q's
 * register for column c at stage[e][c][q]), then a 4 x 4 transpose of their lanes gives each
 * weight row its 64 bytes of the block in one register, stored as one line: streamed past the
 * caches where the lines are whole and aligned (the weight is written once, read at the first
 * run, and a streamed line is not read from memory first), else under a byte mask.  On a
 * 4096 x 4096 weight with cold caches: 1.5 ms against pack4_blocks_avx2's 3.0 (standalone C
 * timing, 9 runs, best; 1.6-1.9 against 2.1-2.5 ms inside the pass). */
AVX512 static void pack4_blocks_avx512(const uint8_t *restrict src, uint8_t *restrict dst,
                                       size_t src_row, size_t row_bytes, uint8_t flip, int k32,
                                       size_t p64)
{
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i flip2 = _mm512_set1_epi8((char)(flip | flip << 4));
    _Alignas(64) __m512i odd[16];
    _Alignas(64) __m512i stage[2][16][4];
    int stream = (uintptr_t)dst % 64 == 0 && row_bytes % 64 == 0;
    for (int c0 = 0; c0 < k32; c0 += CHUNK_ROWS) {
      int c1 = k32 - c0 < CHUNK_ROWS ? k32 : c0 + CHUNK_ROWS;
      for (size_t p0 = 0; p0 < p64; p0 += 64) {
        uint8_t *rows = dst + 2 * p0 * row_bytes;
        for (int g0 = c0; g0 < c1; g0 += 128) {
            int g1 = c1 - g0 < 128 ? c1 : g0 + 128;
            for (int i0 = g0; i0 < g1; i0 += 32) {
                const uint8_t *in = src + (size_t)i0 * src_row + p0;
                int q = (i0 - g0) / 32;
                __m512i r[16];
                for (int t = 0; t < 16; ++t) {
                    __m512i a = _mm512_xor_si512(
                        _mm512_loadu_si512(in + 2 * (size_t)t * src_row), flip2);
                    __m512i b = _mm512_xor_si512(
                        _mm512_loadu_si512(in + (2 * (size_t)t + 1) * src_row), flip2);
                    /* (x & low) | (y & ~low): low nibbles from x, high ones from y */
                    r[t] = _mm512_ternarylogic_epi32(a, _mm512_slli_epi16(b, 4), low, 0xE4);
                    odd[t] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), b, low, 0xE4);
                }
                transpose16_lanes512(r);
                for (int c = 0; c < 16; ++c)
                    stage[0][c][q] = r[BIT_REVERSED[c]];
                for (int t = 0; t < 16; ++t)
                    r[t] = odd[t];
                transpose16_lanes512(r);
                for (int c = 0; c < 16; ++c)
                    stage[1][c][q] = r[BIT_REVERSED[c]];
            }
            /* weight row 2 (16 l + c) + e gets lane l of each tile's stage[e][c] */
            __mmask64 bytes = (uint64_t)-1 >> (64 - (g1 - g0) / 2);
            int whole = g1 - g0 == 128 && stream;
            for (int e = 0; e < 2; ++e)
                for (int c = 0; c < 16; ++c) {
                    __m512i y[4];
                    transpose4_lanes512(stage[e][c], y);
                    for (int l = 0; l < 4; ++l) {
                        uint8_t *to = rows + (2 * (size_t)(16 * l + c) + e) * row_bytes + g0 / 2;
                        if (whole)
                            _mm512_stream_si512((void *)to, y[l]);
                        else
                            _mm512_mask_storeu_epi8(to, bytes, y[l]);
                    }
                }
        }
      }
    }
    _mm_sfence();
}

/* 8-bit codes: source rows [0, k16) (a multiple of 16) by columns [0, n32) (a multiple of
 * 32), tiles of 16 rows by 32 columns (a 16 x 16 byte transpose in each lane). */
AVX2 static void pack8_rows_avx2(const uint8_t *restrict src, uint8_t *restrict dst, size_t n,
                                 size_t row_bytes, uint8_t flip, int k16, size_t n32)
{
    const __m256i flips = _mm256_set1_epi8((char)flip);
    for (size_t j0 = 0; j0 < n32; j0 += 32) {
        for (int i0 = 0; i0 < k16; i0 += 16) {
            __m256i r[16];
            for (int t = 0; t < 16; ++t)
                r[t] = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)(src + (size_t)(i0 + t) * n + j0)), flips);
            transpose16_lanes(r);
            uint8_t *first = dst + j0 * row_bytes + i0;
            for (int c = 0; c < 16; ++c) {
                __m256i v = r[BIT_REVERSED[c]];
                _mm_storeu_si128((__m128i *)(first + (size_t)c * row_bytes), _mm256_castsi256_si128(v));
                _mm_storeu_si128((__m128i *)(first + (16 + (size_t)c) * row_bytes),
                                 _mm256_extracti128_si256(v, 1));
            }
        }
    }
}
#endif

void matmul_nbits_pack4_pairs(const uint8_t *src, uint8_t *dst, int k, int n, size_t row_bytes,
                              uint8_t flip)
{
    size_t src_row = (size_t)n / 2;
    int k32 = 0;
    size_t p32 = 0;
#if defined(__x86_64__)
    if (have_avx2()) {
        k32 = k / 32 * 32;
        size_t p64 = src_row / 64 * 64;
        p32 = src_row / 32 * 32;
        if (k32 && p32) {
            if (p64 && have_avx512())
                pack4_blocks_avx512(src, dst, src_row, row_bytes, flip, k32, p64);
            else if (p64)
                pack4_blocks_avx2(src, dst, src_row, row_bytes, flip, k32, p64);
            if (p32 > p64)  /* one strip of 32 byte columns left */
                pack4_pairs_avx2(src + p64, dst + 2 * p64 * row_bytes, src_row, row_bytes, flip,
                                 k32, 32);
        } else {
            k32 = 0, p32 = 0;
        }
    }
#endif
    pack4_pairs_bytes(src, dst, k, src_row, row_bytes, flip, k32, k, 0, p32);
    pack4_pairs_bytes(src, dst, k, src_row, row_bytes, flip, 0, k, p32, src_row);
}

void matmul_nbits_scales(const float *src, float *dst, int blocks, int n)
{
    size_t rows = (size_t)blocks, cols = (size_t)n, rows8 = 0, cols8 = 0;
#if defined(__x86_64__)
    if (have_avx2()) {
        rows8 = rows / 8 * 8;
        cols8 = cols / 8 * 8;
        transpose_f32_avx2(src, dst, rows, cols, rows8, cols8);
    }
#endif
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = r < rows8 ? cols8 : 0; c < cols; ++c)
            dst[c * rows + r] = src[r * cols + c];
}

void matmul_nbits_pack8_rows(const uint8_t *src, uint8_t *dst, int k, int n, size_t row_bytes,
                             uint8_t flip)
{
    int k16 = 0;
    size_t n32 = 0;
#if defined(__x86_64__)
    if (have_avx2()) {
        k16 = k / 16 * 16;
        n32 = (size_t)n / 32 * 32;
        if (k16 && n32)
            pack8_rows_avx2(src, dst, (size_t)n, row_bytes, flip, k16, n32);
        else
            k16 = 0, n32 = 0;
    }
#endif
    for (size_t i = 0; i < (size_t)k; ++i)
        for (size_t j = (int)i < k16 ? n32 : 0; j < (size_t)n; ++j)
            dst[j * row_bytes + i] = (uint8_t)(src[i * (size_t)n + j] ^ flip);
}
