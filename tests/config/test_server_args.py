"""ServerArgs sources, provenance, aliases, deprecated flags and cross-flag validation."""

from __future__ import annotations

import warnings

import pytest
from infer.core.config import ConfigError, ServerArgs


def test_keyword_args_are_user_set_and_the_rest_default():
    a = ServerArgs(model_path="m", page_size=16)
    assert (a.model_path, a.page_size, a.port) == ("m", 16, 30000)
    assert a.provenance["page_size"] == "user" and a.provenance["port"] == "default"
    assert a.is_set("page_size") and not a.is_set("port")
    assert a.explicit_flags() == [("--model-path", "m"), ("--page-size", 16)]


def test_none_keyword_means_not_given():
    a = ServerArgs(model_path="m", attention_backend=None)
    assert not a.is_set("attention_backend")


def test_sources_rank_user_over_env_over_config_over_default(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 1111\nhost: 0.0.0.0\npage-size: 8\nmax_running_requests: 7\n")
    monkeypatch.setenv("INFER_PORT", "2222")
    monkeypatch.setenv("INFER_PAGE_SIZE", "4")
    a = ServerArgs(config=str(cfg), page_size=32)
    assert (a.page_size, a.provenance["page_size"]) == (32, "user")
    assert (a.port, a.provenance["port"]) == (2222, "env")
    assert (a.host, a.provenance["host"]) == ("0.0.0.0", "config")
    assert (a.max_running_requests, a.provenance["max_running_requests"]) == (7, "config")
    assert a.provenance["dtype"] == "default"
    assert a.spelling("port") == "INFER_PORT"
    flags = dict(a.explicit_flags())
    assert flags["--port"] == 2222 and flags["--host"] == "0.0.0.0" and flags["--page-size"] == 32


def test_config_file_from_env_and_aliases_in_the_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: some/model\ntp-size: 2\nmax-model-len: 4096\nenforce-eager: true\n")
    monkeypatch.setenv("INFER_CONFIG", str(cfg))
    a = ServerArgs()
    assert (a.model_path, a.tp_size, a.context_length, a.disable_cuda_graph) == ("some/model", 2, 4096, True)
    assert a.provenance["tp_size"] == "config" and a.provenance["config"] == "env"


def test_config_file_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("no-such-flag: 1\n")
    with pytest.raises(ConfigError, match=r"--config .*bad.yaml: unknown setting 'no-such-flag'"):
        ServerArgs(config=str(bad))
    with pytest.raises(ConfigError, match="file not found"):
        ServerArgs(config=str(tmp_path / "missing.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        ServerArgs(config=str(tmp_path / "list.yaml"))


def test_env_values_are_typed_and_lists_are_json(monkeypatch):
    monkeypatch.setenv("INFER_CUDA_GRAPH_BS", "[1, 2, 4]")
    monkeypatch.setenv("INFER_DISABLE_RADIX_CACHE", "true")
    monkeypatch.setenv("INFER_MEM_FRACTION_STATIC", "0.5")
    a = ServerArgs()
    assert a.cuda_graph_bs == [1, 2, 4] and a.disable_radix_cache is True and a.mem_fraction_static == 0.5
    monkeypatch.setenv("INFER_PORT", "not-a-port")
    with pytest.raises(ConfigError, match="--port|INFER_PORT"):
        ServerArgs()


@pytest.mark.parametrize("kwargs, dest, value", [
    ({"model": "m"}, "model_path", "m"),
    ({"max_model_len": 2048}, "context_length", 2048),
    ({"gpu_memory_utilization": 0.8}, "mem_fraction_static", 0.8),
    ({"max_num_seqs": 64}, "max_running_requests", 64),
    ({"max_num_batched_tokens": 512}, "chunked_prefill_size", 512),
    ({"enforce_eager": True}, "disable_cuda_graph", True),
    ({"tensor_parallel_size": 2}, "tp_size", 2),
    ({"pipeline_parallel_size": 2, "disable_overlap_schedule": True}, "pp_size", 2),
    ({"data_parallel_size": 2}, "dp_size", 2),
    ({"seed": 7}, "random_seed", 7),
    ({"block_size": 16}, "page_size", 16),
    ({"enable_prefix_caching": True}, "disable_radix_cache", False),
    ({"no_enable_prefix_caching": True}, "disable_radix_cache", True),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype", "fp8_e4m3"),
    ({"uvicorn_log_level": "debug"}, "log_level_http", "debug"),
    ({"tokenizer": "t"}, "tokenizer_path", "t"),
])
def test_vllm_spellings_map_to_the_sglang_setting(kwargs, dest, value):
    a = ServerArgs(**kwargs)
    assert getattr(a, dest) == value
    assert a.is_set(dest)


def test_swap_space_is_refused_with_a_reason():
    with pytest.raises(ConfigError, match="--swap-space: infer has no CPU swap space"):
        ServerArgs(swap_space=4)


def test_deprecated_flag_warns_and_maps_to_the_new_flag():
    with pytest.warns(FutureWarning, match="--enable-deepep-moe is deprecated; using --moe-a2a-backend deepep"):
        a = ServerArgs(enable_deepep_moe=True)
    assert a.moe_a2a_backend == "deepep" and a.provenance["moe_a2a_backend"] == "user"
    assert ("--moe-a2a-backend", "deepep") in a.explicit_flags()
    assert all(flag != "--enable-deepep-moe" for flag, _ in a.explicit_flags())
    with pytest.warns(FutureWarning):
        b = ServerArgs(enable_ep_moe=True, tp_size=4)
    assert b.ep_size == 4
    with pytest.warns(FutureWarning):
        c = ServerArgs(nsa_prefill="fa3")
    assert c.nsa_prefill_backend == "fa3"
    with pytest.warns(FutureWarning, match="prefill-round-robin-balance is deprecated"):
        ServerArgs(prefill_round_robin_balance=True)


def test_deprecated_flag_contradicting_the_new_one_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match="--enable-triton-kernel-moe .*contradicts --moe-runner-backend"):
            ServerArgs(enable_triton_kernel_moe=True, moe_runner_backend="triton")


def test_unset_deprecated_flags_do_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = ServerArgs()
    assert a.moe_a2a_backend == "none" and a.nsa_prefill_backend == "flashmla_sparse"


@pytest.mark.parametrize("kwargs, message", [
    ({"enable_hierarchical_cache": True, "disable_radix_cache": True},
     "--enable-hierarchical-cache and --disable-radix-cache are mutually exclusive"),
    ({"tp_size": 3, "nnodes": 2}, "must be divisible by --nnodes"),
    ({"pp_size": 2}, "pipeline parallelism needs --disable-overlap-schedule"),
    ({"dp_size": 2, "nnodes": 2, "tp_size": 2}, "multi-node data parallelism needs --enable-dp-attention"),
    ({"chunked_prefill_size": 100, "page_size": 16}, "--chunked-prefill-size 100 must be divisible by --page-size 16"),
    ({"speculative_algorithm": "EAGLE", "enable_mixed_chunk": True}, "--enable-mixed-chunk cannot be combined"),
    ({"enable_piecewise_cuda_graph": True, "disable_cuda_graph": True},
     "--enable-piecewise-cuda-graph captures prefill CUDA graphs, which --disable-cuda-graph"),
    ({"enable_piecewise_cuda_graph": True, "piecewise_cuda_graph_tokens": [16, 9000]},
     r"--piecewise-cuda-graph-tokens: 9000 is not an integer in 2\.\.4096"),
    ({"enable_piecewise_cuda_graph": True, "piecewise_cuda_graph_max_tokens": 1},
     "--piecewise-cuda-graph-max-tokens 1: must be an integer >= 2"),
    ({"enable_dp_lm_head": True}, "--enable-dp-lm-head needs --enable-dp-attention"),
    ({"max_loaded_loras": 2, "max_loras_per_batch": 4}, "--max-loaded-loras 2 must be at least"),
    ({"moe_dense_tp_size": 2}, "--moe-dense-tp-size 2"),
    ({"gpu_id_step": 0}, "--gpu-id-step 0"),
    ({"port": 70000}, "--port 70000"),
    ({"mem_fraction_static": 1.5}, r"--mem-fraction-static 1.5: must be in \(0, 1\]"),
    ({"prompt_tokens_buckets": ["tse", "1000", "1", "8"]}, "--prompt-tokens-buckets"),
    ({"lora_target_modules": ["all", "q_proj"]}, "'all' must be the only module"),
    ({"gc_warning_threshold_secs": -0.5}, "--gc-warning-threshold-secs -0.5: must be >= 0"),
    ({"gc_warning_threshold_secs": float("nan")}, "--gc-warning-threshold-secs nan: must be >= 0"),
])
def test_cross_flag_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ServerArgs(**kwargs)


def test_alias_spelling_is_named_in_errors():
    with pytest.raises(ConfigError, match="--block-size 16"):
        ServerArgs(block_size=16, chunked_prefill_size=100)


@pytest.mark.parametrize("kwargs, message", [
    ({"port": "x"}, "--port: invalid value 'x'"),
    ({"dtype": "float99"}, "--dtype: invalid choice 'float99'"),
    ({"schedule_policy": "nope"}, "choose from lpm, random, fcfs"),
    ({"lora_target_modules": ["q_proj", "bogus"]}, "--lora-target-modules: invalid choice 'bogus'"),
    ({"bogus_flag": 1}, "unknown setting 'bogus_flag'"),
    ({"enforce_eager": 3}, "--enforce-eager is a switch"),
])
def test_bad_values_raise_config_error_naming_the_flag(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ServerArgs(**kwargs)


def test_plugin_extensible_choices_are_left_to_the_gate():
    assert ServerArgs(attention_backend="my_plugin_attn").attention_backend == "my_plugin_attn"


def test_platform_default_only_for_unset_settings():
    a = ServerArgs(page_size=16)
    a.set_platform_default("max_running_requests", 8, "small device")
    assert a.max_running_requests == 8 and a.provenance["max_running_requests"] == "platform default"
    assert not a.is_set("max_running_requests")
    with pytest.raises(ConfigError, match="set explicitly"):
        a.set_platform_default("page_size", 1)


def test_server_args_survive_pickling_for_the_engine_process():
    import pickle

    a = pickle.loads(pickle.dumps(ServerArgs(model_path="m", page_size=16)))
    assert a.page_size == 16 and a.provenance["page_size"] == "user" and not a.is_set("port")
