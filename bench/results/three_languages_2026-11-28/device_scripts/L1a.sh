#!/bin/bash
# lease 1, call 1: environment, wheels, first part of the GGUF
date -u +"START %FT%TZ"
nvidia-smi
python3 --version
python3 -c "import torch,triton,transformers,sys; print('torch',torch.__version__,'triton',triton.__version__,'transformers',transformers.__version__, torch.cuda.get_device_name(0), sys.executable)"
mkdir -p /work/exp51/code /tmp/gguf && tar -xJf .exp51/L1a/code.tar.xz -C /work/exp51/code && cp .exp51/L1a/gguf.aa /tmp/gguf/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .exp51/L1a/w/*.whl || echo PIPFAIL
export PYTHONPATH=/work/exp51/code:/tmp/site
cd /work/exp51/code && python3 -c "import pipeline; print(pipeline.__file__); import pipeline.__main__, pipeline.stages, pipeline.stages.replay, pipeline.mixing.replay, gguf; print('IMPORTS OK')"
python3 -m pip list 2>/dev/null | grep -iE "^(pyarrow|huggingface|accelerate|tokenizers|safetensors|numpy|pandas|fsspec|humanize|xxhash|tensorboard|matplotlib|sentencepiece|psutil|ninja|msgpack|einops|py-cpuinfo|nvidia-ml|colorlog|requests|pyyaml|tqdm|regex|typing|filelock|packaging|pydantic|deepspeed|datasets|hjson) "
df -h /tmp | tail -1; nproc; free -g | head -2
date -u +"END %FT%TZ"
