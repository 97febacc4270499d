/* A packed mask applied to attention weights, for cwlens.engine.interventions.value_masking
   (loaded by cwlens/engine/native/__init__.py, which compiles this file on first use). */
#include <pthread.h>
#include <stdint.h>

/* out[r, j] = +0.0 where bit j of row r of `bits` is set, else x[r, j]: a packed mask
   applied to rows of attention weights (x, out: [n_rows, width] float32; bits: rows of
   `bit_stride` bytes covering at least `width` keys). Rows split over n_threads. */
typedef struct {
    const float *x;
    const uint8_t *bits;
    float *out;
    int64_t row0, row1, width, bit_stride;
} Zero;

static void *zero_rows(void *arg) {
    const Zero *z = (const Zero *)arg;
    for (int64_t r = z->row0; r < z->row1; r++) {
        const uint32_t *x = (const uint32_t *)(z->x + r * z->width);  /* the floats' bits */
        const uint8_t *b = z->bits + r * z->bit_stride;
        uint32_t *o = (uint32_t *)(z->out + r * z->width);
        int64_t j = 0;
        for (; j + 8 <= z->width; j += 8) {  /* branch-free: a set bit clears all 32 */
            uint32_t m = b[j >> 3];
            for (int t = 0; t < 8; t++)
                o[j + t] = x[j + t] & (((m >> t) & 1u) - 1u);
        }
        for (; j < z->width; j++)
            o[j] = x[j] & ((uint32_t)((b[j >> 3] >> (j & 7)) & 1) - 1u);
    }
    return 0;
}

int cwlens_zero_masked(const float *x, const uint8_t *bits, float *out, int64_t n_rows, int64_t width,
                       int64_t bit_stride, int n_threads) {
    enum { MAX_THREADS = 64 };
    if (n_rows < 1 || width < 1)
        return 0;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)n_rows;
    Zero zs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < n_threads; t++) {
        Zero z = {x, bits, out, n_rows * t / n_threads, n_rows * (t + 1) / n_threads, width, bit_stride};
        zs[t] = z;
        started[t] = t > 0 && pthread_create(&threads[t], 0, zero_rows, &zs[t]) == 0;
    }
    zero_rows(&zs[0]);
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(threads[t], 0);
        else zero_rows(&zs[t]);
    }
    return 0;
}
