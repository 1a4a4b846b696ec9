#include <omp.h>
#include <cblas.h>

#include "kernels.h"
#include "internal.h"

enum { MIN_WORK_PER_THREAD = 16384 };

static int num_threads = 1;

void kernels_set_num_threads(int n)
{
    num_threads = n < 1 ? 1 : n;
    /* The loops name num_threads explicitly; this also covers any omp default.  BLAS stays
     * single-threaded: gemm_parallel splits its work across these same OpenMP threads. */
    omp_set_num_threads(num_threads);
    scipy_openblas_set_num_threads(1);
}

int kernels_get_num_threads(void)
{
    return num_threads;
}

int threads_for(size_t work)
{
    size_t useful = work / MIN_WORK_PER_THREAD;
    if (useful < 1)
        return 1;
    return useful < (size_t)num_threads ? (int)useful : num_threads;
}
