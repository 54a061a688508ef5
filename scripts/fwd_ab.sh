#!/usr/bin/env bash
# Kernel-only A/B of the Hopper forward between git revisions (session 21): the forward kernel of
# each revision built into bench/gpu/fwd_timeline.cu's program, timed in alternation in one device
# call, with a clock64 trace of each at one shape. Closer than the full bench for a kernel change:
# the kernels alone, back to back, the same inputs.
#
#   scripts/fwd_ab.sh build REV...   here: for each revision (a branch, tag or commit that has
#                                    bench/gpu/fwd_timeline.cu) a plain and a traced binary in
#                                    .carry/fwd_ab/ (git-ignored; carry `.carry`)
#   scripts/fwd_ab.sh run            on the GPU machine: every shape of FWD_AB_SHAPES (batch seqlen
#                                    heads head_dim causal; default: head_dim 128 and 64 at seqlen
#                                    1024-4096, causal and not) twice, the binaries in turn; traces
#                                    of the first shape into $OUT (read them with
#                                    bench/gpu/fwd_timeline.py)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.carry/fwd_ab
case ${1:-} in
  build)
    shift
    [ $# -ge 1 ] || { echo "fwd_ab: build expected at least one revision" >&2; exit 2; }
    export PATH="/usr/local/cuda/bin:$PATH"
    mkdir -p "$DIR"
    for rev in "$@"; do
      label=$(printf '%s' "$rev" | tr -c 'A-Za-z0-9_.' '_')
      tree=$(mktemp -d)
      git archive "$rev" include src bench/gpu/fwd_timeline.cu | tar -x -C "$tree"
      flags=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -cudart static
             -I"$tree/include" -I"$tree/src")
      nvcc "${flags[@]}" "$tree/bench/gpu/fwd_timeline.cu" -o "$DIR/$label"
      nvcc "${flags[@]}" -DFLASHATTN_FWD_TRACE "$tree/bench/gpu/fwd_timeline.cu" -o "$DIR/$label.trace"
      rm -rf "$tree"
      echo "fwd_ab: $rev -> $DIR/$label (+ .trace)"
    done
    ;;
  run)
    OUT=${OUT:-./fwd-ab-out}
    mkdir -p "$OUT"
    shapes=${FWD_AB_SHAPES:-"16 1024 16 128 0;16 1024 16 128 1;8 2048 16 128 0;4 4096 16 128 0;16 1024 32 64 0;16 1024 32 64 1;4 4096 32 64 0"}
    bins=$(ls "$DIR" | grep -v '\.trace$')
    IFS=';' read -ra list <<< "$shapes"
    for shape in "${list[@]}"; do
      for round in 1 2; do
        for bin in $bins; do echo "$bin: $("$DIR/$bin" $shape)"; done
      done
    done
    first=${list[0]}
    for bin in $bins; do "$DIR/$bin.trace" $first "$OUT/$bin.trace.bin" > /dev/null; done
    echo "fwd_ab: traces of '$first' in $OUT"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    [ "${1:-}" = -h ] || [ "${1:-}" = --help ] || exit 2
    ;;
esac
