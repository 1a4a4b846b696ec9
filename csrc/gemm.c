/* GEMM through scipy-openblas32's CBLAS, split into independent blocks across OpenMP threads.
 * BLAS itself runs single-threaded inside each block: one thread pool (OpenMP's), and no
 * spin-waiting BLAS threads that stall when the machine is busy. */
#include <omp.h>
#include <cblas.h>

#include "kernels.h"
#include "internal.h"

/* GEMV is bound by memory bandwidth, so a second thread pays off only on much larger work. */
enum { MIN_FLOPS_PER_THREAD = 1 << 18, MIN_GEMV_FLOPS_PER_THREAD = 1 << 21, BLOCK_ALIGN = 16 };

/* One block on the calling thread; M=1 or N=1 go to GEMV. */
void gemm_block(int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta, float *c,
                       int ldc)
{
    if (m == 1) {
        /* c row = alpha * op(b)^T a_row + beta * c row */
        int inc_a = trans_a ? lda : 1;
        if (trans_b)
            scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, b, ldb, a, inc_a, beta, c, 1);
        else
            scipy_cblas_sgemv(CblasRowMajor, CblasTrans, k, n, alpha, b, ldb, a, inc_a, beta, c, 1);
    } else if (n == 1) {
        /* c column = alpha * op(a) b_column + beta * c column */
        int inc_b = trans_b ? 1 : ldb;
        if (trans_a)
            scipy_cblas_sgemv(CblasRowMajor, CblasTrans, k, m, alpha, a, lda, b, inc_b, beta, c, ldc);
        else
            scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, m, k, alpha, a, lda, b, inc_b, beta, c, ldc);
    } else {
        scipy_cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                          trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb,
                          beta, c, ldc);
    }
}

static int gemm_threads(int m, int n, int k)
{
    int per_thread = (m == 1 || n == 1) ? MIN_GEMV_FLOPS_PER_THREAD : MIN_FLOPS_PER_THREAD;
    double useful = (double)m * n * k / per_thread;
    int threads = kernels_get_num_threads();
    if (useful < 2.0)
        return 1;
    return useful < threads ? (int)useful : threads;
}

void gemm_parallel(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                   int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    int threads = gemm_threads(m, n, k);
    if (threads == 1) {
        gemm_block(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    int split_rows = m >= n;
    int64_t extent = split_rows ? m : n; /* 64-bit: extent + count or start + per may pass 2^31 */
    #pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
        int64_t per = ((extent + count - 1) / count + BLOCK_ALIGN - 1) / BLOCK_ALIGN * BLOCK_ALIGN;
        int64_t start = t * per, len = extent - start < per ? extent - start : per;
        if (len > 0 && split_rows) {
            const float *a_rows = trans_a ? a + start : a + (size_t)start * lda;
            gemm_block(trans_a, trans_b, (int)len, n, k, alpha, a_rows, lda, b, ldb, beta,
                       c + (size_t)start * ldc, ldc);
        } else if (len > 0) {
            const float *b_cols = trans_b ? b + (size_t)start * ldb : b + start;
            gemm_block(trans_a, trans_b, m, (int)len, k, alpha, a, lda, b_cols, ldb, beta,
                       c + start, ldc);
        }
    }
}

/* y = beta * c, broadcast through c's strides. */
static void fill_scaled_c(float *y, int m, int n, float beta, const float *c, int64_t rs,
                          int64_t cs)
{
    PARALLEL_FOR(threads_for((size_t)m * n),
        for (int64_t i = 0; i < m; ++i) {
            float *row = y + (size_t)i * n;
            const float *crow = c + i * rs;
            if (cs == 1)
                for (int64_t j = 0; j < n; ++j) row[j] = beta * crow[j];
            else
                for (int64_t j = 0; j < n; ++j) row[j] = beta * crow[j * cs];
        });
}

void gemm_f32(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
              const float *b, float beta, const float *c, int64_t c_row_stride,
              int64_t c_col_stride, float *y, int act, float act_alpha, float act_beta)
{
    if (m == 0 || n == 0)
        return;
    if (c != NULL)
        fill_scaled_c(y, m, n, beta, c, c_row_stride, c_col_stride);
    if (k > 0) {
        gemm_parallel(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n,
                      c != NULL ? 1.0f : 0.0f, y, n);
    } else if (c == NULL) {
        for (size_t i = 0; i < (size_t)m * n; ++i) y[i] = 0.0f;
    }
    if (act != ACT_NONE)
        activation_f32(y, y, (size_t)m * n, act, act_alpha, act_beta);
}

void gemm_batched_f32(int trans_a, int trans_b, int batch, int m, int n, int k, float alpha,
                      const float *a, int64_t a_batch_stride, const float *b,
                      int64_t b_batch_stride, float *y)
{
    if (batch == 0 || m == 0 || n == 0)
        return;
    size_t y_stride = (size_t)m * n;
    if (k == 0) {
        for (size_t i = 0; i < (size_t)batch * y_stride; ++i) y[i] = 0.0f;
        return;
    }
    int lda = trans_a ? m : k, ldb = trans_b ? k : n;
    /* Many small products (attention heads): one whole product per thread.  Few large ones:
     * each product split across the threads. */
    int per_product = gemm_threads(m, n, k), threads = kernels_get_num_threads();
    if (per_product < threads && batch > 1) {
        double useful = (double)batch * m * n * k / MIN_FLOPS_PER_THREAD;
        int outer = useful < 1.0 ? 1 : useful < threads ? (int)useful : threads;
        PARALLEL_FOR(outer,
            for (int64_t i = 0; i < batch; ++i)
                gemm_block(trans_a, trans_b, m, n, k, alpha, a + i * a_batch_stride, lda,
                           b + i * b_batch_stride, ldb, 0.0f, y + i * y_stride, n););
        return;
    }
    for (int64_t i = 0; i < batch; ++i)
        gemm_parallel(trans_a, trans_b, m, n, k, alpha, a + i * a_batch_stride, lda,
                      b + i * b_batch_stride, ldb, 0.0f, y + i * y_stride, n);
}
