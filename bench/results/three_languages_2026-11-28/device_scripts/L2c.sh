#!/bin/bash
# lease 2, call 3: raw files, work folder, base files; stage=all for fao (GPU 0) and swa (GPU 1) side by side
date -u +"START %FT%TZ"
mkdir -p $OUT
cp .exp51/L2c/collect.sh .exp51/L2c/wait.sh /tmp/ && chmod +x /tmp/*.sh
tar -xf .exp51/L2c/raw.tar -C /work/exp51 && tar -xJf .exp51/L2c/work.tar.xz -C /work/exp51 && tar -xf .exp51/L2c/base_files.tar -C /work/exp51 && touch -d @1764201600 /work/exp51/smollm2/*
export PYTHONPATH=/work/exp51/code:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cd /work/exp51/code
ls -la --time-style=+%s /work/exp51/smollm2; sha256sum /work/exp51/smollm2/model.safetensors
python3 -c "from pipeline.model.files import folder_fingerprint; print('FP', folder_fingerprint('/work/exp51/smollm2'))"
find /work/exp51/raw -type f -printf '%T@ %s %p\n'
C="raw_dir=/work/exp51/raw work_dir=/work/exp51/work model.base=/work/exp51/smollm2 workers=2"
CUDA_VISIBLE_DEVICES=0 setsid nohup bash -c "date -u +'START %FT%TZ'; python3 -m pipeline stage=all lang=fao $C; echo RC=\$?; date -u +'END %FT%TZ'" > /work/exp51/all_fao.log 2>&1 &
echo $! > /work/exp51/all_fao.pid
sleep 15  # the eng stages' locks: fao checks eng clean/replay first, then swa
CUDA_VISIBLE_DEVICES=1 setsid nohup bash -c "date -u +'START %FT%TZ'; python3 -m pipeline stage=all lang=swa $C 'clean.heldout_sources=[globalvoices_later_*]'; echo RC=\$?; date -u +'END %FT%TZ'" > /work/exp51/all_swa.log 2>&1 &
echo $! > /work/exp51/all_swa.pid
sleep 25
grep -h -E "Skipping|Running" /work/exp51/all_*.log
if grep -E "Running (clean|replay|mix|tokenizer|pack) " /work/exp51/all_*.log; then echo "UNEXPECTED RERUN: stopping both"; for L in fao swa; do kill -- -$(cat /work/exp51/all_$L.pid); done; sleep 3; fi
/tmp/wait.sh 495
