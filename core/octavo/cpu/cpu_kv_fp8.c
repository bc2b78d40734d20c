/* The fp8 KV cache (--kv-cache-dtype fp8 | fp8_e4m3 | fp8_e5m2; octavo/attention/kv_quant.py
 * says what is stored): writing a step's keys and values, and decode attention reading them.
 *
 * Writing rounds each element of key * k_inv_scale (value * v_inv_scale) to the nearest fp8
 * value, ties to even, saturated at the format's largest finite value - bit for bit what
 * torch's conversion gives after the Python side's clamp, which the tests compare byte by
 * byte. Reading widens a byte through a 256-entry table of its values already times the
 * layer's scale, so dequantizing costs one load; scores, softmax and the weighted sum of
 * values are fp32, the output rounded once to bf16. */
#include "cpu_kernels.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int exp_bits;
    int man_bits;
    float max; /* largest finite value */
} fp8_format;

static fp8_format format_of(int format) {
    return format == OCTAVO_FP8_E5M2 ? (fp8_format){5, 2, 57344.0f} : (fp8_format){4, 3, 448.0f};
}

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f rounded to fp8 (nearest, ties to even), saturated at the largest finite value. */
static inline uint8_t fp8_from_float(float f, fp8_format fmt) {
    uint32_t sign = (float_bits(f) >> 24) & 0x80u;
    float a = fabsf(f);
    a = a < fmt.max ? a : fmt.max;
    int bias = (1 << (fmt.exp_bits - 1)) - 1;
    int drop = 23 - fmt.man_bits; /* fp32 mantissa bits the format lacks */
    uint32_t u = float_bits(a);
    uint32_t out;
    if (a < bits_float((uint32_t)(127 + 1 - bias) << 23)) {
        /* Below the smallest normal: adding a power of two whose ulp is the format's
         * subnormal step rounds a to a multiple of it (nearest, ties to even); the
         * multiple is what is left in the low mantissa bits. */
        uint32_t magic = (uint32_t)(127 - bias + drop + 1) << 23;
        out = float_bits(a + bits_float(magic)) - magic;
    } else {
        uint32_t odd = (u >> drop) & 1u;
        u += ((uint32_t)(bias - 127) << 23) + (1u << (drop - 1)) - 1u + odd;
        out = u >> drop;
    }
    return (uint8_t)(out | sign);
}

/* What byte b holds, times scale. */
static float fp8_value(int b, fp8_format fmt, float scale) {
    int man_mask = (1 << fmt.man_bits) - 1;
    int exp = (b >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1);
    int man = b & man_mask;
    int bias = (1 << (fmt.exp_bits - 1)) - 1;
    float mag = exp == 0 ? ldexpf((float)man, 1 - bias - fmt.man_bits)
                         : ldexpf(1.0f + (float)man / (float)(man_mask + 1), exp - bias);
    return (b & 0x80 ? -mag : mag) * scale;
}

static void fp8_table(float *table, int format, float scale) {
    fp8_format fmt = format_of(format);
    for (int b = 0; b < 256; b++)
        table[b] = fp8_value(b, fmt, scale);
}

static void quantize_row(uint8_t *dst, const bf16 *src, int64_t width, float inv_scale,
                         fp8_format fmt) {
    for (int64_t i = 0; i < width; i++)
        dst[i] = fp8_from_float(bf2f(src[i]) * inv_scale, fmt);
}

void octavo_write_kv_fp8(void *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                         const int64_t *slot_mapping, int64_t tokens, int64_t width,
                         int64_t key_stride, int64_t value_stride, float k_inv_scale,
                         float v_inv_scale, int format) {
    fp8_format fmt = format_of(format);
    uint8_t *keys = cache;
    uint8_t *values = keys + num_slots * width;
#pragma omp parallel for if (tokens > 1)
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slot_mapping[t];
        quantize_row(keys + slot * width, key + t * key_stride, width, k_inv_scale, fmt);
        quantize_row(values + slot * width, value + t * value_stride, width, v_inv_scale, fmt);
    }
}

/* One query head of one row: softmax(q . k * scale) . v over its len positions. */
static void attend_head(bf16 *out, const bf16 *q, const uint8_t *keys, const uint8_t *values,
                        const int64_t *slots, int64_t len, int64_t width, int64_t head_dim,
                        float scale, const float *k_table, const float *v_table,
                        float *work) {
    float *qf = work, *acc = work + head_dim, *scores = work + 2 * head_dim;
    for (int64_t d = 0; d < head_dim; d++) {
        qf[d] = bf2f(q[d]) * scale;
        acc[d] = 0.0f;
    }
    float max = -FLT_MAX; /* not -INFINITY: -ffast-math assumes no infinities */
    for (int64_t j = 0; j < len; j++) {
        const uint8_t *k = keys + slots[j] * width;
        float s = 0.0f;
        for (int64_t d = 0; d < head_dim; d++)
            s += qf[d] * k_table[k[d]];
        scores[j] = s;
        max = s > max ? s : max;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < len; j++) {
        scores[j] = expf(scores[j] - max);
        sum += scores[j];
    }
    for (int64_t j = 0; j < len; j++) {
        const uint8_t *v = values + slots[j] * width;
        float p = scores[j];
        for (int64_t d = 0; d < head_dim; d++)
            acc[d] += p * v_table[v[d]];
    }
    for (int64_t d = 0; d < head_dim; d++)
        out[d] = f2bf(acc[d] / sum);
}

int octavo_decode_attention_fp8(bf16 *out, const bf16 *q, const void *cache,
                                int64_t num_slots, const int64_t *slots,
                                const int64_t *seq_lens, int64_t batch, int64_t max_len,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t q_stride, float scale, float k_scale, float v_scale,
                                int format) {
    float k_table[256], v_table[256];
    fp8_table(k_table, format, k_scale);
    fp8_table(v_table, format, v_scale);
    int64_t width = num_kv_heads * head_dim, group = num_heads / num_kv_heads;
    const uint8_t *keys = cache;
    const uint8_t *values = keys + num_slots * width;
    int64_t per_thread = 2 * head_dim + max_len;
    float *work = malloc((size_t)omp_get_max_threads() * (size_t)per_thread * sizeof(float));
    if (work == NULL)
        return OCTAVO_ERR_NO_MEMORY;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < num_heads; h++) {
            int64_t kv = h / group;
            attend_head(out + (b * num_heads + h) * head_dim, q + b * q_stride + h * head_dim,
                        keys + kv * head_dim, values + kv * head_dim, slots + b * max_len,
                        seq_lens[b], width, head_dim, scale, k_table, v_table,
                        work + omp_get_thread_num() * per_thread);
        }
    }
    free(work);
    return OCTAVO_OK;
}
