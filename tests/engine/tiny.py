"""A tiny random Llama (fp32) with a small byte-level BPE tokenizer, saved on the fly."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! This is a tiny test corpus for a byte level tokenizer.",
    "Paged attention stores keys and values in fixed size pages.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u65e5\u672c\u8a9e \U0001f600 emoji and accents.",
    '{"name": "infer", "value": 42, "list": [1, 2, 3]}',
] * 20


def make_tokenizer(directory: Path, vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}")
    fast.save_pretrained(directory)
    return fast


def make_tiny_llama(directory: Path, seed: int = 0, **overrides):
    """Tokenizer + random LlamaForCausalLM in ``directory``; returns the transformers model."""
    import transformers as tf

    tokenizer = make_tokenizer(directory)
    cfg = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=1024, initializer_range=0.5, rms_norm_eps=1e-5,
               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg)).eval()
    model.save_pretrained(directory)
    return model


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation with transformers (no EOS stop)."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()
