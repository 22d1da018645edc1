#!/bin/bash
mkdir -p $OUT; cd /work/exp51
find work -type f \( -name '*.json' -o -name '*.md' -o -name '*.jsonl' -o -name '*.log' -o -name '*.txt' -o -name '*.png' -o -name '*.csv' -o -name '*.yaml' \) ! -name tokenizer.json ! -path '*/clean/*/*' -size -5M > /tmp/list.txt
ls all_*.log >> /tmp/list.txt
tar -czf $OUT/results.tgz -T /tmp/list.txt && ls -la $OUT
