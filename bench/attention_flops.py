"""The one FLOP count every benchmark here reports (FlashAttention-2 paper's convention, Sec. 4.1):
4 · batch · heads · seqlen_q · seqlen_k · head_dim for the forward (two matrix products of
2 · seqlen_q · seqlen_k · head_dim each), halved under a causal mask, × 2.5 for the backward.
With head_dim_v != head_dim (MLA's 192 / 128) the two products count 2 · seqlen_q · seqlen_k ·
head_dim and 2 · seqlen_q · seqlen_k · head_dim_v (FlashAttention-3's benchmark does the same)."""


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, backward, head_dim_v=None):
    dv = head_dim if head_dim_v is None else head_dim_v
    f = 2.0 * batch * heads * seqlen_q * seqlen_k * (head_dim + dv)
    if causal:
        f /= 2
    if backward:
        f *= 2.5
    return f
