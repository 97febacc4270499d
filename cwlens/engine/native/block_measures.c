/* One block of the streamed pass in one call, for cwlens.engine.block_fused (loaded by
   cwlens/engine/native/__init__.py, which compiles this file on first use).

   For each head h and query row i of the block (keys lo[i] <= j < hi[i] only):
     contribution    c_ij = a_ij * <u_i^h, v_j^g>   (u = o W_O^h^T / ||o||^2, g = h / group)
     attention       a_ij
     value_weighted  a_ij * ||v~_j^h||
   and out of them, where asked (`wants`): the k largest of each row of each of the three
   (largest first, equal values in key order, a row with fewer than k keys ends in key -1,
   whose value the caller sets to NaN: the lists of cwlens.engine.row_topk), and the column sums over the block's
   rows of c, of a and of a_ij / ||o_i|| (the output-normalised baseline's sums without
   ||v~_j||). Nothing of the block's size is written: the products <u_i, v_j> of a tile of
   ROWS rows are computed into a buffer that stays in the core's cache, multiplied by a,
   summed into the columns and ranked there. Returns 0, -1 (out of memory) or -2 (a
   contribution is not finite: the caller computes the block with torch, which names it).

   With AVX-512 (and k <= 16), the top-k of a row takes two passes over it: the maximum of
   each of the 16 lanes (one vector maximum per 16 keys) gives T, the k-th largest of 16
   real entries, which no entry of the k best is below; the second pass inserts only the
   entries >= T. Without, a row's top-k is row_topk.c's (topk_row, topk_list.h). Rows are
   split over n_threads threads (parallel.h); each thread sums its own columns, added in
   thread order at the end (the same sums for the same thread count). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"
#include "topk_list.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define VEC 1
#endif

#define ROWS 8   /* queries a tile: 8 accumulators of 16 keys */
#define LANES 16
/* 8 floats in GCC's and Clang's vector extension (one AVX register, two SSE or NEON
   ones), for the path without intrinsics */
typedef float vf8 __attribute__((vector_size(32)));
#define GROUP 4  /* rows whose column sums are added together */
#define SEG 256  /* keys a segment of the top-k's lane maxima */

typedef struct {
    const float *alpha, *u, *vt, *vnorm, *inv1;
    const int64_t *lo_of, *hi_of;
    int64_t a_head_stride, a_row_stride, vt_stride, vn_stride, inv_head_stride;
    int64_t n_heads, group, q, width, d, tiles;
    int k, wants;
    int32_t *out_idx;
    float *out_val, *partials;  /* partials: [part][3][head][col_stride] */
    int64_t col_stride;
} Job;

#ifdef VEC
/* lanes lo <= j0 + l < hi of the 16 keys from j0 */
static inline __mmask16 range_mask(int64_t j0, int64_t lo, int64_t hi) {
    int64_t a = lo - j0, b = hi - j0;
    if (a < 0) a = 0;
    if (b > LANES) b = LANES;
    if (b <= a) return 0;
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* the k-th largest (k <= 16) of the 16 lanes of v: a bitonic sorting network (10 steps
   of a lane permutation, a minimum and a maximum) */
static inline float kth_largest(__m512 v, int k) {
    static const int step[10] = {1, 2, 1, 4, 2, 1, 8, 4, 2, 1};  /* lane i meets lane i ^ step */
    static const uint16_t takes_max[10] = {0x6666, 0x3c3c, 0x5a5a, 0x0ff0, 0x33cc,
                                           0x55aa, 0xff00, 0xf0f0, 0xcccc, 0xaaaa};
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int s = 0; s < 10; s++) {
        __m512 p = _mm512_permutexvar_ps(_mm512_xor_si512(lane, _mm512_set1_epi32(step[s])), v);
        v = _mm512_mask_blend_ps(takes_max[s], _mm512_min_ps(v, p), _mm512_max_ps(v, p));
    }
    float sorted[LANES];  /* ascending */
    _mm512_storeu_ps(sorted, v);
    return sorted[LANES - k];
}

/* the k largest of x[j] (times s[j] where s is given), lo <= j < hi; seg: the lane
   maxima of each SEG keys of the row (segment j / SEG), -FLT_MAX on lanes outside it.
   T, the k-th largest of the row's 16 lane maxima (16 real entries: the k-th largest
   entry is not below it), bounds the k best from below: only segments with a lane >= T
   are looked at, and in them only entries >= T are inserted. */
static void topk_pass(const float *x, const float *s, int64_t lo, int64_t hi, const float *seg, int k,
                      int32_t *oi, float *ov) {
    int cnt = 0;
    if (hi <= lo) {
        finish(cnt, k, oi);
        return;
    }
    const int64_t s0 = lo / SEG, s1 = (hi - 1) / SEG + 1;
    __m512 m = _mm512_loadu_ps(seg + s0 * LANES);
    for (int64_t g = s0 + 1; g < s1; g++) m = _mm512_max_ps(m, _mm512_loadu_ps(seg + g * LANES));
    const __m512 tv = _mm512_set1_ps(kth_largest(m, k));
    float vals[LANES];
    for (int64_t g = s0; g < s1; g++) {
        if (!_mm512_cmp_ps_mask(_mm512_loadu_ps(seg + g * LANES), tv, _CMP_GE_OQ))
            continue;  /* no entry of this segment reaches T */
        int64_t j = g * SEG, end = j + SEG < hi ? j + SEG : hi;
        if (j < lo) j = lo - lo % LANES;
        for (; j < end; j += LANES) {
            __mmask16 in = range_mask(j, lo, hi);
            __m512 v = _mm512_maskz_loadu_ps(in, x + j);
            if (s) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(in, s + j));
            __mmask16 hit = _mm512_mask_cmp_ps_mask(in, v, tv, _CMP_GE_OQ);
            if (!hit) continue;
            _mm512_storeu_ps(vals, v);
            while (hit) {
                int l = __builtin_ctz(hit);
                insert(vals[l], (int32_t)(j + l), k, &cnt, oi, ov);
                hit &= hit - 1;
            }
        }
    }
    finish(cnt, k, oi);
}
#endif

typedef struct {
    int64_t lo, hi;
    const float *alpha;
    float inv;
} Row;

/* One tile of n_rows rows of head h: c (into cbuf, key j at cbuf[r * span + j - j0]), the
   column sums (into cc, ca, cv), the lane maxima of c, a and a ||v~|| (into lanes
   [3][ROWS][16]); keys j0 <= j < j1, j0 a multiple of 16. Returns 1 where a c is not
   finite. */
#ifdef VEC
static int tile_vec(const Job *a, const float *u, const float *vt, const float *vn, const Row *rows,
                    int n_rows, int64_t j0, int64_t j1, float *cbuf, int64_t span, float *cc, float *ca,
                    float *cv, float *segs, int64_t n_seg) {
    const int want_c = a->wants & 1, want_cols = a->wants & 8;
    const int64_t d = a->d;
    __mmask16 bad = 0;
    if (want_c)  /* the tile's <u_r, v_j>, 8 rows x 32 (at the end 16) keys at a time, into cbuf */
        for (int64_t j = j0; j < j1;) {
            const float *panel = vt + (j / LANES) * d * LANES;  /* keys j .. j + 15, [d][16] */
            if (j + LANES < j1) {  /* two panels: keys j .. j + 31 */
                __m512 acc[ROWS], acc2[ROWS];
                for (int r = 0; r < ROWS; r++) acc[r] = acc2[r] = _mm512_setzero_ps();
                for (int64_t e = 0; e < d; e++) {
                    __m512 v = _mm512_loadu_ps(panel + e * LANES), w = _mm512_loadu_ps(panel + (d + e) * LANES);
                    for (int r = 0; r < ROWS; r++) {  /* rows past n_rows: whatever u holds, unused */
                        __m512 x = _mm512_set1_ps(u[r * d + e]);
                        acc[r] = _mm512_fmadd_ps(x, v, acc[r]);
                        acc2[r] = _mm512_fmadd_ps(x, w, acc2[r]);
                    }
                }
                for (int r = 0; r < ROWS; r++) {
                    _mm512_storeu_ps(cbuf + r * span + (j - j0), acc[r]);
                    _mm512_storeu_ps(cbuf + r * span + (j - j0) + LANES, acc2[r]);
                }
                j += 2 * LANES;
                continue;
            }
            __m512 acc[ROWS];
            for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t e = 0; e < d; e++) {
                __m512 v = _mm512_loadu_ps(panel + e * LANES);
                for (int r = 0; r < ROWS; r++)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(u[r * d + e]), v, acc[r]);
            }
            for (int r = 0; r < ROWS; r++)
                _mm512_storeu_ps(cbuf + r * span + (j - j0), acc[r]);
            j += LANES;
        }
    /* then GROUP rows at a time (more would share one set of the L1 cache: a tile's rows
       are 4 KB multiples apart): c = a <u, v>, the lane maxima, and the group's column sums
       added to the columns once */
    for (int g0 = 0; g0 < n_rows; g0 += GROUP) {
        const int n_g = n_rows - g0 < GROUP ? n_rows - g0 : GROUP;
        int64_t lo = rows[g0].lo, hi = rows[g0].hi;
        for (int r = 1; r < n_g; r++) {
            if (rows[g0 + r].hi > rows[g0 + r].lo) {
                if (hi <= lo) { lo = rows[g0 + r].lo; hi = rows[g0 + r].hi; continue; }
                if (rows[g0 + r].lo < lo) lo = rows[g0 + r].lo;
                if (rows[g0 + r].hi > hi) hi = rows[g0 + r].hi;
            }
        }
        int64_t ilo = rows[g0].lo, ihi = rows[g0].hi;  /* keys every row of the group holds */
        for (int r = 1; r < n_g; r++) {
            if (rows[g0 + r].lo > ilo) ilo = rows[g0 + r].lo;
            if (rows[g0 + r].hi < ihi) ihi = rows[g0 + r].hi;
        }
        const __m512 low = _mm512_set1_ps(-FLT_MAX);
        __m512 mc[GROUP], ma[GROUP], mv[GROUP];
        for (int r = 0; r < GROUP; r++) mc[r] = ma[r] = mv[r] = low;
        for (int64_t j = lo - lo % LANES; j < hi; j += LANES) {
            __m512 vnv = _mm512_maskz_loadu_ps(range_mask(j, lo, hi), vn + j);
            __m512 sc = _mm512_setzero_ps(), sa = sc, sv = sc;
            __mmask16 any = 0;
            const int inner = j >= ilo && j + LANES <= ihi;  /* every lane of every row: no masks to make */
            for (int r = 0; r < n_g; r++) {
                const Row *row = rows + g0 + r;
                __mmask16 in = inner ? (__mmask16)0xFFFF : range_mask(j, row->lo, row->hi);
                any |= in;
                __m512 x = _mm512_maskz_loadu_ps(in, row->alpha + j);
                if (want_c) {
                    float *c = cbuf + (g0 + r) * span - j0 + j;
                    __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, c), x);
                    bad |= _mm512_mask_fpclass_ps_mask(in, y, 0x99);  /* NaN, +inf, -inf */
                    _mm512_mask_storeu_ps(c, in, y);
                    mc[r] = _mm512_mask_max_ps(mc[r], in, mc[r], y);
                    sc = _mm512_add_ps(sc, y);
                }
                ma[r] = _mm512_mask_max_ps(ma[r], in, ma[r], x);
                mv[r] = _mm512_mask_max_ps(mv[r], in, mv[r], _mm512_mul_ps(x, vnv));
                sa = _mm512_add_ps(sa, x);
                sv = _mm512_fmadd_ps(x, _mm512_set1_ps(row->inv), sv);
            }
            if (want_cols) {
                if (want_c)
                    _mm512_mask_storeu_ps(cc + j, any, _mm512_add_ps(_mm512_maskz_loadu_ps(any, cc + j), sc));
                _mm512_mask_storeu_ps(ca + j, any, _mm512_add_ps(_mm512_maskz_loadu_ps(any, ca + j), sa));
                _mm512_mask_storeu_ps(cv + j, any, _mm512_add_ps(_mm512_maskz_loadu_ps(any, cv + j), sv));
            }
            if ((j + LANES) % SEG == 0 || j + LANES >= hi) {  /* a segment ends: its lane maxima */
                const int64_t g = j / SEG;
                for (int r = 0; r < n_g; r++) {
                    _mm512_storeu_ps(segs + ((g0 + r) * n_seg + g) * LANES, mc[r]);
                    _mm512_storeu_ps(segs + ((ROWS + g0 + r) * n_seg + g) * LANES, ma[r]);
                    _mm512_storeu_ps(segs + ((2 * ROWS + g0 + r) * n_seg + g) * LANES, mv[r]);
                    mc[r] = ma[r] = mv[r] = low;
                }
            }
        }
    }
    return bad != 0;
}
#endif

/* the same without vector intrinsics (what other CPUs build): the products <u_r, v_j> of
   the tile's rows one panel of 16 keys at a time (loops over the lanes the compiler
   vectorises), then row by row c = a <u, v>, its finiteness and the column sums */
static int tile_plain(const Job *a, const float *u, const float *vt, const Row *rows, int n_rows,
                      int64_t j0, int64_t j1, float *cbuf, int64_t span, float *cc, float *ca, float *cv) {
    const int want_c = a->wants & 1, want_cols = a->wants & 8;
    const int64_t d = a->d;
    if (want_c)
        for (int64_t j = j0; j < j1; j += LANES) {
            const float *panel = vt + (j / LANES) * d * LANES;  /* keys j .. j + 15, [d][16] */
            for (int r0 = 0; r0 < n_rows; r0 += 4) {  /* 4 rows: 8 vectors of sums */
                vf8 lo8[4] = {{0}}, hi8[4] = {{0}};
                for (int64_t e = 0; e < d; e++) {
                    vf8 v, w;
                    memcpy(&v, panel + e * LANES, sizeof v);
                    memcpy(&w, panel + e * LANES + 8, sizeof w);
                    for (int r = 0; r < 4; r++) {  /* rows past n_rows: whatever u holds, unused */
                        const float x = u[(r0 + r) * d + e];
                        lo8[r] += x * v;
                        hi8[r] += x * w;
                    }
                }
                for (int r = 0; r < 4; r++) {
                    memcpy(cbuf + (r0 + r) * span + (j - j0), &lo8[r], sizeof lo8[r]);
                    memcpy(cbuf + (r0 + r) * span + (j - j0) + 8, &hi8[r], sizeof hi8[r]);
                }
            }
        }
    uint32_t bad = 0;
    for (int r = 0; r < n_rows; r++) {
        const int64_t lo = rows[r].lo, hi = rows[r].hi;
        const float *restrict al = rows[r].alpha;
        float *restrict c = cbuf + r * span - j0;
        if (want_c)
            for (int64_t j = lo; j < hi; j++) {
                float x = c[j] * al[j];
                uint32_t bits;
                memcpy(&bits, &x, 4);
                bad |= (bits & 0x7F800000u) == 0x7F800000u;  /* by its bits: -ffinite-math-only */
                c[j] = x;
            }
        if (want_cols) {
            const float inv = rows[r].inv;
            float *restrict sc = cc, *restrict sa = ca, *restrict sv = cv;
            if (want_c)
                for (int64_t j = lo; j < hi; j++) sc[j] += c[j];
            for (int64_t j = lo; j < hi; j++) {
                sa[j] += al[j];
                sv[j] += al[j] * inv;
            }
        }
    }
    return bad != 0;
}

static int run_tiles(const void *arg, int part, int64_t item0, int64_t item1) {
    const Job *a = (const Job *)arg;
    const int64_t span = a->width + 2 * LANES;
    float *cbuf = malloc(sizeof(float) * (size_t)(ROWS * span));
    float *upad = calloc((size_t)(ROWS * a->d), sizeof(float));
    const int64_t n_seg = a->width / SEG + 1;
    float *segs = malloc(sizeof(float) * (size_t)(3 * ROWS * n_seg * LANES));
    float *cmax = malloc(sizeof(float) * (size_t)(a->width / CHUNK + 2));  /* topk_row's */
    float *tv = malloc(sizeof(float) * (size_t)a->k);
    int32_t *ti = malloc(sizeof(int32_t) * (size_t)a->k);
    if (!cbuf || !upad || !segs || !cmax || !tv || !ti) {
        free(cbuf); free(upad); free(segs); free(cmax); free(tv); free(ti);
        return 1;
    }
    const int want_c = a->wants & 1;
    const int64_t per = a->n_heads * a->q * a->k;
    const int64_t cs = a->col_stride;
    float *cols = (a->wants & 8) ? a->partials + (int64_t)part * 3 * a->n_heads * cs : 0;
    int bad = 0;
    for (int64_t item = item0; item < item1 && !bad; item++) {
        const int64_t h = item / a->tiles, i0 = (item % a->tiles) * ROWS;
        const int n_rows = (int)(a->q - i0 < ROWS ? a->q - i0 : ROWS);
        Row rows[ROWS];
        int64_t j0 = a->width, j1 = 0;
        for (int r = 0; r < n_rows; r++) {
            int64_t lo = a->lo_of[i0 + r], hi = a->hi_of[i0 + r];
            if (lo < 0) lo = 0;
            if (hi > a->width) hi = a->width;
            if (hi < lo) hi = lo;
            rows[r].lo = lo;
            rows[r].hi = hi;
            rows[r].alpha = a->alpha + h * a->a_head_stride + (i0 + r) * a->a_row_stride;
            rows[r].inv = a->inv1[h * a->inv_head_stride + i0 + r];
            if (hi > lo) {
                if (lo < j0) j0 = lo;
                if (hi > j1) j1 = hi;
            }
        }
        if (j1 <= j0) j0 = j1 = 0;
        j0 -= j0 % LANES;  /* on vt's 16-key grid: a tile never reads past its zero padding */
        memcpy(upad, a->u + (h * a->q + i0) * a->d, sizeof(float) * (size_t)(n_rows * a->d));
        const float *vt = a->vt + (h / a->group) * a->vt_stride, *vn = a->vnorm + h * a->vn_stride;
        float *cc = cols ? cols + h * cs : 0;
        float *ca = cols ? cols + (a->n_heads + h) * cs : 0;
        float *cv = cols ? cols + (2 * a->n_heads + h) * cs : 0;
        int vec = 0;
#ifdef VEC
        vec = a->k <= LANES;
        if (vec)
            bad = tile_vec(a, upad, vt, vn, rows, n_rows, j0, j1, cbuf, span, cc, ca, cv, segs, n_seg);
#endif
        if (!vec)
            bad = tile_plain(a, upad, vt, rows, n_rows, j0, j1, cbuf, span, cc, ca, cv);
        if (bad)
            break;
        for (int r = 0; r < n_rows; r++) {
            const int64_t row = h * a->q + i0 + r, lo = rows[r].lo, hi = rows[r].hi;
            const float *c = cbuf + r * span - j0, *al = rows[r].alpha;
            int32_t *oi = a->out_idx + row * a->k;
            float *ov = a->out_val + row * a->k;
            for (int m = 0; m < 3; m++) {
                const int wanted = m == 0 ? want_c && (a->wants & 16) : (a->wants & (m == 1 ? 2 : 4));
                if (!wanted) continue;
                const float *x = m == 0 ? c : al, *s = m == 2 ? vn : 0;
#ifdef VEC
                if (vec) {
                    topk_pass(x, s, lo, hi, segs + (m * ROWS + r) * n_seg * LANES, a->k,
                              oi + m * per, ov + m * per);
                    continue;
                }
#endif
                topk_row(x, s, lo, hi, a->k, 0, cmax, tv, ti, oi + m * per, ov + m * per);
            }
        }
    }
    free(cbuf); free(upad); free(segs); free(cmax); free(tv); free(ti);
    return bad ? 2 : 0;
}

int cwlens_block_measures(const float *alpha, int64_t a_head_stride, int64_t a_row_stride,
                          const float *u, const float *vt, int64_t vt_stride,
                          const float *vnorm, int64_t vn_stride, const float *inv1, int64_t inv_head_stride,
                          const int64_t *lo_of, const int64_t *hi_of,
                          int64_t n_heads, int64_t group, int64_t q, int64_t width, int64_t d,
                          int k, int wants, int32_t *out_idx, float *out_val, float *out_cols,
                          int n_threads) {
    if (n_heads < 1 || q < 1)
        return 0;
    const int64_t tiles = (q + ROWS - 1) / ROWS, items = n_heads * tiles;
    int parts = cwlens_parallel_parts(items, n_threads);
    float *partials = 0;
    /* each column array 192 bytes past a multiple of 4 KB from the last: the rows of a
       [head, query, key] block are 4 KB multiples apart, and a tile reads 8 of them plus
       these; at one offset they would all share one set of the L1 cache */
    const int64_t cs = width + 48, plane = 3 * n_heads * cs;
    if (wants & 8) {
        partials = calloc((size_t)(parts * plane), sizeof(float));
        if (!partials && plane) return -1;
    }
    Job job = {alpha, u, vt, vnorm, inv1, lo_of, hi_of, a_head_stride, a_row_stride, vt_stride, vn_stride,
               inv_head_stride, n_heads, group, q, width, d, tiles, k, wants, out_idx, out_val, partials, cs};
    int code = cwlens_parallel_indexed(run_tiles, &job, items, n_threads);
    if (!code && partials)
        for (int64_t x = 0; x < 3 * n_heads; x++) {
            float *out = out_cols + x * width;
            memcpy(out, partials + x * cs, sizeof(float) * (size_t)width);
            for (int p = 1; p < parts; p++)
                for (int64_t j = 0; j < width; j++) out[j] += partials[p * plane + x * cs + j];
        }
    free(partials);
    return code == 1 ? -1 : code ? -2 : 0;
}
