#!/usr/bin/env bash
# Call 5 (H100): the stack at Poisson 30/s, the session's first tree (c91f987, no PDL; in old_tree/, not committed)
# then this tree, one after the other on one machine.
set -uo pipefail
ln -sfn "$PWD/.whl" old_tree/.whl
echo "== c91f987"
(cd old_tree && OUT=$OUT/old ONLY=a RATES=30 LEVELS="" BURST=0 timeout 265 bash bench/overload.sh > $OUT/old.log 2>&1)
cat $OUT/old/overload.txt 2>/dev/null | tail -1
echo "== this tree"
OUT=$OUT/new ONLY=a RATES=30 LEVELS="" BURST=0 timeout 265 bash bench/overload.sh > $OUT/new.log 2>&1
cat $OUT/new/overload.txt 2>/dev/null | tail -1
