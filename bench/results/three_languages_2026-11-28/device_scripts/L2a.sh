#!/bin/bash
# lease 2, call 1: environment, wheels, first part of the GGUF
date -u +"START %FT%TZ"
nvidia-smi
python3 --version
mkdir -p /work/exp51/code /tmp/gguf && tar -xJf .exp51/L2a/code.tar.xz -C /work/exp51/code && cp .exp51/L2a/gguf.aa /tmp/gguf/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .exp51/L2a/w/*.whl || echo PIPFAIL
export PYTHONPATH=/work/exp51/code:/tmp/site
cd /work/exp51/code && python3 -c "import pipeline; print(pipeline.__file__); import pipeline.__main__, pipeline.stages, pipeline.stages.replay, pipeline.stages.warmup, pipeline.stages.pretrain, pipeline.stages.evaluate, gguf, deepspeed, datasets, torch, triton, transformers, pipeline.training.engine; print('IMPORTS OK'); print('torch',torch.__version__,'triton',triton.__version__,'transformers',transformers.__version__,'deepspeed',deepspeed.__version__,'datasets',datasets.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])" 2>&1 | grep -v "^\[.*real_accelerator"
python3 -c "from pipeline.corpus.filters import bundled_lid176; print(bundled_lid176())"
nproc; free -g | head -2
date -u +"END %FT%TZ"
