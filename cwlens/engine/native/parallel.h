/* Rows of a kernel split over POSIX threads (no OpenMP runtime beside torch's): shared by
   the kernels of this folder (parallel.c). */
#ifndef CWLENS_PARALLEL_H
#define CWLENS_PARALLEL_H
#include <stdint.h>

/* rows [row0, row1) of `work`; returns 0, or a positive code (the caller's meaning) */
typedef int (*cwlens_rows_fn)(const void *work, int64_t row0, int64_t row1);
/* the same, told which part (0 .. parts - 1) it runs */
typedef int (*cwlens_part_fn)(const void *work, int part, int64_t row0, int64_t row1);

/* fn over rows [0, n_rows) in n_threads contiguous parts (the calling thread takes the
   first; a part whose thread cannot start runs here); returns the largest code */
int cwlens_parallel_rows(cwlens_rows_fn fn, const void *work, int64_t n_rows, int n_threads);
/* the same with the part's index; part p has the rows of cwlens_parallel_rows' part p */
int cwlens_parallel_indexed(cwlens_part_fn fn, const void *work, int64_t n_rows, int n_threads);
/* how many parts cwlens_parallel_indexed makes of n_rows rows */
int cwlens_parallel_parts(int64_t n_rows, int n_threads);
#endif
