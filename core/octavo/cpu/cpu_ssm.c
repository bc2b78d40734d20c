/* One decode step of Mamba's selective scan (Jamba's SSM layers) for a batch of requests,
 * each in its own row of the layer's state tensor: the torch reference is
 * MambaMixer._scan_step (octavo/models/layers/mamba.py), which this computes in one pass
 * over the state instead of five tensor ops, each of which reads or writes all of it.
 *
 * For row b and channel i, with its state s[n] (fp32) at state + rows[b] * slot_stride
 * + i * width + offset:
 *     s[n] = s[n] * exp(dt[b][i] * a[i][n]) + dt[b][i] * bm[b][n] * x[b][i]
 *     y[b][i] = sum_n s[n] * c[b][n]
 * Inputs are fp32, [batch][inner] (x, dt, y) and [batch][d_state] (bm, c); a is
 * [inner][d_state]. The exponential is expf, as precise as torch's. */
#include <math.h>
#include <stdint.h>

#include "cpu_kernels.h"

void octavo_ssm_decode(float *y, float *state, const int64_t *rows, int64_t batch,
                       int64_t inner, int64_t d_state, int64_t slot_stride, int64_t width,
                       int64_t offset, const float *x, const float *dt, const float *bm,
                       const float *c, const float *a) {
#pragma omp parallel for collapse(2) if (batch * inner * d_state >= PARALLEL_MIN)
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t i = 0; i < inner; i++) {
            float *s = state + rows[b] * slot_stride + i * width + offset;
            float step = dt[b * inner + i], drive = step * x[b * inner + i];
            const float *ai = a + i * d_state, *bb = bm + b * d_state, *cb = c + b * d_state;
            float sum = 0.0f;
            for (int64_t n = 0; n < d_state; n++) {
                float value = s[n] * expf(step * ai[n]) + drive * bb[n];
                s[n] = value;
                sum += value * cb[n];
            }
            y[b * inner + i] = sum;
        }
    }
}
