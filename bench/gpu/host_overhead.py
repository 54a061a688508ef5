"""Host (CPU) time per attention call on CUDA tensors: flashattn vs torch SDPA (issue 5).

Small models are launch-bound: what each op costs the CPU decides the step time. Shapes are
tiny (batch 1, seqlen 128, 6 heads of 64) so that the GPU never falls behind and the loop
measures the enqueue path alone: Python wrappers, torch dispatch, autograd, the C API (checks,
TMA descriptors, launches). Prints microseconds per call (median of --repeats rounds).

  python3 bench/gpu/host_overhead.py [--profile]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn


def per_call_us(fn, n=300, repeats=7):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top entries for our forward")
    ap.add_argument("--trace", action="store_true",
                    help="also list the CUDA runtime calls (torch.profiler) that ours and SDPA make")
    ap.add_argument("--seqlen", type=int, default=128)
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    shape = (1, args.seqlen, 6, 64)
    q, k, v = (torch.randn(shape, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    g = torch.randn(shape, device=dev, dtype=dt)
    gt = g.transpose(1, 2)

    def ours_fwd():
        with torch.no_grad():
            flashattn.flash_attn_func(q, k, v, causal=True)

    int_opts, float_opts = flashattn._ops.pack_options(0, 0, 0.0, True, "bottom_right", -1, -1, 0.0, False)

    def op_fwd():  # the registered operator, as compiled code and dispatch modes call it
        with torch.no_grad():
            torch.ops.flashattn.fwd.default(q, k, v, None, None, None, int_opts, float_opts)

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    def ours_fwd_grad():  # with autograd's node (inputs require grad), no backward
        flashattn.flash_attn_func(q, k, v, causal=True)

    def sdpa_fwd_grad():
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    def ours_fwd_bwd():
        flashattn.flash_attn_func(q, k, v, causal=True).backward(g)

    def sdpa_fwd_bwd():
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(gt)

    def baseline_fwd_bwd():  # one elementwise op with autograd: the floor of any op's cost
        (q * 1.0).backward(g)

    # The C API alone: fa_forward / fa_backward on the packed params of the last call (validation,
    # TMA descriptors, workspace, launches), without Python, torch or autograd around them.
    from flashattn import _capi
    captured = {}
    real = _capi.run_packed

    def capture(backward_pass, packed):
        captured[backward_pass] = packed
        return real(backward_pass, packed)

    _capi.run_packed = capture
    # `kept` holds the forward's out/lse; the backward's dq/dk/dv go back to torch's cache after
    # being added to .grad, so c_api_bwd (timed last) writes into cached, unused blocks.
    kept = flashattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    kept[0].backward(g)
    _capi.run_packed = real
    torch.cuda.synchronize()

    def c_api_fwd():
        real(False, captured[False])

    def c_api_bwd():
        real(True, captured[True])

    print(f"host time per call, CUDA bf16 {shape} causal, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    for fn in (ours_fwd, op_fwd, sdpa_fwd, ours_fwd_grad, sdpa_fwd_grad, ours_fwd_bwd, sdpa_fwd_bwd, baseline_fwd_bwd, c_api_fwd, c_api_bwd):
        print(f"  {fn.__name__:18s} {per_call_us(fn):7.1f} us")
    if args.profile:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            ours_fwd()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    if args.trace:
        from torch.profiler import ProfilerActivity, profile
        for fn in (ours_fwd_bwd, sdpa_fwd_bwd):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            print(f"== {fn.__name__}: 20 calls")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))


if __name__ == "__main__":
    main()
