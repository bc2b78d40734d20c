/* The CPU kernels' interface with Python, written once: the status codes, the sizes both
 * sides lay weights out by, the structs Python fills and every entry point it calls. Each C
 * source includes it (built with -Werror=missing-prototypes, so every exported function is
 * declared here and the compiler checks each definition against its declaration), and
 * octavo/cpu/kernel_header.py reads it to declare the ctypes side. So it holds only what that
 * reader takes:
 *   #define NAME <integer>                                  a constant
 *   #define NAME_FIELDS(FIELD) FIELD(type, name) ...        a struct's fields, in order
 *   typedef struct { NAME_FIELDS(OCTAVO_FIELD) } name;      the struct made of them
 *   type name(type arg, ...);                               an entry point
 * with types among int, int64_t, float, bf16 and pointers. The library's layout table
 * (octavo_layout) comes from the same field lists, and tests/core/cpu/test_cpu_interface.py
 * compares it with the ctypes structs. */
#ifndef OCTAVO_CPU_H
#define OCTAVO_CPU_H

#include <stdint.h>

typedef uint16_t bf16;

/* What a kernel that can fail returns; octavo_status_message says it in words. */
#define OCTAVO_OK 0
#define OCTAVO_ERR_NO_MEMORY 1
#define OCTAVO_ERR_NEEDS_AVX512 2
#define OCTAVO_ERR_NEEDS_AVX512_BF16 3
#define OCTAVO_ERR_BAD_QUANT 4

/* Output columns per weight panel: the panel GEMM's, and the pair GEMM's (whose packing
 * Python does). */
#define GEMM_PANEL 32
#define PAIR_PANEL 16

#define OCTAVO_FIELD(type, name) type name;

/* A projection's weight in octavo_layer: with type OCTAVO_WEIGHT_PAIRS, the pair GEMM's
 * packed bf16 copy; with OCTAVO_WEIGHT_FP8_PAIRS, an fp8 layer's e4m3 bytes packed the same
 * way, multiplied by octavo_fp8_pair_gemm with the projection's *_scale; else ggml's type
 * number of the GGUF blocks it points to (the file's rows, as octavo_quant_matmul takes
 * them), multiplied by that type's decode kernel. */
#define OCTAVO_WEIGHT_PAIRS 0
#define OCTAVO_WEIGHT_FP8_PAIRS 1000

/* A projection's LoRA adapter slots in octavo_layer, as octavo_lora_delta takes them (its
 * a, b, dtype, slices, num_slices, num_slots and rank; the projection's own in and out
 * sizes): the fused layer adds the step's delta to the projection's product where the
 * step groups tokens by slot (octavo_decode_step's lora_*). Fixed for the layer's life:
 * loading an adapter into a slot writes a and b in place. */
#define OCTAVO_LORA_FIELDS(FIELD)                                                            \
    FIELD(const void *, a) FIELD(const void *, b) FIELD(int64_t, dtype)                      \
    FIELD(const int64_t *, slices) FIELD(int64_t, num_slices) FIELD(int64_t, num_slots)      \
    FIELD(int64_t, rank)
typedef struct { OCTAVO_LORA_FIELDS(OCTAVO_FIELD) } octavo_lora;

/* What stays fixed for a layer: its weights (each projection's, typed as above; fp32 biases
 * or NULL; fp32 scales per output column for fp8 weights, else NULL; the norms' bf16
 * weights), each projection's LoRA slots (NULL: none) and sizes. */
#define OCTAVO_LAYER_FIELDS(FIELD)                                                           \
    FIELD(const bf16 *, input_norm) FIELD(const bf16 *, post_norm)                           \
    FIELD(const void *, qkv) FIELD(const void *, o) FIELD(const void *, gate_up)             \
    FIELD(const void *, down)                                                                \
    FIELD(const float *, qkv_bias) FIELD(const float *, o_bias)                              \
    FIELD(const float *, gate_up_bias) FIELD(const float *, down_bias)                       \
    FIELD(const float *, qkv_scale) FIELD(const float *, o_scale)                            \
    FIELD(const float *, gate_up_scale) FIELD(const float *, down_scale)                     \
    FIELD(int64_t, qkv_type) FIELD(int64_t, o_type) FIELD(int64_t, gate_up_type)             \
    FIELD(int64_t, down_type)                                                                \
    FIELD(const octavo_lora *, qkv_lora) FIELD(const octavo_lora *, o_lora)                  \
    FIELD(const octavo_lora *, gate_up_lora) FIELD(const octavo_lora *, down_lora)           \
    FIELD(int64_t, hidden) FIELD(int64_t, num_heads) FIELD(int64_t, num_kv_heads)            \
    FIELD(int64_t, head_dim) FIELD(int64_t, intermediate)                                    \
    FIELD(float, eps) FIELD(float, scale)
typedef struct { OCTAVO_LAYER_FIELDS(OCTAVO_FIELD) } octavo_layer;

/* What one step gives every layer: the rows' rotary cos/sin ([T][head_dim]), the new
 * tokens' cache slots, and the decode rows' context slots ([T][max_len]) and lengths; with
 * prefix_len > 0 the positions at prefix_slots are the ones all rows share first, attended
 * once for all (cascade attention), and slots/seq_lens/max_len cover what follows them.
 * With LoRA adapters in the step, its tokens grouped by adapter slot as octavo_lora_delta
 * takes them (lora_sorted_tokens, lora_starts, lora_counts; NULL: no adapter in the step). */
#define OCTAVO_DECODE_STEP_FIELDS(FIELD)                                                     \
    FIELD(int64_t, tokens) FIELD(const bf16 *, cos) FIELD(const bf16 *, sin)                 \
    FIELD(const int64_t *, slot_mapping) FIELD(const int64_t *, slots)                       \
    FIELD(const int64_t *, seq_lens) FIELD(int64_t, max_len)                                 \
    FIELD(const int64_t *, prefix_slots) FIELD(int64_t, prefix_len)                          \
    FIELD(const int *, lora_sorted_tokens) FIELD(const int *, lora_starts)                   \
    FIELD(const int *, lora_counts)
typedef struct { OCTAVO_DECODE_STEP_FIELDS(OCTAVO_FIELD) } octavo_decode_step;

/* One row of octavo_layout: a struct's size (field NULL, offset 0), or the offset and size
 * of one of its fields, as this compiler lays them out. */
#define OCTAVO_LAYOUT_ENTRY_FIELDS(FIELD)                                                    \
    FIELD(const char *, struct_name) FIELD(const char *, field)                              \
    FIELD(int64_t, offset) FIELD(int64_t, size)
typedef struct { OCTAVO_LAYOUT_ENTRY_FIELDS(OCTAVO_FIELD) } octavo_layout_entry;

/* The layout of every struct above: *count rows, each struct's size then its fields. */
const octavo_layout_entry *octavo_layout(int64_t *count);
/* What a status means (NULL for OCTAVO_OK). */
const char *octavo_status_message(int status);

/* Which optional kernels this build has (1) or lacks (0): callers choose a path by them;
 * a kernel called where it is missing returns OCTAVO_ERR_NEEDS_*. */
int octavo_gemm_available(void);
int octavo_pair_gemm_available(void);
int octavo_attention_available(void);

/* Matrix products (cpu_ops.c); bf16 rows in, bf16 rows out, fp32 sums rounded once. */
void octavo_gemv(bf16 *y, const bf16 *w, const bf16 *x, const bf16 *bias, int64_t out,
                 int64_t in);
int octavo_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *panels,
                const float *bias, int64_t rows, int64_t out, int64_t in);
int octavo_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                     const float *bias, int64_t rows, int64_t out, int64_t in);
int octavo_pair_gemm_silu(bf16 *y, const bf16 *x, int64_t x_stride, const bf16 *packed,
                          const float *bias, int64_t rows, int64_t d, int64_t in);
int octavo_fp8_pair_gemm(bf16 *y, const bf16 *x, int64_t x_stride, const void *packed,
                         const float *scale, const float *bias, int64_t rows, int64_t out,
                         int64_t in);

/* The elementwise parts of a layer (cpu_ops.c). */
void octavo_rms_norm(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *weight,
                     int64_t rows, int64_t dim, int64_t x_stride, int64_t res_stride, float eps);
void octavo_silu_and_mul(bf16 *out, const bf16 *x, int64_t rows, int64_t d, int64_t x_stride);
void octavo_rope(bf16 *q, bf16 *k, const bf16 *cos, const bf16 *sin, int64_t tokens,
                 int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t q_stride,
                 int64_t k_stride);
void octavo_write_kv(bf16 *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                     const int64_t *slot_mapping, int64_t tokens, int64_t width,
                     int64_t key_stride, int64_t value_stride);

/* The fp8 KV cache (cpu_kv_fp8.c): the format of its bytes, writing keys and values, and
 * decode attention reading them; cache is [2, num_slots, width] bytes. */
#define OCTAVO_FP8_E4M3 0
#define OCTAVO_FP8_E5M2 1
void octavo_write_kv_fp8(void *cache, int64_t num_slots, const bf16 *key, const bf16 *value,
                         const int64_t *slot_mapping, int64_t tokens, int64_t width,
                         int64_t key_stride, int64_t value_stride, float k_inv_scale,
                         float v_inv_scale, int format);
int octavo_decode_attention_fp8(bf16 *out, const bf16 *q, const void *cache,
                                int64_t num_slots, const int64_t *slots,
                                const int64_t *seq_lens, int64_t batch, int64_t max_len,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                int64_t q_stride, float scale, float k_scale, float v_scale,
                                int format);

/* Attention over the paged cache (cpu_attention.c). */
int octavo_decode_attention(bf16 *out, const bf16 *q, const bf16 *cache, int64_t num_slots,
                            const int64_t *slots, const int64_t *seq_lens, int64_t batch,
                            int64_t max_len, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t q_stride, float scale,
                            const float *prefix_m, const float *prefix_l,
                            const float *prefix_acc);
int octavo_prefill_attention(bf16 *out, const bf16 *q, int64_t q_stride, const bf16 *cache,
                             int64_t num_slots, const int64_t *slots, int64_t max_ctx,
                             const int64_t *query_start, const int64_t *query_lens,
                             const int64_t *seq_lens, int64_t num_reqs, int64_t num_heads,
                             int64_t num_kv_heads, int64_t head_dim, float scale);
int octavo_prefix_attention(float *m, float *l, float *acc, const bf16 *q, int64_t q_stride,
                            int64_t batch, const bf16 *cache, int64_t num_slots,
                            const int64_t *prefix_slots, int64_t prefix_len, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, float scale);

/* Whole decoder layers over a step of decode rows (cpu_layer.c). */
int octavo_decode_layer(const octavo_layer *layer, const octavo_decode_step *step,
                        bf16 *hidden, const bf16 *residual, bf16 *out, bf16 *residual_out,
                        bf16 *cache, int64_t num_slots);
int octavo_decode_layers(const octavo_layer *layers, int64_t num_layers,
                         const octavo_decode_step *step, bf16 *const *bufs,
                         bf16 *const *caches, int64_t num_slots);

/* One decode step of Mamba's selective scan, states updated in place (cpu_ssm.c). */
void octavo_ssm_decode(float *y, float *state, const int64_t *rows, int64_t batch,
                       int64_t inner, int64_t d_state, int64_t slot_stride, int64_t width,
                       int64_t offset, const float *x, const float *dt, const float *bm,
                       const float *c, const float *a);

/* GGUF quantized weights in the file's own block layouts (cpu_quant.c); ggml_type is ggml's
 * type number, in a multiple of the type's block. The bytes of one weight row of in inputs
 * (0 where the type is not served or in is not whole blocks); the rows ids[0..n) (rows 0..n
 * with ids NULL) dequantized to fp32 [n][in]; and y [m][out] = x [m][in] @ w.T in fp32 (any
 * m; up to QUANT_DECODE_ROWS rows, the decode kernel of AVX-512 builds serves it). */
#define QUANT_DECODE_ROWS 8
int64_t octavo_quant_row_bytes(int ggml_type, int64_t in);
int octavo_quant_dequantize(float *out, const void *blocks, const int64_t *ids, int64_t n,
                            int ggml_type, int64_t in);
int octavo_quant_matmul(float *y, const float *x, int64_t m, const void *blocks,
                        int ggml_type, int64_t out, int64_t in);
/* Rows 0..n dequantized straight to bf16 [n][in] (rounded to nearest even, as PyTorch
 * rounds): a bf16 prefill's weight panels. */
int octavo_quant_dequantize_bf16(bf16 *out, const void *blocks, int64_t n, int ggml_type,
                                 int64_t in);

/* The same product on Q8 activations with AVX512-VNNI (cpu_quant_q8.c), for the types
 * octavo_quant_q8_available names (1) and 1..QUANT_DECODE_ROWS rows: x quantized to int8
 * per 32 values as llama.cpp does; OCTAVO_ERR_BAD_QUANT for anything else. */
int octavo_quant_q8_available(int ggml_type);
int octavo_quant_matmul_q8(float *y, const float *x, int64_t m, const void *blocks,
                           int ggml_type, int64_t out, int64_t in);
/* The same product for many rows (cpu_quant_gemm.c: 16 weight rows a panel, each block
 * gathered once for every row of x), on Q8 activations with AVX512-VNNI, for the types
 * octavo_quant_gemm_q8_available names (1: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) and any m >= 1;
 * OCTAVO_ERR_BAD_QUANT for anything else. */
int octavo_quant_gemm_q8_available(int ggml_type);
int octavo_quant_gemm_q8(float *y, const float *x, int64_t m, const void *blocks,
                         int ggml_type, int64_t out, int64_t in);

/* Multi-LoRA's shrink and expand (cpu_lora.c) over a step's tokens grouped by adapter slot:
 * slot s's tokens are sorted_tokens[starts[s] .. starts[s] + counts[s]), for num_slots
 * slots. x, a, b and y hold bf16 (dtype OCTAVO_LORA_BF16) or fp32 (OCTAVO_LORA_FP32).
 * Shrink: out[t][r] = scale * sum_k a[s][r][k] x[t][k] into fp32 rows out_stride apart
 * (rows 0..tokens of tokens in no slot set to 0); a's rows are in values long, its slots
 * a_slot_stride elements apart. Expand: y[t][c] += sum_r b[s][c][r] buf[t][r] for c < size,
 * rounded once to y's dtype; b's rows are rank values long, its slots b_slot_stride
 * elements apart. */
#define OCTAVO_LORA_BF16 0
#define OCTAVO_LORA_FP32 1
int octavo_lora_shrink(float *out, int64_t out_stride, const void *x, int64_t x_stride,
                       const void *a, int64_t a_slot_stride, int dtype,
                       const int *sorted_tokens, const int *starts, const int *counts,
                       int64_t num_slots, int64_t tokens, int64_t rank, int64_t in,
                       float scale);
int octavo_lora_expand(void *y, int64_t y_stride, const float *buf, int64_t buf_stride,
                       const void *b, int64_t b_slot_stride, int dtype,
                       const int *sorted_tokens, const int *starts, const int *counts,
                       int64_t num_slots, int64_t rank, int64_t size);
/* A wrapped layer's whole delta in one call: for each of its num_slices slices i (offset,
 * size pairs in slices: the slice's columns of y and rows of b), shrink x through
 * a[i] (a: [num_slices][num_slots][rank][in] contiguous, scale 1) into an fp32 buffer of
 * tokens x rank made here, then expand it into y's columns offset .. offset + size through
 * b's rows there (b: [num_slots][out_features][rank] contiguous): the same sums as
 * octavo_lora_shrink and octavo_lora_expand called slice by slice. */
int octavo_lora_delta(void *y, int64_t y_stride, const void *x, int64_t x_stride,
                      const void *a, const void *b, int dtype, const int64_t *slices,
                      int64_t num_slices, const int *sorted_tokens, const int *starts,
                      const int *counts, int64_t num_slots, int64_t tokens, int64_t rank,
                      int64_t in, int64_t out_features);

#endif
