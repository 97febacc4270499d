/* Seeded uniforms for the faithfulness sweep's tie-break and random control (loaded by
   cwlens/engine/native/__init__.py, which compiles this file on first use). */
#include <stdint.h>

#include "parallel.h"

/* The seeded uniforms of cwlens.faithfulness.ranking.uniforms_at: out[r, c] from the row's
   hash rows[r] and the key position keys[c] (two 32-bit multiply-xorshift hashes, 53 bits,
   / 2^53), as float64 or rounded once to float32 -- the same values, computed in one pass
   instead of a dozen over int64 tensors. */
static inline uint64_t mix32(uint64_t x) {
    for (int i = 0; i < 2; i++) {
        x ^= x >> 16;
        x = (x * 0x45D9F3BULL) & 0xFFFFFFFFULL;
    }
    return x ^ (x >> 16);
}

/* one uniform: 53 bits of two hashes of (row hash ^ key position), / 2^53 */
static inline double draw(uint64_t base, int64_t key) {
    uint64_t x = mix32(base ^ (uint64_t)key);
    uint64_t y = mix32(x ^ 0x5BD1E995ULL);
    return (double)((x << 21) + (y >> 11)) / 9007199254740992.0;
}

typedef struct {
    const int64_t *rows, *keys;
    void *out;
    int64_t n_keys;
    int is_double;
} Draw;

static int draw_rows(const void *arg, int64_t row0, int64_t row1) {
    const Draw *d = (const Draw *)arg;
    for (int64_t r = row0; r < row1; r++) {
        uint64_t base = (uint64_t)d->rows[r];
        if (d->is_double) {
            double *o = (double *)d->out + r * d->n_keys;
            for (int64_t c = 0; c < d->n_keys; c++) o[c] = draw(base, d->keys[c]);
        } else {
            float *o = (float *)d->out + r * d->n_keys;
            for (int64_t c = 0; c < d->n_keys; c++) o[c] = (float)draw(base, d->keys[c]);
        }
    }
    return 0;
}

int cwlens_uniforms(const int64_t *rows, const int64_t *keys, int64_t n_rows, int64_t n_keys, void *out,
                    int is_double, int n_threads) {
    if (n_rows < 1 || n_keys < 1)
        return 0;
    Draw d = {rows, keys, out, n_keys, is_double};
    return cwlens_parallel_rows(draw_rows, &d, n_rows, n_threads);
}
