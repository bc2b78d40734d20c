/* The decode kernel of the legacy quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the default
 * model's Q4_1, and most of a Q4_K_M file of a model whose width is no multiple of 256, whose
 * rows llama.cpp's quantizer writes as Q5_0 and Q8_0) as llama.cpp
 * runs it: the activations quantized on the fly to int8 per 32 values (scale max|x| / 127,
 * llama.cpp's Q8_0), each weight block's integer dot product with them taken by AVX512-VNNI
 * (vpdpbusd: 32 multiply-adds per instruction) and scaled once per block.
 *
 * Why beside the fp32 kernel (cpu_quant.c): a decode step is memory-bound only once the
 * kernel decodes faster than memory delivers the blocks, and widening every 4-bit weight to
 * fp32 costs several instructions per 16 values where vpdpbusd takes 32 as they are. The
 * price is the activations' rounding, at most half a step (max|x| / 254) per value: the same
 * rounding llama.cpp's results carry. Python chooses between the two kernels. */

#include <math.h>

#include "cpu_kernels.h"

#define QK 32

int octavo_quant_q8_available(int ggml_type) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    return ggml_type == GGML_Q4_0 || ggml_type == GGML_Q4_1 || ggml_type == GGML_Q5_0 ||
           ggml_type == GGML_Q5_1 || ggml_type == GGML_Q8_0;
#else
    (void)ggml_type;
    return 0;
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
/* The m rows of x [m][in] quantized per block of 32: qx int8 [m][in], the block's scale dx
 * and its sums in fp32, of x (sx) and of qx (isx). */
typedef struct {
    int8_t *qx;
    float *dx, *sx;
    int32_t *isx;
} q8_rows;

static void quantize_rows(const float *x, int64_t m, int64_t in, q8_rows *q) {
    for (int64_t b = 0; b < m * in / QK; b++) {
        const float *xb = x + b * QK;
        float amax = 0.0f, sum = 0.0f;
        for (int i = 0; i < QK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            sum += xb[i];
        }
        const float d = amax / 127.0f, id = d > 0.0f ? 127.0f / amax : 0.0f;
        int32_t isum = 0;
        for (int i = 0; i < QK; i++) {
            const int8_t v = (int8_t)lrintf(xb[i] * id);
            q->qx[b * QK + i] = v;
            isum += v;
        }
        q->dx[b] = d;
        q->sx[b] = sum;
        q->isx[b] = isum;
    }
}

/* The 32 weights of a block as bytes in element order: Q4_0/Q4_1's nibbles (0..15,
 * unsigned), Q5_0/Q5_1's nibbles with bit e of their 32-bit high mask as element e's fifth
 * bit (0..31, unsigned), Q8_0's int8. */
static inline __m256i block_bytes(int type, const uint8_t *b) {
    if (type == GGML_Q8_0) return _mm256_loadu_si256((const __m256i *)(b + 2));
    const int64_t high = type == GGML_Q5_0 ? 2 : 4; /* Q5's mask, after the fp16s */
    const int64_t low = type == GGML_Q4_0 ? 2 : type == GGML_Q4_1 ? 4 : high + 4;
    const __m128i v = _mm_loadu_si128((const __m128i *)(b + low));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask),
                                             _mm_and_si128(v, mask));
    if (type == GGML_Q4_0 || type == GGML_Q4_1) return nibbles;
    uint32_t bits;
    memcpy(&bits, b + high, 4);
    return _mm256_or_si256(nibbles, _mm256_and_si256(_mm256_movm_epi8(bits),
                                                     _mm256_set1_epi8(0x10)));
}

/* y[r * out] = w . x[r] for one weight row and m (a constant where inlined) rows: per block,
 * acc += d * dx * (q . qx) in 8 int32 lanes widened to fp32, and the scalar terms apart:
 * Q4_0's offset of 8 (-8 * d * dx * sum(qx)), Q5_0's of 16, and Q4_1/Q5_1's minimum
 * (m * sum(x)). */
static inline __attribute__((always_inline)) void row_dots_q8(
    const int type, const int64_t bytes, const uint8_t *row, const q8_rows *q, const int64_t m,
    int64_t in, float *y, int64_t out) {
    __m256 acc[QUANT_GROUP_ROWS];
    float extra[QUANT_GROUP_ROWS];
    for (int64_t r = 0; r < m; r++) {
        acc[r] = _mm256_setzero_ps();
        extra[r] = 0.0f;
    }
    const int64_t nb = in / QK;
    for (int64_t b = 0; b < nb; b++, row += bytes) {
        _mm_prefetch((const char *)row + QUANT_PREFETCH_BYTES, _MM_HINT_T0);
        const __m256i w = block_bytes(type, row);
        const __m256i aw = type == GGML_Q8_0 ? _mm256_sign_epi8(w, w) : w;
        const float d = fp16_to_fp32(row);
        for (int64_t r = 0; r < m; r++) {
            const int64_t i = r * nb + b;
            __m256i xq = _mm256_loadu_si256((const __m256i *)(q->qx + i * QK));
            if (type == GGML_Q8_0) xq = _mm256_sign_epi8(xq, w); /* |w| . sign(w) x */
            const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, xq);
            const float scale = d * q->dx[i];
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale), acc[r]);
            if (type == GGML_Q4_0) extra[r] -= scale * (float)(8 * q->isx[i]);
            if (type == GGML_Q5_0) extra[r] -= scale * (float)(16 * q->isx[i]);
            if (type == GGML_Q4_1 || type == GGML_Q5_1)
                extra[r] += fp16_to_fp32(row + 2) * q->sx[i];
        }
    }
    for (int64_t r = 0; r < m; r++) {
        const __m128 s =
            _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
        y[r * out] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2))) + extra[r];
    }
}

typedef void (*q8_dots_fn)(const uint8_t *row, const q8_rows *q, int64_t in, float *y,
                           int64_t out);

/* NAME_q8[m]: row_dots_q8 for TYPE and m rows, m = 1..QUANT_GROUP_ROWS. */
#define Q8_M(NAME, TYPE, BYTES, M)                                                         \
    static void NAME##_q8_##M(const uint8_t *row, const q8_rows *q, int64_t in, float *y,  \
                              int64_t out) {                                               \
        row_dots_q8(TYPE, BYTES, row, q, M, in, y, out);                                   \
    }
#define Q8(NAME, TYPE, BYTES)                                                              \
    Q8_M(NAME, TYPE, BYTES, 1) Q8_M(NAME, TYPE, BYTES, 2) Q8_M(NAME, TYPE, BYTES, 3)       \
    Q8_M(NAME, TYPE, BYTES, 4)                                                             \
    static const q8_dots_fn NAME##_q8[QUANT_GROUP_ROWS + 1] = {                            \
        NULL, NAME##_q8_1, NAME##_q8_2, NAME##_q8_3, NAME##_q8_4};
Q8(q4_0, GGML_Q4_0, 18)
Q8(q4_1, GGML_Q4_1, 20)
Q8(q5_0, GGML_Q5_0, 22)
Q8(q5_1, GGML_Q5_1, 24)
Q8(q8_0, GGML_Q8_0, 34)
#endif

int octavo_quant_matmul_q8(float *y, const float *x, int64_t m, const void *blocks,
                           int ggml_type, int64_t out, int64_t in) {
    if (!octavo_quant_q8_available(ggml_type) || in % QK || m < 1 || m > QUANT_DECODE_ROWS)
        return OCTAVO_ERR_BAD_QUANT;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    const int64_t nb = m * in / QK;
    q8_rows q = {octavo_alloc((size_t)(m * in)), octavo_alloc((size_t)nb * sizeof(float)),
                 octavo_alloc((size_t)nb * sizeof(float)),
                 octavo_alloc((size_t)nb * sizeof(int32_t))};
    int status = OCTAVO_ERR_NO_MEMORY;
    if (q.qx && q.dx && q.sx && q.isx) {
        quantize_rows(x, m, in, &q);
        const q8_dots_fn *dots = ggml_type == GGML_Q4_0   ? q4_0_q8
                                 : ggml_type == GGML_Q4_1 ? q4_1_q8
                                 : ggml_type == GGML_Q5_0 ? q5_0_q8
                                 : ggml_type == GGML_Q5_1 ? q5_1_q8
                                                          : q8_0_q8;
        const int64_t block_bytes = ggml_type == GGML_Q4_0   ? 18
                                    : ggml_type == GGML_Q4_1 ? 20
                                    : ggml_type == GGML_Q5_0 ? 22
                                    : ggml_type == GGML_Q5_1 ? 24
                                                             : 34;
        const int64_t row_bytes = in / QK * block_bytes, row_blocks = in / QK;
        const uint8_t *rows = blocks;
#pragma omp parallel for schedule(static) if (out * in >= PARALLEL_MIN)
        for (int64_t o = 0; o < out; o++)
            for (int64_t r = 0; r < m; r += QUANT_GROUP_ROWS) {
                const int64_t group = m - r < QUANT_GROUP_ROWS ? m - r : QUANT_GROUP_ROWS;
                const int64_t first = r * row_blocks; /* the group's first block of x */
                const q8_rows part = {q.qx + first * QK, q.dx + first, q.sx + first,
                                      q.isx + first};
                dots[group](rows + o * row_bytes, &part, in, y + r * out + o, out);
            }
        status = OCTAVO_OK;
    }
    free(q.qx);
    free(q.dx);
    free(q.sx);
    free(q.isx);
    return status;
#else
    (void)y, (void)x, (void)blocks, (void)out;
    return OCTAVO_ERR_BAD_QUANT;
#endif
}
