/* Multi-LoRA shrink and expand (octavo/cpu/lora.py says why they exist): the two halves of
 * y += (x A_s^T) B_s^T for a step whose tokens each run with their adapter slot s, over the
 * tokens grouped by slot once per step (sorted_tokens, starts, counts).
 *
 * Work is split into items that write disjoint parts of the output, spread over the OpenMP
 * threads: shrink takes runs of SHRINK_ROWS tokens of one slot (all ranks), widens their x
 * rows to fp32 once and multiplies them with A's rows SHRINK_RANKS at a time; expand takes
 * runs of up to EXPAND_TOKENS tokens of one slot times EXPAND_CHUNK blocks of EXPAND_COLS
 * output columns, turns those blocks of B (rows of `rank` values) into fp32 columns once,
 * and then adds EXPAND_ROWS tokens' outputs at a time, block by block, a column vector of
 * B per rank. Sums are fp32; y is
 * rounded once per element, to nearest even as PyTorch rounds. AVX-512 builds run the inner
 * loops on 16-lane registers, others plain loops that compute the same sums. */
#include "cpu_kernels.h"

#include <omp.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LORA_AVX512 1
#endif

#define SHRINK_ROWS 4
#define SHRINK_RANKS 4
#define EXPAND_TOKENS 256
#define EXPAND_ROWS 4
#define EXPAND_COLS 64
/* Column blocks in one expand item: a token's output row is then read and written in runs
 * of EXPAND_CHUNK blocks (1 KiB of bf16) rather than one 128-byte block per pass over the
 * run's tokens - with gate_up's 3072-column rows a pass per block touched a fresh page per
 * token and row, and a 2048-token step took 8x qkv's time for 3.2x its columns. */
#define EXPAND_CHUNK 8

/* A run of one slot's tokens: positions first .. first + n of sorted_tokens. */
typedef struct {
    int64_t slot;
    int64_t first;
    int64_t n;
} token_run;

/* The slots' tokens in runs of at most len (*count of them); NULL when out of memory. */
static token_run *token_runs(const int *starts, const int *counts, int64_t num_slots,
                             int64_t len, int64_t *count) {
    int64_t total = 0;
    for (int64_t s = 0; s < num_slots; s++)
        total += (counts[s] + len - 1) / len;
    token_run *runs = octavo_alloc((size_t)total * sizeof(token_run));
    if (runs == NULL)
        return NULL;
    int64_t i = 0;
    for (int64_t s = 0; s < num_slots; s++)
        for (int64_t done = 0; done < counts[s]; done += len) {
            int64_t left = counts[s] - done;
            runs[i++] = (token_run){s, starts[s] + done, left < len ? left : len};
        }
    *count = total;
    return runs;
}

/* sums[j][i] = dot(xf[j], w[i]) over in values, for SHRINK_ROWS rows xf (in apart) and
 * SHRINK_RANKS rows w[i] of A, bf16 or fp32 as dtype says: each load of x or A feeds
 * SHRINK_ROWS or SHRINK_RANKS multiply-adds. */
static void dot_block(float sums[SHRINK_ROWS][SHRINK_RANKS], const float *xf, int64_t in,
                      const void *const w[SHRINK_RANKS], int dtype) {
#ifdef LORA_AVX512
    __m512 acc[SHRINK_ROWS][SHRINK_RANKS];
    for (int j = 0; j < SHRINK_ROWS; j++)
        for (int i = 0; i < SHRINK_RANKS; i++)
            acc[j][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k += 16) {
        __mmask16 m = in - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (in - k)) - 1);
        __m512 wv[SHRINK_RANKS];
        for (int i = 0; i < SHRINK_RANKS; i++)
            wv[i] = dtype == OCTAVO_LORA_BF16
                        ? bf16x16_to_fp32(_mm256_maskz_loadu_epi16(m, (const bf16 *)w[i] + k))
                        : _mm512_maskz_loadu_ps(m, (const float *)w[i] + k);
        for (int j = 0; j < SHRINK_ROWS; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xf + j * in + k);
            for (int i = 0; i < SHRINK_RANKS; i++)
                acc[j][i] = _mm512_fmadd_ps(xv, wv[i], acc[j][i]);
        }
    }
    for (int j = 0; j < SHRINK_ROWS; j++)
        for (int i = 0; i < SHRINK_RANKS; i++)
            sums[j][i] = _mm512_reduce_add_ps(acc[j][i]);
#else
    for (int i = 0; i < SHRINK_RANKS; i++) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        const float *x0 = xf, *x1 = xf + in, *x2 = xf + 2 * in, *x3 = xf + 3 * in;
        for (int64_t k = 0; k < in; k++) {
            float v = dtype == OCTAVO_LORA_BF16 ? bf2f(((const bf16 *)w[i])[k])
                                                : ((const float *)w[i])[k];
            s0 += x0[k] * v, s1 += x1[k] * v, s2 += x2[k] * v, s3 += x3[k] * v;
        }
        sums[0][i] = s0, sums[1][i] = s1, sums[2][i] = s2, sums[3][i] = s3;
    }
#endif
}

/* out[t][r0 + i] = scale * sums[j][i] for the run's n tokens t and the ranks below rank. */
static void store_sums(float *out, int64_t out_stride, const int *tokens, int64_t n,
                       int64_t r0, int64_t rank, float scale,
                       float sums[SHRINK_ROWS][SHRINK_RANKS]) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < SHRINK_RANKS && r0 + i < rank; i++)
            out[tokens[j] * out_stride + r0 + i] = scale * sums[j][i];
}

#ifdef __AVX512BF16__
/* dot_block for bf16 x rows and bf16 A on AVX512-BF16: vdpbf16ps sums the products of 32
 * values a load in pairs into fp32 lanes (products exact, sums fp32), with nothing widened
 * first. */
static void dot_block_bf16(float sums[SHRINK_ROWS][SHRINK_RANKS],
                           const bf16 *const x[SHRINK_ROWS], int64_t in,
                           const bf16 *const w[SHRINK_RANKS]) {
    __m512 acc[SHRINK_ROWS][SHRINK_RANKS];
    for (int j = 0; j < SHRINK_ROWS; j++)
        for (int i = 0; i < SHRINK_RANKS; i++)
            acc[j][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in; k += 32) {
        __mmask32 m = in - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (in - k)) - 1);
        __m512bh wv[SHRINK_RANKS];
        for (int i = 0; i < SHRINK_RANKS; i++)
            wv[i] = (__m512bh)_mm512_maskz_loadu_epi16(m, w[i] + k);
        for (int j = 0; j < SHRINK_ROWS; j++) {
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x[j] + k);
            for (int i = 0; i < SHRINK_RANKS; i++)
                acc[j][i] = _mm512_dpbf16_ps(acc[j][i], xv, wv[i]);
        }
    }
    for (int j = 0; j < SHRINK_ROWS; j++)
        for (int i = 0; i < SHRINK_RANKS; i++)
            sums[j][i] = _mm512_reduce_add_ps(acc[j][i]);
}
#endif

/* One run of shrink: the run's x rows widened to fp32 into xf (SHRINK_ROWS rows; a short
 * run repeats its first row, whose sums are dropped), then A's rows SHRINK_RANKS at a time
 * (the last block repeats the last row where rank is not a multiple); bf16 with
 * AVX512-BF16 reads the x rows as they are instead. */
static void shrink_run(float *out, int64_t out_stride, const void *x, int64_t x_stride,
                       const char *a, int dtype, const int *tokens, int64_t n, int64_t rank,
                       int64_t in, float scale, float *xf) {
    size_t elem = dtype == OCTAVO_LORA_BF16 ? sizeof(bf16) : sizeof(float);
#ifdef __AVX512BF16__
    if (dtype == OCTAVO_LORA_BF16) {
        const bf16 *rows[SHRINK_ROWS];
        for (int64_t j = 0; j < SHRINK_ROWS; j++)
            rows[j] = (const bf16 *)x + tokens[j < n ? j : 0] * x_stride;
        for (int64_t r0 = 0; r0 < rank; r0 += SHRINK_RANKS) {
            const bf16 *w[SHRINK_RANKS];
            for (int i = 0; i < SHRINK_RANKS; i++)
                w[i] = (const bf16 *)a + (r0 + i < rank ? r0 + i : rank - 1) * in;
            float sums[SHRINK_ROWS][SHRINK_RANKS];
            dot_block_bf16(sums, rows, in, w);
            store_sums(out, out_stride, tokens, n, r0, rank, scale, sums);
        }
        return;
    }
#endif
    for (int64_t j = 0; j < SHRINK_ROWS; j++) {
        int64_t t = tokens[j < n ? j : 0];
        if (dtype == OCTAVO_LORA_BF16) {
            const bf16 *row = (const bf16 *)x + t * x_stride;
            for (int64_t k = 0; k < in; k++)
                xf[j * in + k] = bf2f(row[k]);
        } else {
            memcpy(xf + j * in, (const float *)x + t * x_stride, (size_t)in * sizeof(float));
        }
    }
    for (int64_t r0 = 0; r0 < rank; r0 += SHRINK_RANKS) {
        const void *w[SHRINK_RANKS];
        for (int i = 0; i < SHRINK_RANKS; i++) {
            int64_t r = r0 + i < rank ? r0 + i : rank - 1;
            w[i] = a + (size_t)(r * in) * elem;
        }
        float sums[SHRINK_ROWS][SHRINK_RANKS];
        dot_block(sums, xf, in, w, dtype);
        store_sums(out, out_stride, tokens, n, r0, rank, scale, sums);
    }
}

/* The shrink's runs shared among the threads of the enclosing parallel region (all of them
 * must call it; serial outside one); xf: this thread's SHRINK_ROWS x in floats, NULL when
 * its allocation failed (it then skips its share). */
static void shrink_runs(float *out, int64_t out_stride, const void *x, int64_t x_stride,
                        const void *a, int64_t a_slot_stride, int dtype,
                        const int *sorted_tokens, const token_run *runs, int64_t num_runs,
                        int64_t rank, int64_t in, float scale, float *xf) {
    size_t elem = dtype == OCTAVO_LORA_BF16 ? sizeof(bf16) : sizeof(float);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < num_runs; i++) {
        if (xf == NULL)
            continue;
        token_run run = runs[i];
        shrink_run(out, out_stride, x, x_stride,
                   (const char *)a + (size_t)(run.slot * a_slot_stride) * elem, dtype,
                   sorted_tokens + run.first, run.n, rank, in, scale, xf);
    }
}

int octavo_lora_shrink(float *out, int64_t out_stride, const void *x, int64_t x_stride,
                       const void *a, int64_t a_slot_stride, int dtype,
                       const int *sorted_tokens, const int *starts, const int *counts,
                       int64_t num_slots, int64_t tokens, int64_t rank, int64_t in,
                       float scale) {
    for (int64_t t = 0; t < tokens; t++)
        memset(out + t * out_stride, 0, (size_t)rank * sizeof(float));
    int64_t num_runs = 0;
    token_run *runs = token_runs(starts, counts, num_slots, SHRINK_ROWS, &num_runs);
    if (runs == NULL)
        return OCTAVO_ERR_NO_MEMORY;
    int failed = 0;
#pragma omp parallel if (num_runs * SHRINK_ROWS * rank * in >= PARALLEL_MIN)
    {
        float *xf = octavo_alloc((size_t)(SHRINK_ROWS * in) * sizeof(float));
        if (xf == NULL)
            octavo_fail(&failed);
        shrink_runs(out, out_stride, x, x_stride, a, a_slot_stride, dtype, sorted_tokens,
                    runs, num_runs, rank, in, scale, xf);
        free(xf);
    }
    free(runs);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}

/* bt[r][c] = b[c][r] in fp32 for the block's cols (<= EXPAND_COLS) rows of b (rank values
 * each), zero past them: the columns expand_rows multiplies. */
static void transpose_block(float *bt, const void *b, int dtype, int64_t cols, int64_t rank) {
    memset(bt, 0, (size_t)(rank * EXPAND_COLS) * sizeof(float));
    for (int64_t c = 0; c < cols; c++) {
        if (dtype == OCTAVO_LORA_BF16) {
            const bf16 *row = (const bf16 *)b + c * rank;
            for (int64_t r = 0; r < rank; r++)
                bt[r * EXPAND_COLS + c] = bf2f(row[r]);
        } else {
            const float *row = (const float *)b + c * rank;
            for (int64_t r = 0; r < rank; r++)
                bt[r * EXPAND_COLS + c] = row[r];
        }
    }
}

/* y[j][c] += sum_r v[j][r] bt[r][c] for c < cols and EXPAND_ROWS rows (j < n written;
 * the pointers of the others repeat row 0's), y bf16 or fp32 as dtype says: each load of bt
 * feeds EXPAND_ROWS multiply-adds. */
static void expand_rows(void *const y[EXPAND_ROWS], int64_t n, int dtype,
                        const float *const v[EXPAND_ROWS], const float *bt, int64_t rank,
                        int64_t cols) {
#ifdef LORA_AVX512
    __m512 acc[EXPAND_ROWS][EXPAND_COLS / 16];
    for (int j = 0; j < EXPAND_ROWS; j++)
        for (int i = 0; i < EXPAND_COLS / 16; i++)
            acc[j][i] = _mm512_setzero_ps();
    for (int64_t r = 0; r < rank; r++) {
        __m512 w[EXPAND_COLS / 16];
        for (int i = 0; i < EXPAND_COLS / 16; i++)
            w[i] = _mm512_loadu_ps(bt + r * EXPAND_COLS + 16 * i);
        for (int j = 0; j < EXPAND_ROWS; j++) {
            __m512 c = _mm512_set1_ps(v[j][r]);
            for (int i = 0; i < EXPAND_COLS / 16; i++)
                acc[j][i] = _mm512_fmadd_ps(c, w[i], acc[j][i]);
        }
    }
    for (int64_t j = 0; j < n; j++) {
        for (int i = 0; i < EXPAND_COLS / 16 && 16 * i < cols; i++) {
            int64_t left = cols - 16 * i;
            __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
            if (dtype == OCTAVO_LORA_BF16) {
                bf16 *p = (bf16 *)y[j] + 16 * i;
                __m512 sum = _mm512_add_ps(bf16x16_to_fp32(_mm256_maskz_loadu_epi16(m, p)),
                                           acc[j][i]);
                _mm256_mask_storeu_epi16(p, m, round_bf16x16(sum));
            } else {
                float *p = (float *)y[j] + 16 * i;
                _mm512_mask_storeu_ps(p, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, p), acc[j][i]));
            }
        }
    }
#else
    for (int64_t j = 0; j < n; j++) {
        float acc[EXPAND_COLS] = {0};
        for (int64_t r = 0; r < rank; r++)
            for (int c = 0; c < EXPAND_COLS; c++)
                acc[c] += v[j][r] * bt[r * EXPAND_COLS + c];
        for (int64_t c = 0; c < cols; c++) {
            if (dtype == OCTAVO_LORA_BF16)
                ((bf16 *)y[j])[c] = f2bf(bf2f(((bf16 *)y[j])[c]) + acc[c]);
            else
                ((float *)y[j])[c] += acc[c];
        }
    }
#endif
}

/* The expand's (run, chunk of EXPAND_CHUNK column blocks) items shared among the threads
 * of the enclosing parallel region (all of them must call it; serial outside one); bt: this
 * thread's EXPAND_CHUNK x rank x EXPAND_COLS floats, NULL when its allocation failed (it then
 * skips its share). Each EXPAND_ROWS tokens go through the chunk's blocks one after another,
 * each element summed over the ranks in order as before. */
static void expand_runs(void *y, int64_t y_stride, const float *buf, int64_t buf_stride,
                        const void *b, int64_t b_slot_stride, int dtype,
                        const int *sorted_tokens, const token_run *runs, int64_t num_runs,
                        int64_t rank, int64_t size, float *bt) {
    size_t elem = dtype == OCTAVO_LORA_BF16 ? sizeof(bf16) : sizeof(float);
    int64_t chunk_cols = EXPAND_CHUNK * EXPAND_COLS;
    int64_t chunks = (size + chunk_cols - 1) / chunk_cols;
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < num_runs; i++) {
        for (int64_t chunk = 0; chunk < chunks; chunk++) {
            if (bt == NULL)
                continue;
            token_run run = runs[i];
            int64_t first = chunk * chunk_cols;
            int64_t blocks = (size - first + EXPAND_COLS - 1) / EXPAND_COLS;
            if (blocks > EXPAND_CHUNK)
                blocks = EXPAND_CHUNK;
            for (int64_t k = 0; k < blocks; k++) {
                int64_t col = first + k * EXPAND_COLS;
                int64_t cols = size - col < EXPAND_COLS ? size - col : EXPAND_COLS;
                transpose_block(bt + k * rank * EXPAND_COLS,
                                (const char *)b + (size_t)(run.slot * b_slot_stride
                                                           + col * rank) * elem,
                                dtype, cols, rank);
            }
            for (int64_t j0 = 0; j0 < run.n; j0 += EXPAND_ROWS) {
                int64_t t[EXPAND_ROWS];
                const float *v[EXPAND_ROWS];
                for (int64_t j = 0; j < EXPAND_ROWS; j++) {
                    t[j] = sorted_tokens[run.first + (j0 + j < run.n ? j0 + j : j0)];
                    v[j] = buf + t[j] * buf_stride;
                }
                int64_t left = run.n - j0;
                for (int64_t k = 0; k < blocks; k++) {
                    int64_t col = first + k * EXPAND_COLS;
                    int64_t cols = size - col < EXPAND_COLS ? size - col : EXPAND_COLS;
                    void *rows[EXPAND_ROWS];
                    for (int64_t j = 0; j < EXPAND_ROWS; j++)
                        rows[j] = (char *)y + (size_t)(t[j] * y_stride + col) * elem;
                    expand_rows(rows, left < EXPAND_ROWS ? left : EXPAND_ROWS, dtype, v,
                                bt + k * rank * EXPAND_COLS, rank, cols);
                }
            }
        }
    }
}

/* The number of tokens in the runs. */
static int64_t run_tokens(const token_run *runs, int64_t num_runs) {
    int64_t tokens = 0;
    for (int64_t i = 0; i < num_runs; i++)
        tokens += runs[i].n;
    return tokens;
}

int octavo_lora_expand(void *y, int64_t y_stride, const float *buf, int64_t buf_stride,
                       const void *b, int64_t b_slot_stride, int dtype,
                       const int *sorted_tokens, const int *starts, const int *counts,
                       int64_t num_slots, int64_t rank, int64_t size) {
    int64_t num_runs = 0;
    token_run *runs = token_runs(starts, counts, num_slots, EXPAND_TOKENS, &num_runs);
    if (runs == NULL)
        return OCTAVO_ERR_NO_MEMORY;
    int failed = 0;
#pragma omp parallel if (run_tokens(runs, num_runs) * rank * size >= PARALLEL_MIN)
    {
        float *bt = octavo_alloc((size_t)(EXPAND_CHUNK * rank * EXPAND_COLS) * sizeof(float));
        if (bt == NULL)
            octavo_fail(&failed);
        expand_runs(y, y_stride, buf, buf_stride, b, b_slot_stride, dtype, sorted_tokens, runs,
                    num_runs, rank, size, bt);
        free(bt);
    }
    free(runs);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}

/* One parallel region for the whole layer (slice by slice, shrink then expand, the
 * work-sharing loops' barriers between them) rather than two per slice: starting the
 * threads is what a small step's call costs most, not its arithmetic. buf needs no zeroing:
 * expand reads only the rows of tokens in a slot, all of which shrink writes. */
int octavo_lora_delta(void *y, int64_t y_stride, const void *x, int64_t x_stride,
                      const void *a, const void *b, int dtype, const int64_t *slices,
                      int64_t num_slices, const int *sorted_tokens, const int *starts,
                      const int *counts, int64_t num_slots, int64_t tokens, int64_t rank,
                      int64_t in, int64_t out_features) {
    int64_t num_shrink = 0, num_expand = 0;
    token_run *shrink = token_runs(starts, counts, num_slots, SHRINK_ROWS, &num_shrink);
    token_run *expand = token_runs(starts, counts, num_slots, EXPAND_TOKENS, &num_expand);
    float *buf = octavo_alloc((size_t)(tokens * rank) * sizeof(float));
    size_t elem = dtype == OCTAVO_LORA_BF16 ? sizeof(bf16) : sizeof(float);
    int ready = shrink != NULL && expand != NULL && buf != NULL, failed = !ready;
    int64_t work = run_tokens(expand, num_expand) * rank * (num_slices * in + out_features);
#pragma omp parallel if (ready && work >= PARALLEL_MIN)
    {
        float *xf = ready ? octavo_alloc((size_t)(SHRINK_ROWS * in) * sizeof(float)) : NULL;
        float *bt = ready ? octavo_alloc((size_t)(EXPAND_CHUNK * rank * EXPAND_COLS) * sizeof(float)) : NULL;
        if (xf == NULL || bt == NULL) {
            octavo_fail(&failed);
            free(xf);
            free(bt);
            xf = bt = NULL;
        }
        for (int64_t i = 0; i < num_slices; i++) {
            int64_t offset = slices[2 * i], size = slices[2 * i + 1];
            shrink_runs(buf, rank, x, x_stride,
                        (const char *)a + (size_t)(i * num_slots * rank * in) * elem,
                        rank * in, dtype, sorted_tokens, shrink, num_shrink, rank, in, 1.0f,
                        xf);
            expand_runs((char *)y + (size_t)offset * elem, y_stride, buf, rank,
                        (const char *)b + (size_t)(offset * rank) * elem, out_features * rank,
                        dtype, sorted_tokens, expand, num_expand, rank, size, bt);
        }
        free(xf);
        free(bt);
    }
    free(shrink);
    free(expand);
    free(buf);
    return failed ? OCTAVO_ERR_NO_MEMORY : OCTAVO_OK;
}
