#!/usr/bin/env bash
# A/B of kernel changes on the GPU machine in one device call: each change (a branch or commit) is
# built here for sm_90a only and carried compressed next to build-gpu/dist (main's build).
#
#   scripts/gpu_ab.sh build REV...  here: for each REV, a worktree in build-ab/src, its test_cuda
#                                   and libflashattn.so (sm_90a, cudart static) packed into
#                                   .carry/ab-REV.tar.xz (~5 MB each; earlier packs are removed;
#                                   carry .carry and build-gpu/dist).
#   scripts/gpu_ab.sh run           there: for each pack, REV's backward and forward GPU suites
#                                   (again with 3 persistent blocks) and racecheck on a small subset; then bench/gpu/bench_attention.py on
#                                   AB_SHAPES (default fa2paper_d64), bf16, FA-2 as the common peer,
#                                   and bench/gpu/kernel_times.py at AB_KERNEL_ARGS, with main's
#                                   library and with each REV's, one after the other in one process
#                                   group. A pack whose tests fail or time out (AB_TEST_TIMEOUT
#                                   seconds, default 300; lower it for a change that might hang)
#                                   gets no racecheck and no bench. With AB_OURS_ENV=LABEL=VAR=VALUE
#                                   (a switch the REV reads at every call) each side's bench also
#                                   times ours under that switch in the same process (as
#                                   ours_LABEL), the fairer comparison where a kernel's schedule
#                                   moves between builds; AB_ROUNDS (default 3) rounds per shape.
# Logs go to $OUT; the benches' tables are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
case $mode in
  build | run) ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_ab: unknown mode '$mode': expected build REV... or run (--help)" >&2; exit 2 ;;
esac

if [ "$mode" = build ]; then
  set -e
  shift
  [ $# -gt 0 ] || { echo "usage: scripts/gpu_ab.sh build REV..."; exit 1; }
  export PATH="/usr/local/cuda/bin:$PATH"
  mkdir -p build-ab .carry
  rm -f .carry/ab.tar.xz .carry/ab-*.tar.xz
  for rev in "$@"; do
    rm -rf build-ab/src
    git worktree prune
    git worktree add -f --detach build-ab/src "$rev" >/dev/null
    short=$(git -C build-ab/src rev-parse --short HEAD)
    cmake -S build-ab/src -B build-ab/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON \
      -DFLASHATTN_NATIVE=OFF -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON -DFLASHATTN_CUDA_ARCHS=90a >/dev/null
    nice -n 5 cmake --build build-ab/build --target test_cuda flashattn_pytest_lib -j2 > build-ab/build.log 2>&1 ||
      { grep -E "error" build-ab/build.log | head; exit 1; }
    echo "== $rev ($short)"
    grep -A3 -E "Compiling entry.*sm90(_[a-z0-9]+)?_kernel.*'sm_90a'" build-ab/build.log | grep -E "Used [0-9]+ registers|spill" |
      sed 's/, used [0-9]* barriers//' | sort | uniq -c
    # The change's own check: a new kernel family may bring its own thread count.
    bad=$(awk -v require=1 -f build-ab/src/scripts/sm90_entry_regs.awk build-ab/build.log)
    if [ -n "$bad" ]; then
      echo "gpu_ab: an sm90 kernel of $rev was not built with the registers at entry its split assumes; refusing it:"
      echo "$bad"
      exit 1
    fi
    rm -rf build-ab/pack && mkdir -p build-ab/pack/ab
    cp build-ab/build/tests/cuda/test_cuda build-ab/pack/ab/
    cp build-ab/build/tests/python/libflashattn.so build-ab/pack/ab/  # linked as the wheel's
    echo "$short" > build-ab/pack/ab/REV
    tar cJf ".carry/ab-$short.tar.xz" -C build-ab/pack ab
    git worktree remove --force build-ab/src
  done
  du -sh .carry/ab-*.tar.xz build-gpu/dist
  exit 0
fi

OUT=${OUT:-$PWD/gpu-ab-out}
mkdir -p "$OUT"
DIST=$PWD/build-gpu/dist
export LD_LIBRARY_PATH="$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # libgomp
packs=(.carry/ab-*.tar.xz)
[ -f "${packs[0]}" ] || { echo "gpu_ab: no .carry/ab-*.tar.xz (scripts/gpu_ab.sh build REV... here)"; exit 1; }
summary=()
sides=(main)
declare -A libs=([main]=$DIST/libflashattn.so)
for pack in "${packs[@]}"; do
  dir=/tmp/flashattn-$(basename "$pack" .tar.xz)
  rm -rf "$dir" && mkdir -p "$dir" && tar xJf "$pack" -C "$dir"
  rev=$(cat "$dir/ab/REV")
  sides+=("$rev")
  libs[$rev]=$dir/ab/libflashattn.so
  timeout "${AB_TEST_TIMEOUT:-300}" "$dir/ab/test_cuda" --gtest_filter='*CudaBackward*:*CudaForward*' > "$OUT/ab_tests_$rev.log" 2>&1
  rc=$?
  summary+=("$rev tests: rc=$rc, $(grep -E '^\[  PASSED  \]' "$OUT/ab_tests_$rev.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/ab_tests_$rev.log") failed")
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/ab_tests_$rev.log" | sort -u | head -10
  if [ $rc -ne 0 ]; then
    # A failing or hanging change is not benchmarked: the device time goes to the other packs.
    summary+=("$rev: tests failed (rc=$rc; 124 = timed out, a hang?): no racecheck or bench; last test started: $(grep -E '^\[ RUN      \]' "$OUT/ab_tests_$rev.log" | tail -1)")
    sides=("${sides[@]/$rev}")
    continue
  fi
  # The forward and backward suites again with at most 3 persistent blocks (a build that has the
  # variables), so that their small shapes send each block through several tiles or items;
  # racecheck runs that way too.
  export FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3 FLASHATTN_CUDA_BWD_PERSISTENT_BLOCKS=3
  timeout "${AB_TEST_TIMEOUT:-300}" "$dir/ab/test_cuda" --gtest_filter='*CudaForward*:*CudaBackward*' > "$OUT/ab_tests_fwd3_$rev.log" 2>&1
  summary+=("$rev tests, 3 persistent blocks: rc=$?, $(grep -E '^\[  PASSED  \]' "$OUT/ab_tests_fwd3_$rev.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/ab_tests_fwd3_$rev.log") failed")
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 "$dir/ab/test_cuda" \
    --gtest_filter='*CudaBackward.*/bf16_b1_sq113_sk203_h2k1_d*:*CudaBackward.*/bf16_varlen_517*:*CudaForward.*/bf16_b1_sq113_sk203_h2k2_d128:*CudaForward.*/bf16_b1_sq520_sk130_h40k8_d64' \
    > "$OUT/ab_racecheck_$rev.log" 2>&1
  summary+=("$rev racecheck: rc=$?, $(grep -m1 -E 'RACECHECK SUMMARY' "$OUT/ab_racecheck_$rev.log" || echo 'no summary')")
  unset FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS FLASHATTN_CUDA_BWD_PERSISTENT_BLOCKS
done
for side in "${sides[@]}"; do
  [ -n "$side" ] || continue
  lib=${libs[$side]}
  FLASHATTN_LIBRARY=$lib PYTHONPATH=$PWD/python timeout 200 python3 bench/gpu/bench_attention.py --out "$OUT/bench_$side" \
    --shapes "${AB_SHAPES:-fa2paper_d64}" --dtypes bfloat16 --peers fa2 --flex-seqlens '' --rep-ms 40 \
    --rounds "${AB_ROUNDS:-3}" ${AB_OURS_ENV:+--ours-env "$AB_OURS_ENV"} > "$OUT/bench_$side.log" 2>&1
  # The device returns at most 8 files per call and the logs carry the numbers (bench_SIDE.log:
  # TFLOP/s per point), so the bench's json, table and plot stay behind.
  rm -rf "$OUT/bench_$side"
  FLASHATTN_LIBRARY=$lib PYTHONPATH=$PWD/python timeout 60 python3 bench/gpu/kernel_times.py ${AB_KERNEL_ARGS:---seqlen 512} \
    2>/dev/null | grep -A8 "== ours" > "$OUT/kernels_$side.log"
done
for side in "${sides[@]}"; do
  [ -n "$side" ] || continue
  echo "== $side"
  grep "<-" "$OUT/bench_$side.log"
  cut -c1-120 "$OUT/kernels_$side.log"
done
printf '%s\n' "${summary[@]}"
