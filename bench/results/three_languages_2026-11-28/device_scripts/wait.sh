#!/bin/bash
# wait until both stage=all runs ended or $1 seconds of this call passed, then collect
LIMIT=${1:-560}
while [ $SECONDS -lt $LIMIT ]; do
  n=$(grep -l "^END " /work/exp51/all_fao.log /work/exp51/all_swa.log 2>/dev/null | wc -l); [ "$n" = 2 ] && break; sleep 5; done
date -u +"WAIT_END %FT%TZ"
nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv
for L in fao swa; do echo "=== $L"; grep -v "it/s\]\|s/it\]" /work/exp51/all_$L.log | grep -E "START|END|RC=|Skipping|Running|finished|bits per byte|Error|error|Traceback|micro-batch|steps" | tail -25; done
/tmp/collect.sh
