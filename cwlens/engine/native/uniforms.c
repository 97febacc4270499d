/* Seeded uniforms for the faithfulness sweep's tie-break and random control (loaded by
   cwlens/engine/native/__init__.py, which compiles this file on first use). */
#include <pthread.h>
#include <stdint.h>

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

typedef struct {
    const int64_t *rows, *keys;
    void *out;
    int64_t row0, row1, n_keys;
    int is_double;
} Draw;

static void *draw_rows(void *arg) {
    const Draw *d = (const Draw *)arg;
    for (int64_t r = d->row0; r < d->row1; r++) {
        uint64_t base = (uint64_t)d->rows[r];
        for (int64_t c = 0; c < d->n_keys; c++) {
            uint64_t x = mix32(base ^ (uint64_t)d->keys[c]);
            uint64_t y = mix32(x ^ 0x5BD1E995ULL);
            double u = (double)((x << 21) + (y >> 11)) / 9007199254740992.0;
            if (d->is_double) ((double *)d->out)[r * d->n_keys + c] = u;
            else ((float *)d->out)[r * d->n_keys + c] = (float)u;
        }
    }
    return 0;
}

int cwlens_uniforms(const int64_t *rows, const int64_t *keys, int64_t n_rows, int64_t n_keys, void *out,
                    int is_double, int n_threads) {
    enum { MAX_THREADS = 64 };
    if (n_rows < 1 || n_keys < 1)
        return 0;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n_rows) n_threads = (int)n_rows;
    Draw ds[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < n_threads; t++) {
        Draw d = {rows, keys, out, n_rows * t / n_threads, n_rows * (t + 1) / n_threads, n_keys, is_double};
        ds[t] = d;
        started[t] = t > 0 && pthread_create(&threads[t], 0, draw_rows, &ds[t]) == 0;
    }
    draw_rows(&ds[0]);
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(threads[t], 0);
        else draw_rows(&ds[t]);
    }
    return 0;
}
