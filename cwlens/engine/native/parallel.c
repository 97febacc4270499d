/* cwlens_parallel_rows and cwlens_parallel_indexed (parallel.h): the thread split every
   kernel of this folder uses.

   Built with -fopenmp (cwlens/engine/native/__init__.py tries it first), the parts run on
   OpenMP's threads: where torch's libgomp is loaded (it is named libgomp.so.1, as the
   system's), they are torch's own threads. With threads of our own, each kernel would
   share its cores with torch's OpenMP workers, which spin for a while after every torch
   operation: a 2-core machine then ran the kernels no faster on 2 threads than on 1. */
#include <pthread.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "parallel.h"

enum { MAX_THREADS = 64 };

typedef struct {
    cwlens_part_fn fn;
    const void *work;
    int part;
    int64_t row0, row1;
    int code;
} Part;

static void *run_part(void *arg) {
    Part *p = (Part *)arg;
    p->code = p->fn(p->work, p->part, p->row0, p->row1);
    return 0;
}

int cwlens_parallel_parts(int64_t n_rows, int n_threads) {
    if (n_rows < 1) return 0;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)n_rows;
    return n_threads;
}

int cwlens_parallel_indexed(cwlens_part_fn fn, const void *work, int64_t n_rows, int n_threads) {
    n_threads = cwlens_parallel_parts(n_rows, n_threads);
    if (n_threads < 1)
        return 0;
#ifdef _OPENMP
    if (n_threads > 1) {
        int codes[MAX_THREADS] = {0}, ran[MAX_THREADS] = {0};
        #pragma omp parallel num_threads(n_threads)
        {
            int t = omp_get_thread_num(), n = omp_get_num_threads();
            for (int p = t; p < n_threads; p += n) {  /* fewer threads than asked: each takes more parts */
                codes[p] = fn(work, p, n_rows * p / n_threads, n_rows * (p + 1) / n_threads);
                ran[p] = 1;
            }
        }
        int code = 0;
        for (int p = 0; p < n_threads; p++) {
            if (!ran[p]) codes[p] = fn(work, p, n_rows * p / n_threads, n_rows * (p + 1) / n_threads);
            if (codes[p] > code) code = codes[p];
        }
        return code;
    }
#endif
    Part parts[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < n_threads; t++) {
        Part p = {fn, work, t, n_rows * t / n_threads, n_rows * (t + 1) / n_threads, 0};
        parts[t] = p;
        started[t] = t > 0 && pthread_create(&threads[t], 0, run_part, &parts[t]) == 0;
    }
    run_part(&parts[0]);
    int code = parts[0].code;
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(threads[t], 0);
        else run_part(&parts[t]);  /* no thread: run its rows here */
        if (parts[t].code > code) code = parts[t].code;
    }
    return code;
}

typedef struct {
    cwlens_rows_fn fn;
    const void *work;
} Plain;

static int plain_part(const void *arg, int part, int64_t row0, int64_t row1) {
    (void)part;
    const Plain *p = (const Plain *)arg;
    return p->fn(p->work, row0, row1);
}

int cwlens_parallel_rows(cwlens_rows_fn fn, const void *work, int64_t n_rows, int n_threads) {
    Plain plain = {fn, work};
    return cwlens_parallel_indexed(plain_part, &plain, n_rows, n_threads);
}
