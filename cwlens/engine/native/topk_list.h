/* A row's best-k list, kept sorted while its keys come in key order: shared by the top-k
   kernels of this folder (row_topk.c, block_measures.c). */
#ifndef CWLENS_TOPK_LIST_H
#define CWLENS_TOPK_LIST_H
#include <stdint.h>

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
#endif
