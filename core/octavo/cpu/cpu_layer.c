/* One Llama-family decoder layer over a step of decode rows in one call (see
 * octavo/cpu/layers.py for when it runs). A decode step of a small model spends as long in
 * the Python between kernels as in a quarter of its arithmetic: ten calls a layer, each
 * with its module call, views and output allocations. Here the same kernels run in the
 * same order, on the same rounding, straight one after the other.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"

/* What stays fixed for a layer: its weights (the pair GEMM's packed copies, fp32 biases or
 * NULL, the norms' bf16 weights) and sizes. */
typedef struct {
    const bf16 *input_norm, *post_norm;
    const bf16 *qkv, *o, *gate_up, *down;
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias;
    int64_t hidden, num_heads, num_kv_heads, head_dim, intermediate;
    float eps, scale;
} octavo_layer;

/* What one step gives every layer: the rows' rotary cos/sin ([T][head_dim]), the new
 * tokens' cache slots, and the decode rows' context slots ([T][max_len]) and lengths; with
 * prefix_len > 0 the positions at prefix_slots are the ones all rows share first, attended
 * once for all (cascade attention), and slots/seq_lens/max_len cover what follows them. */
typedef struct {
    int64_t tokens;
    const bf16 *cos, *sin;
    const int64_t *slot_mapping, *slots, *seq_lens;
    int64_t max_len;
    const int64_t *prefix_slots;
    int64_t prefix_len;
} octavo_decode_step;

/* hidden [T][hidden] (this layer's input, overwritten with the residual stream when there is
 * a residual) and residual (NULL for the first layer); writes the layer's output to out and
 * the new residual stream to residual_out, as the portable layers return them. cache: the
 * layer's [2][num_slots][kv_heads * head_dim]. */
void octavo_decode_layer(const octavo_layer *layer, const octavo_decode_step *step,
                         bf16 *hidden, const bf16 *residual, bf16 *out, bf16 *residual_out,
                         bf16 *cache, int64_t num_slots) {
    int64_t t = step->tokens, h = layer->hidden, d = layer->head_dim;
    int64_t q_size = layer->num_heads * d, kv_size = layer->num_kv_heads * d;
    int64_t qkv_size = q_size + 2 * kv_size, inter = layer->intermediate;
    bf16 *normed = malloc(sizeof(bf16) * t * (h + qkv_size + q_size + inter));
    bf16 *qkv = normed + t * h, *attn = qkv + t * qkv_size, *act = attn + t * q_size;
    /* hidden becomes the residual stream (hidden + residual), normed its norm. */
    octavo_rms_norm(normed, hidden, residual, layer->input_norm, t, h, h, h, layer->eps);
    octavo_pair_gemm(qkv, normed, h, layer->qkv, layer->qkv_bias, t, qkv_size, h);
    octavo_rope(qkv, qkv + q_size, step->cos, step->sin, t, layer->num_heads,
                layer->num_kv_heads, d, qkv_size, qkv_size);
    octavo_write_kv(cache, num_slots, qkv + q_size, qkv + q_size + kv_size, step->slot_mapping,
                    t, kv_size, qkv_size, qkv_size);
    float *state = NULL;
    if (step->prefix_len > 0) {
        state = malloc(sizeof(float) * t * layer->num_heads * (2 + d));
        octavo_prefix_attention(state, state + t * layer->num_heads,
                                state + 2 * t * layer->num_heads, qkv, qkv_size, t, cache,
                                num_slots, step->prefix_slots, step->prefix_len,
                                layer->num_heads, layer->num_kv_heads, d, layer->scale);
    }
    octavo_decode_attention(attn, qkv, cache, num_slots, step->slots, step->seq_lens, t,
                            step->max_len, layer->num_heads, layer->num_kv_heads, d, qkv_size,
                            layer->scale, state, state ? state + t * layer->num_heads : NULL,
                            state ? state + 2 * t * layer->num_heads : NULL);
    free(state);
    octavo_pair_gemm(residual_out, attn, q_size, layer->o, layer->o_bias, t, h, q_size);
    /* residual_out += the stream (the next residual stream), normed its norm. */
    octavo_rms_norm(normed, residual_out, hidden, layer->post_norm, t, h, h, h, layer->eps);
    octavo_pair_gemm_silu(act, normed, h, layer->gate_up, layer->gate_up_bias, t, inter, h);
    octavo_pair_gemm(out, act, inter, layer->down, layer->down_bias, t, h, inter);
    free(normed);
}

/* Every layer of a decode step in one call: layer i over caches[i] (each
 * [2][num_slots][width]), each layer's output and residual stream the next one's input, as
 * the model's loop over octavo_decode_layer would pass them. bufs[0]: the first layer's
 * input (read only); bufs[1..4]: [T][hidden] each, which the layers take in turn for their
 * outputs: the last layer's output and residual stream end in bufs[1] and bufs[2] for an odd
 * number of layers, bufs[3] and bufs[4] for an even one. */
void octavo_decode_layers(const octavo_layer *layers, int64_t num_layers,
                          const octavo_decode_step *step, bf16 *const *bufs,
                          bf16 *const *caches, int64_t num_slots) {
    bf16 *hidden = bufs[0], *residual = NULL;
    for (int64_t i = 0; i < num_layers; i++) {
        bf16 *out = bufs[i % 2 ? 3 : 1], *residual_out = bufs[i % 2 ? 4 : 2];
        octavo_decode_layer(&layers[i], step, hidden, residual, out, residual_out, caches[i],
                            num_slots);
        hidden = out;
        residual = residual_out;
    }
}
