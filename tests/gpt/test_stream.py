"""Streaming and chat prompts: the pieces ``CausalLMModule.stream`` yields join to ``generate``'s continuation (greedy
and sampled, from text or from chat messages), and a chat prompt ends with the template's generation prompt."""

from __future__ import annotations

import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT, CausalLMModule
from zoo.io.chat_template import chat_renderer
from zoo.io.tokenizers import ByteTokenizer

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12+30?"}]


@pytest.fixture(scope="module")
def module() -> CausalLMModule:
    torch.manual_seed(0)
    m = CausalLMModule(GPT(vocab_size=257, block_size=96, n_layer=1, n_embd=32, n_head=2))
    with torch.no_grad():  # large random weights: sampled replies of many bytes, characters split across tokens
        for p in m.net.parameters():
            p.normal_(0, 0.5)
    m.tokenizer = ByteTokenizer()
    return m.eval()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_stream_joins_to_the_generated_reply(module, temperature):
    prompt_text = module.tokenizer.decode(module.chat_prompt(CHAT).tolist())
    for request, text in ((CHAT, prompt_text), ("ab", "ab")):
        pieces = list(module.stream(request, max_new_tokens=24, temperature=temperature, seed=3))
        (want,) = module.generate([text], max_new_tokens=24, temperature=temperature, seed=3)
        assert len(pieces) > 1 and "".join(pieces) == want


def test_a_chat_prompt_is_the_rendered_conversation_with_the_generation_prompt(module):
    ids = module.chat_prompt(CHAT).tolist()
    assert ids == chat_renderer(module.tokenizer)(CHAT, True).ids
    assert module.tokenizer.decode(ids).endswith("What is 12+30?\n<|assistant|>\n")
    with pytest.raises(InputError, match="role 'tool'"):
        module.chat_prompt([{"role": "tool", "content": "x"}])


def test_a_character_split_across_tokens_is_sent_whole_and_a_cut_one_at_the_end(module, monkeypatch):
    import zoo.gpt.module as gpt_module

    def drawn(ids):  # the decoding loop stubbed: these byte ids, one a step
        return lambda *args, **kwargs: iter(torch.tensor([i]) for i in ids)

    e_acute = list("é".encode())  # two bytes: the first alone is no character
    monkeypatch.setattr(gpt_module, "decoding", drawn([65, *e_acute, 66, e_acute[0]]))
    assert list(module.stream("x", max_new_tokens=5)) == ["A", "é", "B", "\ufffd"]
    monkeypatch.setattr(gpt_module, "decoding", drawn([65, ByteTokenizer.eos_id, 66]))
    assert list(module.stream("x", max_new_tokens=3)) == ["A"]  # nothing after the stop id
