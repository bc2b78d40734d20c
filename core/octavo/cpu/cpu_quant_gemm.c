/* The many-row product on GGUF blocks (a W1 decode step of 9+ requests, a chunked prefill):
 * y [m][out] = x [m][in] @ w.T with AVX512-VNNI, for Q4_0, Q4_1, Q8_0, Q4_K and Q6_K.
 *
 * Why: the decode kernels (cpu_quant.c, cpu_quant_q8.c) take one weight row at a time and
 * apply each block's scale per row of x, a few instructions per 32 multiply-adds; fine for
 * the 1..8 rows of a memory-bound decode step, but with more rows the arithmetic is what
 * costs, and dequantizing panels to bf16 for torch's matmul (the former path) costs as much
 * again as the bf16 product it feeds. Here, as in llama.cpp's repacked CPU kernels, the
 * lanes are output rows: 16 weight rows' block of 32 values is gathered once into eight
 * registers (register j: values 4j..4j+3 of each row, as int8), and every row of x
 * (quantized once per call to int8 per 32 values, llama.cpp's Q8_0, stored as u8 = q + 128
 * for vpdpbusd) takes it in eight vpdpbusd (512 multiply-adds) on its four bytes broadcast,
 * then one scale per 16 values (Q6_K) or 32 (the rest). The +128 shift is taken back by the
 * weights' own sums (128 * sum(w), computed once per block, not per row). A block's min
 * (Q4_1, Q4_K) adds min * sum(x) over the block in fp32.
 *
 * The result carries the activations' rounding (at most max|x| / 254 per value of a block),
 * as the Q8 decode kernel's and llama.cpp's do; the weights' integers and scales are the
 * file's exactly. */
#include <math.h>
#include <string.h>
#include <omp.h>

#include "cpu_kernels.h"

#define QK 32
#define LANES 16 /* weight rows per panel: one int32 / fp32 lane each */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAVE_GEMM_Q8 1
#else
#define HAVE_GEMM_Q8 0
#endif

int octavo_quant_gemm_q8_available(int ggml_type) {
    return HAVE_GEMM_Q8 && (ggml_type == GGML_Q4_0 || ggml_type == GGML_Q4_1 ||
                            ggml_type == GGML_Q8_0 || ggml_type == GGML_Q4_K ||
                            ggml_type == GGML_Q6_K);
}

#if HAVE_GEMM_Q8
/* One block of 32 values of 16 weight rows: w[j] holds values 4j..4j+3 of each row (lane
 * o: row o's four int8), d_lo / d_hi the scale of values 0..15 / 16..31 (equal but for
 * Q6_K), mn the row's block minimum (0 for the types without one). */
typedef struct {
    __m512i w[8];
    __m512i base_lo, base_hi; /* unshift of values 0..15 and 16..31, or of all 32 in base_lo */
    _Alignas(64) float d_lo[LANES];
    _Alignas(64) float d_hi[LANES];
    _Alignas(64) float mn[LANES];
} panel_block;

/* Where the 16 rows start, and which exist (the last panel of an out not a multiple of 16). */
typedef struct {
    const uint8_t *rows;
    int64_t row_bytes;
    __m512i offsets; /* o * row_bytes */
    __mmask16 valid;
    int count;
} panel_rows;

/* The dword at byte offset `at` of each valid row (0 in the others). */
static inline __m512i gather(const panel_rows *p, int64_t at) {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), p->valid, p->offsets,
                                       p->rows + at, 1);
}

static inline __m512i nibbles(__m512i v, int high) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    return _mm512_and_si512(high ? _mm512_srli_epi32(v, 4) : v, mask);
}

/* The legacy types' fp16 d (and Q4_1's m after it) at the block's start, 16 rows at once. */
static inline void legacy_scales(const panel_rows *p, int64_t block_at, int with_min,
                                 panel_block *pb) {
    const __m512i g = gather(p, block_at);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
    _mm512_store_ps(pb->d_lo, d);
    _mm512_store_ps(pb->d_hi, d);
    _mm512_store_ps(pb->mn, with_min ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                                           _mm512_srli_epi32(g, 16)))
                                     : _mm512_setzero_ps());
}

/* Q4_0 (offset 8, no min) and Q4_1: qs[16] at qs_at, value l low nibble of byte l, value
 * 16 + l its high nibble. */
static void fill_q4_legacy(const panel_rows *p, int64_t block_at, int64_t qs_at, int offset,
                           panel_block *pb) {
    const __m512i eight = _mm512_set1_epi8((char)offset);
    for (int j = 0; j < 4; j++) {
        const __m512i g = gather(p, block_at + qs_at + 4 * j);
        pb->w[j] = _mm512_sub_epi8(nibbles(g, 0), eight);
        pb->w[j + 4] = _mm512_sub_epi8(nibbles(g, 1), eight);
    }
    legacy_scales(p, block_at, qs_at == 4, pb);
}

static void fill_q8_0(const panel_rows *p, int64_t block_at, panel_block *pb) {
    for (int j = 0; j < 8; j++) pb->w[j] = gather(p, block_at + 2 + 4 * j);
    legacy_scales(p, block_at, 0, pb);
}

/* Q4_K super-block (fp16 d, fp16 dmin, scales[12], qs[128]), its sub-block `sub` of 32:
 * the nibbles (low for even sub, high for odd) of qs[32 * (sub / 2) ..], w = d sc q - dmin m. */
static void fill_q4_k(const panel_rows *p, int64_t super_at, int sub, panel_block *pb) {
    for (int j = 0; j < 8; j++)
        pb->w[j] = nibbles(gather(p, super_at + 16 + 32 * (sub / 2) + 4 * j), sub & 1);
    for (int o = 0; o < LANES; o++) {
        const uint8_t *b = p->rows + o * p->row_bytes + super_at;
        int sc = 0, mn = 0;
        if (o < p->count) scale_min_k4(sub, b + 4, &sc, &mn);
        const int ok = o < p->count;
        pb->d_lo[o] = pb->d_hi[o] = ok ? fp16_to_fp32(b) * (float)sc : 0.0f;
        pb->mn[o] = ok ? -fp16_to_fp32(b + 2) * (float)mn : 0.0f;
    }
}

/* Q6_K super-block (ql[128], qh[64], int8 scales[16], fp16 d), its block `blk` of 32 (half
 * blk / 4 of 128 values, quarter kk = blk % 4): low 4 bits from ql (low nibbles for kk < 2),
 * the high 2 from qh at bit 2 kk, minus 32; scales per 16 values. */
static void fill_q6_k(const panel_rows *p, int64_t super_at, int blk, panel_block *pb) {
    const int half = blk / 4, kk = blk % 4;
    const int64_t ql = super_at + 64 * half + 32 * (kk & 1), qh = super_at + 128 + 32 * half;
    const __m512i three = _mm512_set1_epi8(3), bias = _mm512_set1_epi8(32);
    for (int j = 0; j < 8; j++) {
        const __m512i low = nibbles(gather(p, ql + 4 * j), kk >= 2);
        const __m512i high = _mm512_and_si512(
            _mm512_srli_epi32(gather(p, qh + 4 * j), (unsigned)(2 * kk)), three);
        pb->w[j] = _mm512_sub_epi8(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), bias);
    }
    for (int o = 0; o < LANES; o++) {
        const uint8_t *b = p->rows + o * p->row_bytes + super_at;
        const int ok = o < p->count;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * half + 2 * kk;
        const float d = ok ? fp16_to_fp32(b + 208) : 0.0f;
        pb->d_lo[o] = d * (float)(ok ? sc[0] : 0);
        pb->d_hi[o] = d * (float)(ok ? sc[1] : 0);
        pb->mn[o] = 0.0f;
    }
}

/* Block b (of 32 values) of the panel's rows, whichever the type. */
static void fill_block(int type, const panel_rows *p, int64_t b, panel_block *pb) {
    switch (type) {
    case GGML_Q4_0: fill_q4_legacy(p, b * 18, 2, 8, pb); break;
    case GGML_Q4_1: fill_q4_legacy(p, b * 20, 4, 0, pb); break;
    case GGML_Q8_0: fill_q8_0(p, b * 34, pb); break;
    case GGML_Q4_K: fill_q4_k(p, b / 8 * 144, (int)(b % 8), pb); break;
    default: fill_q6_k(p, b / 8 * 210, (int)(b % 8), pb); break;
    }
}

/* x [m][in] as Q8 blocks of 32: xu = round(x / dx) + 128 as u8, dx = max|x| / 127, and
 * sx the block's sum of x (for the minima). */
typedef struct {
    uint8_t *xu;
    float *dx, *sx;
} q8_acts;

static void quantize_acts(const float *x, int64_t blocks, q8_acts *a) {
    for (int64_t b = 0; b < blocks; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f, sum = 0.0f;
        for (int i = 0; i < QK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            sum += xb[i];
        }
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < QK; i++) a->xu[b * QK + i] = (uint8_t)(lrintf(xb[i] * id) + 128);
        a->dx[b] = amax / 127.0f;
        a->sx[b] = sum;
    }
}

/* -128 * the sum of w[first..first + count) per lane: the u8 shift of x taken back. */
static inline __m512i unshift(const __m512i *w, int first, int count) {
    __m512i s = _mm512_setzero_si512();
    for (int j = first; j < first + count; j++)
        s = _mm512_dpbusd_epi32(s, _mm512_set1_epi8(1), w[j]);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 7));
}

/* The block's dot products with rows x0..x0 + R of x: R accumulators in registers, the
 * block's registers loaded once for all R. split: two scales per block (Q6_K). */
#define TILE_ROWS 8

static inline __attribute__((always_inline)) void tile_rows(
    const panel_block *panel, const q8_acts *a, int64_t r0, const int rows, int64_t nb,
    const int split, const int has_min, float *y, int64_t out, __mmask16 valid) {
    __m512 acc[TILE_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const panel_block *pb = panel + b;
        const __m512 d_lo = _mm512_load_ps(pb->d_lo), d_hi = _mm512_load_ps(pb->d_hi);
        for (int r = 0; r < rows; r++) {
            const int64_t i = (r0 + r) * nb + b;
            const int32_t *xr = (const int32_t *)(a->xu + i * QK);
            __m512i lo = pb->base_lo, hi = split ? pb->base_hi : _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) { /* two chains: half the dependent latency */
                lo = _mm512_dpbusd_epi32(lo, _mm512_set1_epi32(xr[j]), pb->w[j]);
                hi = _mm512_dpbusd_epi32(hi, _mm512_set1_epi32(xr[j + 4]), pb->w[j + 4]);
            }
            const __m512 f = split ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d_hi,
                                                     _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d_lo))
                                   : _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)),
                                                   d_lo);
            acc[r] = _mm512_fmadd_ps(f, _mm512_set1_ps(a->dx[i]), acc[r]);
            if (has_min)
                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(pb->mn), _mm512_set1_ps(a->sx[i]),
                                         acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(y + (r0 + r) * out, valid, acc[r]);
}

/* tile_rows for 1..TILE_ROWS rows and a type's kind (split, has_min), all constants. */
#define TILE(SPLIT, MIN, R)                                                                \
    static void tile_##SPLIT##MIN##_##R(const panel_block *panel, const q8_acts *a,        \
                                         int64_t r0, int64_t nb, float *y, int64_t out,    \
                                         __mmask16 valid) {                                \
        tile_rows(panel, a, r0, R, nb, SPLIT, MIN, y, out, valid);                         \
    }
#define TILES(SPLIT, MIN) TILE(SPLIT, MIN, 1) TILE(SPLIT, MIN, 2) TILE(SPLIT, MIN, 3)      \
    TILE(SPLIT, MIN, 4) TILE(SPLIT, MIN, 5) TILE(SPLIT, MIN, 6) TILE(SPLIT, MIN, 7)        \
    TILE(SPLIT, MIN, 8)                                                                    \
    static const tile_fn tiles_##SPLIT##MIN[TILE_ROWS + 1] = {                             \
        NULL, tile_##SPLIT##MIN##_1, tile_##SPLIT##MIN##_2, tile_##SPLIT##MIN##_3,         \
        tile_##SPLIT##MIN##_4, tile_##SPLIT##MIN##_5, tile_##SPLIT##MIN##_6,               \
        tile_##SPLIT##MIN##_7, tile_##SPLIT##MIN##_8};
typedef void (*tile_fn)(const panel_block *panel, const q8_acts *a, int64_t r0, int64_t nb,
                        float *y, int64_t out, __mmask16 valid);
TILES(0, 0)
TILES(0, 1)
TILES(1, 0)

/* y's 16 columns of panel p: its every block filled once into `panel` (nb blocks), then
 * every row of x against them, TILE_ROWS rows at a time. */
static void panel_product(int type, const panel_rows *p, const q8_acts *a, int64_t m,
                          int64_t nb, panel_block *panel, float *y, int64_t out) {
    const int split = type == GGML_Q6_K;
    for (int64_t b = 0; b < nb; b++) {
        panel_block *pb = panel + b;
        /* 16 rows at once are more streams than the hardware prefetcher follows */
        const int64_t ahead = b * p->row_bytes / nb + QUANT_PREFETCH_BYTES / 4;
        for (int o = 0; o < p->count; o++)
            _mm_prefetch((const char *)p->rows + o * p->row_bytes + ahead, _MM_HINT_T0);
        fill_block(type, p, b, pb);
        pb->base_lo = unshift(pb->w, 0, split ? 4 : 8);
        pb->base_hi = split ? unshift(pb->w, 4, 4) : _mm512_setzero_si512();
    }
    const tile_fn *tiles = split ? tiles_10 : type == GGML_Q4_1 || type == GGML_Q4_K ? tiles_01
                                                                                    : tiles_00;
    for (int64_t r0 = 0; r0 < m; r0 += TILE_ROWS) {
        const int64_t rows = m - r0 < TILE_ROWS ? m - r0 : TILE_ROWS;
        tiles[rows](panel, a, r0, nb, y, out, p->valid);
    }
}
#endif

int octavo_quant_gemm_q8(float *y, const float *x, int64_t m, const void *blocks,
                         int ggml_type, int64_t out, int64_t in) {
    const int64_t row_bytes = octavo_quant_row_bytes(ggml_type, in);
    if (!octavo_quant_gemm_q8_available(ggml_type) || row_bytes == 0 || m < 1 || out < 1 ||
        row_bytes * LANES > INT32_MAX)
        return OCTAVO_ERR_BAD_QUANT;
#if HAVE_GEMM_Q8
    const int64_t nb = in / QK;
    q8_acts a = {octavo_alloc((size_t)(m * in)), octavo_alloc((size_t)(m * nb) * sizeof(float)),
                 octavo_alloc((size_t)(m * nb) * sizeof(float))};
    int failed = !a.xu || !a.dx || !a.sx;
    if (!failed) quantize_acts(x, m * nb, &a);
    const int64_t panels = (out + LANES - 1) / LANES;
#pragma omp parallel if (!failed && m * out * in >= PARALLEL_MIN)
    {
        panel_block *panel =
            failed ? NULL : aligned_alloc(64, (size_t)nb * sizeof(panel_block));
        if (panel == NULL) octavo_fail(&failed);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < panels; i++) {
            if (panel == NULL) continue;
            const int count = out - i * LANES < LANES ? (int)(out - i * LANES) : LANES;
            const __m512i lanes =
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            const panel_rows p = {(const uint8_t *)blocks + i * LANES * row_bytes, row_bytes,
                                  _mm512_mullo_epi32(lanes, _mm512_set1_epi32((int)row_bytes)),
                                  (__mmask16)((1u << count) - 1), count};
            panel_product(ggml_type, &p, &a, m, nb, panel, y + i * LANES, out);
        }
        free(panel);
    }
    free(a.xu);
    free(a.dx);
    free(a.sx);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
#else
    (void)y, (void)x, (void)blocks;
    return OCTAVO_ERR_BAD_QUANT;
#endif
}
