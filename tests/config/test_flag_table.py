"""The generated flag table covers every flag of the inventory, with the seed's types and defaults."""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest
from infer.core.config import FLAG_SPECS, SECTION_MODELS, ServerArgs
from infer.core.config.flags import INFER_FLAGS, load_flag_table

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
TSV = SHARED / "flags" / "server-flags.tsv"

needs_shared = pytest.mark.skipif(not TSV.exists(), reason="../shared (the seeds) not present")


def _inventory():
    with open(TSV) as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            yield row["section"], row["flag"], [a for a in re.split(r"[,\s]+", row["aliases"] or "") if a]


@needs_shared
def test_every_inventory_flag_is_a_setting_with_its_section_and_aliases():
    by_flag = {s.flag: s for s in FLAG_SPECS.values()}
    rows = list(_inventory())
    assert len(rows) == 336
    for section, flag, aliases in rows:
        spec = by_flag[flag]
        assert spec.section == section
        assert list(spec.aliases) == aliases
        assert spec.dest in ServerArgs.model_fields
    # plus the two flags the seed page documents that the inventory has no row for, and infer's
    # own (vLLM spellings of settings SGLang has no flag for)
    extra = {s.flag for s in FLAG_SPECS.values()} - {flag for _, flag, _ in rows}
    assert extra == {"--log-requests-level", "--preferred-sampling-params",
                     "--distributed-executor-backend", "--enable-expert-parallel"}
    assert len(FLAG_SPECS) == 340
    assert FLAG_SPECS["log_requests_level"].choices == (0, 1, 2, 3)
    assert FLAG_SPECS["log_requests_level"].default == 2


def _generator():
    spec = importlib.util.spec_from_file_location("gen_flags", ROOT / "docs" / "tools" / "gen_flags.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


@needs_shared
def test_committed_table_is_what_the_generator_makes_from_the_seeds():
    gen = _generator()
    table = gen.build(SHARED)
    committed = ROOT / "core" / "config" / "flags.json"
    assert committed.read_text(encoding="utf-8") == gen.render(table)
    assert load_flag_table() == table


def test_flag_table_is_package_data_and_its_generator_is_not_installed():
    # The table ships as JSON read at import; the generator (which reads ../shared) stays a
    # development tool under docs/tools, outside the installed package.
    assert importlib.util.find_spec("infer.core.config.gen_flags") is None
    assert importlib.util.find_spec("infer.core.config.flags_data") is None
    assert not list((ROOT / "core").rglob("gen_*.py"))
    rows = load_flag_table()
    assert len(rows) == 338 and len(FLAG_SPECS) == 338 + len(INFER_FLAGS)
    assert {r["dest"] for r in rows + INFER_FLAGS} == set(FLAG_SPECS)


def test_dest_names_types_defaults_and_choices_follow_sglang():
    s = FLAG_SPECS
    assert s["tp_size"].flag == "--tensor-parallel-size" and "--tp-size" in s["tp_size"].aliases
    assert s["pp_size"].flag == "--pipeline-parallel-size"
    assert s["dp_size"].flag == "--data-parallel-size"
    assert s["ep_size"].aliases == ("--ep-size", "--ep")
    assert s["model_path"].aliases == ("--model",)
    assert (s["port"].type, s["port"].default) == ("int", 30000)
    assert (s["host"].type, s["host"].default) == ("str", "127.0.0.1")
    assert (s["mem_fraction_static"].type, s["mem_fraction_static"].default) == ("float", None)
    assert (s["page_size"].default, s["max_prefill_tokens"].default) == (1, 16384)
    assert (s["disable_radix_cache"].type, s["disable_radix_cache"].default) == ("bool", False)
    assert s["schedule_policy"].default == "fcfs" and "lpm" in s["schedule_policy"].choices
    assert s["tokenizer_mode"].choices == ("auto", "slow")
    assert s["kv_cache_dtype"].choices == ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")
    assert {"fa3", "torch_native", "triton", "flashinfer"} <= set(s["attention_backend"].choices)
    assert s["speculative_draft_attention_backend"].choices == s["attention_backend"].choices
    assert s["max_lora_chunk_size"].choices == (16, 32, 64, 128) and s["max_lora_chunk_size"].type == "int"
    assert s["cuda_graph_bs"].type == "list[int]"
    assert s["mm_process_config"].type == "json" and s["mm_process_config"].default == {}
    assert s["torchao_config"].default == ""
    assert s["otlp_traces_endpoint"].default == "localhost:4317"
    # descriptions are whole sentences from the seed page, not fragments
    assert s["tokenizer_mode"].help.startswith("Tokenizer mode.")
    assert s["port"].help == "The port of the HTTP server."
    assert all(spec.help for spec in s.values())


def test_settings_are_grouped_in_one_pydantic_model_per_section():
    from pydantic_settings import BaseSettings

    assert issubclass(ServerArgs, BaseSettings)
    sections = {spec.section for spec in FLAG_SPECS.values()}
    assert set(SECTION_MODELS) == sections
    for name, model in SECTION_MODELS.items():
        assert issubclass(ServerArgs, model)
        assert {d for d, sp in FLAG_SPECS.items() if sp.section == name} == set(model.model_fields)
    http = ServerArgs(port=1234).section("HTTP server")
    assert http.port == 1234 and http.host == "127.0.0.1"
