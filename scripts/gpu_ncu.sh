#!/usr/bin/env bash
# Nsight Compute profile of our kernels on the GPU machine, in one device call (issue 4's "what each
# remaining gap is made of, measured").
#
#   scripts/gpu_ncu.sh [NAME:KERNEL_REGEX:KERNEL_TIMES_ARGS]...
#
# For each profile: bench/gpu/kernel_times.py runs one forward + backward of the shape given by
# KERNEL_TIMES_ARGS (its flags, spaces as commas) on build-gpu/dist's library, and ncu profiles the
# third launch of the kernel whose name matches KERNEL_REGEX with the full section set (clocks at
# base, as ncu locks them). $OUT gets NAME.txt (the details page: speed of light, memory, scheduler
# and warp-state statistics, occupancy, launch), NAME.stalls.txt (bench/gpu/ncu_stalls.py: cycles
# per stall reason, the SASS instructions with the most warp samples and the executed instructions
# by opcode) and ncu-reports.tgz (the
# NAME.ncu-rep reports to open in Nsight Compute, logs and CSVs); a short table of each profile's
# headline metrics is printed last.
# Default: the head_dim 128 backward and forward at bf16 batch 8, seqlen 2048, 16 heads, and the
# head_dim 64 backward and forward at batch 16, seqlen 1024, 32 heads (the FlashAttention-2 paper
# shapes where BENCHMARKS.md has us furthest behind cuDNN at seqlen >= 1024).
# Carry build-gpu/dist (scripts/gpu_check.sh build). NCU_PACK=.carry/ab-REV.tar.xz (scripts/gpu_ab.sh
# build REV; carry .carry too) profiles that pack's library instead of build-gpu/dist's, e.g. to see
# a branch's executed-instruction counts next to main's. NCU_KEEP_REPORTS=0 leaves the report
# archive out of $OUT (the device returns few files; four profiles already make eight).

set -uo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_ncu: expected an NVIDIA GPU (nvidia-smi found none): run it on the GPU machine" >&2
  exit 1
fi
command -v ncu > /dev/null || { echo "gpu_ncu: expected ncu on PATH, got none" >&2; exit 1; }
OUT=${OUT:-$PWD/gpu-ncu-out}
mkdir -p "$OUT"
DIST=$PWD/build-gpu/dist
export LD_LIBRARY_PATH="$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LIB=$DIST/libflashattn.so
if [ -n "${NCU_PACK:-}" ]; then
  [ -f "$NCU_PACK" ] || { echo "gpu_ncu: NCU_PACK: expected a pack from scripts/gpu_ab.sh build, got '$NCU_PACK'" >&2; exit 2; }
  packdir=$(mktemp -d)
  tar xJf "$NCU_PACK" -C "$packdir"
  LIB=$packdir/ab/libflashattn.so
  echo "gpu_ncu: profiling $(cat "$packdir/ab/REV" 2>/dev/null || echo "$NCU_PACK")'s library"
fi
tmp=$(mktemp -d)  # reports, logs and CSVs: packed into one archive at the end (the device returns few files)
profiles=("$@")
if [ ${#profiles[@]} -eq 0 ]; then
  profiles=("bwd_d128_s2048:bwd_sm90_kernel:--batch,8,--seqlen,2048,--heads,16,--head-dim,128"
            "fwd_d128_s2048:fwd_sm90_kernel:--batch,8,--seqlen,2048,--heads,16,--head-dim,128"
            "bwd_d64_s1024:bwd_sm90_kernel:--batch,16,--seqlen,1024,--heads,32,--head-dim,64"
            "fwd_d64_s1024:fwd_sm90_kernel:--batch,16,--seqlen,1024,--heads,32,--head-dim,64")
fi
summary=()
for prof in "${profiles[@]}"; do
  IFS=: read -r name regex args <<< "$prof"
  if [ -z "$name" ] || [ -z "$regex" ]; then
    echo "gpu_ncu: expected NAME:KERNEL_REGEX:KERNEL_TIMES_ARGS, got '$prof'" >&2
    exit 2
  fi
  start=$(date +%s)
  FLASHATTN_LIBRARY=$LIB PYTHONPATH=$PWD/python timeout 300 \
    ncu --target-processes all -k "regex:$regex" --launch-skip 2 --launch-count 1 --set full \
    -f -o "$OUT/$name" python3 bench/gpu/kernel_times.py --iters 3 ${args//,/ } > "$OUT/$name.log" 2>&1
  rc=$?
  ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/$name.txt" 2>&1
  # Where the warps wait: stall reasons, then the SASS instructions with the most samples.
  ncu --import "$OUT/$name.ncu-rep" --page raw --csv > "$tmp/$name.raw.csv" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$tmp/$name.sass.csv" 2>&1
  python3 bench/gpu/ncu_stalls.py "$tmp/$name.raw.csv" "$tmp/$name.sass.csv" > "$OUT/$name.stalls.txt" 2>&1
  mv "$OUT/$name.ncu-rep" "$OUT/$name.log" "$tmp/"
  pick() { grep -m1 -E "^ +$1 " "$OUT/$name.txt" | awk '{print $NF}'; }
  summary+=("$(printf '%-22s rc=%s %4s s  duration %s  SM %s %%  memory %s %%  issue busy %s %%  warps/sched eligible %s' \
    "$name" "$rc" "$(( $(date +%s) - start ))" "$(pick Duration)" "$(pick 'Compute \(SM\) Throughput')" \
    "$(pick 'Memory Throughput')" "$(pick 'Issue Slots Busy')" "$(pick 'Eligible Warps Per Scheduler')")")
done
if [ "${NCU_KEEP_REPORTS:-1}" != 0 ]; then tar czf "$OUT/ncu-reports.tgz" -C "$tmp" .; fi
rm -rf "$tmp"
printf '%s\n' "${summary[@]}"
