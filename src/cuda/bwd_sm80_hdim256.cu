// Instantiations of the sm80 backward kernels for head_dim bucket 256: both element types, both roles
// (dK/dV with optional dQ atomics, and the deterministic dQ kernel). One bucket per translation unit
// so that a parallel build compiles the buckets side by side.
#include "cuda/bwd_sm80_mma.cuh"

namespace flashattn::cuda {

template void launch_bwd_sm80<F16, 256, false>(const BwdParams&, void*);
template void launch_bwd_sm80<F16, 256, true>(const BwdParams&, void*);
template void launch_bwd_sm80<BF16, 256, false>(const BwdParams&, void*);
template void launch_bwd_sm80<BF16, 256, true>(const BwdParams&, void*);

}  // namespace flashattn::cuda
