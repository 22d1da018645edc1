"""The command line as users meet it: help, resolved config, and errors that say what to do."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.config import CONF_DIR, TARGETS
from tests.conftest import run_cli


def test_help_lists_every_stage_and_the_main_options(tmp_path):
    out = run_cli("--help", cwd=tmp_path).stdout
    for stage in TARGETS:
        assert f"\n  {stage} " in out
    for option in (
        "work_dir=",
        "raw_dir=",
        "workers=",
        "cluster=",
        "clean.lid.model=",
        "mix.tokens=",
        "--cfg job",
    ):
        assert option in out
    # --help prints the template without Hydra (which would list every config group first): it must
    # not need any of Hydra's $ variables, or Hydra would print something else.
    template = yaml.safe_load((CONF_DIR / "config.yaml").read_text(encoding="utf-8"))["hydra"][
        "help"
    ]["template"]
    assert "$" not in template and out == template + "\n"


def test_cfg_job_prints_the_resolved_config_with_the_language_entry(tmp_path):
    out = run_cli("--cfg", "job", "stage=clean", "lang=nb", cwd=tmp_path).stdout
    assert "stage: clean" in out
    assert "code: nob" in out and "language_score: 0.813" in out and "line_punct_thr: 0.12" in out
    assert not (tmp_path / "work").exists()  # printing the config does no work


def test_a_language_name_suggests_each_of_its_variants(tmp_path):
    result = run_cli("stage=clean", "lang=norwegian", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "Closest known codes: nob (Norwegian Bokmål), nno (Norwegian Nynorsk), " in result.stderr


@pytest.mark.parametrize("typed, first", [("xyz", None), ("nbo", "nob"), ("fra_Latn", "fra")])
def test_unknown_or_aliased_language(tmp_path, typed, first):
    result = run_cli("stage=clean", f"lang={typed}", "--cfg", "job", cwd=tmp_path, check=False)
    if typed == "fra_Latn":  # an alias of a known language resolves
        assert result.returncode == 0 and "code: fra" in result.stdout
        return
    assert result.returncode == 2
    assert f"Unknown language `lang={typed}`" in result.stderr
    assert "languages.yaml" in result.stderr
    if first:
        assert result.stderr.split("Closest known codes: ")[1].startswith(first)


@pytest.mark.parametrize(
    "args, code, message",
    [
        (
            ["stage=claen", "lang=nob"],
            2,
            "Unknown stage `stage=claen`. Valid stages, closest first: clean,",
        ),
        (
            ["stage=clean", "lang=nob", "clean.heldout_fracton=0.1"],
            2,
            "Unknown config key `clean.heldout_fracton`. Did you mean: `clean.heldout_fraction`",
        ),
        (
            ["stage=clean", "lang=nob", "clean.heldout_fraction=abc"],
            2,
            "Invalid value for `clean.heldout_fraction`: 'abc' is not a number. "
            "`clean.heldout_fraction` takes a number, "
            "e.g. clean.heldout_fraction=0.02.",
        ),
        (
            ["stage=clean", "lang=nob", "tokenizer.vocab_size=abc"],
            2,
            "Invalid value for `tokenizer.vocab_size`: 'abc' is not an integer. "
            "`tokenizer.vocab_size` takes an integer",
        ),
        (
            ["stage=clean", "lang=nob", "clean.dedup.enabled=maybe"],
            2,
            "Invalid value for `clean.dedup.enabled`: 'maybe' is not true or false.",
        ),
        (
            ["stage=clean", "lang=nob", "clean.tasks=two"],
            2,
            "`clean.tasks` takes an integer or null",
        ),
        (
            ["stage=clean", "lang=nob", "clean.heldout_fraction=1.5"],
            1,
            "Invalid value for `clean.heldout_fraction`: 1.5. Allowed: a number in [0, 1)",
        ),
        (["stage=clean"], 2, "Missing `lang=`"),
        # the key warmup.train_base_rows (a bool) became warmup.base_rows (a choice)
        (
            ["stage=warmup", "lang=nob", "warmup.train_base_rows=false"],
            2,
            "Unknown config key `warmup.train_base_rows`. Did you mean: `warmup.base_rows`",
        ),
        (
            ["stage=warmup", "lang=nob", "warmup.base_rows=yes"],
            1,
            "Invalid value for `warmup.base_rows`: 'yes'. Allowed: trained, frozen.",
        ),
        (
            ["stage=warmup", "lang=nob", "warmup.base_rows_lr=0"],
            1,
            "Invalid value for `warmup.base_rows_lr`: 0.0. Allowed: null (warmup.train.lr's), a "
            "learning rate > 0",
        ),
    ],
    ids=[
        "stage",
        "key",
        "type-float",
        "type-int",
        "type-bool",
        "type-optional",
        "range",
        "missing-lang",
        "renamed-key",
        "choice",
        "positive",
    ],
)
def test_mistakes_fail_at_once_naming_the_key_and_the_fix(tmp_path, args, code, message):
    result = run_cli(*args, cwd=tmp_path, check=False)
    assert result.returncode == code
    assert message in result.stderr
    assert not (tmp_path / "work" / "nob" / "clean").exists()


def test_missing_lid_model_file_names_the_key(tmp_path):
    result = run_cli(
        "stage=clean", "lang=nob", "clean.lid.model=/nonexistent/lid.bin", cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    assert "clean.lid.model" in result.stderr and "/nonexistent/lid.bin" in result.stderr


def _bloom_config(folder, **sizes):
    """A BLOOM base as the command line sees it: its config.json (the weights are the stages'
    business)."""
    folder.mkdir()
    config = {
        "architectures": ["BloomForCausalLM"],
        "model_type": "bloom",
        "vocab_size": 512,
        "hidden_size": 64,
        "n_layer": 2,
        "n_head": 4,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        **sizes,
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_cfg_job_shows_the_base_models_shape_over_the_preset(tmp_path):
    base = _bloom_config(tmp_path / "bloom")
    out = run_cli(
        "--cfg",
        "job",
        "stage=warmup",
        "lang=nob",
        f"model.base={base}",
        "model.max_seq_len=128",
        cwd=tmp_path,
    ).stdout
    model = yaml.safe_load(out)["model"]
    assert {
        key: model[key]
        for key in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "ffn_size",
            "vocab_size",
            "position",
            "norm",
            "activation",
            "embedding_norm",
            "bias",
        )
    } == {
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 4,
        "ffn_size": 256,
        "vocab_size": 512,
        "position": "alibi",
        "norm": "layernorm",
        "activation": "gelu",
        "embedding_norm": True,
        "bias": True,
    }
    assert model["max_seq_len"] == 128  # a shorter context than the base's is the user's choice
    # a real base takes the defaults, not the demo scale's budgets and vocabulary
    # (pipeline/conf/scale/demo.yaml) ...
    config = yaml.safe_load(out)
    assert (config["tokenizer"]["extend_base"], config["tokenizer"]["added_tokens"]) == (
        True,
        16384,
    )
    assert (config["train"]["steps"], config["warmup"]["train"]["steps"]) == (None, None)
    assert (config["train"]["lr"], config["train"]["global_batch_size"]) == (3e-4, 64)
    assert (config["replay"]["tokens"], config["warmup"]["base_rows"]) == (6_000_000, "trained")
    assert (config["warmup"]["base_rows_lr"], config["warmup"]["train"]["lr"]) == (1e-4, 1e-3)
    # ... and the command line's own values still win
    own = yaml.safe_load(
        run_cli(
            "--cfg",
            "job",
            "stage=warmup",
            "lang=nob",
            f"model.base={base}",
            "train.lr=1e-5",
            "tokenizer.extend_base=false",
            "tokenizer.vocab_size=4096",
            cwd=tmp_path,
        ).stdout
    )
    assert (
        own["train"]["lr"],
        own["tokenizer"]["extend_base"],
        own["tokenizer"]["vocab_size"],
    ) == (1e-5, False, 4096)


def _origins(out: str) -> dict:
    """`--cfg job`'s lines `key: value  # origin` as dotted key -> origin."""
    origins, path = {}, []
    for line in out.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        if line.lstrip().startswith("- ") or depth > len(path):
            continue  # inside a list of mappings, whose key carries the origin
        key, _, rest = line.strip().partition(":")
        path = [*path[:depth], key]
        if "  # " in rest:
            origins[".".join(path)] = rest.rsplit("  # ", 1)[1]
    return origins


def test_cfg_job_names_where_each_value_came_from(tmp_path):
    argv = ("stage=pretrain", "lang=nob", "train.lr=1e-5")
    demo = run_cli("--cfg", "job", *argv, cwd=tmp_path).stdout
    # the same config as Hydra's own --cfg job (which a package flag leaves to Hydra), with the
    # base-model rule's value where Hydra leaves null
    hydras = yaml.safe_load(run_cli("--cfg", "job", "-p", "_global_", *argv, cwd=tmp_path).stdout)
    assert hydras["tokenizer"]["extend_base"] is None
    hydras["tokenizer"]["extend_base"] = False
    assert yaml.safe_load(demo) == hydras
    shown = _origins(demo)
    assert (shown["train.lr"], shown["train.steps"], shown["train.schedule"]) == (
        "command line",
        "scale=demo",
        "default",
    )
    assert (shown["tokenizer.vocab_size"], shown["tokenizer.extend_base"]) == (
        "scale=demo",
        "rule: model.base not given",
    )
    assert (shown["mix.sources"], shown["mix.max_epochs"]) == ("mix=default", "default")
    assert (shown["model.hidden_size"], shown["lang.filters.language_score"]) == (
        "preset model=tiny",
        "lang=nob (pipeline/conf/languages.yaml)",
    )
    assert (shown["work_dir"], shown["stage"]) == ("pipeline/conf/config.yaml", "command line")
    base = _origins(
        run_cli(
            "--cfg", "job", *argv, f"model.base={_bloom_config(tmp_path / 'bloom')}", cwd=tmp_path
        ).stdout
    )
    assert (base["train.lr"], base["train.steps"], base["tokenizer.vocab_size"]) == (
        "command line",
        "default",
        "default",
    )
    assert (base["model.hidden_size"], base["model.base"]) == (
        "model.base's config.json",
        "command line",
    )
    assert base["model.init_std"] == "preset model=tiny"  # what a config.json does not say
    assert base["tokenizer.extend_base"] == "rule: model.base given"
    # another preset without a base is not the demo: the defaults' budgets, which its layouts divide
    other = run_cli("--cfg", "job", "stage=plan", "model=mistral-7b", cwd=tmp_path).stdout
    assert (
        _origins(other)["train.steps"],
        yaml.safe_load(other)["train"]["global_batch_size"],
    ) == ("default", 64)


def test_a_llama_3_1_base_brings_its_rope_scaling_over_a_preset_without_one(tmp_path):
    base = tmp_path / "llama"
    base.mkdir()
    (base / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": 1024,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "intermediate_size": 160,
                "max_position_embeddings": 4096,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 512,
                },
            }
        )
    )
    model = yaml.safe_load(
        run_cli(
            "--cfg", "job", "stage=warmup", "lang=nob", f"model.base={base}", cwd=tmp_path
        ).stdout
    )["model"]
    llama3 = {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_seq_len": 512,
    }
    # the other types' keys (yarn's, longrope's) keep their defaults
    assert {key: model["rope_scaling"][key] for key in llama3} == llama3
    assert (model["num_kv_heads"], model["rope_theta"], model["max_seq_len"]) == (1, 500000.0, 4096)


def test_a_shape_that_contradicts_the_base_names_both_values(tmp_path):
    base = _bloom_config(tmp_path / "bloom")
    result = run_cli(
        "stage=clean",
        "lang=nob",
        f"model.base={base}",
        "model.num_layers=3",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1
    assert (
        "Invalid value for `model.num_layers`: 3" in result.stderr
        and "num_layers=2" in result.stderr
    )
    assert "model.base decides the model's shape" in result.stderr
    result = run_cli(
        "stage=clean", "lang=nob", f"model.base={tmp_path / 'missing'}", cwd=tmp_path, check=False
    )
    assert result.returncode == 2 and f"{tmp_path / 'missing'} is not a folder" in result.stderr
