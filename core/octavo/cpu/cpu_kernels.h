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

/* 16 bf16 values (the lanes of a __m256i) as fp32. */
static inline __m512 bf16x16_to_fp32(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e^x in 16 lanes, x clamped to [-100, 88]: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two
 * parts, so r is exact to fp32), e^r by its Taylor series to r^6 (error < 2e-7 of the
 * result), times 2^n. Inline, where glibc's vector expf is a library call per 16 lanes: the
 * softmax of the attention kernels runs on it (prefill attention at W1's chunk of 16 prompts
 * of 256 tokens: 8.1 -> 6.5 ms a layer, with the softmax's other loops made explicit). */
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
#define PAIR_PANEL 16
typedef void (*pair_tile_fn)(float sums[PAIR_MR][PAIR_NP * PAIR_PANEL], const bf16 *x,
                             int64_t x_stride, const bf16 *w, int64_t panel_stride,
                             int64_t jump, int64_t pairs, const char *ahead,
                             int64_t ahead_lines);
extern const pair_tile_fn pair_tiles[PAIR_MR][PAIR_NP];
#endif

/* The kernels octavo_decode_layer (cpu_layer.c) runs in turn: cpu_ops.c's and
 * cpu_attention.c's entry points. */
void octavo_rms_norm(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *weight,
                     int64_t rows, int64_t dim, int64_t x_stride, int64_t res_stride, float eps);
void octavo_silu_and_mul(bf16 *out, const bf16 *x, int64_t rows, int64_t d, int64_t x_stride);
void octavo_pair_gemm_silu(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                           const float *bias, int64_t rows, int64_t d, int64_t in);
void octavo_rope(bf16 *q, bf16 *k, const bf16 *cos, const bf16 *sin, int64_t tokens,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                 int64_t k_stride);
void octavo_write_kv(bf16 *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                     const int64_t *slot_mapping, int64_t tokens, int64_t width,
                     int64_t key_stride, int64_t value_stride);
void octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                      const float *bias, int64_t rows, int64_t out, int64_t in);
void octavo_decode_attention(bf16 *out, const bf16 *q, const bf16 *cache, int64_t num_slots,
                             const int64_t *slots, const int64_t *seq_lens, int64_t batch,
                             int64_t max_len, int64_t num_heads, int64_t num_kv_heads,
                             int64_t head_dim, int64_t q_stride, float scale,
                             const float *prefix_m, const float *prefix_l,
                             const float *prefix_acc);
void octavo_prefix_attention(float *m, float *l, float *acc, const bf16 *q, int64_t q_stride,
                             int64_t batch, const bf16 *cache, int64_t num_slots,
                             const int64_t *prefix_slots, int64_t prefix_len, int64_t num_heads,
                             int64_t num_kv_heads, int64_t head_dim, float scale);

#endif
