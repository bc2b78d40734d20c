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
/* The same into the L2 cache only: for rows wanted further ahead, where more requests can be
 * in flight at once than the L1 cache holds. */
static inline void prefetch_row_l2(const bf16 *row, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) __builtin_prefetch(row + i, 0, 1);
}

/* The key and value rows of positions from .. to - 1 (at slot[...]) into L2. */
static inline void prefetch_kv_l2(const bf16 *keys, const bf16 *values, const int64_t *slot,
                                  int64_t from, int64_t to, int64_t width) {
    for (int64_t r = from; r < to; r++) {
        prefetch_row_l2(keys + slot[r] * width, width);
        prefetch_row_l2(values + slot[r] * width, width);
    }
}

/* The next decode row's key and value rows (this thread's next row), asked of the memory
 * into L2 a few at a time while this row computes: ~30% during its keys' pass, the rest
 * during its values' pass, which otherwise leaves the memory idle. Then the memory streams
 * through both passes instead of in bursts during the keys' pass alone. The next row's own
 * keys' pass still asks two blocks ahead, for what was evicted or not yet asked for. */
typedef struct {
    const bf16 *keys, *values;
    const int64_t *slot;
    int64_t len, width;
    int64_t next; /* cache rows asked for so far: the keys of positions 0..len-1, then values */
} row_fetch;

static inline void row_fetch_some(row_fetch *f, int n) {
    for (; n > 0 && f->next < 2 * f->len; n--, f->next++) {
        int64_t j = f->next < f->len ? f->next : f->next - f->len;
        prefetch_row_l2((f->next < f->len ? f->keys : f->values) + f->slot[j] * f->width,
                        f->width);
    }
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
    return bf16x16_to_fp32(_mm256_loadu_si256((const __m256i *)p));
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

#ifdef __AVX512BF16__
/* ---- Decode attention on bf16 pairs (AVX512-BF16, head_dim a multiple of 32) ----------
 *
 * Both products run vdpbf16ps straight on the cache's bf16 rows, with no fp32 copy of them:
 * scores as pair dot products of the bf16 query and key rows, scaled afterwards (as
 * PyTorch's flash attention scales q k^T), and the weighted sum of values two positions at
 * a time, the two value rows interleaved into pairs. That takes far fewer instructions
 * than widening every row to fp32, which leaves the fp32 path compute-bound at batched
 * decode shapes. */
#define PAIR_DECODE_MAX_DIM 256
/* The running max before any key: finite, as -ffast-math assumes no infinities. */
#define ATT_NO_MAX -1e30f

/* The softmax's weights over n fp32 scores: s[j] *= scale in place, m = the larger of *max
 * and every s[j], w[j] = e^(s[j] - m) rounded to bf16 and zeros from n to w_len, *max = m.
 * Returns the fp32 sum of the exponentials before their rounding. */
static float exp_weights(float *s, int64_t n, float scale, float *max, bf16 *w,
                         int64_t w_len) {
    __m512 factor = _mm512_set1_ps(scale), top = _mm512_set1_ps(*max);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), factor);
        _mm512_mask_storeu_ps(s + j, k, x);
        top = _mm512_mask_max_ps(top, k, top, x);
    }
    float m = _mm512_reduce_max_ps(top);
    __m512 sum = _mm512_setzero_ps(), shift = _mm512_set1_ps(m);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), shift));
        sum = _mm512_mask_add_ps(sum, k, sum, e);
        _mm256_mask_storeu_epi16(w + j, k, round_bf16x16(e));
    }
    for (int64_t j = n; j < w_len; j++) w[j] = 0;
    *max = m;
    return _mm512_reduce_add_ps(sum);
}

/* Scores of query heads q[0 .. hs) (one kv head: columns col.. of each cache row) against
 * the 16 key rows at slot[0 .. 16), into scores[h * max_len + j0 ...]. nz = head_dim / 32,
 * a constant where pair_scores16_n calls this, so the dot products unroll. */
static inline __attribute__((always_inline)) void pair_scores16(
    float *scores, int64_t max_len, int64_t j0, const bf16 *q, const bf16 *keys,
    const int64_t *slot, int64_t width, int64_t col, int64_t hs, int nz, float scale) {
    const bf16 *rows[16];
    for (int i = 0; i < 16; i++) rows[i] = keys + slot[i] * width + col;
    for (int64_t h = 0; h < hs; h++) {
        __m512bh qv[PAIR_DECODE_MAX_DIM / 32];
        for (int c = 0; c < nz; c++)
            qv[c] = (__m512bh)_mm512_loadu_si512(q + h * 32 * nz + 32 * c);
        __m512 dots[16];
        for (int i = 0; i < 16; i++) {
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < nz; c++)
                acc = _mm512_dpbf16_ps(acc, qv[c],
                                       (__m512bh)_mm512_loadu_si512(rows[i] + 32 * c));
            dots[i] = acc;
        }
        _mm512_storeu_ps(scores + h * max_len + j0,
                         _mm512_mul_ps(sum_lanes16(dots), _mm512_set1_ps(scale)));
    }
}

static void pair_scores16_n(float *scores, int64_t max_len, int64_t j0, const bf16 *q,
                            const bf16 *keys, const int64_t *slot, int64_t width, int64_t col,
                            int64_t hs, int nz, float scale) {
    switch (nz) {
    case 2: pair_scores16(scores, max_len, j0, q, keys, slot, width, col, hs, 2, scale); break;
    case 4: pair_scores16(scores, max_len, j0, q, keys, slot, width, col, hs, 4, scale); break;
    default: pair_scores16(scores, max_len, j0, q, keys, slot, width, col, hs, nz, scale);
    }
}

/* scores[h * max_len + j] = scale * (q_h . key of position j) for the `len` positions at
 * `slot`: 16 positions at a time (each key row read once, for all query heads), the rest one
 * by one. The key and value rows two blocks ahead are asked of the memory into L2 meanwhile,
 * a share before each kv head's block so the requests do not all come at once; the values'
 * pass then finds its rows in the cache. A share of the next row's rows is asked for here
 * too (`next`, see row_fetch). */
static void pair_score_context(float *scores, const bf16 *q, const bf16 *cache,
                               int64_t num_slots, const int64_t *slot, int64_t len,
                               int64_t max_len, int64_t width, int64_t num_heads,
                               int64_t group, int64_t head_dim, float scale, row_fetch *next) {
    int nz = (int)(head_dim / 32);
    int64_t j = 0;
    const bf16 *values = cache + num_slots * width;
    int64_t kv_heads = num_heads / group, blocks = len / 16 * kv_heads;
    /* ~30% of the next row's cache rows here, the rest in the values' pass */
    int share = blocks ? (int)((2 * next->len * 3 / 10 + blocks - 1) / blocks) : 0;
    prefetch_kv_l2(cache, values, slot, 0, len < 32 ? len : 32, width);
    for (; j + 16 <= len; j += 16) {
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            int64_t to = j + 32 + 16 * (kv + 1) / kv_heads;
            prefetch_kv_l2(cache, values, slot, j + 32 + 16 * kv / kv_heads, to < len ? to : len,
                           width);
            row_fetch_some(next, share);
            pair_scores16_n(scores + kv * group * max_len, max_len, j,
                            q + kv * group * head_dim, cache, slot + j, width, kv * head_dim,
                            group, nz, scale);
        }
    }
    for (; j < len; j++) {
        const bf16 *k = cache + slot[j] * width;
        for (int64_t h = 0; h < num_heads; h++) {
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < nz; c++)
                acc = _mm512_dpbf16_ps(
                    acc, (__m512bh)_mm512_loadu_si512(q + h * head_dim + 32 * c),
                    (__m512bh)_mm512_loadu_si512(k + (h / group) * head_dim + 32 * c));
            scores[h * max_len + j] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
}

/* acc[h * acc_stride ...] = sum over positions j of weight_h[j] * value row j, for hs <= 4
 * query heads of one kv head and 32 * nz (nz <= 2) columns from `col` of each value row.
 * weights: bf16, heads w_stride apart, with a 0 after an odd len. Two positions a step:
 * their rows interleaved by 16-bit unpacks within 128-bit lanes, so each 32 columns come
 * out as [16 "lo" sums | 16 "hi" sums] (pair_dim gives each one's column). */
static inline __attribute__((always_inline)) void pair_weigh(
    float *acc, int64_t acc_stride, const bf16 *weights, int64_t w_stride, const bf16 *values,
    const int64_t *slot, int64_t len, int64_t width, int64_t col, int nz, int hs,
    row_fetch *next) {
    __m512 sums[4][4];
    for (int h = 0; h < hs; h++)
        for (int c = 0; c < 2 * nz; c++) sums[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; j += 2) {
        row_fetch_some(next, 1);
        const bf16 *v0 = values + slot[j] * width + col;
        const bf16 *v1 = j + 1 < len ? values + slot[j + 1] * width + col : v0; /* weight 0 */
        __m512bh lo[2], hi[2];
        for (int c = 0; c < nz; c++) {
            __m512i a = _mm512_loadu_si512(v0 + 32 * c), b = _mm512_loadu_si512(v1 + 32 * c);
            lo[c] = (__m512bh)_mm512_unpacklo_epi16(a, b);
            hi[c] = (__m512bh)_mm512_unpackhi_epi16(a, b);
        }
        for (int h = 0; h < hs; h++) {
            int32_t pair;
            memcpy(&pair, weights + h * w_stride + j, sizeof(pair));
            __m512bh w = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < nz; c++) {
                sums[h][2 * c] = _mm512_dpbf16_ps(sums[h][2 * c], w, lo[c]);
                sums[h][2 * c + 1] = _mm512_dpbf16_ps(sums[h][2 * c + 1], w, hi[c]);
            }
        }
    }
    for (int h = 0; h < hs; h++)
        for (int c = 0; c < 2 * nz; c++)
            _mm512_storeu_ps(acc + h * acc_stride + 16 * c, sums[h][c]);
}

#define PAIR_WEIGH_CASE(nz, hs)                                                             \
    case (nz) * 8 + (hs):                                                                  \
        pair_weigh(acc, acc_stride, weights, w_stride, values, slot, len, width, col, nz, hs, \
                   next); \
        break;

static void pair_weigh_n(float *acc, int64_t acc_stride, const bf16 *weights,
                         int64_t w_stride, const bf16 *values, const int64_t *slot,
                         int64_t len, int64_t width, int64_t col, int nz, int hs,
                         row_fetch *next) {
    switch (nz * 8 + hs) {
        PAIR_WEIGH_CASE(1, 1) PAIR_WEIGH_CASE(1, 2) PAIR_WEIGH_CASE(1, 3) PAIR_WEIGH_CASE(1, 4)
        PAIR_WEIGH_CASE(2, 1) PAIR_WEIGH_CASE(2, 2) PAIR_WEIGH_CASE(2, 3) PAIR_WEIGH_CASE(2, 4)
    }
}

/* The column of sum s (0..31) of a 32-column piece of pair_weigh's output. */
static inline int64_t pair_dim(int64_t s) {
    int64_t t = s & 15;
    return 8 * (t >> 2) + (s >= 16 ? 4 : 0) + (t & 3);
}

/* One decode row's attention before the division by the sums (acc [heads, head_dim] in
 * column order, sums and maxes per head), on bf16 pairs. scores: [heads, max_len] fp32;
 * weights: bf16 [heads, max_len + 2]; piece: [heads * head_dim] fp32 scratch. */
static void pair_attend_row(float *acc, float *sums, float *maxes, float *scores,
                            bf16 *weights, float *piece, const bf16 *q, const bf16 *cache,
                            int64_t num_slots, const bf16 *values, const int64_t *slot,
                            int64_t len, const int64_t *next_slot, int64_t next_len,
                            int64_t max_len, int64_t width, int64_t num_heads,
                            int64_t group, int64_t head_dim, float scale) {
    int64_t w_stride = max_len + 2;
    row_fetch next = {cache, values, next_slot, next_len, width, 0};
    pair_score_context(scores, q, cache, num_slots, slot, len, max_len, width, num_heads, group,
                       head_dim, scale, &next);
    for (int64_t h = 0; h < num_heads; h++) { /* w[len] = 0: an odd last position's partner */
        maxes[h] = ATT_NO_MAX;
        sums[h] = exp_weights(scores + h * max_len, len, 1.0f, &maxes[h],
                              weights + h * w_stride, len + 1);
    }
    int hs;
    for (int64_t h0 = 0; h0 < num_heads; h0 += hs) {
        int64_t kv = h0 / group, group_end = (kv + 1) * group;
        hs = (int)(group_end - h0 < 4 ? group_end - h0 : 4);
        for (int64_t d = 0; d < head_dim; d += 64) {
            int nz = head_dim - d < 64 ? 1 : 2;
            pair_weigh_n(piece + h0 * head_dim + d, head_dim, weights + h0 * w_stride,
                         w_stride, values, slot, len, width, kv * head_dim + d, nz, hs,
                         &next);
        }
    }
    for (int64_t h = 0; h < num_heads; h++)
        for (int64_t s = 0; s < head_dim; s++)
            acc[h * head_dim + (s & ~(int64_t)31) + pair_dim(s & 31)] = piece[h * head_dim + s];
}
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

/* One decode row's attention before the division by the sums (acc [heads, head_dim], sums
 * and maxes per head), the keys and values widened to fp32: where AVX512-BF16 or a
 * head_dim the pair path takes is missing. scores: [heads, max_len]; scratch: 16 fp32
 * cache rows; qf: [heads * head_dim] fp32. */
static void fp32_attend_row(float *acc, float *sums, float *maxes, float *scores,
                            float *scratch, float *qf, const bf16 *q, const bf16 *cache,
                            const bf16 *values, const int64_t *slot, int64_t len,
                            int64_t max_len, int64_t width, int64_t num_heads, int64_t group,
                            int64_t head_dim, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < num_heads * head_dim; i++) qf[i] = bf2f(q[i]) * scale;
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
        maxes[h] = m;
    }
#if SCORE_BLOCK
    if (head_dim % 16 == 0)
        weigh_all_values(acc, scores, max_len, values, slot, len, width, num_heads, group,
                         head_dim);
    else
#endif
        weigh_values_portable(acc, scratch, scores, max_len, values, slot, len, width,
                              num_heads, group, head_dim);
}

/* Attention of one query token per request over its paged context, read straight from the
 * cache (no gathered copy). Request b attends positions 0..seq_lens[b]-1, whose slots are
 * slots[b * max_len + j]; query head h reads key/value head h / (heads / kv_heads). Each
 * cache row (all kv heads of one position) is read once, for all query heads. Rounded as
 * PyTorch's CPU flash attention rounds bf16: scores and exp(score - max) in fp32, the
 * exponentials rounded to bf16 for the weighted sum of values (accumulated in fp32), which
 * is divided by the fp32 sum of the exponentials and rounded to bf16 at the end.
 * q: [B, heads, head_dim], rows q_stride apart; out contiguous. With prefix_m (else NULL),
 * the positions given are what follows a prefix the rows share, whose part
 * octavo_prefix_attention computed: the two are merged before the division. */
int octavo_decode_attention(bf16 *out, const bf16 *q, const bf16 *cache, int64_t num_slots,
                            const int64_t *slots, const int64_t *seq_lens, int64_t batch,
                            int64_t max_len, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t q_stride, float scale,
                            const float *prefix_m, const float *prefix_l,
                            const float *prefix_acc) {
    int64_t group = num_heads / num_kv_heads;
    int64_t width = num_kv_heads * head_dim;
    int64_t qwidth = num_heads * head_dim;
    const bf16 *values = cache + num_slots * width;
    int64_t total = 0;
    for (int64_t b = 0; b < batch; b++) total += seq_lens[b];
    int failed = 0;
#pragma omp parallel if (total * width >= PARALLEL_MIN)
    {
        float *scores = octavo_alloc(sizeof(float) * num_heads * max_len);
        float *qf = octavo_alloc(sizeof(float) * qwidth);
        float *acc = octavo_alloc(sizeof(float) * qwidth);
        float *sums = octavo_alloc(sizeof(float) * num_heads);
        float *maxes = octavo_alloc(sizeof(float) * num_heads);
        float *scratch = octavo_alloc(sizeof(float) * 16 * width); /* fp32 cache rows */
        int ok = scores && qf && acc && sums && maxes && scratch;
#ifdef __AVX512BF16__
        int pairs = head_dim % 32 == 0 && head_dim <= PAIR_DECODE_MAX_DIM;
        bf16 *weights = pairs ? octavo_alloc(sizeof(bf16) * num_heads * (max_len + 2)) : NULL;
        float *piece = pairs ? octavo_alloc(sizeof(float) * qwidth) : NULL;
        ok = ok && (!pairs || (weights && piece));
        int64_t step = omp_get_num_threads(); /* rows b, b + step, ... are this thread's */
#endif
        if (!ok) octavo_fail(&failed);
#pragma omp for schedule(static, 1)
        for (int64_t b = 0; b < batch; b++) {
            if (!ok) continue;
            int64_t len = seq_lens[b];
            const int64_t *slot = slots + b * max_len;
#ifdef __AVX512BF16__
            if (pairs)
                pair_attend_row(acc, sums, maxes, scores, weights, piece, q + b * q_stride,
                                cache, num_slots, values, slot, len, slot + step * max_len,
                                b + step < batch ? seq_lens[b + step] : 0, max_len, width,
                                num_heads, group, head_dim, scale);
            else
#endif
                fp32_attend_row(acc, sums, maxes, scores, scratch, qf, q + b * q_stride, cache,
                                values, slot, len, max_len, width, num_heads, group, head_dim,
                                scale);
            bf16 *o = out + b * qwidth;
            for (int64_t h = 0; h < num_heads; h++) {
                float own = 1.0f, inv = 1.0f / sums[h];
                const float *shared = NULL;
                if (prefix_m) { /* merge with the shared prefix's part, rescaled to one max */
                    int64_t at = b * num_heads + h;
                    float top = prefix_m[at] > maxes[h] ? prefix_m[at] : maxes[h];
                    float theirs = expf(prefix_m[at] - top);
                    own = expf(maxes[h] - top);
                    inv = 1.0f / (sums[h] * own + prefix_l[at] * theirs);
                    own *= inv;
                    inv *= theirs; /* now the prefix output's weight */
                    shared = prefix_acc + at * head_dim;
                }
                if (shared) {
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++)
                        o[h * head_dim + d] = f2bf(acc[h * head_dim + d] * own + shared[d] * inv);
                } else {
#pragma omp simd
                    for (int64_t d = 0; d < head_dim; d++)
                        o[h * head_dim + d] = f2bf(acc[h * head_dim + d] * inv);
                }
            }
        }
        free(scores);
        free(qf);
        free(acc);
        free(sums);
        free(maxes);
        free(scratch);
#ifdef __AVX512BF16__
        free(weights);
        free(piece);
#endif
    }
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}


/* ---- Many queries over the same keys: prefill chunks and shared prefixes ----------------
 *
 * With AVX512-BF16 both products of attention run on the pair GEMM's tiles: the keys and
 * values a group of query rows sees are packed once per kv head (keys as 16-key panels of
 * bf16 pairs along head_dim, values as 16-dim panels of bf16 pairs along the keys), then
 * S = Q K^T and O += P V are pair GEMMs of up to ATT_ROWS query rows. An online softmax over
 * blocks of ATT_KEY_BLOCK keys - the block PyTorch's CPU flash attention uses - keeps the
 * scores of one block per row. head_dim must be a multiple of 16. */
#ifdef __AVX512BF16__
#define ATT_KEY_BLOCK 512
#define ATT_ROWS 48 /* query rows of a prompt chunk attended together: 8 tiles of 6 */
#define ATT_PREFIX_ROWS 18 /* decode rows attended together over a shared prefix: 3 tiles */
int octavo_attention_available(void) { return 1; }

/* One kv head's keys and values for `keys` positions, packed: the layout pair_tiles reads. */
typedef struct {
    bf16 *k; /* [ceil(keys / 16)][head_dim / 2][16][2] */
    bf16 *v; /* per block of ATT_KEY_BLOCK keys: [head_dim / 16][ATT_KEY_BLOCK / 2][16][2] */
    int64_t keys, head_dim;
} packed_kv;

static int64_t packed_k_elems(int64_t keys, int64_t head_dim) {
    return (keys + 15) / 16 * 16 * head_dim;
}

static int64_t packed_v_elems(int64_t keys, int64_t head_dim) {
    return (keys + ATT_KEY_BLOCK - 1) / ATT_KEY_BLOCK * ATT_KEY_BLOCK * head_dim;
}

/* Packs keys [first, end) of kv head `kv` (first a multiple of 16), whose cache rows are at
 * slot[...]: each 16-key panel gathered pair by pair, lanes past p->keys zero. */
static void pack_keys(packed_kv *p, const bf16 *cache, int64_t width, int64_t kv,
                      const int64_t *slot, int64_t first, int64_t end) {
    int64_t head_dim = p->head_dim, half = head_dim / 2, keys = p->keys;
    const int32_t *key_pairs = (const int32_t *)cache;
    for (int64_t k0 = first; k0 < end; k0 += 16) {
        int32_t index[16];
        __mmask16 valid = keys - k0 >= 16 ? 0xFFFF : (__mmask16)((1u << (keys - k0)) - 1);
        for (int j = 0; j < 16; j++)
            index[j] = k0 + j < keys ? (int32_t)((slot[k0 + j] * width + kv * head_dim) / 2) : 0;
        __m512i rows = _mm512_loadu_si512(index);
        bf16 *panel = p->k + k0 * head_dim;
        for (int64_t i = 0; i < half; i++)
            _mm512_storeu_si512(panel + i * 32,
                                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid,
                                                            _mm512_add_epi32(rows,
                                                            _mm512_set1_epi32((int)i)),
                                                            key_pairs, 4));
    }
}

/* Packs the values of keys [first, end) of kv head `kv` (first even): the rows of two
 * consecutive keys interleaved, 16 dims at a time (a missing second key reads as zero). */
static void pack_values(packed_kv *p, const bf16 *cache, int64_t num_slots, int64_t width,
                        int64_t kv, const int64_t *slot, int64_t first, int64_t end) {
    int64_t head_dim = p->head_dim, keys = p->keys;
    const bf16 *values = cache + num_slots * width + kv * head_dim;
    for (int64_t j = first / 2; 2 * j < end; j++) {
        int64_t block = 2 * j / ATT_KEY_BLOCK, jj = j - block * (ATT_KEY_BLOCK / 2);
        const bf16 *one = values + slot[2 * j] * width;
        const bf16 *two = 2 * j + 1 < keys ? values + slot[2 * j + 1] * width : NULL;
        bf16 *dst = p->v + block * ATT_KEY_BLOCK * head_dim + jj * 32;
        for (int64_t d = 0; d < head_dim; d += 16) {
            __m512i low = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(one + d)));
            __m512i high = two ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                     _mm256_loadu_si256((const __m256i *)(two + d))), 16)
                               : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + d / 16 * (ATT_KEY_BLOCK * 16),
                                _mm512_or_si512(low, high));
        }
    }
}

/* Packing is split into items of ATT_PACK_KEYS keys of one kv head, keys or values, so that
 * every thread has some. */
#define ATT_PACK_KEYS 128

static int64_t pack_items(int64_t keys, int64_t num_kv_heads) {
    return 2 * num_kv_heads * ((keys + ATT_PACK_KEYS - 1) / ATT_PACK_KEYS);
}

/* The packs of `keys` keys of every kv head, laid out one after another from `base`. */
static void place_packs(packed_kv *p, bf16 *base, int64_t keys, int64_t num_kv_heads,
                        int64_t head_dim) {
    int64_t per_head = packed_k_elems(keys, head_dim) + packed_v_elems(keys, head_dim);
    for (int64_t kv = 0; kv < num_kv_heads; kv++) {
        p[kv].k = base + kv * per_head;
        p[kv].v = p[kv].k + packed_k_elems(keys, head_dim);
        p[kv].keys = keys;
        p[kv].head_dim = head_dim;
    }
}

/* Item `item` of pack_items(keys, ...) for the kv heads' packs p[0 .. num_kv_heads). */
static void pack_item(packed_kv *p, int64_t item, const bf16 *cache, int64_t num_slots,
                      int64_t width, const int64_t *slot) {
    int64_t ranges = (p[0].keys + ATT_PACK_KEYS - 1) / ATT_PACK_KEYS;
    int64_t kv = item / (2 * ranges), range = item % (2 * ranges) / 2;
    int64_t first = range * ATT_PACK_KEYS, end = first + ATT_PACK_KEYS;
    end = end < p[0].keys ? end : p[0].keys;
    if (item % 2 == 0)
        pack_keys(&p[kv], cache, width, kv, slot, first, end);
    else
        pack_values(&p[kv], cache, num_slots, width, kv, slot, first, end);
}

/* Scratch of one thread for attend_rows. */
typedef struct {
    float s[ATT_ROWS][ATT_KEY_BLOCK]; /* scores of one key block */
    bf16 p[ATT_ROWS][ATT_KEY_BLOCK];  /* their exponentials, rounded to bf16 */
    float sums[PAIR_MR][PAIR_NP * PAIR_PANEL];
} att_scratch;

/* Keys of the block from k0 (`seen` of them) that any of rows r0 .. r0 + mr - 1 sees: a
 * causal chunk's earlier rows skip the products of keys none of them sees, whose weights
 * would be zeros. */
static inline int64_t tile_keys(const int64_t *limit, int64_t r0, int mr, int64_t k0,
                                int64_t seen) {
    if (!limit) return seen;
    int64_t top = -1;
    for (int r = 0; r < mr; r++) top = limit[r0 + r] > top ? limit[r0 + r] : top;
    int64_t keys = top - k0 + 1;
    return keys < 0 ? 0 : keys < seen ? keys : seen;
}

/* Online softmax of `rows` query rows (row r at q + r * q_stride: one query head's vectors,
 * bf16) over the packed keys, key j visible to row r when j <= limit[r] (limit NULL: every
 * key). Updates each row's running max m, sum l and unnormalised output acc [rows][head_dim]
 * (fp32), which start at ATT_NO_MAX, 0 and 0. */
static void attend_rows(const bf16 *q, int64_t q_stride, int64_t rows, const packed_kv *kv,
                        const int64_t *limit, float scale, float *m, float *l, float *acc,
                        att_scratch *t) {
    int64_t head_dim = kv->head_dim, half = head_dim / 2;
    int64_t last = kv->keys - 1; /* the last key any row sees */
    if (limit) {
        last = -1;
        for (int64_t r = 0; r < rows; r++) last = limit[r] > last ? limit[r] : last;
    }
    for (int64_t k0 = 0; k0 <= last; k0 += ATT_KEY_BLOCK) {
        int64_t seen = last - k0 + 1 < ATT_KEY_BLOCK ? last - k0 + 1 : ATT_KEY_BLOCK;
        int64_t pairs = (seen + 1) / 2;
        for (int64_t r0 = 0; r0 < rows; r0 += PAIR_MR) { /* S = Q K^T */
            int mr = rows - r0 < PAIR_MR ? (int)(rows - r0) : PAIR_MR;
            int64_t panels = (tile_keys(limit, r0, mr, k0, seen) + 15) / 16;
            for (int64_t p = 0; p < panels; p += PAIR_NP) {
                int np = panels - p < PAIR_NP ? (int)(panels - p) : PAIR_NP;
                pair_tiles[mr - 1][np - 1](t->sums, q + r0 * q_stride, q_stride,
                                           kv->k + (k0 + p * 16) * head_dim, 16 * head_dim, 0,
                                           half, NULL, 0);
                for (int r = 0; r < mr; r++)
                    memcpy(&t->s[r0 + r][p * 16], t->sums[r], sizeof(float) * np * 16);
            }
        }
        for (int64_t r = 0; r < rows; r++) { /* the softmax step */
            int64_t n = limit ? limit[r] - k0 + 1 : seen; /* keys of the block row r sees */
            n = n < seen ? n : seen;
            float *s = t->s[r];
            bf16 *p = t->p[r];
            if (n <= 0) {
                memset(p, 0, sizeof(bf16) * 2 * pairs);
                continue;
            }
            float new_max = m[r];
            float sum = exp_weights(s, n, scale, &new_max, p, 2 * pairs);
            float alpha = expf(m[r] - new_max);
            l[r] = l[r] * alpha + sum;
            m[r] = new_max;
            for (int64_t d = 0; d < head_dim; d++) acc[r * head_dim + d] *= alpha;
        }
        const bf16 *values = kv->v + k0 * head_dim;
        for (int64_t r0 = 0; r0 < rows; r0 += PAIR_MR) { /* O += P V */
            int mr = rows - r0 < PAIR_MR ? (int)(rows - r0) : PAIR_MR;
            int64_t tile_pairs = (tile_keys(limit, r0, mr, k0, seen) + 1) / 2;
            if (tile_pairs == 0) continue;
            for (int64_t d0 = 0; d0 < head_dim; d0 += PAIR_NP * 16) {
                int np = (head_dim - d0) / 16 < PAIR_NP ? (int)((head_dim - d0) / 16) : PAIR_NP;
                pair_tiles[mr - 1][np - 1](t->sums, &t->p[r0][0], ATT_KEY_BLOCK,
                                           values + d0 * ATT_KEY_BLOCK,
                                           ATT_KEY_BLOCK * 16, 0, tile_pairs, NULL, 0);
                for (int r = 0; r < mr; r++) {
                    float *a = acc + (r0 + r) * head_dim + d0;
                    for (int64_t c = 0; c < np * 16; c++) a[c] += t->sums[r][c];
                }
            }
        }
    }
}

/* Causal attention of the prompt chunks of `num_reqs` requests over their contexts in the
 * cache (their new keys and values already written there). Request r's queries are the
 * query_lens[r] flat rows from query_start[r] of q (rows q_stride apart, num_heads * head_dim
 * each); its context is positions 0 .. seq_lens[r] - 1, at slots[r * max_ctx ...]; query i
 * sits at position seq_lens[r] - query_lens[r] + i. Writes those rows of out (rows of
 * num_heads * head_dim, bf16) and no others. */
int octavo_prefill_attention(bf16 *out, const bf16 *q, int64_t q_stride, const bf16 *cache,
                             int64_t num_slots, const int64_t *slots, int64_t max_ctx,
                             const int64_t *query_start, const int64_t *query_lens,
                             const int64_t *seq_lens, int64_t num_reqs, int64_t num_heads,
                             int64_t num_kv_heads, int64_t head_dim, float scale) {
    int64_t group = num_heads / num_kv_heads, width = num_kv_heads * head_dim;
    int64_t qwidth = num_heads * head_dim;
    /* Per request: where its packs start in one buffer, and its packing and attention
     * items' first numbers. */
    int64_t *offset = octavo_alloc(sizeof(int64_t) * 3 * (num_reqs + 1));
    if (!offset) return OCTAVO_ERR_NO_MEMORY;
    int64_t *packs = offset + num_reqs + 1, *chunks = packs + num_reqs + 1;
    offset[0] = packs[0] = chunks[0] = 0;
    for (int64_t r = 0; r < num_reqs; r++) {
        offset[r + 1] = offset[r] + num_kv_heads * (packed_k_elems(seq_lens[r], head_dim)
                                                    + packed_v_elems(seq_lens[r], head_dim));
        packs[r + 1] = packs[r] + pack_items(seq_lens[r], num_kv_heads);
        chunks[r + 1] = chunks[r] + num_heads * ((query_lens[r] + ATT_ROWS - 1) / ATT_ROWS);
    }
    bf16 *packed = octavo_alloc(sizeof(bf16) * offset[num_reqs]);
    if (!packed) {
        free(offset);
        return OCTAVO_ERR_NO_MEMORY;
    }
    int failed = 0;
#pragma omp parallel
    {
        packed_kv *p = octavo_alloc(sizeof(packed_kv) * num_kv_heads);
        att_scratch *t = octavo_alloc(sizeof(att_scratch));
        float *acc = octavo_alloc(sizeof(float) * ATT_ROWS * head_dim);
        int ok = p && t && acc;
        if (!ok) octavo_fail(&failed);
        int64_t r = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < packs[num_reqs]; item++) {
            if (!ok) continue;
            while (packs[r + 1] <= item) r++;
            place_packs(p, packed + offset[r], seq_lens[r], num_kv_heads, head_dim);
            pack_item(p, item - packs[r], cache, num_slots, width, slots + r * max_ctx);
        }
        float m[ATT_ROWS], l[ATT_ROWS];
        int64_t limit[ATT_ROWS];
        r = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < chunks[num_reqs]; item++) {
            if (!ok) continue;
            while (chunks[r + 1] <= item) r++;
            int64_t q_len = query_lens[r];
            int64_t per_head_chunks = (q_len + ATT_ROWS - 1) / ATT_ROWS;
            int64_t head = (item - chunks[r]) / per_head_chunks;
            int64_t i0 = (item - chunks[r]) % per_head_chunks * ATT_ROWS;
            int64_t rows = q_len - i0 < ATT_ROWS ? q_len - i0 : ATT_ROWS;
            place_packs(p, packed + offset[r], seq_lens[r], num_kv_heads, head_dim);
            for (int64_t i = 0; i < rows; i++) {
                m[i] = ATT_NO_MAX;
                l[i] = 0.0f;
                limit[i] = seq_lens[r] - q_len + i0 + i;
            }
            memset(acc, 0, sizeof(float) * rows * head_dim);
            int64_t row0 = query_start[r] + i0;
            attend_rows(q + row0 * q_stride + head * head_dim, q_stride, rows, &p[head / group],
                        limit, scale, m, l, acc, t);
            for (int64_t i = 0; i < rows; i++) {
                bf16 *o = out + (row0 + i) * qwidth + head * head_dim;
                float inv = 1.0f / l[i];
                for (int64_t d = 0; d < head_dim; d++) o[d] = f2bf(acc[i * head_dim + d] * inv);
            }
        }
        free(acc);
        free(t);
        free(p);
    }
    free(packed);
    free(offset);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}

/* The part of `batch` decode rows' attention that lies over a prefix of `prefix_len` positions
 * they all share (its cache rows at prefix_slots): for row b and query head h, the running
 * max m[b * num_heads + h], sum l[...] and unnormalised output acc[... * head_dim + d], which
 * octavo_decode_attention completes with each row's own positions (cascade attention). q:
 * [batch][num_heads][head_dim], rows q_stride apart. */
int octavo_prefix_attention(float *m, float *l, float *acc, const bf16 *q, int64_t q_stride,
                            int64_t batch, const bf16 *cache, int64_t num_slots,
                            const int64_t *prefix_slots, int64_t prefix_len, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, float scale) {
    int64_t group = num_heads / num_kv_heads, width = num_kv_heads * head_dim;
    int64_t per_head = packed_k_elems(prefix_len, head_dim) + packed_v_elems(prefix_len, head_dim);
    bf16 *packed = octavo_alloc(sizeof(bf16) * per_head * num_kv_heads);
    if (!packed) return OCTAVO_ERR_NO_MEMORY;
    int64_t row_chunks = (batch + ATT_PREFIX_ROWS - 1) / ATT_PREFIX_ROWS;
    int failed = 0;
#pragma omp parallel
    {
        packed_kv *p = octavo_alloc(sizeof(packed_kv) * num_kv_heads);
        att_scratch *t = octavo_alloc(sizeof(att_scratch));
        float *racc = octavo_alloc(sizeof(float) * ATT_PREFIX_ROWS * head_dim);
        int ok = p && t && racc;
        if (!ok) octavo_fail(&failed);
        if (ok) place_packs(p, packed, prefix_len, num_kv_heads, head_dim);
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < pack_items(prefix_len, num_kv_heads); item++)
            if (ok) pack_item(p, item, cache, num_slots, width, prefix_slots);
        float rm[ATT_PREFIX_ROWS], rl[ATT_PREFIX_ROWS];
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_heads * row_chunks; item++) {
            if (!ok) continue;
            int64_t head = item / row_chunks, b0 = item % row_chunks * ATT_PREFIX_ROWS;
            int64_t rows = batch - b0 < ATT_PREFIX_ROWS ? batch - b0 : ATT_PREFIX_ROWS;
            for (int64_t i = 0; i < rows; i++) {
                rm[i] = ATT_NO_MAX;
                rl[i] = 0.0f;
            }
            memset(racc, 0, sizeof(float) * rows * head_dim);
            attend_rows(q + b0 * q_stride + head * head_dim, q_stride, rows, &p[head / group],
                        NULL, scale, rm, rl, racc, t);
            for (int64_t i = 0; i < rows; i++) {
                int64_t at = (b0 + i) * num_heads + head;
                m[at] = rm[i];
                l[at] = rl[i];
                memcpy(acc + at * head_dim, racc + i * head_dim, sizeof(float) * head_dim);
            }
        }
        free(racc);
        free(t);
        free(p);
    }
    free(packed);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}
#else
int octavo_attention_available(void) { return 0; }

int octavo_prefill_attention(bf16 *out, const bf16 *q, int64_t q_stride, const bf16 *cache,
                             int64_t num_slots, const int64_t *slots, int64_t max_ctx,
                             const int64_t *query_start, const int64_t *query_lens,
                             const int64_t *seq_lens, int64_t num_reqs, int64_t num_heads,
                             int64_t num_kv_heads, int64_t head_dim, float scale) {
    return OCTAVO_ERR_NEEDS_AVX512_BF16;
}

int octavo_prefix_attention(float *m, float *l, float *acc, const bf16 *q, int64_t q_stride,
                            int64_t batch, const bf16 *cache, int64_t num_slots,
                            const int64_t *prefix_slots, int64_t prefix_len, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, float scale) {
    return OCTAVO_ERR_NEEDS_AVX512_BF16;
}
#endif
