/* What the library says about its own interface (octavo_cpu.h): the compiler's layout of
 * every struct there, from the same field lists that define them, for the test that compares
 * it with the ctypes structs Python builds from the header; and what each status means. */
#include <stddef.h>
#include <stdint.h>

#include "octavo_cpu.h"

/* The rows of the struct STRUCT (defined around each field list below): its size, then one
 * row per field. */
#define NAME_OF(s) #s
#define NAME(s) NAME_OF(s)
#define LAYOUT_STRUCT {NAME(STRUCT), NULL, 0, sizeof(STRUCT)},
#define LAYOUT_FIELD(type, name) \
    {NAME(STRUCT), #name, offsetof(STRUCT, name), sizeof(((STRUCT *)0)->name)},

static const octavo_layout_entry layout[] = {
#define STRUCT octavo_lora
    LAYOUT_STRUCT OCTAVO_LORA_FIELDS(LAYOUT_FIELD)
#undef STRUCT
#define STRUCT octavo_layer
    LAYOUT_STRUCT OCTAVO_LAYER_FIELDS(LAYOUT_FIELD)
#undef STRUCT
#define STRUCT octavo_decode_step
    LAYOUT_STRUCT OCTAVO_DECODE_STEP_FIELDS(LAYOUT_FIELD)
#undef STRUCT
#define STRUCT octavo_layout_entry
    LAYOUT_STRUCT OCTAVO_LAYOUT_ENTRY_FIELDS(LAYOUT_FIELD)
#undef STRUCT
};

const octavo_layout_entry *octavo_layout(int64_t *count) {
    *count = sizeof(layout) / sizeof(layout[0]);
    return layout;
}

const char *octavo_status_message(int status) {
    switch (status) {
    case OCTAVO_OK: return NULL;
    case OCTAVO_ERR_NO_MEMORY: return "out of memory for its scratch buffers";
    case OCTAVO_ERR_NEEDS_AVX512:
        return "built without AVX-512 on this CPU (check gemm_available() before calling it)";
    case OCTAVO_ERR_NEEDS_AVX512_BF16:
        return "built without AVX512-BF16 on this CPU (check pair_gemm_available() or "
               "attention_available() before calling it)";
    case OCTAVO_ERR_BAD_QUANT:
        return "a GGUF type the quantized kernels do not serve, or a row length that is not a "
               "whole number of its blocks (check quant_types() before calling them)";
    default: return "unknown status";
    }
}
