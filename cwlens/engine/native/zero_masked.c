/* A packed mask applied to attention weights, for cwlens.engine.interventions.value_masking
   (loaded by cwlens/engine/native/__init__.py, which compiles this file on first use). */
#include <stdint.h>

#include "parallel.h"

/* out[r, j] = +0.0 where bit j of row r of `bits` is set, else x[r, j]: a packed mask
   applied to rows of attention weights (x, out: [n_rows, width] float32; bits: rows of
   `bit_stride` bytes covering at least `width` keys). Rows split over n_threads. */
typedef struct {
    const float *x;
    const uint8_t *bits;
    float *out;
    int64_t width, bit_stride;
} Zero;

static int zero_rows(const void *arg, int64_t row0, int64_t row1) {
    const Zero *z = (const Zero *)arg;
    for (int64_t r = row0; r < row1; r++) {
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
    if (n_rows < 1 || width < 1)
        return 0;
    Zero z = {x, bits, out, width, bit_stride};
    return cwlens_parallel_rows(zero_rows, &z, n_rows, n_threads);
}
