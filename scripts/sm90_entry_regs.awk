# Reads ptxas -v output; prints each sm90 kernel (sm_90a pass) whose register count at entry is not
# what its setmaxnreg split assumes: 65536 / threads rounded down to 8, i.e. 168 for the
# 384-thread kernels and 128 for the 512-thread forward with block_m 192 (three consumer
# warpgroups; fwd_traits.hpp kEntryRegs). Any other count makes setmaxnreg.inc wait forever.
/Compiling entry/ {
  name = ""
  if ($0 ~ /(fwd|bwd)_sm90_kernel/ && $0 ~ /'sm_90a'/) {
    name = $0
    want = ($0 ~ /FwdSm90ConfigILi[0-9]+ELi[0-9]+ELi[0-9]+ELi192EE/) ? 128 : 168
  }
  next
}
name != "" && /Used [0-9]+ registers/ {
  match($0, /Used [0-9]+ registers/)
  n = substr($0, RSTART + 5, RLENGTH - 15) + 0
  if (n != want) print "expected " want " registers at entry, got " n ": " name
  name = ""
}
