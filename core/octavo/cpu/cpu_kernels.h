/* What the CPU kernels (cpu_ops.c, cpu_attention.c) share: bf16 conversions rounded as
 * PyTorch rounds, the pair GEMM's register tiles, and the threshold below which work stays on
 * one thread. See octavo/cpu/kernels.py for why and how the kernels are built. */
#ifndef OCTAVO_CPU_KERNELS_H
#define OCTAVO_CPU_KERNELS_H

#include <stdint.h>
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

/* Work below this many elements runs on one thread: waking the others costs more. */
#define PARALLEL_MIN 32768

#ifdef __AVX512F__
/* 16 fp32 values rounded to bf16 as f2bf rounds them. */
static inline __m256i round_bf16x16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}
#endif

#ifdef __AVX512BF16__
/* The pair GEMM's tiles (cpu_ops.c): pair_tiles[mr - 1][np - 1] writes, for mr <= PAIR_MR
 * rows of x (bf16, rows x_stride apart, inputs in pairs) and np <= PAIR_NP panels of
 * PAIR_PANEL columns of w (packed as bf16 pairs, panels panel_stride apart), the fp32 sums
 * over `pairs` input pairs into sums[r][PAIR_PANEL * p + j]. */
#define PAIR_MR 6
#define PAIR_NP 4
#define PAIR_PANEL 16
typedef void (*pair_tile_fn)(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x,
                             int64_t x_stride, const bf16 *w, int64_t panel_stride,
                             int64_t pairs);
extern const pair_tile_fn pair_tiles[PAIR_MR][PAIR_NP];
#endif

#endif
