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

   Two passes a row: the maximum of each chunk of CHUNK keys (a plain loop the compiler
   vectorises), then the k-th largest of those maxima, T, bounds the k-th largest value
   from below, so only the chunks whose maximum reaches T are looked at key by key, in key
   order (typically k chunks). Rows are split over n_threads threads (parallel.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "parallel.h"
#include "topk_list.h"

#define CHUNK 32

typedef struct {
    const float *x, *scale;
    const int64_t *lo_of, *hi_of;
    int64_t stride, rows_per_scale, scale_stride, n_ranges, width;
    int k, by_abs;
    int32_t *out_idx;
    float *out_val;
} Job;

static inline float value_at(const float *row, const float *srow, int64_t j, int by_abs) {
    float v = srow ? row[j] * srow[j] : row[j];
    return by_abs ? fabsf(v) : v;
}

static inline float chunk_max(const float *row, const float *srow, int64_t j0, int64_t j1, int by_abs) {
    float m = value_at(row, srow, j0, by_abs);
    if (srow) {
        if (by_abs) { for (int64_t j = j0; j < j1; j++) { float v = fabsf(row[j] * srow[j]); m = v > m ? v : m; } }
        else { for (int64_t j = j0; j < j1; j++) { float v = row[j] * srow[j]; m = v > m ? v : m; } }
    } else {
        if (by_abs) { for (int64_t j = j0; j < j1; j++) { float v = fabsf(row[j]); m = v > m ? v : m; } }
        else { for (int64_t j = j0; j < j1; j++) { float v = row[j]; m = v > m ? v : m; } }
    }
    return m;
}

static void one_row(const float *row, const float *srow, int64_t lo, int64_t hi, int k, int by_abs,
                    float *cmax, float *tv, int32_t *ti, int32_t *oi, float *ov) {
    int64_t n_chunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
    int tcnt = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t j0 = lo + c * CHUNK, j1 = j0 + CHUNK < hi ? j0 + CHUNK : hi;
        cmax[c] = chunk_max(row, srow, j0, j1, by_abs);
        insert(cmax[c], (int32_t)c, k, &tcnt, ti, tv);
    }
    int cnt = 0;
    for (int64_t c = 0; c < n_chunks; c++) {
        if (tcnt == k && cmax[c] < tv[k - 1])
            continue;  /* below T: none of its keys is among the k best */
        int64_t j0 = lo + c * CHUNK, j1 = j0 + CHUNK < hi ? j0 + CHUNK : hi;
        for (int64_t j = j0; j < j1; j++)
            insert(value_at(row, srow, j, by_abs), (int32_t)j, k, &cnt, oi, ov);
    }
    finish(cnt, k, oi);
}

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
        one_row(a->x + r * a->stride, srow, lo, hi, a->k, a->by_abs, cmax, tv, ti,
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
