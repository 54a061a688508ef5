#!/usr/bin/env python3
"""Where a Hopper forward tile's time goes: reads the clock64 trace that bench/gpu/fwd_timeline.cu
writes (g_fwd_trace[132 blocks][5 roles][24 tiles][64 events], roles 0 = producer, 1.. = consumer
warpgroups; events as FWD_TRACE in src/cuda/fwd_sm90_tma_wgmma.cuh) and prints, over every block's
full tiles (the first and last of each block left out), the mean and 10th / 90th percentile of each
segment in SM cycles: the tile boundary (last turn -> epilogue -> next tile's first products) and
the steady rounds (turn -> S done -> P V done -> next turn).

    python3 bench/gpu/fwd_timeline.py trace.bin
"""
import sys

import numpy as np

BLOCKS, ROLES, TILES, EVENTS = 132, 5, 24, 64
# Consumer events (fwd_sm90_tma_wgmma.cuh): round r of a tile's main loop at 8 + 4r .. 11 + 4r.
TOP, PRE_Q, Q_FULL, Q_READY, TURN0, S0_DONE, SOFTMAX0_DONE = 0, 1, 2, 3, 4, 5, 6
LAST_TURN, LAST_PV_DONE, STAGED, EPILOGUE_END, SO_FREE, ROWS_DONE = 56, 57, 58, 59, 60, 61
ROUND_K_FULL, ROUND_TURN, ROUND_S_DONE, ROUND_PV_DONE = 0, 1, 2, 3
MAX_ROUNDS = 12


def segments(trace):
    out = {}

    def add(name, value):
        out.setdefault(name, []).append(value)

    for b in range(BLOCKS):
        for wg in range(1, ROLES):
            t = trace[b, wg]
            tiles = int((t[:, TOP] > 0).sum())
            for j in range(1, tiles - 1):
                r, n = t[j], t[j + 1]
                if r[LAST_PV_DONE] == 0 or n[TURN0] == 0:
                    continue
                add("tile period", n[TOP] - r[TOP])
                add("boundary: last turn -> last P V done", r[LAST_PV_DONE] - r[LAST_TURN])
                add("boundary: -> sO free (previous store read)", r[SO_FREE] - r[LAST_PV_DONE])
                add("boundary: -> 1 / l and lse", r[ROWS_DONE] - r[SO_FREE])
                add("boundary: -> O staged", r[STAGED] - r[ROWS_DONE])
                add("boundary: -> O stored", r[EPILOGUE_END] - r[STAGED])
                add("boundary: -> next tile's top", n[TOP] - r[EPILOGUE_END])
                add("boundary: -> query block known", n[PRE_Q] - n[TOP])
                add("boundary: -> Q loaded", n[Q_FULL] - n[PRE_Q])
                add("boundary: -> Q fragments", n[Q_READY] - n[Q_FULL])
                add("boundary: -> first turn", n[TURN0] - n[Q_READY])
                add("boundary: -> first S done", n[S0_DONE] - n[TURN0])
                add("boundary: -> first softmax done", n[SOFTMAX0_DONE] - n[S0_DONE])
                rounds = [8 + 4 * k for k in range(MAX_ROUNDS) if r[8 + 4 * k + ROUND_TURN] > 0]
                for k, e in enumerate(rounds):
                    add("round: turn -> S done", r[e + ROUND_S_DONE] - r[e + ROUND_TURN])
                    add("round: S done -> P V done", r[e + ROUND_PV_DONE] - r[e + ROUND_S_DONE])
                    if k + 1 < len(rounds):
                        add("round: period (turn to turn)", r[rounds[k + 1] + ROUND_TURN] - r[e + ROUND_TURN])
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    trace = np.fromfile(sys.argv[1], dtype=np.int64)
    if trace.size != BLOCKS * ROLES * TILES * EVENTS:
        sys.exit(f"{sys.argv[1]}: expected {BLOCKS * ROLES * TILES * EVENTS} int64 values, got {trace.size}")
    trace = trace.reshape(BLOCKS, ROLES, TILES, EVENTS).astype(np.float64)
    for name, values in segments(trace).items():
        v = np.array(values)
        print(f"{name:40s} mean {v.mean():8.0f}   p10 {np.percentile(v, 10):8.0f}   p90 {np.percentile(v, 90):8.0f}"
              f"   n {len(v)}")


if __name__ == "__main__":
    main()
