/* Attention kernels for bf16 layers on the CPU, reading keys and values straight from the
 * paged KV cache ([2][num_slots][kv_heads * head_dim]: keys, then values; see
 * octavo/cpu/attention.py for when each runs). They round where PyTorch's CPU flash attention
 * rounds bf16: scores and softmax sums in fp32, the exponentials rounded to bf16 for the
 * weighted sum of values, which accumulates in fp32 and is rounded to bf16 at the end.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

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

