/* flashattn C API: the same calls as include/flashattn/flashattn.hpp for other languages (the
 * Python package binds it with ctypes). See flashattn.hpp for the math, masks and layouts.
 *
 * fa_forward and fa_backward return 0 (FA_STATUS_OK) on success and a non-zero FA_STATUS_* on error
 * (FA_STATUS_INVALID_ARGUMENT for bad input, FA_STATUS_CUDA when the CUDA runtime failed);
 * fa_plan returns 1 when the call can run and 0 otherwise. After a failure fa_last_error() gives the
 * message (naming the argument, what was expected and what came), valid until the next
 * call on the same thread. No C++ exception crosses this boundary. */
#ifndef FLASHATTN_FLASHATTN_H_
#define FLASHATTN_FLASHATTN_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* FA_DTYPE_E4M3: OCP float8 e4m3fn (PyTorch's float8_e4m3fn), q, k and v of the FP8 forward only
 * (see fa_params' descales). */
enum { FA_DTYPE_F32 = 0, FA_DTYPE_F16 = 1, FA_DTYPE_BF16 = 2, FA_DTYPE_I32 = 3, FA_DTYPE_E4M3 = 4 };
enum { FA_DEVICE_CPU = 0, FA_DEVICE_CUDA = 1 };
enum { FA_ALIGN_BOTTOM_RIGHT = 0, FA_ALIGN_TOP_LEFT = 1 };
/* FA_STATUS_CUDA: a CUDA runtime call failed (the message carries CUDA's error name and text). */
enum { FA_STATUS_OK = 0, FA_STATUS_INVALID_ARGUMENT = 1, FA_STATUS_INTERNAL = 2, FA_STATUS_CUDA = 3 };

/* A strided tensor view; ndim == 0 (or data == NULL with ndim == 0) means "not given" (except for
 * the FP8 descales, where ndim 0 with data != NULL is one value; shape [1] says the same).
 * Strides are in elements; the last dimension must be contiguous. */
typedef struct fa_tensor {
  void* data;
  int32_t dtype;        /* FA_DTYPE_* */
  int32_t device;       /* FA_DEVICE_* */
  int32_t device_index;
  int32_t ndim;         /* 0..4 */
  int64_t shape[4];
  int64_t stride[4];
} fa_tensor;

/* Mirrors flashattn::AttentionParams field by field. Zero-initialize, then set what you need
 * (fa_params_init does that and sets window sizes to -1). */
typedef struct fa_params {
  fa_tensor q, k, v, out, lse;
  fa_tensor dout, dq, dk, dv;
  fa_tensor cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q, max_seqlen_k;
  float softmax_scale;      /* 0 = 1/sqrt(head_dim); else |softmax_scale| >= FLT_MIN */
  int32_t causal;           /* 0 or 1 */
  int32_t causal_align;     /* FA_ALIGN_* */
  int64_t window_size_left; /* -1 = unbounded */
  int64_t window_size_right;
  float softcap;            /* 0 = off; else as flashattn.hpp's (softmax_scale / softcap normal) */
  fa_tensor alibi_slopes;   /* float32 [num_heads] or [batch, num_heads] */
  int32_t deterministic;    /* 0 or 1 */
  int32_t num_threads;      /* CPU: 0 = all */
  void* stream;             /* CUDA: cudaStream_t, NULL = default stream */
  /* FP8 forward (q, k, v FA_DTYPE_E4M3; FlashAttention-3 Sec. 3.3, its q_descale / k_descale /
   * v_descale): float32 dequantization factors on q's device, [batch, num_heads_k] (any strides,
   * 0 broadcasts) or one value per tensor (ndim 0 with data != NULL, or shape [1]); not given
   * (data NULL, ndim 0) = 1. S = softmax_scale * (q_descale q)(k_descale k)^T, O = P (v_descale v),
   * out bf16; query head h uses KV head h / (num_heads / num_heads_k). Forward only, batched only,
   * head_dim = head_dim_v = 128, CUDA (sm_90) only; given with non-e4m3 q: FA_STATUS_INVALID_ARGUMENT.
   * The values are read by the kernel, not on the host (no synchronization per call): a (batch,
   * kv head) whose descales are not finite and > 0, or whose softmax_scale * q_descale * k_descale
   * (and it / softcap when softcap is on) is not a normal float32 of magnitude <= FLT_MAX / log2(e),
   * gets NaN in every out and lse element of its query heads. See flashattn.hpp for the workspace
   * the call takes (FA_STATUS_INVALID_ARGUMENT naming v past 2^48 bytes). */
  fa_tensor q_descale, k_descale, v_descale;
} fa_params;

void fa_params_init(fa_params* params);

/* Forward: writes out (and lse when given). */
int fa_forward(const fa_params* params);
/* Backward: writes dq, dk, dv. */
int fa_backward(const fa_params* params);
/* pass: 0 = forward, 1 = backward. Returns 1 when the call can run and writes the kernel name into
 * kernel (up to kernel_len bytes, NUL-terminated); returns 0 and sets fa_last_error() otherwise. */
int fa_plan(const fa_params* params, int32_t pass, char* kernel, int32_t kernel_len);

const char* fa_last_error(void);
int fa_cuda_available(void);
const char* fa_version(void);
/* sizeof(fa_params), so bindings can check that their struct layout matches this build. */
int64_t fa_params_size(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_FLASHATTN_H_ */
