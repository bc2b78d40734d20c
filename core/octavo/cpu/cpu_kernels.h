/* What the CPU kernels' sources share inside the library: the interface (octavo_cpu.h), bf16
 * conversions rounded as PyTorch rounds, checked allocation, the pair GEMM's register tiles,
 * and the threshold below which work stays on one thread. See octavo/cpu/kernels.py for why
 * the kernels exist and octavo/cpu/kernel_build.py for how they are built. */
#ifndef OCTAVO_CPU_KERNELS_H
#define OCTAVO_CPU_KERNELS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "octavo_cpu.h"

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

/* ggml's type numbers (GGMLQuantizationType) of the types served here. */
enum {
    GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
    GGML_IQ4_NL = 20,
};
/* A GGUF block's little-endian fp16 field. */
static inline float fp16_to_fp32(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* The 6-bit scale and min of sub-block j of Q4_K/Q5_K's 12 packed bytes. */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Rows of activations one call of a quantized decode kernel takes: it is compiled once per
 * row count up to this (its accumulators unrolled into registers), and more rows, up to
 * QUANT_DECODE_ROWS, go through it in groups. Four keeps the build a few seconds shorter. */
#define QUANT_GROUP_ROWS 4

/* How far ahead of the block they decode the quantized kernels ask for the weight bytes:
 * on this VM the hardware prefetcher leaves a single stream at a fraction of the memory's
 * bandwidth, and each thread streams its own run of rows. */
#define QUANT_PREFETCH_BYTES 1024

/* Work below this many elements runs on one thread: waking the others costs more. */
#define PARALLEL_MIN 32768

/* malloc, but NULL only when out of memory (malloc(0) may return NULL too). Every kernel
 * checks what it gets and returns OCTAVO_ERR_NO_MEMORY instead of using a NULL. */
static inline void *octavo_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* Records, from any thread of a parallel region, that the call failed for lack of memory:
 * a thread whose scratch is missing still reaches every worksharing loop of the region (each
 * ends at a barrier) but skips its iterations, and the kernel returns the failure after it. */
static inline void octavo_fail(int *failed) {
#pragma omp atomic write
    *failed = 1;
}

#ifdef __AVX512F__
/* 16 fp32 values rounded to bf16 as f2bf rounds them. */
static inline __m256i round_bf16x16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

/* 16 bf16 values (the lanes of a __m256i) as fp32. */
static inline __m512 bf16x16_to_fp32(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e^x in 16 lanes, x clamped to [-100, 88]: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two
 * parts, so r is exact to fp32), e^r by its Taylor series to r^6 (error < 2e-7 of the
 * result), times 2^n. Inline, where glibc's vector expf is a library call per 16 lanes: the
 * softmax of the attention kernels runs on it. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-100.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

#ifdef __AVX512BF16__
/* The pair GEMM's tiles (cpu_ops.c): pair_tiles[mr - 1][np - 1] writes, for mr <= PAIR_MR
 * rows of x (bf16, rows x_stride apart, inputs in pairs) and np <= PAIR_NP panels of
 * PAIR_PANEL columns of w (packed as bf16 pairs, panels panel_stride apart), the fp32 sums
 * over `pairs` input pairs into sums[r][PAIR_PANEL * p + j], and meanwhile asks the memory
 * for the ahead_lines (<= pairs) cache lines from `ahead` into L2, one line a pair. The
 * panels of the tile's upper half (p >= np / 2) lie `jump` elements further on: 0 for
 * evenly spaced panels, more to pair gate panels with their up panels. */
#define PAIR_MR 6
#define PAIR_NP 4
typedef void (*pair_tile_fn)(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x,
                             int64_t x_stride, const bf16 *w, int64_t panel_stride,
                             int64_t jump, int64_t pairs, const char *ahead,
                             int64_t ahead_lines);
extern const pair_tile_fn pair_tiles[PAIR_MR][PAIR_NP];
#endif

#endif
