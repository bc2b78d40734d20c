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

/* ggml's type numbers (GGMLQuantizationType) of the types served here. */
enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11,
    T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20,
};
#define QK 32    /* elements per block of the legacy types and IQ4_NL */
#define QK_K 256 /* elements per super-block of the k-quants */

static float fp16_to_fp32(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

static void decode_q4_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void decode_q4_1(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b), m = fp16_to_fp32(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

/* The fifth bits of Q5_0/Q5_1: bit j of qh (little-endian) goes with element j. */
static void decode_q5(const uint8_t *qh_bytes, const uint8_t *qs, int q[QK]) {
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 0x0F) | (int)(((qh >> j) << 4) & 0x10);
        q[j + QK / 2] = (qs[j] >> 4) | (int)((qh >> (j + 12)) & 0x10);
    }
}

static void decode_q5_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    int q[QK];
    decode_q5(b + 2, b + 6, q);
    for (int j = 0; j < QK; j++) y[j] = (float)(q[j] - 16) * d;
}

static void decode_q5_1(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b), m = fp16_to_fp32(b + 2);
    int q[QK];
    decode_q5(b + 4, b + 8, q);
    for (int j = 0; j < QK; j++) y[j] = (float)q[j] * d + m;
}

static void decode_q8_0(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

static void decode_iq4_nl(const uint8_t *b, float *y) {
    const float d = fp16_to_fp32(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)IQ4_NL_VALUES[qs[j] & 0x0F];
        y[j + QK / 2] = d * (float)IQ4_NL_VALUES[qs[j] >> 4];
    }
}

/* Q2_K: scales[16] (4-bit scale, 4-bit min), qs[64] (2-bit q), fp16 d, fp16 dmin. */
static void decode_q2_k(const uint8_t *b, float *y) {
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
static void decode_q3_k(const uint8_t *b, float *y) {
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

/* The 6-bit scale and min of sub-block j of Q4_K/Q5_K's 12 packed bytes. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K (qh NULL) and Q5_K: fp16 d, fp16 dmin, scales[12], [qh[32],] qs[128]. */
static void decode_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *ql, float *y) {
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

static void decode_q4_k(const uint8_t *b, float *y) { decode_q45_k(b, NULL, b + 16, y); }
static void decode_q5_k(const uint8_t *b, float *y) { decode_q45_k(b, b + 16, b + 48, y); }

/* Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d. */
static void decode_q6_k(const uint8_t *b, float *y) {
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

typedef void (*decode_fn)(const uint8_t *block, float *y);

typedef struct {
    int type;
    int64_t elems, bytes;
    decode_fn decode;
} block_format;

static const block_format FORMATS[] = {
    {T_Q4_0, QK, 18, decode_q4_0},     {T_Q4_1, QK, 20, decode_q4_1},
    {T_Q5_0, QK, 22, decode_q5_0},     {T_Q5_1, QK, 24, decode_q5_1},
    {T_Q8_0, QK, 34, decode_q8_0},     {T_IQ4_NL, QK, 18, decode_iq4_nl},
    {T_Q2_K, QK_K, 84, decode_q2_k},   {T_Q3_K, QK_K, 110, decode_q3_k},
    {T_Q4_K, QK_K, 144, decode_q4_k},  {T_Q5_K, QK_K, 176, decode_q5_k},
    {T_Q6_K, QK_K, 210, decode_q6_k},
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

static void decode_row(const block_format *f, const uint8_t *row, float *y, int64_t in) {
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

/* sum(a[k] * b[k]) in fp32, vectorised (the reassociation -ffast-math allows). */
static float dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < n; k++) sum += a[k] * b[k];
    return sum;
}

int octavo_quant_matmul(float *y, const float *x, int64_t m, const void *blocks,
                        int ggml_type, int64_t out, int64_t in) {
    const block_format *f = format_of(ggml_type);
    if (f == NULL || in % f->elems) return OCTAVO_ERR_BAD_QUANT;
    const int64_t row_bytes = in / f->elems * f->bytes;
    int failed = 0;
#pragma omp parallel if (out * in >= PARALLEL_MIN)
    {
        float *w = octavo_alloc((size_t)in * sizeof(float));
        if (w == NULL) octavo_fail(&failed);
#pragma omp for schedule(static)
        for (int64_t o = 0; o < out; o++) {
            if (w == NULL) continue;
            decode_row(f, (const uint8_t *)blocks + o * row_bytes, w, in);
            for (int64_t r = 0; r < m; r++) y[r * out + o] = dot(w, x + r * in, in);
        }
        free(w);
    }
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}
