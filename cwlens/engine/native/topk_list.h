/* A row's best-k list, kept sorted while its keys come in key order, and the top-k of a
   row made with it: shared by the top-k kernels of this folder (row_topk.c,
   block_measures.c). */
#ifndef CWLENS_TOPK_LIST_H
#define CWLENS_TOPK_LIST_H
#include <math.h>
#include <stdint.h>

#define CHUNK 32  /* keys a chunk of topk_row */

/* v into the sorted best-so-far (ov, oi: cnt of at most k), after every equal value */
static inline void insert(float v, int32_t j, int k, int *cnt, int32_t *oi, float *ov) {
    if (*cnt == k && !(v > ov[k - 1]))
        return;
    int p = *cnt < k ? (*cnt)++ : k - 1;  /* a new slot, or the k-th best's */
    while (p > 0 && v > ov[p - 1]) {
        ov[p] = ov[p - 1];
        oi[p] = oi[p - 1];
        p--;
    }
    ov[p] = v;
    oi[p] = j;
}

/* a row with fewer than k keys: the rest marked key -1 (their values, left as they are,
   are set to NaN by the caller: no NaN is written in a unit built with -ffinite-math-only) */
static inline void finish(int cnt, int k, int32_t *oi) {
    for (int t = cnt; t < k; t++)
        oi[t] = -1;
}

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

/* The k largest of row[j] (times srow[j] where srow is given; |.| where by_abs), lo <= j <
   hi, into oi/ov, largest first, equal values in key order, key -1 past the row's keys.
   Two passes: the maximum of each chunk of CHUNK keys (a plain loop the compiler
   vectorises), then the k-th largest of those maxima, T, bounds the k-th largest value
   from below, so only the chunks whose maximum reaches T are looked at key by key, in key
   order (typically k chunks). cmax: (hi - lo) / CHUNK + 1 floats, tv/ti: k each. */
static inline void topk_row(const float *row, const float *srow, int64_t lo, int64_t hi, int k, int by_abs,
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
#endif
