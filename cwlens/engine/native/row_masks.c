/* Row-scope faithfulness masks, for cwlens.faithfulness.job_masks (loaded by
   cwlens/engine/native/__init__.py, which compiles this file on first use).

   Row r of `scores` and `ties` ([n_rows, width] float32) is ranked on its eligible keys
   lo <= j < hi (lo, hi = lo_of[g], hi_of[g], g = r / rows_per_range * ... see range_of):
   by score, then by the seeded tie-break, then by key position (lower first) -- the order
   of cwlens.faithfulness.ranking.rank_entries (a stable descending sort of the int64
   sort_key(score) << 32 | sort_key(tie)). For each job (mode, k of the row): the k best
   keys (comprehensiveness, mode 0) or the k worst (sufficiency, mode 1) are set in the
   job's packed mask (bit j % 8 of byte j / 8, as cwlens.core.bitmask.PackedMask), and
   three counts of the row are written: removed, removed by the tie-break (the cut falls
   inside a run of equal scores: the removed entries scored like the cut), removed on
   the row's first real token (cwlens.faithfulness.cut_counts, the same numbers). An
   eligible NaN score stops it (returns -2: the caller ranks with torch).

   No sort: the k-th key of every job is found by one selection with several targets
   (a quickselect), then each mask is one pass over the row's keys. Rows are split over
   n_threads threads (parallel.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

/* float32 bits -> uint32 in the same order as the floats (-0.0 as 0.0): the unsigned
   twin of cwlens.faithfulness.ranking.sort_key (sort_key(x) + 2^31) */
static inline uint32_t ordered(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static inline void swap64(uint64_t *a, int64_t i, int64_t j) {
    uint64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* a[lo..hi) rearranged so that a[t] is the t-th smallest for every t in want[0..nw)
   (sorted ascending, each in [lo, hi)). A quickselect with several targets: a branch-free
   Lomuto partition around the median of three (keys are almost never equal: the
   tie-break draws differ), three-way where no key is below the pivot (runs of equal keys
   never make it quadratic). */
#define SMALL 16

static void select_many(uint64_t *a, int64_t lo, int64_t hi, const int64_t *want, int nw) {
    while (nw > 0 && hi - lo > 1) {
        if (hi - lo <= SMALL) {  /* a sort by counting: each key's place is the number of
                                    keys before it, branch-free (distinct keys: the places
                                    differ; equal keys: ordered by where they are) */
            uint64_t v[SMALL];
            int64_t m = hi - lo;
            memcpy(v, a + lo, (size_t)m * sizeof(uint64_t));
            for (int64_t i = 0; i < m; i++) {
                int64_t place = 0;
                for (int64_t j = 0; j < m; j++)
                    place += (v[j] < v[i]) | ((v[j] == v[i]) & (j < i));
                a[lo + place] = v[i];
            }
            return;
        }
        int64_t mid = lo + (hi - lo) / 2;  /* the median of three to the end, as the pivot */
        if (a[mid] < a[lo]) swap64(a, mid, lo);
        if (a[hi - 1] < a[lo]) swap64(a, hi - 1, lo);
        if (a[mid] < a[hi - 1]) swap64(a, mid, hi - 1);
        uint64_t p = a[hi - 1];
        int64_t lt = lo;
        for (int64_t i = lo; i < hi - 1; i++) {  /* [lo, lt) < p, branch-free */
            uint64_t v = a[i];
            a[i] = a[lt];
            a[lt] = v;
            lt += v < p;
        }
        int64_t gt;  /* [lt, gt) == p, [gt, hi) > p */
        if (lt > lo) {
            swap64(a, lt, hi - 1);
            gt = lt + 1;
        } else {  /* nothing below the pivot: gather the keys equal to it */
            gt = lo;
            for (int64_t i = lo; i < hi; i++)
                if (a[i] == p) swap64(a, gt++, i);
        }
        int nl = 0;
        while (nl < nw && want[nl] < lt) nl++;
        int ne = nl;
        while (ne < nw && want[ne] < gt) ne++;
        /* the smaller side recursively, the larger in the loop */
        if (lt - lo < hi - gt) {
            select_many(a, lo, lt, want, nl);
            want += ne; nw -= ne; lo = gt;
        } else {
            select_many(a, gt, hi, want + ne, nw - ne);
            nw = nl; hi = lt;
        }
    }
}

/* the bits of keys lo + i (i < n) on T's removed side, T included: key >= T (comp) or
   key <= T; a byte at a time, each byte assembled in a register */
static void write_bits(uint8_t *row_bits, const uint64_t *keys, int64_t lo, int64_t n, uint64_t T, int comp) {
    int64_t i = 0;
    while (i < n && ((lo + i) & 7)) {  /* the first, partial byte */
        int out = comp ? keys[i] >= T : keys[i] <= T;
        row_bits[(lo + i) >> 3] |= (uint8_t)(out << ((lo + i) & 7));
        i++;
    }
    if (comp) {
        for (; i + 8 <= n; i += 8) {
            uint32_t m = 0;
            for (int t = 0; t < 8; t++) m |= (uint32_t)(keys[i + t] >= T) << t;
            row_bits[(lo + i) >> 3] = (uint8_t)m;
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            uint32_t m = 0;
            for (int t = 0; t < 8; t++) m |= (uint32_t)(keys[i + t] <= T) << t;
            row_bits[(lo + i) >> 3] = (uint8_t)m;
        }
    }
    for (; i < n; i++) {
        int out = comp ? keys[i] >= T : keys[i] <= T;
        row_bits[(lo + i) >> 3] |= (uint8_t)(out << ((lo + i) & 7));
    }
}

typedef struct {
    const float *scores, *ties;
    const int64_t *lo_of, *hi_of, *first_of, *k_of;
    const int32_t *modes;
    int64_t width, heads, queries, range_heads, n_ranges, n_rows, n_bytes;
    int n_jobs;
    uint8_t *bits;
    int32_t *counts;
} Work;

/* 0, or 1 where an eligible score is NaN (the caller ranks with torch then) */
static int one_row(const Work *w, int64_t r, uint64_t *keys, uint64_t *sel, int64_t *want, int64_t *cut) {
    int64_t q = r % w->queries, h = (r / w->queries) % w->heads, b = r / (w->queries * w->heads);
    int64_t g = (w->range_heads ? b * w->heads + h : b) * w->queries + q;
    int64_t lo = w->lo_of[g], hi = w->hi_of[g];
    if (lo < 0) lo = 0;
    if (hi > w->width) hi = w->width;
    int64_t n = hi - lo;
    if (n <= 0) return 0;
    const float *s = w->scores + r * w->width + lo, *t = w->ties + r * w->width + lo;
    uint32_t nan = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, s + i, 4);
        nan |= (bits & 0x7FFFFFFFu) > 0x7F800000u;  /* by its bits: built -ffinite-math-only */
        keys[i] = ((uint64_t)ordered(s[i]) << 32) | ordered(t[i]);
    }
    if (nan) return 1;
    /* the ascending position of each job's cut key: comprehensiveness n - k, sufficiency k - 1 */
    int nw = 0;
    for (int j = 0; j < w->n_jobs; j++) {
        int64_t k = w->k_of[(int64_t)j * w->n_ranges + g];
        if (k < 0) k = 0;
        if (k > n) k = n;
        cut[j] = k == 0 ? -1 : (w->modes[j] == 0 ? n - k : k - 1);
        if (cut[j] >= 0) want[nw++] = cut[j];
    }
    if (nw == 0) return 0;
    for (int a = 1; a < nw; a++) {  /* sort the targets, drop repeats */
        int64_t v = want[a];
        int c = a;
        while (c > 0 && want[c - 1] > v) { want[c] = want[c - 1]; c--; }
        want[c] = v;
    }
    int u = 1;
    for (int a = 1; a < nw; a++)
        if (want[a] != want[u - 1]) want[u++] = want[a];
    memcpy(sel, keys, (size_t)n * sizeof(uint64_t));
    select_many(sel, 0, n, want, u);
    int64_t first = w->first_of[b] - lo;
    for (int j = 0; j < w->n_jobs; j++) {
        if (cut[j] < 0) continue;
        uint8_t *row_bits = w->bits + ((int64_t)j * w->n_rows + r) * w->n_bytes;
        int32_t *cnt = w->counts + ((int64_t)j * w->n_rows + r) * 3;
        uint64_t T = sel[cut[j]];
        uint32_t cut_score = (uint32_t)(T >> 32);
        int comp = w->modes[j] == 0;
        int64_t k = comp ? n - cut[j] : cut[j] + 1;
        /* the removed side of T and T itself; unless another key equals T (equal score and
           equal tie-break draw), that is exactly the k removed */
        int64_t taken = 0, same_score = 0, kept_same = 0;
        if (comp) {
            for (int64_t i = 0; i < n; i++) {  /* counts: plain sums, vectorised */
                int out = keys[i] >= T, same = (uint32_t)(keys[i] >> 32) == cut_score;
                taken += out; same_score += out & same; kept_same += (!out) & same;
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                int out = keys[i] <= T, same = (uint32_t)(keys[i] >> 32) == cut_score;
                taken += out; same_score += out & same; kept_same += (!out) & same;
            }
        }
        if (taken == k)
            write_bits(row_bits, keys, lo, n, T, comp);
        else {  /* keys equal to T: the lowest positions first (comprehensiveness), the
                   highest (sufficiency), as the stable sort ranks them */
            int64_t equal_left = k;
            for (int64_t i = 0; i < n; i++) equal_left -= comp ? keys[i] > T : keys[i] < T;
            same_score = kept_same = 0;
            for (int64_t a = 0; a < n; a++) {
                int64_t i = comp ? a : n - 1 - a;
                int out = comp ? keys[i] > T : keys[i] < T;
                if (!out && keys[i] == T && equal_left > 0) { out = 1; equal_left--; }
                int same = (uint32_t)(keys[i] >> 32) == cut_score;
                if (out) row_bits[(lo + i) >> 3] |= (uint8_t)(1u << ((lo + i) & 7));
                same_score += out & same;
                kept_same += (!out) & same;
            }
        }
        int on_first = first >= 0 && first < n && ((row_bits[(lo + first) >> 3] >> ((lo + first) & 7)) & 1);
        cnt[0] = (int32_t)k;
        cnt[1] = kept_same ? (int32_t)same_score : 0;
        cnt[2] = on_first;
    }
    return 0;
}

/* 0; 1: an eligible NaN score; 2: out of memory */
static int run_rows(const void *arg, int64_t row0, int64_t row1) {
    const Work *w = (const Work *)arg;
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(2 * w->width + 1));
    int64_t *want = malloc(sizeof(int64_t) * (size_t)(2 * w->n_jobs + 1));
    if (!keys || !want) {
        free(keys); free(want);
        return 2;
    }
    int nan = 0;
    for (int64_t r = row0; r < row1 && !nan; r++)
        nan = one_row(w, r, keys, keys + w->width, want, want + w->n_jobs);
    free(keys); free(want);
    return nan;
}

/* scores, ties: [n_rows, width], n_rows = batch * heads * queries (row r = (b, h, q));
   lo_of, hi_of: the eligible range of range g = (b, h if range_heads else -, q);
   first_of[b]: the first real key of text b (-1: none); modes[n_jobs]: 0 / 1;
   k_of[n_jobs, n_ranges]: the entries each job removes in each range's rows;
   bits: uint8 [n_jobs, n_rows, ceil(width / 8)], zeroed; counts: int32 [n_jobs, n_rows, 3], zeroed.
   Returns 0, -1 (out of memory) or -2 (an eligible NaN score). */
int cwlens_row_masks(const float *scores, const float *ties, int64_t n_rows, int64_t width,
                     int64_t heads, int64_t queries, const int64_t *lo_of, const int64_t *hi_of,
                     int64_t range_heads, int64_t n_ranges, const int64_t *first_of, int n_jobs,
                     const int32_t *modes, const int64_t *k_of, uint8_t *bits, int32_t *counts,
                     int n_threads) {
    if (n_rows < 1 || n_jobs < 1 || width < 1)
        return 0;
    Work w = {scores, ties, lo_of, hi_of, first_of, k_of, modes, width, heads, queries, range_heads,
              n_ranges, n_rows, (width + 7) / 8, n_jobs, bits, counts};
    int code = cwlens_parallel_rows(run_rows, &w, n_rows, n_threads);
    return code == 2 ? -1 : code == 1 ? -2 : 0;
}
