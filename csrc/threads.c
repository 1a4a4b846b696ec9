#define _DEFAULT_SOURCE /* getloadavg */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <omp.h>
#include <cblas.h>

#include "kernels.h"
#include "internal.h"

enum { MIN_WORK_PER_THREAD = 16384 };

/* How often the kernels look at the machine's load, and the load (runnable tasks, the kernel's
 * 1-minute average) per online CPU from which the machine counts as oversubscribed. */
#define LOAD_CHECK_NS 250000000LL
#define BUSY_LOAD_PER_CPU 2.0

static int num_threads = 1;

void kernels_set_num_threads(int n)
{
    num_threads = n < 1 ? 1 : n;
    /* The loops name num_threads explicitly; this also covers any omp default.  BLAS stays
     * single-threaded: gemm_parallel splits its work across these same OpenMP threads. */
    omp_set_num_threads(num_threads);
    scipy_openblas_set_num_threads(1);
}

int kernels_configured_threads(void)
{
    return num_threads;
}

static long long monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Whether more tasks want to run than the machine has CPUs for, by a wide margin.  An OpenMP
 * region ends at a barrier that waits for every thread of its team; on such a machine a team
 * thread waits milliseconds for a core (measured: mobilenet_v3_small at 2 threads, 61 ms a run
 * against 6.8 ms with this check, load average 6 on 2 CPUs), so the kernels then run on the
 * calling thread alone.  ONNX_PARITY_BUSY_MACHINE=ignore keeps every thread whatever the load;
 * a number sets the load per CPU instead of BUSY_LOAD_PER_CPU.  Races between threads here
 * are benign: each word is read and written whole. */
static double busy_load_per_cpu(void)
{
    const char *setting = getenv("ONNX_PARITY_BUSY_MACHINE");
    if (setting == NULL || setting[0] == '\0')
        return BUSY_LOAD_PER_CPU;
    if (setting[0] == 'i')
        return -1.0;
    char *end;
    double value = strtod(setting, &end);
    return end != setting && value >= 0.0 ? value : BUSY_LOAD_PER_CPU;
}

static int machine_is_busy(void)
{
    static double per_cpu = -2.0; /* -2: not read yet; -1: ignore the load */
    static int busy = 0;
    static long long next_check = 0;
    if (per_cpu == -2.0)
        per_cpu = busy_load_per_cpu();
    if (per_cpu < 0.0)
        return 0;
    long long now = monotonic_ns();
    if (now >= __atomic_load_n(&next_check, __ATOMIC_RELAXED)) {
        double load;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int verdict = getloadavg(&load, 1) == 1 && cpus > 0 && load >= per_cpu * cpus;
        __atomic_store_n(&busy, verdict, __ATOMIC_RELAXED);
        __atomic_store_n(&next_check, now + LOAD_CHECK_NS, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&busy, __ATOMIC_RELAXED);
}

static long long busy_fallbacks;

int kernels_get_num_threads(void)
{
    if (num_threads > 1 && machine_is_busy()) {
        __atomic_fetch_add(&busy_fallbacks, 1, __ATOMIC_RELAXED);
        return 1;
    }
    return num_threads;
}

long long kernels_busy_fallbacks(void)
{
    return __atomic_load_n(&busy_fallbacks, __ATOMIC_RELAXED);
}

static int cpu_isa(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
        return ISA_PORTABLE;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    return ISA_AVX2;
#else
    return ISA_PORTABLE;
#endif
}

static int isa_from_environment(void)
{
    const char *setting = getenv("ONNX_PARITY_MAX_ISA");
    if (setting == NULL || setting[0] == '\0' || strcmp(setting, "avx512") == 0)
        return ISA_AVX512;
    if (strcmp(setting, "avx2") == 0)
        return ISA_AVX2;
    return ISA_PORTABLE; /* "portable", or a value it does not know: the safe choice */
}

static int isa = -1;

int kernels_isa(void)
{
    int level = __atomic_load_n(&isa, __ATOMIC_RELAXED);
    if (level < 0) {
        int cpu = cpu_isa(), allowed = isa_from_environment();
        level = cpu < allowed ? cpu : allowed;
        __atomic_store_n(&isa, level, __ATOMIC_RELAXED);
    }
    return level;
}

int kernels_limit_isa(int level)
{
    int cpu = cpu_isa();
    __atomic_store_n(&isa, level < cpu ? (level < 0 ? 0 : level) : cpu, __ATOMIC_RELAXED);
    return kernels_isa();
}

int threads_for(size_t work)
{
    size_t useful = work / MIN_WORK_PER_THREAD;
    if (useful < 1)
        return 1;
    int threads = kernels_get_num_threads();
    return useful < (size_t)threads ? (int)useful : threads;
}
