/* One Llama-family decoder layer over a step of decode rows in one call (see
 * octavo/cpu/decode_layer.py for when it runs). A decode step of a small model spends as long
 * in the Python between kernels as in a quarter of its arithmetic: ten calls a layer, each
 * with its module call, views and output allocations. Here the same kernels run in the same
 * order, on the same rounding, straight one after the other. The structs are octavo_cpu.h's.
 *
 * A projection's weight is the pair GEMM's packed bf16 copy, an fp8 checkpoint's bytes packed
 * the same way (octavo_fp8_pair_gemm, as octavo.cpu.fp8_gemm calls it) or GGUF blocks
 * (octavo_layer's *_type): a GGUF model kept in its blocks runs the same fused layer, each
 * quantized projection the decode kernel octavo.cpu.quant_gemm would call for the layer
 * (Q8 activations with VNNI where the type has it), rounded to bf16 as it rounds. q, k and
 * v are one weight (qkv), as gate and up are, so each input row is quantized once for them.
 *
 * A projection with LoRA adapter slots (octavo_layer's *_lora), in a step whose tokens run
 * with adapters (octavo_decode_step's lora_*), has the step's delta added to its product by
 * octavo_lora_delta, as the layer by layer path adds it (LoRALinearMethod.after_gemm: the
 * product rounded to bf16 with its bias, then the delta, rounded once): the same call on the
 * same operands, so the same bits. The gate/up projection then takes the unfused path (its
 * [T][2 * intermediate] product, the delta, octavo_silu_and_mul), as the layers do.
 */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_kernels.h"

/* Whether a projection's weight of type `type` is GGUF blocks (not packed pairs). */
static int blocks(int64_t type) {
    return type != OCTAVO_WEIGHT_PAIRS && type != OCTAVO_WEIGHT_FP8_PAIRS;
}

/* fp32 scratch of a layer's GGUF-block projections (none where no weight is in blocks): an
 * input [T][widest input] and an output [T][widest output] in fp32. */
static int64_t quant_scratch_floats(const octavo_layer *layer, int64_t t) {
    if (!blocks(layer->qkv_type) && !blocks(layer->o_type) && !blocks(layer->gate_up_type)
        && !blocks(layer->down_type))
        return 0;
    int64_t h = layer->hidden, q_size = layer->num_heads * layer->head_dim;
    int64_t qkv_size = q_size + 2 * layer->num_kv_heads * layer->head_dim;
    int64_t inter = layer->intermediate;
    int64_t widest_in = h > q_size ? h : q_size, widest_out = qkv_size > h ? qkv_size : h;
    widest_in = widest_in > inter ? widest_in : inter;
    widest_out = widest_out > 2 * inter ? widest_out : 2 * inter;
    return t * (widest_in + widest_out);
}

/* Whether the step adds LoRA deltas to the projection with adapter slots `lora`. */
static int adds_lora(const octavo_lora *lora, const octavo_decode_step *step) {
    return lora != NULL && step->lora_sorted_tokens != NULL;
}

/* Whether the gate/up projection's product is written out before SiLU: a quantized one's
 * (blocks or fp8), or one the step adds a LoRA delta to (the pair GEMM otherwise applies
 * SiLU itself). */
static int unfused_gate_up(const octavo_layer *layer, const octavo_decode_step *step) {
    return layer->gate_up_type != OCTAVO_WEIGHT_PAIRS || adds_lora(layer->gate_up_lora, step);
}

/* y [T][out] (rows out apart) += the step's LoRA delta of x [T][in] (rows x_stride apart)
 * through the adapter slots `lora`, where the step has adapters. */
static int add_lora(bf16 *y, const bf16 *x, int64_t x_stride, const octavo_lora *lora,
                    const octavo_decode_step *step, int64_t in, int64_t out) {
    if (!adds_lora(lora, step)) return OCTAVO_OK;
    return octavo_lora_delta(y, out, x, x_stride, lora->a, lora->b, (int)lora->dtype,
                             lora->slices, lora->num_slices, step->lora_sorted_tokens,
                             step->lora_starts, step->lora_counts, lora->num_slots,
                             step->tokens, lora->rank, in, out);
}

/* y [T][out] = x [T][in] (rows x_stride apart) times GGUF blocks of ggml type `type`, plus
 * bias: as octavo.cpu.quant.QuantGemm computes it layer by layer (x widened to fp32, the
 * kernel its decode_kernel picks, the fp32 product rounded to bf16, then the bias added and
 * rounded again, as bf16 tensors add). scratch: [T][in] + [T][out] floats. */
static int quant_project(bf16 *y, const bf16 *x, int64_t x_stride, const void *blocks,
                         int64_t type, const float *bias, int64_t t, int64_t out, int64_t in,
                         float *scratch) {
    float *x32 = scratch, *y32 = scratch + t * in;
    for (int64_t r = 0; r < t; r++)
        for (int64_t i = 0; i < in; i++) x32[r * in + i] = bf2f(x[r * x_stride + i]);
    int status = octavo_quant_q8_available((int)type)
                     ? octavo_quant_matmul_q8(y32, x32, t, blocks, (int)type, out, in)
                     : octavo_quant_matmul(y32, x32, t, blocks, (int)type, out, in);
    if (status != OCTAVO_OK) return status;
    for (int64_t r = 0; r < t; r++)
        for (int64_t j = 0; j < out; j++) {
            bf16 v = f2bf(y32[r * out + j]);
            y[r * out + j] = bias ? f2bf(bf2f(v) + bias[j]) : v;
        }
    return OCTAVO_OK;
}

/* A projection of the layer, its weight of any kind (octavo_layer's *_type; `scale` an fp8
 * weight's), plus the step's LoRA delta where it has one for the projection (`lora`). */
static int project(bf16 *y, const bf16 *x, int64_t x_stride, const void *w, int64_t type,
                   const float *bias, const float *scale, const octavo_lora *lora,
                   const octavo_decode_step *step, int64_t out, int64_t in, float *scratch) {
    int64_t t = step->tokens;
    int status = type == OCTAVO_WEIGHT_PAIRS
                     ? octavo_pair_gemm(y, x, x_stride, w, bias, t, out, in)
                 : type == OCTAVO_WEIGHT_FP8_PAIRS
                     ? octavo_fp8_pair_gemm(y, x, x_stride, w, scale, bias, t, out, in)
                     : quant_project(y, x, x_stride, w, type, bias, t, out, in, scratch);
    return status == OCTAVO_OK ? add_lora(y, x, x_stride, lora, step, in, out) : status;
}

/* The gate/up projection and SiLU: silu(gate) * up [T][intermediate], as octavo_pair_gemm_silu
 * computes it for packed pairs, or as the layer by layer path does for blocks or with a LoRA
 * delta (the [T][2 * intermediate] product rounded into gate_up, the delta added, then
 * octavo_silu_and_mul). */
static int project_silu(bf16 *act, const bf16 *normed, const octavo_layer *layer,
                        const octavo_decode_step *step, bf16 *gate_up, float *scratch) {
    int64_t t = step->tokens, h = layer->hidden, inter = layer->intermediate;
    if (!unfused_gate_up(layer, step))
        return octavo_pair_gemm_silu(act, normed, h, layer->gate_up, layer->gate_up_bias, t,
                                     inter, h);
    int status = project(gate_up, normed, h, layer->gate_up, layer->gate_up_type,
                         layer->gate_up_bias, layer->gate_up_scale, layer->gate_up_lora, step,
                         2 * inter, h, scratch);
    if (status == OCTAVO_OK) octavo_silu_and_mul(act, gate_up, t, inter, 2 * inter);
    return status;
}

/* The layer's kernels in turn, on scratch the caller gives: normed [T][hidden], qkv
 * [T][qkv_size], attn [T][q_size], act [T][intermediate] and, where unfused_gate_up, gate_up
 * [T][2 * intermediate], with a shared prefix state [T][heads][2 + head_dim] fp32, and with
 * quantized projections quant (quant_scratch_floats). The first kernel that fails ends the
 * layer, its status returned. */
static int run_layer(const octavo_layer *layer, const octavo_decode_step *step, bf16 *hidden,
                     const bf16 *residual, bf16 *out, bf16 *residual_out, bf16 *cache,
                     int64_t num_slots, bf16 *normed, float *state, float *quant) {
    int64_t t = step->tokens, h = layer->hidden, d = layer->head_dim;
    int64_t q_size = layer->num_heads * d, kv_size = layer->num_kv_heads * d;
    int64_t qkv_size = q_size + 2 * kv_size, inter = layer->intermediate;
    int64_t stats = t * layer->num_heads; /* per row and head: a max, a sum */
    bf16 *qkv = normed + t * h, *attn = qkv + t * qkv_size, *act = attn + t * q_size;
    bf16 *gate_up = act + t * inter;
    int status;
    /* hidden becomes the residual stream (hidden + residual), normed its norm. */
    octavo_rms_norm(normed, hidden, residual, layer->input_norm, t, h, h, h, layer->eps);
    status = project(qkv, normed, h, layer->qkv, layer->qkv_type, layer->qkv_bias,
                     layer->qkv_scale, layer->qkv_lora, step, qkv_size, h, quant);
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
    status = project(residual_out, attn, q_size, layer->o, layer->o_type, layer->o_bias,
                     layer->o_scale, layer->o_lora, step, h, q_size, quant);
    if (status != OCTAVO_OK) return status;
    /* residual_out += the stream (the next residual stream), normed its norm. */
    octavo_rms_norm(normed, residual_out, hidden, layer->post_norm, t, h, h, h, layer->eps);
    status = project_silu(act, normed, layer, step, gate_up, quant);
    if (status != OCTAVO_OK) return status;
    return project(out, act, inter, layer->down, layer->down_type, layer->down_bias,
                   layer->down_scale, layer->down_lora, step, h, inter, quant);
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
    int64_t inter = layer->intermediate, gate_up = unfused_gate_up(layer, step) ? 2 * inter : 0;
    bf16 *normed = octavo_alloc(sizeof(bf16) * t
                                * (layer->hidden + qkv_size + q_size + inter + gate_up));
    float *state = prefix ? octavo_alloc(sizeof(float) * t * layer->num_heads * (2 + d)) : NULL;
    int64_t quant_floats = quant_scratch_floats(layer, t);
    float *quant = quant_floats ? octavo_alloc(sizeof(float) * quant_floats) : NULL;
    int status = !normed || (prefix && !state) || (quant_floats && !quant)
                     ? OCTAVO_ERR_NO_MEMORY
                     : run_layer(layer, step, hidden, residual, out, residual_out, cache,
                                 num_slots, normed, state, quant);
    free(quant);
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
