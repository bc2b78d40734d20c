/* One Llama-family decoder layer over a step of decode rows in one call (see
 * octavo/cpu/decode_layer.py for when it runs). A decode step of a small model spends as long
 * in the Python between kernels as in a quarter of its arithmetic: ten calls a layer, each
 * with its module call, views and output allocations. Here the same kernels run in the same
 * order, on the same rounding, straight one after the other. The structs are octavo_cpu.h's.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"

/* The layer's kernels in turn, on scratch the caller gives: normed [T][hidden], qkv
 * [T][qkv_size], attn [T][q_size], act [T][intermediate], and with a shared prefix, state
 * [T][heads][2 + head_dim] fp32. The first kernel that fails ends the layer, its status
 * returned. */
static int run_layer(const octavo_layer *layer, const octavo_decode_step *step, bf16 *hidden,
                     const bf16 *residual, bf16 *out, bf16 *residual_out, bf16 *cache,
                     int64_t num_slots, bf16 *normed, float *state) {
    int64_t t = step->tokens, h = layer->hidden, d = layer->head_dim;
    int64_t q_size = layer->num_heads * d, kv_size = layer->num_kv_heads * d;
    int64_t qkv_size = q_size + 2 * kv_size, inter = layer->intermediate;
    int64_t stats = t * layer->num_heads; /* per row and head: a max, a sum */
    bf16 *qkv = normed + t * h, *attn = qkv + t * qkv_size, *act = attn + t * q_size;
    int status;
    /* hidden becomes the residual stream (hidden + residual), normed its norm. */
    octavo_rms_norm(normed, hidden, residual, layer->input_norm, t, h, h, h, layer->eps);
    status = octavo_pair_gemm(qkv, normed, h, layer->qkv, layer->qkv_bias, t, qkv_size, h);
    if (status != OCTAVO_OK) return status;
    octavo_rope(qkv, qkv + q_size, step->cos, step->sin, t, layer->num_heads,
                layer->num_kv_heads, d, qkv_size, qkv_size);
    octavo_write_kv(cache, num_slots, qkv + q_size, qkv + q_size + kv_size, step->slot_mapping,
                    t, kv_size, qkv_size, qkv_size);
    if (state) {
        status = octavo_prefix_attention(state, state + stats, state + 2 * stats, qkv, qkv_size,
                                         t, cache, num_slots, step->prefix_slots,
                                         step->prefix_len, layer->num_heads,
                                         layer->num_kv_heads, d, layer->scale);
        if (status != OCTAVO_OK) return status;
    }
    status = octavo_decode_attention(attn, qkv, cache, num_slots, step->slots, step->seq_lens, t,
                                     step->max_len, layer->num_heads, layer->num_kv_heads, d,
                                     qkv_size, layer->scale, state,
                                     state ? state + stats : NULL,
                                     state ? state + 2 * stats : NULL);
    if (status != OCTAVO_OK) return status;
    status = octavo_pair_gemm(residual_out, attn, q_size, layer->o, layer->o_bias, t, h, q_size);
    if (status != OCTAVO_OK) return status;
    /* residual_out += the stream (the next residual stream), normed its norm. */
    octavo_rms_norm(normed, residual_out, hidden, layer->post_norm, t, h, h, h, layer->eps);
    status = octavo_pair_gemm_silu(act, normed, h, layer->gate_up, layer->gate_up_bias, t,
                                   inter, h);
    if (status != OCTAVO_OK) return status;
    return octavo_pair_gemm(out, act, inter, layer->down, layer->down_bias, t, h, inter);
}

/* hidden [T][hidden] (this layer's input, overwritten with the residual stream when there is
 * a residual) and residual (NULL for the first layer); writes the layer's output to out and
 * the new residual stream to residual_out, as the portable layers return them. cache: the
 * layer's [2][num_slots][kv_heads * head_dim]. */
int octavo_decode_layer(const octavo_layer *layer, const octavo_decode_step *step,
                        bf16 *hidden, const bf16 *residual, bf16 *out, bf16 *residual_out,
                        bf16 *cache, int64_t num_slots) {
    int64_t t = step->tokens, d = layer->head_dim;
    int64_t q_size = layer->num_heads * d, qkv_size = q_size + 2 * layer->num_kv_heads * d;
    int prefix = step->prefix_len > 0;
    bf16 *normed = octavo_alloc(sizeof(bf16) * t
                                * (layer->hidden + qkv_size + q_size + layer->intermediate));
    float *state = prefix ? octavo_alloc(sizeof(float) * t * layer->num_heads * (2 + d)) : NULL;
    int status = !normed || (prefix && !state)
                     ? OCTAVO_ERR_NO_MEMORY
                     : run_layer(layer, step, hidden, residual, out, residual_out, cache,
                                 num_slots, normed, state);
    free(state);
    free(normed);
    return status;
}

/* Every layer of a decode step in one call: layer i over caches[i] (each
 * [2][num_slots][width]), each layer's output and residual stream the next one's input, as
 * the model's loop over octavo_decode_layer would pass them. bufs[0]: the first layer's
 * input (read only); bufs[1..4]: [T][hidden] each, which the layers take in turn for their
 * outputs: the last layer's output and residual stream end in bufs[1] and bufs[2] for an odd
 * number of layers, bufs[3] and bufs[4] for an even one. */
int octavo_decode_layers(const octavo_layer *layers, int64_t num_layers,
                         const octavo_decode_step *step, bf16 *const *bufs,
                         bf16 *const *caches, int64_t num_slots) {
    bf16 *hidden = bufs[0], *residual = NULL;
    for (int64_t i = 0; i < num_layers; i++) {
        bf16 *out = bufs[i % 2 ? 3 : 1], *residual_out = bufs[i % 2 ? 4 : 2];
        int status = octavo_decode_layer(&layers[i], step, hidden, residual, out, residual_out,
                                         caches[i], num_slots);
        if (status != OCTAVO_OK) return status;
        hidden = out;
        residual = residual_out;
    }
    return OCTAVO_OK;
}
