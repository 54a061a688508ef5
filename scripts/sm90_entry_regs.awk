# Reads ptxas -v output; prints each sm90 kernel (sm_90a pass) whose register count at entry is not
# what its setmaxnreg split assumes: 65536 / threads rounded down to 8 (fwd_traits.hpp kEntryRegs),
# with 128 · (1 + block_m / 64) threads for the forward (block_m is FwdSm90Config's fourth argument)
# and 384 for the backward: 168 for the 384-thread kernels, 128 for the 512-thread forward, 96 for
# the 640-thread one. Any other count makes setmaxnreg.inc wait forever. With -v require=1 it also
# fails when the input holds no sm90 kernel at all (a report of nothing is not a pass).
/Compiling entry/ {
  name = ""
  if ($0 ~ /(fwd|bwd)_sm90(_[a-z0-9]+)?_kernel/ && $0 ~ /'sm_90a'/) {
    name = $0
    threads = 384
    # FwdSm90Config<head_dim, block_n, stages, block_m, elem_bytes>: block_m is the fourth
    # argument whether or not the fifth (defaulted) one is spelled out in the mangled name.
    if (match($0, /FwdSm90ConfigILi[0-9]+ELi[0-9]+ELi[0-9]+ELi[0-9]+E/)) {
      cfg = substr($0, RSTART, RLENGTH)
      split(cfg, parts, "ELi")
      block_m = parts[4] + 0  # "192E" -> 192
      threads = 128 * (1 + block_m / 64)
    }
    want = int(int(65536 / threads) / 8) * 8
    seen++
  }
  next
}
name != "" && /Used [0-9]+ registers/ {
  match($0, /Used [0-9]+ registers/)
  n = substr($0, RSTART + 5, RLENGTH - 15) + 0
  if (n != want) print "expected " want " registers at entry, got " n ": " name
  name = ""
}
END {
  if (require && seen == 0) print "no sm90 kernel in the ptxas report (nothing was checked)"
}
