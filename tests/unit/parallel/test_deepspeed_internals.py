"""What pipeline/parallel/deepspeed_internals.py changes in DeepSpeed, checked in a fresh
interpreter."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, cli_env


def test_deepspeeds_muon_is_imported_without_compiling_its_kernel_or_importing_inductor():
    code = (
        "import os, sys, types\n"
        "from pipeline.parallel.deepspeed_internals import import_muon_uncompiled\n"
        "import_muon_uncompiled()\n"
        "from deepspeed.runtime.zero.muon import original_muon\n"
        "print('torch._inductor.compile_fx' in sys.modules, 'TORCHDYNAMO_DISABLE' in os.environ,\n"
        "      isinstance(original_muon.zeropower_via_newtonschulz5, types.FunctionType))\n"
    )
    env = {key: value for key, value in cli_env().items() if key != "TORCHDYNAMO_DISABLE"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert result.stdout.splitlines()[-1].split() == ["False", "False", "True"], (
        result.stdout + result.stderr
    )
