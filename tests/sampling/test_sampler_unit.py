"""The vectorised sampler on fixed logits: distributions, filters, seeds, validation."""

from __future__ import annotations

import pytest
import torch
from infer.core.sampling.defaults import sampling_defaults
from infer.core.sampling.params import SamplingParams
from infer.core.sampling.sampler import SamplingTensors, sample


def tensors(b, v, temperature=1.0, top_p=1.0, top_k=None, min_p=0.0, seeds=None, step=0):
    top_k = v if top_k is None else top_k
    return SamplingTensors(
        temperature=torch.full((b,), temperature), top_p=torch.full((b,), top_p),
        top_k=torch.full((b,), top_k, dtype=torch.int64), min_p=torch.full((b,), min_p),
        greedy=torch.zeros(b, dtype=torch.bool),
        seed=torch.tensor(seeds if seeds is not None else list(range(b)), dtype=torch.int64),
        step=torch.full((b,), step, dtype=torch.int64), all_greedy=False,
        need_top_filter=top_k < v or top_p < 1 or min_p > 0)


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def freqs(t, n=20000):
    ids = sample(LOGITS.repeat(n, 1), t).ids
    return torch.bincount(ids, minlength=5).float() / n


def test_temperature_sampling_follows_softmax():
    f = freqs(tensors(20000, 5))
    assert torch.allclose(f, torch.softmax(LOGITS, 0), atol=0.015)
    f2 = freqs(tensors(20000, 5, temperature=2.0))
    assert torch.allclose(f2, torch.softmax(LOGITS / 2, 0), atol=0.015)


def test_top_k_top_p_min_p_filters():
    assert freqs(tensors(20000, 5, top_k=2))[2:].sum() == 0
    p = torch.softmax(LOGITS, 0)
    f = freqs(tensors(20000, 5, top_p=float(p[0] + p[1]) - 0.01))  # nucleus = first two
    assert f[2:].sum() == 0 and f[1] > 0.2
    f = freqs(tensors(20000, 5, min_p=0.3))  # keeps tokens with p >= 0.3 * p_max
    assert f[(p < 0.3 * p[0])].sum() == 0 and f[1] > 0


def test_seed_is_per_row_and_batch_independent():
    a = sample(LOGITS.repeat(4, 1), tensors(4, 5, seeds=[11, 12, 13, 14], step=3)).ids
    b = sample(LOGITS.repeat(2, 1), tensors(2, 5, seeds=[13, 11], step=3)).ids
    assert a[2] == b[0] and a[0] == b[1]


def test_params_validation_names_the_field():
    for bad, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                       ({"top_k": 0}, "top_k"), ({"min_p": 2}, "min_p"),
                       ({"max_new_tokens": -1}, "max_new_tokens"), ({"n": 0}, "n"),
                       ({"repetition_penalty": 0}, "repetition_penalty"),
                       ({"frequency_penalty": 3}, "frequency_penalty"),
                       ({"presence_penalty": -3}, "presence_penalty"),
                       ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
                       ({"stop": [""]}, "stop"), ({"bogus": 1}, "bogus"),
                       ({"regex": "a", "ebnf": "b"}, "regex"), ({"logit_bias": {"1": 2.0}}, "logit_bias")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            SamplingParams.from_dict(bad)
    assert SamplingParams.from_dict({"stop": "x"}).stop == ["x"]


def test_sampling_defaults_modes():
    gen = {"temperature": 0.6, "top_p": 0.9, "top_k": 0, "do_sample": True}
    assert sampling_defaults("model", gen) == {"temperature": 0.6, "top_p": 0.9, "top_k": -1}
    assert sampling_defaults("openai", gen) == {}
    p = SamplingParams.from_dict({"top_p": 0.5}, sampling_defaults("model", gen))
    assert (p.temperature, p.top_p) == (0.6, 0.5)
    with pytest.raises(ValueError, match="sampling_defaults"):
        sampling_defaults("bogus", gen)
