/* Fused bf16 kernels for the CPU hot path (see octavo/cpu/kernels.py for why and how they
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

#include "cpu_kernels.h"

/* o[i] = silu(gate[i]) * up[i] for n columns, each op rounded to bf16 as PyTorch's bf16
 * SiluAndMul rounds: silu in fp32 on the bf16 gate, rounded, times up, rounded. With
 * AVX-512 16 columns at a time on the inline exp16, a masked load for the last few: every
 * column takes the same path whatever n is (a compiler-vectorised loop sent a tail through
 * the scalar expf, and the fused GEMM's narrow tiles then rounded a few values otherwise
 * than the SiLU kernel's wide rows). */
static inline void silu_mul_row(bf16 *o, const bf16 *gate, const bf16 *up, int64_t n) {
#ifdef __AVX512F__
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 g = bf16x16_to_fp32(_mm256_maskz_loadu_epi16(k, gate + i));
        __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                     exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        __m512 product = _mm512_mul_ps(bf16x16_to_fp32(round_bf16x16(silu)),
                                       bf16x16_to_fp32(_mm256_maskz_loadu_epi16(k, up + i)));
        _mm256_mask_storeu_epi16(o + i, k, round_bf16x16(product));
    }
#else
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float g = bf2f(gate[i]);
        float silu = bf2f(f2bf(g / (1.0f + expf(-g))));
        o[i] = f2bf(silu * bf2f(up[i]));
    }
#endif
}

/* y = W x (+ bias) for one row x [in] and W [out, in] in its plain layout, each output
 * summed in fp32 and rounded to bf16 once. A decode step of one request is bound by
 * streaming the weights from memory; four rows at a time with AVX512-BF16's dot-product
 * instruction (no conversion pass) keep more loads in flight than oneDNN's blocked GEMV. */
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
 * columns ([out / GEMM_PANEL][in][GEMM_PANEL], zero-padded; see pack_gemm_weight in
 * kernels.py). This CPU's vdpbf16ps retires half as many multiply-adds per cycle as fp32
 * FMAs, so oneDNN's bf16 GEMM runs at ~0.5x fp32 peak, and an fp32 weight copy doubles the
 * bytes a decode step streams. Here each panel row is read once as bf16, widened to fp32 in
 * registers and used for up to GEMM_MR rows of fp32 FMAs: bf16 bandwidth at fp32 speed.
 * Sums stay in fp32 along `in` and round to bf16 once, as a bf16 GEMM's do. */
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

int octavo_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *panels,
                const float *bias, int64_t rows, int64_t out, int64_t in) {
    int64_t num_panels = (out + GEMM_PANEL - 1) / GEMM_PANEL;
    int64_t chunk = rows < GEMM_MC ? rows : GEMM_MC;
    float *a = octavo_alloc(sizeof(float) * chunk * in);
    if (!a) return OCTAVO_ERR_NO_MEMORY;
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
    return OCTAVO_OK;
}
#else
int octavo_gemm_available(void) { return 0; }

int octavo_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *panels,
                const float *bias, int64_t rows, int64_t out, int64_t in) {
    return OCTAVO_ERR_NEEDS_AVX512;
}
#endif

/* Y = X W^T (+ bias) on a CPU with AVX512-BF16, for any number of rows: W prepacked as
 * bf16 pairs, [ceil(out / 16)][in / 2][16][2] (16 output columns a panel, zero-padded;
 * lane j of one 64-byte row holds column j's weights for inputs 2i and 2i + 1; see
 * pack_pair_weight in kernels.py), so that one vdpbf16ps multiplies a broadcast pair of
 * an X row into 16 columns at once and adds both products to fp32 sums. Tiles of up to
 * PAIR_MR rows times PAIR_NP panels keep 24 sums in registers while their panels stream
 * past; each thread owns a contiguous range of panels, so every weight is read from memory
 * once per call (per chunk of rows) whatever the row count. Sums stay in fp32 along `in`
 * and round to bf16 once. */
#ifdef __AVX512BF16__
#define PAIR_CHUNK_BYTES (512 * 1024)

int octavo_pair_gemm_available(void) { return 1; }

/* 32 fp8 e4m3 weights (one pair row of a panel: 16 columns x 2 inputs) as the bf16 pairs
 * vdpbf16ps takes, exactly: a normal e4m3 value (exponent e > 0, bias 7; mantissa m, 3 bits)
 * is a bf16 with exponent e + 120 (bias 127) and m as its top mantissa bits; a subnormal
 * (e = 0: m * 2^-9, m < 8) comes from a table of the eight. The byte 0x7F (e4m3fn's NaN) is
 * read as 480: no checkpoint's weight is NaN. */
static inline __m512i fp8_e4m3_to_bf16x32(__m256i bytes) {
    const __m512i n = _mm512_cvtepu8_epi16(bytes);
    const __m512i magnitude = _mm512_and_si512(n, _mm512_set1_epi16(0x7F));
    __m512i v = _mm512_add_epi16(_mm512_slli_epi16(magnitude, 4), _mm512_set1_epi16(120 << 7));
    const __m512i subnormals = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0x3C60, 0x3C40, 0x3C20, 0x3C00, 0x3BC0, 0x3B80, 0x3B00, 0);
    v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(magnitude, _mm512_set1_epi16(8)),
                                      magnitude, subnormals);
    /* v | (n << 8 & 0x8000): the sign bit moved to bf16's */
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(n, 8), _mm512_set1_epi16((short)0x8000),
                                     0xF8);
}

/* n fp8 e4m3 weights (n a multiple of 32) as bf16, in the same order. */
static void widen_fp8(bf16 *wide, const uint8_t *w, int64_t n) {
    for (int64_t i = 0; i < n; i += 32)
        _mm512_storeu_si512(wide + i,
                            fp8_e4m3_to_bf16x32(_mm256_loadu_si256((const __m256i *)(w + i))));
}

/* sums[r][16 p + j] = row r of x times column 16 p + j, for mr rows and np panels: the hot
 * loop, which keeps its 24 sums in registers only when nothing else competes for them. The
 * weights are bf16 pairs, or with fp8 their fp8 e4m3 bytes in the same order (converted to
 * bf16 pairs as they load); panel_stride and jump count weights either way. */
static inline __attribute__((always_inline)) void pair_tile(
    float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x, int64_t x_stride, const void *w,
    int64_t panel_stride, int64_t jump, int64_t pairs, const char *ahead, int64_t ahead_lines,
    int mr, int np, int fp8) {
    const int64_t bytes = fp8 ? 1 : sizeof(bf16); /* a weight's */
    const char *panel[PAIR_NP];
    for (int p = 0; p < np; p++)
        panel[p] = (const char *)w + bytes * (p * panel_stride + (2 * p >= np ? jump : 0));
    __m512 acc[PAIR_MR][PAIR_NP];
    for (int r = 0; r < mr; r++)
        for (int p = 0; p < np; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t k = 0; k < pairs; k++) {
        if (k < ahead_lines) _mm_prefetch(ahead + 64 * k, _MM_HINT_T1);
        __m512bh b[PAIR_NP];
        for (int p = 0; p < np; p++) {
            const char *row = panel[p] + k * 2 * PAIR_PANEL * bytes;
            b[p] = fp8 ? (__m512bh)fp8_e4m3_to_bf16x32(_mm256_loadu_si256((const __m256i *)row))
                       : (__m512bh)_mm512_loadu_si512(row);
        }
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

/* Scales a tile's sums (rows PAIR_NP * PAIR_PANEL apart) by their column's scale (NULL:
 * none), adds the bias, rounds them to bf16 and stores the `cols` columns that exist. */
static void pair_tile_store(bf16 *y, int64_t y_stride,
                            const float (*sums)[PAIR_NP * PAIR_PANEL], const float *scale,
                            const float *bias, int mr, int64_t cols) {
    for (int64_t c = 0; c < cols; c += PAIR_PANEL) {
        int64_t left = cols - c;
        __mmask16 mask = left >= PAIR_PANEL ? 0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + c) : _mm512_setzero_ps();
        __m512 s = scale ? _mm512_maskz_loadu_ps(mask, scale + c) : _mm512_set1_ps(1.0f);
        for (int r = 0; r < mr; r++)
            _mm256_mask_storeu_epi16(
                y + r * y_stride + c, mask,
                round_bf16x16(_mm512_fmadd_ps(_mm512_loadu_ps(sums[r] + c), s, b)));
    }
}

/* pair_tile with its sizes fixed at compile time, one function each for mr in 1..6 and np
 * in 1..4: in one function holding all 24, GCC allocated the registers of the 6 x 4 tile
 * worse. */
#define PAIR_TILE_OF(name, weight, fp8, mr, np) \
    static void name##_##mr##x##np(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x, \
                                   int64_t x_stride, const weight *w, int64_t panel_stride, \
                                   int64_t jump, int64_t pairs, const char *ahead, \
                                   int64_t ahead_lines) { \
        pair_tile(sums, x, x_stride, w, panel_stride, jump, pairs, ahead, ahead_lines, mr, np, \
                  fp8); \
    }
#define PAIR_TILE(mr, np) \
    PAIR_TILE_OF(pair_tile, bf16, 0, mr, np) PAIR_TILE_OF(fp8_pair_tile, uint8_t, 1, mr, np)
#define PAIR_TILES(mr) PAIR_TILE(mr, 1) PAIR_TILE(mr, 2) PAIR_TILE(mr, 3) PAIR_TILE(mr, 4)
PAIR_TILES(1) PAIR_TILES(2) PAIR_TILES(3) PAIR_TILES(4) PAIR_TILES(5) PAIR_TILES(6)
#define PAIR_ROW(prefix, mr) \
    {prefix##_##mr##x1, prefix##_##mr##x2, prefix##_##mr##x3, prefix##_##mr##x4}
#define PAIR_TABLE(prefix) \
    {PAIR_ROW(prefix, 1), PAIR_ROW(prefix, 2), PAIR_ROW(prefix, 3), PAIR_ROW(prefix, 4), \
     PAIR_ROW(prefix, 5), PAIR_ROW(prefix, 6)}
const pair_tile_fn pair_tiles[PAIR_MR][PAIR_NP] = PAIR_TABLE(pair_tile);
/* The same tiles on fp8 e4m3 weights (octavo_fp8_pair_gemm). */
typedef void (*fp8_pair_tile_fn)(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x,
                                 int64_t x_stride, const uint8_t *w, int64_t panel_stride,
                                 int64_t jump, int64_t pairs, const char *ahead,
                                 int64_t ahead_lines);
static const fp8_pair_tile_fn fp8_pair_tiles[PAIR_MR][PAIR_NP] = PAIR_TABLE(fp8_pair_tile);

/* silu(gate) * up for the tile's gate sums (its lower half of panels) and up sums (the
 * upper half), each stored to bf16 first as the GEMM's output would be, then as
 * octavo_silu_and_mul computes it; `cols` of the gate columns exist. */
static void pair_tile_store_silu(bf16 *y, int64_t y_stride,
                                 float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const float *gate_bias,
                                 const float *up_bias, int mr, int np, int64_t cols) {
    int64_t half = np / 2 * PAIR_PANEL;
    bf16 gate[PAIR_MR][PAIR_NP / 2 * PAIR_PANEL], up[PAIR_MR][PAIR_NP / 2 * PAIR_PANEL];
    pair_tile_store(&gate[0][0], PAIR_NP / 2 * PAIR_PANEL, sums, NULL, gate_bias, mr, half);
    pair_tile_store(&up[0][0], PAIR_NP / 2 * PAIR_PANEL,
                    (const float (*)[PAIR_NP * PAIR_PANEL])(sums[0] + half), NULL, up_bias, mr,
                    half);
    for (int r = 0; r < mr; r++) silu_mul_row(y + r * y_stride, gate[r], up[r], cols);
}

/* Asks for the cache lines a tile's output rows (mr rows of `bytes`, `stride` elements apart)
 * will be stored to, for writing, before the tile's long loop: else its stores would each
 * wait for its line to come from memory at the end of it. */
static inline void prefetch_tile_output(const bf16 *y, int64_t stride, int mr, int64_t bytes) {
    for (int r = 0; r < mr; r++) {
        uintptr_t start = (uintptr_t)(y + r * stride), end = start + bytes - 1;
        for (uintptr_t line = start & ~(uintptr_t)63; line <= end; line += 64)
            _m_prefetchw((void *)line);
    }
}

/* Where tile i of `tiles` asks the memory for its share of the next panel group (`lines`
 * cache lines from `ahead`; fused, as many again from `ahead_up`, the up panels', shared out
 * after the gate's), and how many lines (*count, at most `pairs`: one a step of its loop). */
static const char *ahead_share(const char *ahead, const char *ahead_up, int64_t lines,
                               int64_t i, int64_t tiles, int64_t pairs, int64_t *count) {
    int64_t total = ahead_up ? 2 * lines : lines;
    int64_t from = total * i / tiles, to = total * (i + 1) / tiles;
    if (ahead_up && from >= lines) { /* the up panels' share */
        ahead = ahead_up;
        from -= lines;
        to -= lines;
    }
    to = to < lines ? to : lines;
    *count = to - from < pairs ? to - from : pairs;
    return ahead + 64 * from;
}

/* The pair GEMM over `panels` output panels of `packed`: with up == 0 y = x W^T (+ bias),
 * [rows, out]; with up > 0 (the fused gate/up projection) panels p < `panels` are the gate's
 * and p + up the up's, and y = silu(gate) * up, [rows, out] with out = 16 * panels. Each
 * thread owns a contiguous range of (gate) panels; in groups of up to PAIR_NP panels (half
 * gate, half up when fused) its tiles of PAIR_MR rows pass over a chunk of rows. With fp8
 * (up == 0 only) the weights are fp8 e4m3 bytes laid out as the bf16 pairs, and each output
 * column is multiplied by its `scale` before the bias. */
static void pair_gemm_panels(bf16 *y, const bf16 *x, int64_t x_stride, const void *packed,
                             const float *scale, const float *bias, int64_t rows, int64_t out,
                             int64_t in, int64_t panels, int64_t up, int fp8) {
    int64_t pairs = in / 2, panel_stride = pairs * 2 * PAIR_PANEL;
    const char *weights = packed;
    const int64_t bytes = fp8 ? 1 : sizeof(bf16); /* a weight's */
    int group = up ? PAIR_NP / 2 : PAIR_NP; /* panels of y a group writes */
    /* Rows whose inputs stay in L2 while every panel of the thread passes over them: many
     * rows of a prefill would otherwise come from memory once per panel group. */
    int64_t chunk = PAIR_CHUNK_BYTES / (2 * in) / PAIR_MR * PAIR_MR;
    chunk = chunk < PAIR_MR ? PAIR_MR : chunk;
#pragma omp parallel if (rows * out * in * (up ? 2 : 1) >= PARALLEL_MIN)
    {
        int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t first = panels * t / threads, end = panels * (t + 1) / threads;
        float sums[PAIR_MR][PAIR_NP * PAIR_PANEL];
        /* fp8 weights under more than one tile of rows are widened to bf16 once per group of
         * panels and chunk of rows, here, for the bf16 tiles to read: else every tile of
         * PAIR_MR rows would widen them again. Under one tile (decode), or without the
         * memory, the fp8 tiles widen them as they load. */
        bf16 *wide = fp8 && rows > PAIR_MR ? octavo_alloc(sizeof(bf16) * PAIR_NP * panel_stride)
                                           : NULL;
        for (int64_t m0 = 0; m0 < rows; m0 += chunk) {
            int64_t m_end = rows - m0 < chunk ? rows : m0 + chunk;
            int64_t tiles = (m_end - m0 + PAIR_MR - 1) / PAIR_MR;
            for (int64_t p = first; p < end; p += group) {
                int np = (int)(end - p < group ? end - p : group);
                int widened = wide != NULL && tiles > 1;
                if (widened)
                    widen_fp8(wide, (const uint8_t *)weights + p * panel_stride, np * panel_stride);
                int64_t cols = out - p * PAIR_PANEL;
                cols = cols < np * PAIR_PANEL ? cols : np * PAIR_PANEL;
                /* The panels this thread multiplies next, which its tiles here ask the memory
                 * for a share each: else the first tile of every group would wait for its
                 * weights. Fused, the gate's share first and then the up's. */
                int64_t next = p + group < end ? p + group : first;
                int64_t next_np = end - next < group ? end - next : group;
                int more = p + group < end || m_end < rows;
                int64_t lines = more ? next_np * panel_stride * bytes / 64 : 0;
                const char *ahead = weights + next * panel_stride * bytes;
                const char *ahead_up = up ? weights + (next + up) * panel_stride * bytes : NULL;
                for (int64_t m = m0, i = 0; m < m_end; m += PAIR_MR, i++) {
                    int mr = (int)(m_end - m < PAIR_MR ? m_end - m : PAIR_MR);
                    int64_t count;
                    const char *pf = ahead_share(ahead, ahead_up, lines, i, tiles, pairs, &count);
                    const bf16 *x_tile = x + m * x_stride;
                    const char *w = widened ? (const char *)wide
                                            : weights + p * panel_stride * bytes;
                    prefetch_tile_output(y + m * out + p * PAIR_PANEL, out, mr,
                                         cols * (int64_t)sizeof(bf16));
                    if (!up) {
                        if (fp8 && !widened)
                            fp8_pair_tiles[mr - 1][np - 1](sums, x_tile, x_stride,
                                                           (const uint8_t *)w, panel_stride, 0,
                                                           pairs, pf, count);
                        else
                            pair_tiles[mr - 1][np - 1](sums, x_tile, x_stride, (const bf16 *)w,
                                                       panel_stride, 0, pairs, pf, count);
                        pair_tile_store(y + m * out + p * PAIR_PANEL, out, sums,
                                        scale ? scale + p * PAIR_PANEL : NULL,
                                        bias ? bias + p * PAIR_PANEL : NULL, mr, cols);
                        continue;
                    }
                    pair_tiles[mr - 1][2 * np - 1](sums, x_tile, x_stride, (const bf16 *)w,
                                                   panel_stride,
                                                   (up - np) * panel_stride, pairs, pf, count);
                    pair_tile_store_silu(y + m * out + p * PAIR_PANEL, out, sums,
                                         bias ? bias + p * PAIR_PANEL : NULL,
                                         bias ? bias + (p + up) * PAIR_PANEL : NULL, mr, 2 * np,
                                         cols);
                }
            }
        }
        free(wide);
    }
}

/* x: [rows, in] with rows x_stride apart, in even; y: [rows, out] contiguous; bias: fp32,
 * padded to whole panels, or NULL. */
int octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                     const float *bias, int64_t rows, int64_t out, int64_t in) {
    pair_gemm_panels(y, x, x_stride, packed, NULL, bias, rows, out, in,
                     (out + PAIR_PANEL - 1) / PAIR_PANEL, 0, 0);
    return OCTAVO_OK;
}

/* octavo_pair_gemm on fp8 e4m3 weights (an fp8 checkpoint's, vLLM's `fp8`), packed as the
 * bf16 pairs are but a byte each; y = (x W^T) * scale + bias, scale and bias fp32 per output
 * column, padded to whole panels (bias NULL: none). The weights stream at half the bf16
 * copy's bytes and widen to bf16 in registers, exactly: the products are the bf16 GEMM's on
 * the dequantized weight, the scale applied to the sums. */
int octavo_fp8_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const void *packed,
                         const float *scale, const float *bias, int64_t rows, int64_t out,
                         int64_t in) {
    pair_gemm_panels(y, x, x_stride, packed, scale, bias, rows, out, in,
                     (out + PAIR_PANEL - 1) / PAIR_PANEL, 0, 1);
    return OCTAVO_OK;
}

/* y = silu(gate) * up, [rows, d], for a gate/up projection packed as one pair GEMM weight of
 * 2 * d outputs (the gate's d, then the up's; d a multiple of PAIR_PANEL): the projection's
 * output never goes to memory, and no second pass reads it back. Each product rounds as
 * octavo_pair_gemm then octavo_silu_and_mul would. */
int octavo_pair_gemm_silu(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                          const float *bias, int64_t rows, int64_t d, int64_t in) {
    pair_gemm_panels(y, x, x_stride, packed, NULL, bias, rows, d, in, d / PAIR_PANEL,
                     d / PAIR_PANEL, 0);
    return OCTAVO_OK;
}
#else
int octavo_pair_gemm_available(void) { return 0; }

int octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                     const float *bias, int64_t rows, int64_t out, int64_t in) {
    return OCTAVO_ERR_NEEDS_AVX512_BF16;
}

int octavo_pair_gemm_silu(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                          const float *bias, int64_t rows, int64_t d, int64_t in) {
    return OCTAVO_ERR_NEEDS_AVX512_BF16;
}

int octavo_fp8_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const void *packed,
                         const float *scale, const float *bias, int64_t rows, int64_t out,
                         int64_t in) {
    return OCTAVO_ERR_NEEDS_AVX512_BF16;
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
    for (int64_t r = 0; r < rows; r++)
        silu_mul_row(out + r * d, x + r * x_stride, x + r * x_stride + d, d);
}

/* Rotary embedding in place on `heads` vectors of head_dim per token (x: [tokens, heads,
 * head_dim], rows `stride` apart): x * cos + rotate_half(x) * sin with `sin` already signed
 * (-sin on the first half), as octavo.models.layers.rotary computes it: each product and the
 * sum rounded to bf16. cos/sin: [tokens, head_dim]. */
static void rope_rows(bf16 *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
                      const bf16 *cos, const bf16 *sin) {
    int64_t half = head_dim / 2;
#pragma omp parallel for if (tokens * heads * head_dim >= PARALLEL_MIN) schedule(static)
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
