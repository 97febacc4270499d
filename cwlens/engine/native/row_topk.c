/* Top-k of each row of a float32 block, for cwlens.engine.row_topk (loaded by
   cwlens/engine/native/__init__.py, which compiles this file on first use).

   Row r holds `width` floats at x + r * stride; only its keys lo <= j < hi are ranked,
   lo = lo_of[r % n_ranges], hi = hi_of[r % n_ranges] (every key where lo_of is NULL): a
   causal block's rows stop at their query, a sliding window's start after it. The value
   ranked is x[j], times scale[j] of the row's scale row where scale is given (row
   r / rows_per_scale: the value-weighted baseline a_ij ||v~_j|| without its tensor), |.|
   where by_abs. Out: the k best keys (int32) and their ranked values per row, largest
   first, equal values in key order; a row with fewer than k keys ends in key -1 (its value
   NaN: the caller's, set before the call).

   Each row: topk_row (topk_list.h). Rows are split over n_threads threads (parallel.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "parallel.h"
#include "topk_list.h"

typedef struct {
    const float *x, *scale;
    const int64_t *lo_of, *hi_of;
    int64_t stride, rows_per_scale, scale_stride, n_ranges, width;
    int k, by_abs;
    int32_t *out_idx;
    float *out_val;
} Job;

static int run_rows(const void *arg, int64_t row0, int64_t row1) {
    const Job *a = (const Job *)arg;
    float *cmax = malloc(sizeof(float) * (size_t)((a->width + CHUNK - 1) / CHUNK + 1));
    float *tv = malloc(sizeof(float) * (size_t)a->k);
    int32_t *ti = malloc(sizeof(int32_t) * (size_t)a->k);
    if (!cmax || !tv || !ti) {
        free(cmax); free(tv); free(ti);
        return 1;
    }
    for (int64_t r = row0; r < row1; r++) {
        const float *srow = a->scale ? a->scale + (r / a->rows_per_scale) * a->scale_stride : 0;
        int64_t lo = a->lo_of ? a->lo_of[r % a->n_ranges] : 0;
        int64_t hi = a->hi_of ? a->hi_of[r % a->n_ranges] : a->width;
        if (lo < 0) lo = 0;
        if (hi > a->width) hi = a->width;
        topk_row(a->x + r * a->stride, srow, lo, hi, a->k, a->by_abs, cmax, tv, ti,
                 a->out_idx + r * a->k, a->out_val + r * a->k);
    }
    free(cmax); free(tv); free(ti);
    return 0;
}

int cwlens_row_topk(const float *x, int64_t n_rows, int64_t stride, int64_t width,
                    const float *scale, int64_t rows_per_scale, int64_t scale_stride,
                    const int64_t *lo_of, const int64_t *hi_of, int64_t n_ranges,
                    int k, int by_abs, int32_t *out_idx, float *out_val, int n_threads) {
    if (k < 1 || n_rows < 1)
        return 0;  /* nothing to rank (the caller filled its outputs) */
    Job job = {x, scale, lo_of, hi_of, stride, rows_per_scale, scale_stride, n_ranges, width, k, by_abs,
               out_idx, out_val};
    return cwlens_parallel_rows(run_rows, &job, n_rows, n_threads) ? -1 : 0;  /* -1: out of memory */
}
