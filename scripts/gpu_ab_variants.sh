#!/usr/bin/env bash
# In-process A/B of kernel variants compiled into ONE library (run on the GPU machine; carry
# build-gpu/dist and .carry). The experiment branch instantiates each variant and its launch picks
# one per call from an environment variable read at launch time (session 17 used
# FLASHATTN_CUDA_FWD_AB=0..5 in launch_fwd_sm90); `scripts/gpu_ab.sh build BRANCH` packs that
# branch's test_cuda and libflashattn.so into .carry/ab-REV.tar.xz. This script runs the forward
# suite (default, then 3 persistent blocks) and racecheck for each variant in AB_TEST_VARIANTS
# (default "1 2"; AB_RACE_VARIANT for racecheck), then one bench_attention.py process in which
# main's kernel ("ours", the variable unset), every --ours-env variant (AB_ENVS) and cuDNN are timed
# in the same interleaved rounds (AB_ROUNDS, default 5): two runs of one library differed by up to
# 8 % at single points on the power-capped H200, the contenders of one run far less.
# Other knobs: AB_SHAPES (fa2paper,llama), AB_DTYPES (bfloat16), AB_REP_MS (150), AB_BENCH_TIMEOUT.
set -u
AB_VAR=${AB_VAR:-FLASHATTN_CUDA_FWD_AB}  # the branch's per-call variant switch
PACK=$(ls .carry/ab-*.tar.xz | head -1)
D=/tmp/abx; rm -rf $D; mkdir -p $D; tar xJf $PACK -C $D
export LD_LIBRARY_PATH=$PWD/build-gpu/dist
T=$D/ab/test_cuda
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for v in ${AB_TEST_VARIANTS:-1 2}; do
  env "$AB_VAR=$v" timeout 150 $T --gtest_filter='*CudaForward*' > $OUT/t$v.log 2>&1
  echo "AB=$v rc=$? $(grep -E '^\[  PASSED' $OUT/t$v.log) $(grep -c '^\[  FAILED  \] [A-Za-z]' $OUT/t$v.log) failed"
  grep '^\[  FAILED  \] [A-Za-z]' $OUT/t$v.log | head -5
  env "$AB_VAR=$v" FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3 timeout 150 $T --gtest_filter='*CudaForward*' > $OUT/t${v}p.log 2>&1
  echo "AB=$v p3 rc=$? $(grep -E '^\[  PASSED' $OUT/t${v}p.log)"
done
v=${AB_RACE_VARIANT:-2}
env "$AB_VAR=$v" FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 $T \
  --gtest_filter='*CudaForward.*/bf16_b1_sq113_sk203_h2k2_d128:*CudaForward.*/bf16_b1_sq520_sk130_h40k8_d64' > $OUT/rc.log 2>&1
echo "racecheck AB=$v rc=$? $(grep -m1 'RACECHECK SUMMARY' $OUT/rc.log)"
FLASHATTN_LIBRARY=$D/ab/libflashattn.so PYTHONPATH=$PWD/python timeout ${AB_BENCH_TIMEOUT:-420} python3 bench/gpu/bench_attention.py \
  --out $OUT/bench --shapes ${AB_SHAPES:-fa2paper,llama} --dtypes ${AB_DTYPES:-bfloat16} --peers cudnn --flex-seqlens '' \
  --no-bwd --rounds ${AB_ROUNDS:-5} --rep-ms ${AB_REP_MS:-150} ${AB_ENVS:---ours-env rs=FLASHATTN_CUDA_FWD_AB=1 --ours-env lz=FLASHATTN_CUDA_FWD_AB=2 --ours-env diag=FLASHATTN_CUDA_FWD_AB=3} > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -v "^|" $OUT/bench.log | tail -40
