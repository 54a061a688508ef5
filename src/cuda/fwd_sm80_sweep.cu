// Tile-configuration sweep (build option FLASHATTN_CUDA_FWD_SWEEP, off by default): extra bf16
// instantiations selected at run time by FLASHATTN_FWD_VARIANT=1..3 so that one device call can
// time several candidates of the FwdTraits table side by side (docs/perf-notes.md).
#include "cuda/fwd_sm80_mma.cuh"

namespace flashattn::cuda {

bool launch_fwd_sweep(int variant, int head_dim, const FwdParams& p, int batch, int max_seqlen_q, void* stream) {
  if (head_dim == 64) {
    switch (variant) {
      case 1: launch_fwd_sm80_config<BF16, FwdConfig<64, 64, 2, 1>>(p, batch, max_seqlen_q, stream); return true;
      case 2: launch_fwd_sm80_config<BF16, FwdConfig<64, 64, 1, 1>>(p, batch, max_seqlen_q, stream); return true;
      case 3: launch_fwd_sm80_config<BF16, FwdConfig<64, 32, 2, 1>>(p, batch, max_seqlen_q, stream); return true;
    }
  } else if (head_dim == 128) {
    switch (variant) {
      case 1: launch_fwd_sm80_config<BF16, FwdConfig<128, 64, 2, 1>>(p, batch, max_seqlen_q, stream); return true;
      case 2: launch_fwd_sm80_config<BF16, FwdConfig<128, 32, 2, 1>>(p, batch, max_seqlen_q, stream); return true;
      case 3: launch_fwd_sm80_config<BF16, FwdConfig<128, 64, 1, 1>>(p, batch, max_seqlen_q, stream); return true;
    }
  }
  return false;
}

}  // namespace flashattn::cuda
