/* Matrix products on GGUF quantized weights, read in the file's own block layouts
 * (llama.cpp's ggml-common.h), and the dequantized rows of such a weight (the embedding
 * lookup). See octavo/cpu/quant_gemm.py for why and how Python calls them.
 *
 * Each type has one decoder that turns a row's blocks into fp32 in llama.cpp's reference
 * arithmetic order, so the rows equal gguf's (and llama.cpp's) dequantized values bit for
 * bit: FMA contraction is off in this file (the build's -ffast-math would otherwise fuse
 * d * q - m into one rounding). The products decode each weight row into a buffer that
 * stays in L1 and take its dot products with the activation rows there, so memory carries
 * only the quantized bytes; output rows are shared among the OpenMP threads. */
#pragma GCC optimize("fp-contract=off")

#include <string.h>
#include <omp.h>

#include "cpu_kernels.h"

#define QK 32    /* elements per block of the legacy types and IQ4_NL */
#define QK_K 256 /* elements per super-block of the k-quants */

static inline void decode_q4_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static inline void decode_q4_1(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b), m = fp16_to_fp32(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

/* The fifth bits of Q5_0/Q5_1: bit j of qh (little-endian) goes with element j. */
static inline void decode_q5(const uint8_t *qh_bytes, const uint8_t *qs, int q[QK]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10);
        q[j + QK / 2] = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
    }
}

static inline void decode_q5_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    int q[QK];
    decode_q5(b + 2, b + 6, q);
    for (int j = 0; j < QK; j++) y[j] = (float)(q[j] - 16) * d;
}

static inline void decode_q5_1(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b), m = fp16_to_fp32(b + 2);
    int q[QK];
    decode_q5(b + 4, b + 8, q);
    for (int j = 0; j < QK; j++) y[j] = (float)q[j] * d + m;
}

static inline void decode_q8_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static inline void decode_iq4_nl(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)IQ4_NL_VALUES[qs[j] & 0x0F];
        y[j + QK / 2] = d * (float)IQ4_NL_VALUES[qs[j] >> 4];
    }
}

/* Q2_K: scales[16] (4-bit scale, 4-bit min), qs[64] (2-bit q), fp16 d, fp16 dmin. */
static inline void decode_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *q = b + 16;
    const float d = fp16_to_fp32(b + 80), dmin = fp16_to_fp32(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                const uint8_t sc = scales[is++];
                const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
    }
}

/* Q3_K: hmask[32] (third bits), qs[64] (low 2 bits), scales[12] (16 x 6 bits), fp16 d. */
static inline void decode_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    const float d_all = fp16_to_fp32(b + 108);
    uint32_t aux[4];
    memcpy(aux, b + 96, 12);
    const uint32_t kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu, tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++) {
                const float dl = d_all * (float)(scales[is++] - 32);
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
        }
    }
}

/* Q4_K (qh NULL) and Q5_K: fp16 d, fp16 dmin, scales[12], [qh[32],] qs[128]. */
static inline void decode_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *ql, float *y) {
    const float d = fp16_to_fp32(b), dmin = fp16_to_fp32(b + 2);
    const uint8_t *scales = b + 4;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        int sc, mn;
        scale_min_k4(is, scales, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        scale_min_k4(is + 1, scales, &sc, &mn);
        const float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 0x0F) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
    }
}

static inline void decode_q4_k(const uint8_t *b, float *y) { decode_q45_k(b, NULL, b + 16, y); }
static inline void decode_q5_k(const uint8_t *b, float *y) { decode_q45_k(b, b + 16, b + 48, y); }

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d. */
static inline void decode_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = fp16_to_fp32(b + 208);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

#ifdef __AVX512F__
/* AVX-512 decoders of the types a decode step meets most (the default model's Q4_1/Q8_0,
 * Q4_K_M's Q4_K/Q6_K and the Q5_0/Q5_1 it falls back to, with their siblings): the same
 * arithmetic as the scalar ones above, in
 * the same order, 16 values at a time, so their results are bit-equal. */

/* 16 bytes as 16 int32 lanes, zero- or sign-extended. */
static inline __m512i u8x16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline __m512i i8x16(const uint8_t *p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline __m512 to_ps(__m512i v) { return _mm512_cvtepi32_ps(v); }
static inline __m512i low4(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0x0F)); }
static inline __m512i high4(__m512i v) { return _mm512_srli_epi32(v, 4); }

/* The 32-value types straight into two registers, for the decode kernel; the decode_*_avx512
 * beside each stores them, for the rows. */
typedef void (*regs_fn)(const uint8_t *block, __m512 w[2]);

static inline void q4_0_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b));
    const __m512i q = u8x16(b + 2), eight = _mm512_set1_epi32(8);
    w[0] = _mm512_mul_ps(to_ps(_mm512_sub_epi32(low4(q), eight)), d);
    w[1] = _mm512_mul_ps(to_ps(_mm512_sub_epi32(high4(q), eight)), d);
}

static inline void q4_1_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b)), m = _mm512_set1_ps(fp16_to_fp32(b + 2));
    const __m512i q = u8x16(b + 4);
    w[0] = _mm512_add_ps(_mm512_mul_ps(to_ps(low4(q)), d), m);
    w[1] = _mm512_add_ps(_mm512_mul_ps(to_ps(high4(q)), d), m);
}

static inline void q8_0_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b));
    w[0] = _mm512_mul_ps(to_ps(i8x16(b + 2)), d);
    w[1] = _mm512_mul_ps(to_ps(i8x16(b + 18)), d);
}

/* Q5_0/Q5_1's values 0..31: a nibble of qs with bit j of qh (little-endian) as its fifth. */
static inline void q5_values(const uint8_t *qh_bytes, const uint8_t *qs, __m512i q[2]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    const __m512i bits = _mm512_set1_epi32((int)qh), one = _mm512_set1_epi32(1);
    const __m512i lanes =
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i nibbles = u8x16(qs);
    const __m512i fifth_lo = _mm512_and_si512(_mm512_srlv_epi32(bits, lanes), one);
    const __m512i fifth_hi = _mm512_and_si512(
        _mm512_srlv_epi32(bits, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))), one);
    q[0] = _mm512_or_si512(low4(nibbles), _mm512_slli_epi32(fifth_lo, 4));
    q[1] = _mm512_or_si512(high4(nibbles), _mm512_slli_epi32(fifth_hi, 4));
}

static inline void q5_0_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b));
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i q[2];
    q5_values(b + 2, b + 6, q);
    w[0] = _mm512_mul_ps(to_ps(_mm512_sub_epi32(q[0], sixteen)), d);
    w[1] = _mm512_mul_ps(to_ps(_mm512_sub_epi32(q[1], sixteen)), d);
}

static inline void q5_1_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b)), m = _mm512_set1_ps(fp16_to_fp32(b + 2));
    __m512i q[2];
    q5_values(b + 4, b + 8, q);
    w[0] = _mm512_add_ps(_mm512_mul_ps(to_ps(q[0]), d), m);
    w[1] = _mm512_add_ps(_mm512_mul_ps(to_ps(q[1]), d), m);
}

static inline void iq4_nl_regs(const uint8_t *b, __m512 w[2]) {
    const __m512 d = _mm512_set1_ps(fp16_to_fp32(b));
    const __m512 values = to_ps(i8x16((const uint8_t *)IQ4_NL_VALUES));
    const __m512i q = u8x16(b + 2);
    w[0] = _mm512_mul_ps(d, _mm512_permutexvar_ps(low4(q), values));
    w[1] = _mm512_mul_ps(d, _mm512_permutexvar_ps(high4(q), values));
}

#define STORE_REGS(NAME)                                                                   \
    static inline void decode_##NAME##_avx512(const uint8_t *b, float *y) {                \
        __m512 w[2];                                                                       \
        NAME##_regs(b, w);                                                                 \
        _mm512_storeu_ps(y, w[0]);                                                         \
        _mm512_storeu_ps(y + 16, w[1]);                                                    \
    }
STORE_REGS(q4_0)
STORE_REGS(q4_1)
STORE_REGS(q8_0)
STORE_REGS(q5_0)
STORE_REGS(q5_1)
STORE_REGS(iq4_nl)

/* Q4_K (qh NULL) and Q5_K, as decode_q45_k. */
static inline void decode_q45_k_avx512(const uint8_t *b, const uint8_t *qh, const uint8_t *ql,
                                float *y) {
    const float d = fp16_to_fp32(b), dmin = fp16_to_fp32(b + 2);
    const __m512i sixteen = _mm512_set1_epi32(16);
    for (int is = 0; is < 8; is += 2, ql += 32, y += 64) {
        int sc, mn;
        scale_min_k4(is, b + 4, &sc, &mn);
        const __m512 d1 = _mm512_set1_ps(d * (float)sc), m1 = _mm512_set1_ps(dmin * (float)mn);
        scale_min_k4(is + 1, b + 4, &sc, &mn);
        const __m512 d2 = _mm512_set1_ps(d * (float)sc), m2 = _mm512_set1_ps(dmin * (float)mn);
        for (int l = 0; l < 32; l += 16) {
            const __m512i q = u8x16(ql + l);
            __m512i lo = low4(q), hi = high4(q);
            if (qh) {
                const __m512i h = u8x16(qh + l);
                const __m512i bit1 = _mm512_set1_epi32(1 << is), bit2 = _mm512_set1_epi32(2 << is);
                lo = _mm512_mask_add_epi32(lo, _mm512_test_epi32_mask(h, bit1), lo, sixteen);
                hi = _mm512_mask_add_epi32(hi, _mm512_test_epi32_mask(h, bit2), hi, sixteen);
            }
            _mm512_storeu_ps(y + l, _mm512_sub_ps(_mm512_mul_ps(d1, to_ps(lo)), m1));
            _mm512_storeu_ps(y + 32 + l, _mm512_sub_ps(_mm512_mul_ps(d2, to_ps(hi)), m2));
        }
    }
}

static inline void decode_q4_k_avx512(const uint8_t *b, float *y) {
    decode_q45_k_avx512(b, NULL, b + 16, y);
}
static inline void decode_q5_k_avx512(const uint8_t *b, float *y) {
    decode_q45_k_avx512(b, b + 16, b + 48, y);
}

/* Q6_K's two high bits at shift of h, as bits 4 and 5. */
static inline __m512i high2(__m512i h, int shift) {
    const __m512i bits = _mm512_and_si512(_mm512_srli_epi32(h, (unsigned)shift),
                                          _mm512_set1_epi32(3));
    return _mm512_slli_epi32(bits, 4);
}

static inline void decode_q6_k_avx512(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = fp16_to_fp32(b + 208);
    const __m512i bias = _mm512_set1_epi32(32);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l += 16) {
            const int is = l / 16;
            const __m512i a = u8x16(ql + l), c = u8x16(ql + l + 32), h = u8x16(qh + l);
            const __m512i qs[4] = {_mm512_or_si512(low4(a), high2(h, 0)),
                                   _mm512_or_si512(low4(c), high2(h, 2)),
                                   _mm512_or_si512(high4(a), high2(h, 4)),
                                   _mm512_or_si512(high4(c), high2(h, 6))};
            for (int k = 0; k < 4; k++) {
                const __m512 ds = _mm512_set1_ps(d * (float)sc[is + 2 * k]);
                const __m512i q = _mm512_sub_epi32(qs[k], bias);
                _mm512_storeu_ps(y + l + 32 * k, _mm512_mul_ps(ds, to_ps(q)));
            }
        }
    }
}
#endif

typedef void (*decode_fn)(const uint8_t *block, float *y);

/* The decode kernel for m = 1..QUANT_GROUP_ROWS activation rows: y[r * out] = w . x[r]
 * for one weight row (entry 0 unused). */
typedef void (*row_dots_fn)(const uint8_t *row, const float *x, int64_t in, float *y,
                            int64_t out);

typedef struct {
    int type;
    int64_t elems, bytes;
    decode_fn decode;
    const row_dots_fn *fused; /* NULL where only the portable path serves */
} block_format;

#ifdef __AVX512F__
/* The decode kernel: the weight row decoded QK_K values at a time into an L1 buffer (the
 * k-quants) or a block at a time straight into two registers (the 32-value types, regs) and
 * multiplied at once with every row of x, two fp32 accumulators per row held in registers
 * across the whole row. Inlined with decode, regs, elems, bytes and m constant (FUSED
 * below), so the decoder is inlined too and the accumulators unrolled: a decoder called
 * through a pointer would make the compiler save them around each call (zmm registers are
 * all caller-saved). */
static inline __attribute__((always_inline)) void row_dots_fused(
    decode_fn decode, regs_fn regs, const int64_t elems, const int64_t bytes,
    const uint8_t *row, const float *x, const int64_t m, int64_t in, float *y, int64_t out) {
    _Alignas(64) float w[QK_K];
    __m512 acc[QUANT_GROUP_ROWS][2];
    for (int64_t r = 0; r < m; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k += QK_K) {
        const int64_t n = in - k < QK_K ? in - k : QK_K; /* whole blocks: both are */
        const char *chunk = (const char *)row + k / elems * bytes;
        for (int64_t line = 0; line < n / elems * bytes; line += 64)
            _mm_prefetch(chunk + QUANT_PREFETCH_BYTES + line, _MM_HINT_T0);
        if (regs == NULL)
            for (int64_t b = 0; b < n; b += elems) decode(row + (k + b) / elems * bytes, w + b);
        for (int64_t j = 0; j < n; j += 32) {
            __m512 wv[2];
            if (regs != NULL) {
                regs(row + (k + j) / 32 * bytes, wv);
            } else {
                wv[0] = _mm512_load_ps(w + j);
                wv[1] = _mm512_load_ps(w + j + 16);
            }
            for (int64_t r = 0; r < m; r++) {
                const float *xr = x + r * in + k + j;
                acc[r][0] = _mm512_fmadd_ps(wv[0], _mm512_loadu_ps(xr), acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(wv[1], _mm512_loadu_ps(xr + 16), acc[r][1]);
            }
        }
    }
    for (int64_t r = 0; r < m; r++)
        y[r * out] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

/* NAME_fused[m]: row_dots_fused for decode_NAME (REGS: its registers' decoder, or NULL for
 * the k-quants, decoded a super-block at a time) and m rows, m = 1..QUANT_GROUP_ROWS. */
#define FUSED_M(NAME, REGS, ELEMS, BYTES, M)                                               \
    static void NAME##_dots_##M(const uint8_t *row, const float *x, int64_t in, float *y,  \
                                int64_t out) {                                             \
        row_dots_fused(NAME##_avx512, REGS, ELEMS, BYTES, row, x, M, in, y, out);          \
    }
#define FUSED(NAME, REGS, ELEMS, BYTES)                                                    \
    FUSED_M(NAME, REGS, ELEMS, BYTES, 1) FUSED_M(NAME, REGS, ELEMS, BYTES, 2)              \
    FUSED_M(NAME, REGS, ELEMS, BYTES, 3) FUSED_M(NAME, REGS, ELEMS, BYTES, 4)              \
    static const row_dots_fn NAME##_fused[QUANT_GROUP_ROWS + 1] = {                        \
        NULL, NAME##_dots_1, NAME##_dots_2, NAME##_dots_3, NAME##_dots_4};
FUSED(decode_q4_0, q4_0_regs, QK, 18)
FUSED(decode_q4_1, q4_1_regs, QK, 20)
FUSED(decode_q8_0, q8_0_regs, QK, 34)
FUSED(decode_q5_0, q5_0_regs, QK, 22)
FUSED(decode_q5_1, q5_1_regs, QK, 24)
FUSED(decode_iq4_nl, iq4_nl_regs, QK, 18)
FUSED(decode_q4_k, NULL, QK_K, 144)
FUSED(decode_q5_k, NULL, QK_K, 176)
FUSED(decode_q6_k, NULL, QK_K, 210)
#define FAST(name) name##_avx512, name##_fused
#else
#define FAST(name) name, NULL
#endif

static const block_format FORMATS[] = {
    {GGML_Q4_0, QK, 18, FAST(decode_q4_0)},    {GGML_Q4_1, QK, 20, FAST(decode_q4_1)},
    {GGML_Q5_0, QK, 22, FAST(decode_q5_0)},    {GGML_Q5_1, QK, 24, FAST(decode_q5_1)},
    {GGML_Q8_0, QK, 34, FAST(decode_q8_0)},    {GGML_IQ4_NL, QK, 18, FAST(decode_iq4_nl)},
    {GGML_Q2_K, QK_K, 84, decode_q2_k, NULL},  {GGML_Q3_K, QK_K, 110, decode_q3_k, NULL},
    {GGML_Q4_K, QK_K, 144, FAST(decode_q4_k)}, {GGML_Q5_K, QK_K, 176, FAST(decode_q5_k)},
    {GGML_Q6_K, QK_K, 210, FAST(decode_q6_k)},
};

static const block_format *format_of(int ggml_type) {
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (FORMATS[i].type == ggml_type) return &FORMATS[i];
    return NULL;
}

int64_t octavo_quant_row_bytes(int ggml_type, int64_t in) {
    const block_format *f = format_of(ggml_type);
    if (f == NULL || in <= 0 || in % f->elems) return 0;
    return in / f->elems * f->bytes;
}

static inline void decode_row(const block_format *f, const uint8_t *row, float *y, int64_t in) {
    for (int64_t k = 0; k < in; k += f->elems, row += f->bytes) f->decode(row, y + k);
}

int octavo_quant_dequantize(float *out, const void *blocks, const int64_t *ids, int64_t n,
                            int ggml_type, int64_t in) {
    const block_format *f = format_of(ggml_type);
    if (f == NULL || in % f->elems) return OCTAVO_ERR_BAD_QUANT;
    const int64_t row_bytes = in / f->elems * f->bytes;
#pragma omp parallel for schedule(static) if (n * in >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = ids ? ids[i] : i;
        decode_row(f, (const uint8_t *)blocks + row * row_bytes, out + i * in, in);
    }
    return OCTAVO_OK;
}

int octavo_quant_dequantize_bf16(bf16 *out, const void *blocks, int64_t n, int ggml_type,
                                 int64_t in) {
    const block_format *f = format_of(ggml_type);
    if (f == NULL || in % f->elems) return OCTAVO_ERR_BAD_QUANT;
    const int64_t row_bytes = in / f->elems * f->bytes;
#pragma omp parallel for schedule(static) if (n * in >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)blocks + i * row_bytes;
        _Alignas(64) float w[QK_K];
        for (int64_t k = 0; k < in; k += f->elems, row += f->bytes) {
            f->decode(row, w);
            for (int64_t j = 0; j < f->elems; j++) out[i * in + k + j] = f2bf(w[j]);
        }
    }
    return OCTAVO_OK;
}

/* sum(a[k] * b[k]) in fp32, vectorised (the reassociation -ffast-math allows). */
static float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < n; k++) sum += a[k] * b[k];
    return sum;
}

/* y[r * out] = w . x[r] for the m rows of x, w the weight row decoded into the buffer w. */
static void row_dots(const block_format *f, const uint8_t *row, float *w, const float *x,
                     int64_t m, int64_t in, float *y, int64_t out) {
    decode_row(f, row, w, in);
    for (int64_t r = 0; r < m; r++) y[r * out] = dot(w, x + r * in, in);
}


int octavo_quant_matmul(float *y, const float *x, int64_t m, const void *blocks,
                        int ggml_type, int64_t out, int64_t in) {
    const block_format *f = format_of(ggml_type);
    if (f == NULL || in % f->elems) return OCTAVO_ERR_BAD_QUANT;
    const int64_t row_bytes = in / f->elems * f->bytes;
    const uint8_t *rows = blocks;
    if (f->fused != NULL && m >= 1 && m <= QUANT_DECODE_ROWS) {
#pragma omp parallel for schedule(static) if (out * in >= PARALLEL_MIN)
        for (int64_t o = 0; o < out; o++)
            for (int64_t r = 0; r < m; r += QUANT_GROUP_ROWS) {
                const int64_t group = m - r < QUANT_GROUP_ROWS ? m - r : QUANT_GROUP_ROWS;
                f->fused[group](rows + o * row_bytes, x + r * in, in, y + r * out + o, out);
            }
        return OCTAVO_OK;
    }
    int failed = 0;
#pragma omp parallel if (out * in >= PARALLEL_MIN)
    {
        float *w = octavo_alloc((size_t)in * sizeof(float));
        if (w == NULL) octavo_fail(&failed);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < out; o++)
            if (w != NULL) row_dots(f, rows + o * row_bytes, w, x, m, in, y + o, out);
        free(w);
    }
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}
