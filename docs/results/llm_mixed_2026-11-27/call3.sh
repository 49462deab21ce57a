#!/usr/bin/env bash
# Call 3 (H100): call 2 in the other order: the stack at Poisson 30/s, c0e7284 (old_tree/, not committed: mixed steps with the text branch,
# the prefill attention over every padding sequence in 64-row tiles) then this tree, one after the other
# on one machine. Each tree's files packed into one.
set -uo pipefail
ln -sfn "$PWD/.whl" old_tree/.whl
for tree in new old; do
  dir=$([ $tree = old ] && echo old_tree || echo .)
  echo "== $tree"
  (cd $dir && OUT=$OUT/$tree ONLY=a RATES=30 LEVELS="" BURST=0 timeout 270 bash bench/overload.sh > $OUT/$tree.log 2>&1)
  tail -1 $OUT/$tree/overload.txt 2>/dev/null
  grep "admission limit" $OUT/$tree/up.log 2>/dev/null | tail -8
  (cd $OUT && tar czf ${tree}.tgz $tree && rm -rf $tree)
done
