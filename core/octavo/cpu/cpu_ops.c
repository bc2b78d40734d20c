/* Fused bf16 kernels for the CPU hot path (see octavo/kernels/cpu.py for why and how they
 * are built). Each one replaces a chain of small PyTorch ops whose per-op dispatch cost,
 * not arithmetic, dominates a decode step, and rounds to bf16 where that chain rounds, so
 * results match it to the last bit or nearly (sums may be added in another order).
 *
 * Tensors arrive as raw pointers with the row strides (in elements) the caller checked;
 * within a row the elements are contiguous. bf16 values travel as uint16_t.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef uint16_t bf16;

static inline float bf2f(bf16 h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

/* Round to nearest even, as PyTorch's float -> bfloat16 conversion does (no NaNs here). */
static inline bf16 f2bf(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    return (bf16)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* y = W x (+ bias) for one row x [in] and W [out, in] in its plain layout, each output
 * summed in fp32 and rounded to bf16 once. A decode step of one request is bound by
 * streaming the weights from memory; four rows at a time with AVX512-BF16's dot-product
 * instruction (no conversion pass) keep more loads in flight than oneDNN's blocked GEMV,
 * ~1.25x its bandwidth on both cores of a SmolLM2-135M step. */
static float dot_row(const bf16 *w, const bf16 *x, int64_t in) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < in; i++) sum += bf2f(w[i]) * bf2f(x[i]);
    return sum;
}

void octavo_gemv(bf16 *y, const bf16 *w, const bf16 *x, const bf16 *bias, int64_t out,
                 int64_t in) {
    int64_t groups = out / 4;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const bf16 *w0 = w + 4 * g * in;
        float sums[4];
#ifdef __AVX512BF16__
        if (in % 32 == 0) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            const bf16 *next = w0 + 4 * in; /* the next group's rows, asked for ahead */
            for (int64_t i = 0; i < in; i += 32) {
                for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(next + r * in + i),
                                                         _MM_HINT_T0);
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
                a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + i), xv);
                a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w0 + in + i), xv);
                a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w0 + 2 * in + i), xv);
                a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w0 + 3 * in + i), xv);
            }
            sums[0] = _mm512_reduce_add_ps(a0);
            sums[1] = _mm512_reduce_add_ps(a1);
            sums[2] = _mm512_reduce_add_ps(a2);
            sums[3] = _mm512_reduce_add_ps(a3);
        } else
#endif
            for (int r = 0; r < 4; r++) sums[r] = dot_row(w0 + r * in, x, in);
        for (int r = 0; r < 4; r++) {
            int64_t o = 4 * g + r;
            y[o] = f2bf(sums[r] + (bias ? bf2f(bias[o]) : 0.0f));
        }
    }
    for (int64_t o = 4 * groups; o < out; o++)
        y[o] = f2bf(dot_row(w + o * in, x, in) + (bias ? bf2f(bias[o]) : 0.0f));
}

/* Y = X W^T (+ bias) for a batch of rows, with W prepacked into panels of GEMM_PANEL
 * columns ([out / GEMM_PANEL][in][GEMM_PANEL], zero-padded; see pack_gemm_weight in cpu.py).
 * This CPU's vdpbf16ps retires half as many multiply-adds per cycle as fp32 FMAs, so
 * oneDNN's bf16 GEMM runs at ~0.5x fp32 peak, and an fp32 weight copy doubles the bytes a
 * decode step streams. Here each panel row is read once as bf16, widened to fp32 in
 * registers and used for up to GEMM_MR rows of fp32 FMAs: bf16 bandwidth at fp32 speed.
 * Sums stay in fp32 along `in` and round to bf16 once, as a bf16 GEMM's do. */
#define GEMM_PANEL 32
#define GEMM_MR 14
#define GEMM_PREFETCH 32 /* panel rows ahead to ask the memory for (2 KiB) */
#define GEMM_MC 196 /* rows whose fp32 copy stays in L2 while every panel passes over it */

#ifdef __AVX512F__
int octavo_gemm_available(void) { return 1; }

/* One panel row of 32 bf16 columns as two fp32 vectors, two instructions: the panel stores
 * column j in the low half of 32-bit lane j and column 16 + j in its high half. */
static inline void widen_panel_row(const bf16 *p, __m512 *low, __m512 *high) {
    __m512i v = _mm512_loadu_si512(p);
    *low = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *high = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000)));
}

static inline __m256i round_bf16x16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

/* `mr` rows of A (fp32, row stride `in`) times one panel: [mr, GEMM_PANEL] of Y. */
static inline __attribute__((always_inline)) void gemm_tile(
    bf16 *y, int64_t y_stride, const float *a, const bf16 *panel, const float *bias,
    int64_t in, int mr, __mmask16 mask0, __mmask16 mask1) {
    __m512 acc0[GEMM_MR], acc1[GEMM_MR];
#pragma GCC unroll 14
    for (int r = 0; r < mr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k++) {
        __m512 b0, b1;
        _mm_prefetch((const char *)(panel + (k + GEMM_PREFETCH) * GEMM_PANEL), _MM_HINT_T0);
        widen_panel_row(panel + k * GEMM_PANEL, &b0, &b1);
#pragma GCC unroll 14
        for (int r = 0; r < mr; r++) {
            __m512 av = _mm512_set1_ps(a[r * in + k]);
            acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
        }
    }
    __m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __m512 bias1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 14
    for (int r = 0; r < mr; r++) {
        _mm256_mask_storeu_epi16(y + r * y_stride, mask0,
                                 round_bf16x16(_mm512_add_ps(acc0[r], bias0)));
        _mm256_mask_storeu_epi16(y + r * y_stride + 16, mask1,
                                 round_bf16x16(_mm512_add_ps(acc1[r], bias1)));
    }
}

#define GEMM_TILE_CASE(n) \
    case n: gemm_tile(y, y_stride, a, panel, bias, in, n, mask0, mask1); break;

static void gemm_tile_rows(bf16 *y, int64_t y_stride, const float *a, const bf16 *panel,
                           const float *bias, int64_t in, int mr, __mmask16 mask0,
                           __mmask16 mask1) {
    switch (mr) {
        GEMM_TILE_CASE(1) GEMM_TILE_CASE(2) GEMM_TILE_CASE(3) GEMM_TILE_CASE(4)
        GEMM_TILE_CASE(5) GEMM_TILE_CASE(6) GEMM_TILE_CASE(7) GEMM_TILE_CASE(8)
        GEMM_TILE_CASE(9) GEMM_TILE_CASE(10) GEMM_TILE_CASE(11) GEMM_TILE_CASE(12)
        GEMM_TILE_CASE(13) GEMM_TILE_CASE(14)
    }
}

void octavo_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *panels,
                 const float *bias, int64_t rows, int64_t out, int64_t in) {
    int64_t num_panels = (out + GEMM_PANEL - 1) / GEMM_PANEL;
    int64_t chunk = rows < GEMM_MC ? rows : GEMM_MC;
    float *a = malloc(sizeof(float) * chunk * in);
#pragma omp parallel
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t mc = rows - r0 < chunk ? rows - r0 : chunk;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < mc; r++)
            for (int64_t i = 0; i < in; i++) a[r * in + i] = bf2f(x[(r0 + r) * x_stride + i]);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < num_panels; p++) {
            int64_t cols = out - p * GEMM_PANEL;
            __mmask16 mask0 = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
            __mmask16 mask1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0
                                                  : (__mmask16)((1u << (cols - 16)) - 1);
            const bf16 *panel = panels + p * in * GEMM_PANEL;
            const float *b = bias ? bias + p * GEMM_PANEL : NULL;
            for (int64_t m = 0; m < mc; m += GEMM_MR) {
                int mr = mc - m < GEMM_MR ? (int)(mc - m) : GEMM_MR;
                gemm_tile_rows(y + (r0 + m) * out + p * GEMM_PANEL, out, a + m * in, panel, b,
                               in, mr, mask0, mask1);
            }
        }
    }
    free(a);
}
#else
int octavo_gemm_available(void) { return 0; }

void octavo_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *panels,
                 const float *bias, int64_t rows, int64_t out, int64_t in) {
    abort(); /* callers check octavo_gemm_available() first */
}
#endif

/* Work below this many elements runs on one thread: waking the others costs more. */
#define PARALLEL_MIN 32768

/* Y = X W^T (+ bias) on a CPU with AVX512-BF16, for any number of rows: W prepacked as
 * bf16 pairs, [ceil(out / 16)][in / 2][16][2] (16 output columns a panel, zero-padded;
 * lane j of one 64-byte row holds column j's weights for inputs 2i and 2i + 1; see
 * pack_pair_weight in kernels.py), so that one vdpbf16ps multiplies a broadcast pair of
 * an X row into 16 columns at once and adds both products to fp32 sums. Tiles of up to
 * PAIR_MR rows times PAIR_NP panels keep 24 sums in registers while their panels stream
 * past; each thread owns a contiguous range of panels, so every weight is read from memory
 * once per call (per chunk of rows) whatever the row count. On an AVX512-BF16 EPYC it
 * multiplies SmolLM2-135M's layers at 1.0-2.6x oneDNN's bf16 GEMM up to 64 rows and
 * 0.93-1.03x from 128 (one row: ~32 GB/s of weights, the GEMV ~20). Sums stay in fp32 along
 * `in` and round to bf16 once. */
#ifdef __AVX512BF16__
#define PAIR_MR 6
#define PAIR_NP 4
#define PAIR_PANEL 16
#define PAIR_CHUNK_BYTES (512 * 1024)

int octavo_pair_gemm_available(void) { return 1; }

/* sums[r][16 p + j] = row r of x times column 16 p + j, for mr rows and np panels: the hot
 * loop, which keeps its 24 sums in registers only when nothing else competes for them. */
static inline __attribute__((always_inline)) void pair_tile(
    float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x, int64_t x_stride, const bf16 *w,
    int64_t panel_stride, int64_t pairs, int mr, int np) {
    __m512 acc[PAIR_MR][PAIR_NP];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < np; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t k = 0; k < pairs; k++) {
        __m512bh b[PAIR_NP];
        for (int p = 0; p < np; p++)
            b[p] = (__m512bh)_mm512_loadu_si512(w + p * panel_stride + k * 2 * PAIR_PANEL);
        for (int r = 0; r < mr; r++) {
            int32_t pair;
            memcpy(&pair, x + r * x_stride + 2 * k, sizeof pair);
            __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            for (int p = 0; p < np; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], a, b[p]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < np; p++) _mm512_storeu_ps(sums[r] + p * PAIR_PANEL, acc[r][p]);
}

/* Adds the bias to a tile's sums, rounds them to bf16 and stores the `cols` columns that
 * exist. */
static void pair_tile_store(bf16 *y, int64_t y_stride, float sums[PAIR_MR][PAIR_NP * PAIR_PANEL],
                            const float *bias, int mr, int64_t cols) {
    for (int64_t c = 0; c < cols; c += PAIR_PANEL) {
        int64_t left = cols - c;
        __mmask16 mask = left >= PAIR_PANEL ? 0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
        for (int r = 0; r < mr; r++)
            _mm256_mask_storeu_epi16(y + r * y_stride + c, mask,
                                     round_bf16x16(_mm512_add_ps(_mm512_loadu_ps(sums[r] + c), b)));
    }
}

/* pair_tile with its sizes fixed at compile time, one function each for mr in 1..6 and np
 * in 1..4 (one function holding all 24 ran the 6 x 4 tile 10% slower: GCC allocated its
 * registers worse). */
typedef void (*pair_tile_fn)(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x,
                             int64_t x_stride, const bf16 *w, int64_t panel_stride,
                             int64_t pairs);
#define PAIR_TILE(mr, np) \
    static void pair_tile_##mr##x##np(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], \
                                      const bf16 *x, int64_t x_stride, const bf16 *w, \
                                      int64_t panel_stride, int64_t pairs) { \
        pair_tile(sums, x, x_stride, w, panel_stride, pairs, mr, np); \
    }
#define PAIR_TILES(mr) PAIR_TILE(mr, 1) PAIR_TILE(mr, 2) PAIR_TILE(mr, 3) PAIR_TILE(mr, 4)
PAIR_TILES(1) PAIR_TILES(2) PAIR_TILES(3) PAIR_TILES(4) PAIR_TILES(5) PAIR_TILES(6)
#define PAIR_ROW(mr) {pair_tile_##mr##x1, pair_tile_##mr##x2, pair_tile_##mr##x3, pair_tile_##mr##x4}
static const pair_tile_fn pair_tiles[PAIR_MR][PAIR_NP] = {
    PAIR_ROW(1), PAIR_ROW(2), PAIR_ROW(3), PAIR_ROW(4), PAIR_ROW(5), PAIR_ROW(6)};

/* x: [rows, in] with rows x_stride apart, in even; y: [rows, out] contiguous; bias: fp32,
 * padded to whole panels, or NULL. */
void octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                      const float *bias, int64_t rows, int64_t out, int64_t in) {
    int64_t panels = (out + PAIR_PANEL - 1) / PAIR_PANEL, pairs = in / 2;
    int64_t panel_stride = pairs * 2 * PAIR_PANEL;
    /* Rows whose inputs stay in L2 while every panel of the thread passes over them: many
     * rows of a prefill would otherwise come from memory once per panel group. */
    int64_t chunk = PAIR_CHUNK_BYTES / (2 * in) / PAIR_MR * PAIR_MR;
    chunk = chunk < PAIR_MR ? PAIR_MR : chunk;
#pragma omp parallel if (rows * out * in >= PARALLEL_MIN)
    {
        int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t first = panels * t / threads, end = panels * (t + 1) / threads;
        float sums[PAIR_MR][PAIR_NP * PAIR_PANEL];
        for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
            int64_t m_end = rows - m0 < chunk ? rows : m0 + chunk;
            for (int64_t p = first; p < end; p += PAIR_NP) {
                int np = (int)(end - p < PAIR_NP ? end - p : PAIR_NP);
                int64_t cols = out - p * PAIR_PANEL;
                cols = cols < np * PAIR_PANEL ? cols : np * PAIR_PANEL;
                for (int64_t m = m0; m < m_end; m += PAIR_MR) {
                    int mr = (int)(m_end - m < PAIR_MR ? m_end - m : PAIR_MR);
                    pair_tiles[mr - 1][np - 1](sums, x + m * x_stride, x_stride,
                                               packed + p * panel_stride, panel_stride, pairs);
                    pair_tile_store(y + m * out + p * PAIR_PANEL, out, sums,
                                    bias ? bias + p * PAIR_PANEL : NULL, mr, cols);
                }
            }
        }
    }
}
#else
int octavo_pair_gemm_available(void) { return 0; }

void octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                      const float *bias, int64_t rows, int64_t out, int64_t in) {
    abort(); /* callers check octavo_pair_gemm_available() first */
}
#endif

/* out = weight * rmsnorm(x), or with residual != NULL first x = x + residual (bf16), the new
 * residual stream, written back into x. As HF: the norm in fp32, rounded to bf16, then
 * multiplied by the bf16 weight. */
void octavo_rms_norm(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *weight,
                     int64_t rows, int64_t dim, int64_t x_stride, int64_t res_stride,
                     float eps) {
#pragma omp parallel for if (rows * dim >= PARALLEL_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        bf16 *xr = x + r * x_stride;
        float sum = 0.0f;
        if (residual) {
            const bf16 *rr = residual + r * res_stride;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) {
                bf16 s = f2bf(bf2f(xr[i]) + bf2f(rr[i]));
                xr[i] = s;
                float f = bf2f(s);
                sum += f * f;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) {
                float f = bf2f(xr[i]);
                sum += f * f;
            }
        }
        float scale = 1.0f / sqrtf(sum / (float)dim + eps);
        bf16 *o = out + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++)
            o[i] = f2bf(bf2f(weight[i]) * bf2f(f2bf(bf2f(xr[i]) * scale)));
    }
}

/* out[r] = silu(gate) * up for x[r] = [gate | up] (each d wide), each op rounded to bf16. */
void octavo_silu_and_mul(bf16 *out, const bf16 *x, int64_t rows, int64_t d, int64_t x_stride) {
#pragma omp parallel for if (rows * d >= PARALLEL_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = x + r * x_stride;
        const bf16 *up = gate + d;
        bf16 *o = out + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) {
            float g = bf2f(gate[i]);
            float silu = bf2f(f2bf(g / (1.0f + expf(-g))));
            o[i] = f2bf(silu * bf2f(up[i]));
        }
    }
}

/* Rotary embedding in place on `heads` vectors of head_dim per token (x: [tokens, heads,
 * head_dim], rows `stride` apart): x * cos + rotate_half(x) * sin with `sin` already signed
 * (-sin on the first half), as octavo.models.layers.rotary computes it: each product and the
 * sum rounded to bf16. cos/sin: [tokens, head_dim]. */
static void rope_rows(bf16 *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
                      const bf16 *cos, const bf16 *sin) {
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const bf16 *c = cos + t * head_dim, *s = sin + t * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            bf16 *v = x + t * stride + h * head_dim;
            float lo[half], hi[half];
            for (int64_t i = 0; i < half; i++) {
                lo[i] = bf2f(v[i]);
                hi[i] = bf2f(v[i + half]);
            }
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = bf2f(f2bf(lo[i] * bf2f(c[i])));
                float b = bf2f(f2bf(hi[i] * bf2f(s[i])));
                v[i] = f2bf(a + b);
                float a2 = bf2f(f2bf(hi[i] * bf2f(c[i + half])));
                float b2 = bf2f(f2bf(lo[i] * bf2f(s[i + half])));
                v[i + half] = f2bf(a2 + b2);
            }
        }
    }
}

void octavo_rope(bf16 *q, bf16 *k, const bf16 *cos, const bf16 *sin, int64_t tokens,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                 int64_t k_stride) {
    rope_rows(q, tokens, num_heads, head_dim, q_stride, cos, sin);
    rope_rows(k, tokens, num_kv_heads, head_dim, k_stride, cos, sin);
}

/* Store each token's key and value row (width = kv_heads * head_dim) at its cache slot.
 * cache: [2, slots, width]; key rows key_stride apart, value rows value_stride apart. */
void octavo_write_kv(bf16 *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                     const int64_t *slot_mapping, int64_t tokens, int64_t width,
                     int64_t key_stride, int64_t value_stride) {
    bf16 *values = cache + num_slots * width;
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slot_mapping[t];
        memcpy(cache + slot * width, key + t * key_stride, width * sizeof(bf16));
        memcpy(values + slot * width, value + t * value_stride, width * sizeof(bf16));
    }
}

/* Ask the memory for a cache row a few positions ahead: the rows of a context lie in
 * blocks scattered over the cache, which the hardware prefetcher cannot guess. */
static inline void prefetch_row(const bf16 *row, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) __builtin_prefetch(row + i);
}

#ifdef __AVX512F__
/* Lane i of the result = the sum of v[i]'s 16 lanes: 15 shuffle-and-add steps for all 16
 * sums instead of a full horizontal reduction for each. */
static inline __m512 sum_lanes16(__m512 v[16]) {
    __m512 w[8], x[4], y[2];
    for (int k = 0; k < 8; k++)
        w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                             _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++)
        x[k] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * k], w[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(w[2 * k], w[2 * k + 1], 0xEE));
    for (int k = 0; k < 2; k++)
        y[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88),
                         _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
}

/* Scores of every query head against 16 consecutive positions whose key rows (fp32, all
 * kv heads) are keys[0..15]; written to scores[h * max_len + j0 ...]. head_dim = 16 * nd,
 * a constant where score_block16 calls this, so the dot products unroll. */
static inline __attribute__((always_inline)) void score_block16_nd(
    float *scores, int64_t max_len, int64_t j0, const float *qf, const float *keys,
    int64_t num_heads, int64_t group, int64_t width, int64_t nd) {
    int64_t head_dim = 16 * nd;
    for (int64_t h = 0; h < num_heads; h++) {
        const float *qh = qf + h * head_dim, *kh = keys + (h / group) * head_dim;
        __m512 dots[16];
        for (int j = 0; j < 16; j++) {
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(kh + j * width));
            for (int64_t c = 1; c < nd; c++)
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * c),
                                      _mm512_loadu_ps(kh + j * width + 16 * c), acc);
            dots[j] = acc;
        }
        _mm512_storeu_ps(scores + h * max_len + j0, sum_lanes16(dots));
    }
}

static void score_block16(float *scores, int64_t max_len, int64_t j0, const float *qf,
                          const float *keys, int64_t num_heads, int64_t group, int64_t head_dim,
                          int64_t width) {
    switch (head_dim) {
    case 64: score_block16_nd(scores, max_len, j0, qf, keys, num_heads, group, width, 4); break;
    case 128: score_block16_nd(scores, max_len, j0, qf, keys, num_heads, group, width, 8); break;
    default:
        score_block16_nd(scores, max_len, j0, qf, keys, num_heads, group, width, head_dim / 16);
    }
}
#define SCORE_BLOCK 16

/* 16 consecutive bf16 values as fp32. */
static inline __m512 widen_bf16x16(const bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* acc[h][0 .. 16 * nd) = sum over j of p[h * max_len + j] * value row j (fp32), for hs query
 * heads sharing one kv head: the hs * nd sums stay in registers while the value rows pass
 * (16 * nd columns from column `col` of each cache row). */
static inline __attribute__((always_inline)) void weigh_values(
    float *acc, int64_t acc_stride, const float *p, int64_t max_len, const bf16 *values,
    const int64_t *slot, int64_t len, int64_t width, int64_t col, int nd, int hs) {
    __m512 sums[4][4];
    for (int h = 0; h < hs; h++)
        for (int c = 0; c < nd; c++) sums[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; j++) {
        if (j + 8 < len) prefetch_row(values + slot[j + 8] * width + col, 16 * nd);
        const bf16 *v = values + slot[j] * width + col;
        __m512 row[4];
        for (int c = 0; c < nd; c++) row[c] = widen_bf16x16(v + 16 * c);
        for (int h = 0; h < hs; h++) {
            __m512 weight = _mm512_set1_ps(p[h * max_len + j]);
            for (int c = 0; c < nd; c++) sums[h][c] = _mm512_fmadd_ps(weight, row[c], sums[h][c]);
        }
    }
    for (int h = 0; h < hs; h++)
        for (int c = 0; c < nd; c++) _mm512_storeu_ps(acc + h * acc_stride + 16 * c, sums[h][c]);
}

#define WEIGH_CASE(nd, hs) \
    case (nd) * 8 + (hs): \
        weigh_values(acc, acc_stride, p, max_len, values, slot, len, width, col, nd, hs); break;

/* weigh_values for nd, hs in 1..4, each compiled with its sizes fixed. */
static void weigh_values_n(float *acc, int64_t acc_stride, const float *p, int64_t max_len,
                           const bf16 *values, const int64_t *slot, int64_t len, int64_t width,
                           int64_t col, int nd, int hs) {
    switch (nd * 8 + hs) {
        WEIGH_CASE(1, 1) WEIGH_CASE(1, 2) WEIGH_CASE(1, 3) WEIGH_CASE(1, 4)
        WEIGH_CASE(2, 1) WEIGH_CASE(2, 2) WEIGH_CASE(2, 3) WEIGH_CASE(2, 4)
        WEIGH_CASE(3, 1) WEIGH_CASE(3, 2) WEIGH_CASE(3, 3) WEIGH_CASE(3, 4)
        WEIGH_CASE(4, 1) WEIGH_CASE(4, 2) WEIGH_CASE(4, 3) WEIGH_CASE(4, 4)
    }
}

/* The weighted sum of values for every query head, kv head by kv head, in register-sized
 * pieces: up to 4 heads of a group times up to 64 columns. head_dim % 16 == 0. */
static void weigh_all_values(float *acc, const float *scores, int64_t max_len,
                             const bf16 *values, const int64_t *slot, int64_t len,
                             int64_t width, int64_t num_heads, int64_t group,
                             int64_t head_dim) {
    int hs;
    for (int64_t h0 = 0; h0 < num_heads; h0 += hs) {
        int64_t kv = h0 / group, group_end = (kv + 1) * group;
        hs = (int)(group_end - h0 < 4 ? group_end - h0 : 4);
        for (int64_t d = 0; d < head_dim; d += 64) {
            int nd = (int)((head_dim - d < 64 ? head_dim - d : 64) / 16);
            weigh_values_n(acc + h0 * head_dim + d, head_dim, scores + h0 * max_len, max_len,
                           values, slot, len, width, kv * head_dim + d, nd, hs);
        }
    }
}
#else
#define SCORE_BLOCK 0
#endif

/* The weighted sum of values for every query head, position by position, in portable C
 * (acc [heads, head_dim]; row: scratch for one fp32 cache row). */
static void weigh_values_portable(float *acc, float *row, const float *scores,
                                  int64_t max_len, const bf16 *values, const int64_t *slot,
                                  int64_t len, int64_t width, int64_t num_heads, int64_t group,
                                  int64_t head_dim) {
    memset(acc, 0, sizeof(float) * num_heads * head_dim);
    for (int64_t j = 0; j < len; j++) {
        const bf16 *v = values + slot[j] * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) row[i] = bf2f(v[i]);
        for (int64_t h = 0; h < num_heads; h++) {
            const float *vh = row + (h / group) * head_dim;
            float p = scores[h * max_len + j], *ah = acc + h * head_dim;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) ah[d] += p * vh[d];
        }
    }
}

/* scores[h * max_len + j] = q_h . key of position j (qf: the scaled query in fp32), for the
 * `len` positions whose cache rows are at `slot`. With AVX-512 and head_dim % 16 == 0, 16
 * positions at a time, the rest one by one. scratch: room for 16 fp32 cache rows. */
static void score_context(float *scores, float *scratch, const float *qf, const bf16 *cache,
                          const int64_t *slot, int64_t len, int64_t max_len, int64_t width,
                          int64_t num_heads, int64_t group, int64_t head_dim) {
    int64_t j = 0;
#if SCORE_BLOCK
    for (; head_dim % 16 == 0 && j + SCORE_BLOCK <= len; j += SCORE_BLOCK) {
        for (int64_t r = 0; r < SCORE_BLOCK; r++) {
            if (j + SCORE_BLOCK + r < len)
                prefetch_row(cache + slot[j + SCORE_BLOCK + r] * width, width);
            const bf16 *k = cache + slot[j + r] * width;
#pragma omp simd
            for (int64_t i = 0; i < width; i++) scratch[r * width + i] = bf2f(k[i]);
        }
        score_block16(scores, max_len, j, qf, scratch, num_heads, group, head_dim, width);
    }
#endif
    for (; j < len; j++) {
        const bf16 *k = cache + slot[j] * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) scratch[i] = bf2f(k[i]);
        for (int64_t h = 0; h < num_heads; h++) {
            const float *kh = scratch + (h / group) * head_dim, *qh = qf + h * head_dim;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; d++) dot += qh[d] * kh[d];
            scores[h * max_len + j] = dot;
        }
    }
}

/* Attention of one query token per request over its paged context, read straight from the
 * cache (no gathered copy). Request b attends positions 0..seq_lens[b]-1, whose slots are
 * slots[b * max_len + j]; query head h reads key/value head h / (heads / kv_heads). Each
 * cache row (all kv heads of one position) is read once, for all query heads. Rounded as
 * PyTorch's CPU flash attention rounds bf16: scores and exp(score - max) in fp32, the
 * exponentials rounded to bf16 for the weighted sum of values (accumulated in fp32), which
 * is divided by the fp32 sum of the exponentials and rounded to bf16 at the end.
 * q: [B, heads, head_dim], rows q_stride apart; out contiguous. */
void octavo_decode_attention(bf16 *out, const bf16 *q, const bf16 *cache, int64_t num_slots,
                             const int64_t *slots, const int64_t *seq_lens, int64_t batch,
                             int64_t max_len, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_dim, int64_t q_stride, float scale) {
    int64_t group = num_heads / num_kv_heads;
    int64_t width = num_kv_heads * head_dim;
    int64_t qwidth = num_heads * head_dim;
    const bf16 *values = cache + num_slots * width;
    int64_t total = 0;
    for (int64_t b = 0; b < batch; b++) total += seq_lens[b];
#pragma omp parallel if (total * width >= PARALLEL_MIN)
    {
        float *scores = malloc(sizeof(float) * num_heads * max_len);
        float *qf = malloc(sizeof(float) * qwidth);
        float *acc = malloc(sizeof(float) * qwidth);
        float *sums = malloc(sizeof(float) * num_heads);
        float *scratch = malloc(sizeof(float) * 16 * width); /* fp32 cache rows */
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < batch; b++) {
            int64_t len = seq_lens[b];
            const int64_t *slot = slots + b * max_len;
#pragma omp simd
            for (int64_t i = 0; i < qwidth; i++) qf[i] = bf2f(q[b * q_stride + i]) * scale;
            score_context(scores, scratch, qf, cache, slot, len, max_len, width, num_heads, group,
                          head_dim);
            for (int64_t h = 0; h < num_heads; h++) {
                float *s = scores + h * max_len;
                float m = s[0], sum = 0.0f;
                for (int64_t j = 1; j < len; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd reduction(+ : sum)
                for (int64_t j = 0; j < len; j++) {
                    float e = expf(s[j] - m);
                    sum += e;
                    s[j] = bf2f(f2bf(e));
                }
                sums[h] = sum;
            }
#if SCORE_BLOCK
            if (head_dim % 16 == 0)
                weigh_all_values(acc, scores, max_len, values, slot, len, width, num_heads,
                                 group, head_dim);
            else
#endif
                weigh_values_portable(acc, scratch, scores, max_len, values, slot, len, width,
                                      num_heads, group, head_dim);
            bf16 *o = out + b * qwidth;
            for (int64_t h = 0; h < num_heads; h++) {
                float inv = 1.0f / sums[h];
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++)
                    o[h * head_dim + d] = f2bf(acc[h * head_dim + d] * inv);
            }
        }
        free(scores);
        free(qf);
        free(acc);
        free(sums);
        free(scratch);
    }
}

