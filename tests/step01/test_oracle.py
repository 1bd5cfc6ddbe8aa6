"""Our model against Hugging Face's LlamaForCausalLM holding the same weights: the oracle we did not write."""
from __future__ import annotations

import pytest
import torch

from step01_kvcache.generate import SamplingParams, generate
from step01_kvcache.hf import to_hf_model
from step01_kvcache.tiny import tiny_model


def our_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(len(ids))))


def hf_logits(hf, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf(ids[None]).logits[0]


@pytest.mark.task("task1.rope")
@pytest.mark.parametrize("heads,kv_heads,tied", [(4, 2, True), (4, 4, True), (6, 2, False), (8, 1, True)])
def test_tiny_logits_match_hf(heads, kv_heads, tied):
    """GQA group sizes 2, 1, 3 and 8; tied and untied LM head (head_dim 16 throughout)."""
    model = tiny_model(seed=1, num_heads=heads, num_kv_heads=kv_heads, tie_word_embeddings=tied,
                       hidden_size=16 * heads)
    ids = torch.randint(0, model.config.vocab_size, (37,), generator=torch.Generator().manual_seed(2))
    diff = (our_logits(model, ids) - hf_logits(to_hf_model(model), ids)).abs().max().item()
    assert diff <= 1e-4, f"max abs logit diff {diff}"


@pytest.mark.slow
def test_real_model_logits_match_hf(real_model, tokenizer):
    from step01_kvcache.demo import chat_ids

    ids = torch.tensor(chat_ids(tokenizer, "Name three primary colors.", "You are a helpful assistant."))
    diff = (our_logits(real_model, ids) - hf_logits(to_hf_model(real_model), ids)).abs().max().item()
    assert diff <= 1e-4, f"max abs logit diff {diff}"


@pytest.mark.slow
def test_real_model_greedy_tokens_match_hf_generate(real_model, tokenizer):
    from step01_kvcache.demo import chat_ids

    ids = chat_ids(tokenizer, "Write a short story about a lighthouse keeper who finds a map.",
                   "You are a creative writer.")
    n = 40
    ours = generate(real_model, ids, SamplingParams(max_new_tokens=n))
    hf = to_hf_model(real_model)
    with torch.inference_mode():
        # explicit attention mask: the prompt contains <|im_end|>, which is also the pad token
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.eos_token_id)
    theirs = out[0, len(ids):].tolist()
    assert len(ours) == n and ours == theirs


@pytest.mark.slow
def test_gguf_reader_matches_transformers_gguf_loader(real_model):
    """Our own dequantization (and un-permutation of Q/K) equals transformers' GGUF path, weight for weight."""
    from transformers import AutoModelForCausalLM

    from step01_kvcache.pretrained import gguf_path

    path = gguf_path()
    theirs = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
    ref = theirs.state_dict()
    for name, w in real_model.state_dict().items():
        key = name if name.startswith("lm_head") else "model." + name
        assert torch.equal(w, ref[key].to(w.dtype)), f"{name} differs from transformers' GGUF loader"
