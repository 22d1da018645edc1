#!/bin/bash
# lease 1, call 2: rest of the GGUF, conversion, stage=replay lang=eng
date -u +"START %FT%TZ"
mkdir -p $OUT
cat /tmp/gguf/gguf.aa .exp51/L1b/gguf.ab .exp51/L1b/gguf.ac > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/work/exp51/code:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cd /work/exp51/code && python3 -c "import pipeline; print(pipeline.__file__)"
python3 bench/gguf_to_hf.py /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf /work/exp51/smollm2 --eos-token '<|endoftext|>' --prompt "The capital of France is" 2>&1 | grep -v "Loading weights\|Writing model"
touch -d @1764201600 /work/exp51/smollm2/*
ls -la --time-style=+%s /work/exp51/smollm2; sha256sum /work/exp51/smollm2/*
python3 -c "from pipeline.model.files import folder_fingerprint; print('FP', folder_fingerprint('/work/exp51/smollm2'))"
tar -cf $OUT/base_files.tar -C /work/exp51 --exclude model.safetensors smollm2
C="raw_dir=/work/exp51/raw work_dir=/work/exp51/work model.base=/work/exp51/smollm2 workers=2"
date -u +"REPLAY_START %FT%TZ"
setsid nohup bash -c "python3 -m pipeline stage=replay lang=eng $C > /work/exp51/replay_log.txt 2>&1; echo \$? > /work/exp51/replay_rc; date -u +'REPLAY_END %FT%TZ' >> /work/exp51/replay_log.txt" > /dev/null 2>&1 &
while [ ! -f /work/exp51/replay_rc ] && [ $SECONDS -lt 565 ]; do sleep 5; done
date -u +"WAIT_END %FT%TZ"
grep -v "it/s\]" /work/exp51/replay_log.txt | tail -30
nvidia-smi --query-gpu=name,memory.used --format=csv
if [ -f /work/exp51/replay_rc ]; then echo "RC $(cat /work/exp51/replay_rc)"; tar -czf /tmp/replay.tgz -C /work/exp51 work/eng/replay work/eng/logs replay_log.txt && ls -la /tmp/replay.tgz && split -b 15000000 -d /tmp/replay.tgz $OUT/replay.tgz.; fi
ls -la $OUT
date -u +"END %FT%TZ"
