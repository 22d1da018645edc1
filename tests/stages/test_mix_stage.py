"""The mix stage through the real CLI, on the embedded samples cleaned by the real clean stage."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.mixing.planner import effective_tokens
from tests.conftest import DATA, copy_of, marker, read_jsonl_gz, run_cli, write_jsonl_gz


def plan(cwd, lang: str = "nob") -> dict:
    return json.loads((cwd / "work" / lang / "mix" / "plan.json").read_text(encoding="utf-8"))


def by_name(document: dict) -> dict[str, dict]:
    return {s["name"]: s for s in document["sources"]}


def assert_effective_tokens_follow_the_formula(document: dict) -> None:
    for s in document["sources"]:
        assert s["effective_tokens"] == pytest.approx(
            effective_tokens(s["unique_tokens_est"], s["epochs"]), abs=1
        )
        assert s["tokens"] == pytest.approx(s["epochs"] * s["unique_tokens_est"], abs=1e-6)
    assert document["effective_tokens"] == pytest.approx(
        sum(s["effective_tokens"] for s in document["sources"]), abs=2
    )


def write_code_corpus(folder) -> None:
    """A raw folder of (synthetic) source code, ~800 kB: a filler with a fixed ratio."""
    docs = [
        {
            "id": f"code/{i}",
            "text": "\n".join(
                f"def scale_{i}_{j}(value):\n    return value * {j} + {i}\n" for j in range(40)
            ),
        }
        for i in range(400)
    ]
    write_jsonl_gz(folder / "code.jsonl.gz", docs)


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory, nob_eng_cleaned):
    """nob (the target) and eng (the default filler) cleaned side by side, then the default plan."""
    cwd = copy_of(nob_eng_cleaned, tmp_path_factory, "mix")
    result = run_cli("stage=mix", "lang=nob", cwd=cwd)
    return cwd, result


def test_default_plan_repeats_nob_four_times_and_replays_english_at_a_quarter(cleaned):
    cwd, result = cleaned
    document = plan(cwd)
    nob, eng = by_name(document)["nob"], by_name(document)["eng"]
    train_bytes = sum(
        len(r["text"].encode("utf-8"))
        for r in read_jsonl_gz(cwd / "work" / "nob" / "clean" / "train")
    )
    assert (
        nob["unique_bytes"] == train_bytes
        and nob["bytes_per_token"] == 4.0
        and nob["input"] == "clean output"
    )
    assert nob["unique_tokens_est"] == round(train_bytes / 4.0)
    # no mix.tokens: the budget is what nob gives at mix.max_epochs, plus the base language's replay
    # (a quarter of the budget, or what its 4 epochs give)
    assert nob["tokens"] == 4 * nob["unique_tokens_est"] and nob["epochs"] == 4
    assert eng["kind"] == "fixed ratio" and eng["tokens"] == min(
        math.floor(0.25 * document["budget_tokens"]), math.floor(4 * eng["unique_tokens_est"])
    )
    assert eng["tokens"] > 0 and eng["share"] == pytest.approx(0.25, abs=1e-3)
    assert document["budget_tokens"] == document["planned_tokens"] == nob["tokens"] + eng["tokens"]
    assert document["budget_met"]
    assert_effective_tokens_follow_the_formula(document)
    assert "| nob | target |" in result.stderr and document["verdict"] in result.stderr


def test_acceptance_ten_times_the_unique_nob_tokens(cleaned):
    cwd, _ = cleaned
    unique = by_name(plan(cwd))["nob"]["unique_tokens_est"]
    result = run_cli("stage=mix", "lang=nob", f"mix.tokens={10 * unique}", cwd=cwd)
    document = plan(cwd)
    nob, eng = by_name(document)["nob"], by_name(document)["eng"]
    assert [s["name"] for s in document["sources"]] == ["nob", "eng"]
    assert nob["epochs"] == 4 and nob["at_cap"]
    # English, replayed at a quarter of the budget (or what its 4 epochs give), then nob at its cap;
    # nothing else can fill the rest, and the plan says so
    assert eng["kind"] == "fixed ratio"
    assert eng["tokens"] == min(
        math.floor(0.25 * 10 * unique), math.floor(4 * eng["unique_tokens_est"])
    )
    assert document["planned_tokens"] == nob["tokens"] + eng["tokens"]
    assert document["shortfall_tokens"] == 10 * unique - document["planned_tokens"] > 0
    assert not document["budget_met"] and document["verdict"].startswith("Budget NOT met")
    assert_effective_tokens_follow_the_formula(document)
    assert nob["verdict"].startswith("nob repeated 4.0x: effective 93% of unique-equivalent")
    assert nob["share"] == pytest.approx(0.4, abs=1e-6)

    plan_md = (cwd / "work" / "nob" / "mix" / "plan.md").read_text(encoding="utf-8")
    assert (
        "| source | kind | unique tokens | epochs | tokens | share | effective tokens | verdict |"
        in plan_md
    )
    assert (
        document["verdict"] in plan_md and nob["verdict"] in plan_md and eng["verdict"] in plan_md
    )
    assert "- nob: 100%, 97%, 91%, 85%" in plan_md
    assert "| nob | target |" in result.stderr  # the table is printed too

    metrics = marker(cwd / "work", "nob", "mix")["metrics"]
    assert metrics["budget_tokens"] == 10 * unique and metrics["budget_met"] is False
    assert metrics["epochs"] == {"nob": nob["epochs"], "eng": eng["epochs"]}
    assert metrics["effective_tokens_by_source"]["nob"] == nob["effective_tokens"]


def test_related_language_code_and_english_fill_the_rest(cleaned, tmp_path):
    cwd, _ = cleaned
    unique = by_name(plan(cwd))["nob"]["unique_tokens_est"]
    write_code_corpus(tmp_path / "code")
    # a raw folder of Nynorsk as the related language, synthetic code at a fixed 10%, then English
    sources = (
        f"[{{name:eng,path:${{work_dir}}/eng/clean,priority:2,max_epochs:8}},"
        f"{{name:nno,path:{DATA / 'nno'},priority:1}},"
        f"{{name:code,path:{tmp_path / 'code'},script:code,ratio:0.1}}]"
    )
    run_cli("stage=mix", "lang=nob", f"mix.tokens={10 * unique}", f"mix.sources={sources}", cwd=cwd)
    document = plan(cwd)
    sources = by_name(document)
    # the target first, then the fixed ratio, then the fillers by priority
    assert [s["name"] for s in document["sources"]] == ["nob", "code", "nno", "eng"]
    assert [s["kind"] for s in document["sources"]] == ["target", "fixed ratio", "filler", "filler"]
    assert document["budget_met"] and document["planned_tokens"] == 10 * unique
    assert sources["nob"]["epochs"] == 4
    assert (
        sources["code"]["tokens"] == 10 * unique // 10 and sources["code"]["bytes_per_token"] == 3.5
    )
    assert sources["code"]["input"] == sources["nno"]["input"] == "raw folder"
    assert sources["nno"]["at_cap"] and sources["nno"]["epochs"] == pytest.approx(4)
    assert 1 < sources["eng"]["epochs"] < 8 and not sources["eng"]["at_cap"]
    assert sum(s["sampling_weight"] for s in document["sources"]) == pytest.approx(1)
    assert_effective_tokens_follow_the_formula(document)


def test_without_fillers_it_caps_or_shows_the_value_of_each_extra_epoch(cleaned):
    cwd, _ = cleaned
    unique = by_name(plan(cwd))["nob"]["unique_tokens_est"]
    run_cli("stage=mix", "lang=nob", f"mix.tokens={10 * unique}", "mix.sources=[]", cwd=cwd)
    capped = plan(cwd)
    assert [s["name"] for s in capped["sources"]] == ["nob"]
    assert capped["sources"][0]["epochs"] == 4 and capped["shortfall_tokens"] == 6 * unique
    assert "Budget NOT met" in capped["verdict"] and "the best achievable is" in capped["verdict"]

    run_cli(
        "stage=mix",
        "lang=nob",
        f"mix.tokens={10 * unique}",
        "mix.sources=[]",
        "mix.max_epochs=10",
        cwd=cwd,
    )
    raised = plan(cwd)
    nob = raised["sources"][0]
    assert raised["budget_met"] and nob["epochs"] == 10
    assert nob["effective_tokens"] == pytest.approx(effective_tokens(unique, 10), abs=1)
    values = nob["epoch_values"]
    assert len(values) == 10 and all(b < a for a, b in zip(values, values[1:]))
    assert nob["verdict"].endswith("epoch 10 is worth 58% of new data (at its 10-epoch cap)")
    plan_md = (cwd / "work" / "nob" / "mix" / "plan.md").read_text(encoding="utf-8")
    assert "- nob: 100%, 97%, 91%, 85%, 80%, 75%, 70%, 66%, 61%, 58%" in plan_md


def test_same_command_is_skipped_and_a_new_budget_reruns(cleaned):
    cwd, _ = cleaned
    run_cli("stage=mix", "lang=nob", "mix.tokens=1e6", cwd=cwd)
    before = marker(cwd / "work", "nob", "mix")
    again = run_cli("stage=mix", "lang=nob", "mix.tokens=1e6", cwd=cwd)
    assert "Skipping mix for nob: it is up to date" in again.stderr
    assert marker(cwd / "work", "nob", "mix") == before
    changed = run_cli("stage=mix", "lang=nob", "mix.tokens=2e6", cwd=cwd)
    assert "mix for nob changed" in changed.stderr
    after = marker(cwd / "work", "nob", "mix")
    assert (
        after["config_hash"] != before["config_hash"]
        and after["metrics"]["budget_tokens"] == 2_000_000
    )
    # the English filler's clean output is part of the hash
    assert (
        after["inputs"]["mix_sources"]["eng"]["config_hash"]
        == marker(cwd / "work", "eng", "clean")["config_hash"]
    )


def test_a_missing_source_fails_naming_it_and_how_to_create_it(cleaned):
    cwd, _ = cleaned
    result = run_cli(
        "stage=mix",
        "lang=nob",
        "mix.sources=[{name:swe,path:${work_dir}/swe/clean}]",
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 1
    assert (
        f"mix source `swe` (mix.sources.0.path): {cwd / 'work' / 'swe' / 'clean'} does not exist"
        in result.stderr
    )
    assert "python -m pipeline stage=clean lang=swe work_dir=work" in result.stderr


def test_bad_budget_fails_before_any_work(tmp_path):
    result = run_cli("stage=mix", "lang=nob", "mix.tokens=-1", cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert (
        "Invalid value for `mix.tokens`: -1.0. Allowed: a positive number of tokens"
        in result.stderr
    )
    assert not (tmp_path / "work" / "nob" / "mix").exists()


def test_clean_then_rehydration_on_known_cluster_sizes(tmp_path, embedded_records):
    """Faroese documents copied 1, 2, 3, 4, 5, 99, 100 and 250 times: clean clusters them, mix
    rehydrates."""
    copies = [1, 2, 3, 4, 5, 99, 100, 250]
    bases = [r for r in embedded_records["fao"] if len(r["text"]) > 1000][: len(copies)]
    records = [
        {"id": f"{base['id']}/copy{k}", "text": base["text"], "lang": "fao"}
        for base, n in zip(bases, copies)
        for k in range(n)
    ]
    write_jsonl_gz(tmp_path / "raw" / "fao" / "copies.jsonl.gz", records)
    clean_options = [
        f"raw_dir={tmp_path / 'raw'}",
        "clean.heldout_fraction=0",
        "clean.heldout_min_documents=0",
        "clean.gopher_repetition=false",
        "clean.gopher_quality=false",
        "clean.fineweb_quality=false",
    ]

    run_cli("stage=clean", "lang=fao", *clean_options, cwd=tmp_path)
    result = run_cli("stage=mix", "lang=fao", *clean_options, cwd=tmp_path)
    assert "Running mix for fao" in result.stderr
    # the default English replay is optional: without its clean output and the base's samples it is
    # skipped, and the plan says so and how to make them
    assert (
        "source `eng` skipped" in result.stderr and "source `eng-samples` skipped" in result.stderr
    )
    skipped = plan(tmp_path, "fao")["skipped_sources"]
    assert [s["name"] for s in skipped] == ["eng", "eng-samples"]
    assert "python -m pipeline stage=clean lang=eng" in skipped[0]["reason"]
    assert (
        "python -m pipeline stage=replay lang=eng" in skipped[1]["reason"]
        and "model.base=" in skipped[1]["reason"]
    )

    run_cli("stage=mix", "lang=fao", *clean_options, "mix.rehydration.enabled=true", cwd=tmp_path)
    document = plan(tmp_path, "fao")
    rehydration, fao = document["rehydration"], by_name(document)["fao"]
    kept = read_jsonl_gz(tmp_path / "work" / "fao" / "clean" / "train")
    assert sorted(r["metadata"]["minhash_cluster_size"] for r in kept) == copies
    buckets = {b["cluster_sizes"]: b for b in rehydration["buckets"]}
    assert {label: (b["documents"], b["weight"]) for label, b in buckets.items()} == {
        "1": (1, 1),
        "2": (1, 2),
        "3-4": (2, 3),
        "5-99": (2, 5),
        "100+": (2, 8),
    }
    # the weights are scaled so that the mean repetition over the bytes is fao's planned 4 epochs
    size_bytes = {len(b["text"].encode("utf-8")): n for b, n in zip(bases, copies)}
    assert sum(b["bytes"] for b in buckets.values()) == fao["unique_bytes"] == sum(size_bytes)
    mean_weight = sum(b["weight"] * b["bytes"] for b in buckets.values()) / fao["unique_bytes"]
    assert rehydration["mean_weight"] == pytest.approx(mean_weight)
    assert [b["epochs"] for b in buckets.values()] == pytest.approx(
        [w * 4 / mean_weight for w in (1, 2, 3, 5, 8)]
    )
    assert rehydration["mean_epochs"] == pytest.approx(fao["epochs"]) and fao["epochs"] == 4
    assert "## Rehydration" in (tmp_path / "work" / "fao" / "mix" / "plan.md").read_text(
        encoding="utf-8"
    )


def test_a_language_whose_text_is_all_rejected_fails_at_its_mix_naming_the_language_and_the_cause(
    tmp_path,
):
    """A workflow over many languages lets such a language fail alone
    (tests/slurm/test_workflow_slurm.py): the clean stage finishes with nothing kept, and the mix
    says what was rejected where."""
    write_jsonl_gz(
        tmp_path / "raw" / "dan" / "junk.jsonl.gz",
        [{"id": f"junk/{i}", "text": "ok " * 3, "lang": "dan"} for i in range(30)],
    )
    options = ("lang=dan", f"raw_dir={tmp_path / 'raw'}")
    run_cli("stage=clean", *options, cwd=tmp_path)
    assert marker(tmp_path / "work", "dan", "clean")["metrics"]["docs_out"] == 0
    result = run_cli("stage=mix", *options, cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert "mix dan: the clean stage kept no training text of dan" in result.stderr
    assert "0 of 30 documents kept, rejected by language_id 30" in result.stderr
    assert str(tmp_path / "work" / "dan" / "clean" / "report.md") in result.stderr
