"""The one FLOP count every benchmark here reports (FlashAttention-2 paper's convention, Sec. 4.1):
4 · batch · heads · seqlen_q · seqlen_k · head_dim for the forward (two matrix products of
2 · seqlen_q · seqlen_k · head_dim each), halved under a causal mask, × 2.5 for the backward."""


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, backward):
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        f /= 2
    if backward:
        f *= 2.5
    return f
