#!/bin/bash
# lease 2, call 2: rest of the GGUF, conversion of the base
date -u +"START %FT%TZ"
cat /tmp/gguf/gguf.aa .exp51/L2b/gguf.ab > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf && sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=/work/exp51/code:/tmp/site PYTHONUNBUFFERED=1
cd /work/exp51/code && python3 bench/gguf_to_hf.py /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf /work/exp51/smollm2 --eos-token '<|endoftext|>' --prompt "The capital of France is" 2>&1 | grep -v "Loading weights\|Writing model\|Converting and"
sha256sum /work/exp51/smollm2/*
date -u +"END %FT%TZ"
