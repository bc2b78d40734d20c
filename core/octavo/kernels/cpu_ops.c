/* Fused bf16 kernels for the CPU hot path (see octavo/kernels/cpu.py for why and how they
 * are built). Each one replaces a chain of small PyTorch ops whose per-op dispatch cost,
 * not arithmetic, dominates a decode step, and rounds to bf16 where that chain rounds, so
 * results match it to the last bit or nearly (sums may be added in another order).
 *
 * Tensors arrive as raw pointers with the row strides (in elements) the caller checked;
 * within a row the elements are contiguous. bf16 values travel as uint16_t.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512BF16__
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

/* y = W x (+ bias) for one row x [in] and W [out, in] in its plain layout, each output
 * summed in fp32 and rounded to bf16 once. A decode step of one request is bound by
 * streaming the weights from memory; four rows at a time with AVX512-BF16's dot-product
 * instruction (no conversion pass) keep more loads in flight than oneDNN's blocked GEMV,
 * ~1.25x its bandwidth on both cores of a SmolLM2-135M step. */
static float dot_row(const bf16 *w, const bf16 *x, int64_t in) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < in; i++) sum += bf2f(w[i]) * bf2f(x[i]);
    return sum;
}

void octavo_gemv(bf16 *y, const bf16 *w, const bf16 *x, const bf16 *bias, int64_t out,
                 int64_t in) {
    int64_t groups = out / 4;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const bf16 *w0 = w + 4 * g * in;
        float sums[4];
#ifdef __AVX512BF16__
        if (in % 32 == 0) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < in; i += 32) {
                __m512bh xv = (__m512bh)_mm512_loadu_si512(x + i);
                a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w0 + i), xv);
                a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w0 + in + i), xv);
                a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w0 + 2 * in + i), xv);
                a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w0 + 3 * in + i), xv);
            }
            sums[0] = _mm512_reduce_add_ps(a0);
            sums[1] = _mm512_reduce_add_ps(a1);
            sums[2] = _mm512_reduce_add_ps(a2);
            sums[3] = _mm512_reduce_add_ps(a3);
        } else
#endif
            for (int r = 0; r < 4; r++) sums[r] = dot_row(w0 + r * in, x, in);
        for (int r = 0; r < 4; r++) {
            int64_t o = 4 * g + r;
            y[o] = f2bf(sums[r] + (bias ? bf2f(bias[o]) : 0.0f));
        }
    }
    for (int64_t o = 4 * groups; o < out; o++)
        y[o] = f2bf(dot_row(w + o * in, x, in) + (bias ? bf2f(bias[o]) : 0.0f));
}

/* Work below this many elements runs on one thread: waking the others costs more. */
#define PARALLEL_MIN 32768

/* out = weight * rmsnorm(x), or with residual != NULL first x = x + residual (bf16), the new
 * residual stream, written back into x. As HF: the norm in fp32, rounded to bf16, then
 * multiplied by the bf16 weight. */
void octavo_rms_norm(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *weight,
                     int64_t rows, int64_t dim, int64_t x_stride, int64_t res_stride,
                     float eps) {
#pragma omp parallel for if (rows * dim >= PARALLEL_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        bf16 *xr = x + r * x_stride;
        float sum = 0.0f;
        if (residual) {
            const bf16 *rr = residual + r * res_stride;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) {
                bf16 s = f2bf(bf2f(xr[i]) + bf2f(rr[i]));
                xr[i] = s;
                float f = bf2f(s);
                sum += f * f;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) {
                float f = bf2f(xr[i]);
                sum += f * f;
            }
        }
        float scale = 1.0f / sqrtf(sum / (float)dim + eps);
        bf16 *o = out + r * dim;
#pragma omp simd
        for (int64_t i = 0; i < dim; i++)
            o[i] = f2bf(bf2f(weight[i]) * bf2f(f2bf(bf2f(xr[i]) * scale)));
    }
}

/* out[r] = silu(gate) * up for x[r] = [gate | up] (each d wide), each op rounded to bf16. */
void octavo_silu_and_mul(bf16 *out, const bf16 *x, int64_t rows, int64_t d, int64_t x_stride) {
#pragma omp parallel for if (rows * d >= PARALLEL_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = x + r * x_stride;
        const bf16 *up = gate + d;
        bf16 *o = out + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) {
            float g = bf2f(gate[i]);
            float silu = bf2f(f2bf(g / (1.0f + expf(-g))));
            o[i] = f2bf(silu * bf2f(up[i]));
        }
    }
}

/* Rotary embedding in place on `heads` vectors of head_dim per token (x: [tokens, heads,
 * head_dim], rows `stride` apart): x * cos + rotate_half(x) * sin with `sin` already signed
 * (-sin on the first half), as octavo.models.layers.rotary computes it: each product and the
 * sum rounded to bf16. cos/sin: [tokens, head_dim]. */
static void rope_rows(bf16 *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
                      const bf16 *cos, const bf16 *sin) {
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const bf16 *c = cos + t * head_dim, *s = sin + t * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            bf16 *v = x + t * stride + h * head_dim;
            float lo[half], hi[half];
            for (int64_t i = 0; i < half; i++) {
                lo[i] = bf2f(v[i]);
                hi[i] = bf2f(v[i + half]);
            }
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float a = bf2f(f2bf(lo[i] * bf2f(c[i])));
                float b = bf2f(f2bf(hi[i] * bf2f(s[i])));
                v[i] = f2bf(a + b);
                float a2 = bf2f(f2bf(hi[i] * bf2f(c[i + half])));
                float b2 = bf2f(f2bf(lo[i] * bf2f(s[i + half])));
                v[i + half] = f2bf(a2 + b2);
            }
        }
    }
}

void octavo_rope(bf16 *q, bf16 *k, const bf16 *cos, const bf16 *sin, int64_t tokens,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                 int64_t k_stride) {
    rope_rows(q, tokens, num_heads, head_dim, q_stride, cos, sin);
    rope_rows(k, tokens, num_kv_heads, head_dim, k_stride, cos, sin);
}

/* Store each token's key and value row (width = kv_heads * head_dim) at its cache slot.
 * cache: [2, slots, width]; key rows key_stride apart, value rows value_stride apart. */
void octavo_write_kv(bf16 *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                     const int64_t *slot_mapping, int64_t tokens, int64_t width,
                     int64_t key_stride, int64_t value_stride) {
    bf16 *values = cache + num_slots * width;
    for (int64_t t = 0; t < tokens; t++) {
        int64_t slot = slot_mapping[t];
        memcpy(cache + slot * width, key + t * key_stride, width * sizeof(bf16));
        memcpy(values + slot * width, value + t * value_stride, width * sizeof(bf16));
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
        float *row = malloc(sizeof(float) * width);
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < batch; b++) {
            int64_t len = seq_lens[b];
            const int64_t *slot = slots + b * max_len;
#pragma omp simd
            for (int64_t i = 0; i < qwidth; i++) qf[i] = bf2f(q[b * q_stride + i]) * scale;
            for (int64_t j = 0; j < len; j++) {
                const bf16 *k = cache + slot[j] * width;
#pragma omp simd
                for (int64_t i = 0; i < width; i++) row[i] = bf2f(k[i]);
                for (int64_t h = 0; h < num_heads; h++) {
                    const float *kh = row + (h / group) * head_dim, *qh = qf + h * head_dim;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < head_dim; d++) dot += qh[d] * kh[d];
                    scores[h * max_len + j] = dot;
                }
            }
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
            memset(acc, 0, sizeof(float) * qwidth);
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
        free(row);
    }
}

