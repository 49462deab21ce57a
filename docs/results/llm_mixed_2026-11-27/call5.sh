#!/usr/bin/env bash
# Call 5 (H100): the ramp of 256 streams started over 6 s, this tree then c0e7284 (old_tree/, not committed), one
# after the other on one machine. Each tree's files packed into one.
set -uo pipefail
ln -sfn "$PWD/.whl" old_tree/.whl
for tree in new old; do
  dir=$([ $tree = old ] && echo old_tree || echo .)
  echo "== $tree"
  (cd $dir && OUT=$OUT/ramp_$tree ONLY=a RATES="" LEVELS=256 BURST=0 timeout 250 bash bench/overload.sh > $OUT/ramp_$tree.log 2>&1)
  tail -1 $OUT/ramp_$tree/overload.txt 2>/dev/null
  (cd $OUT && tar czf ramp_${tree}.tgz ramp_$tree && rm -rf ramp_$tree)
done
