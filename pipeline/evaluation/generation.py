"""Greedy continuations of held-out prompts: what each model writes, for a reader to judge at a
glance what the numbers mean (a model that lost the language writes another one, or repeats
itself).

A plain loop without a cache: each new token runs the whole prefix again, a few hundred forward
passes of some 60 tokens per model, seconds on the models this stage scores.
"""

from __future__ import annotations

import torch

# The first words of the first documents: the start of a held-out text, as a reader would give it.
PROMPTS, PROMPT_WORDS, NEW_TOKENS = 3, 30, 32


def held_out_prompts(
    texts: list[str], count: int = PROMPTS, words: int = PROMPT_WORDS
) -> list[str]:
    """The first `words` words of each of the first `count` texts, their spacing made single
    spaces."""
    return [" ".join(text.split()[:words]) for text in texts[:count]]


@torch.no_grad()
def greedy_continuation(
    model: torch.nn.Module,
    tokenizer,
    prompt: str,
    start_id: int,
    eos_id: int | None,
    seq_len: int,
    device: torch.device,
    new_tokens: int = NEW_TOKENS,
) -> str:
    """The most likely next token, `new_tokens` times (or until `eos_id`), after the start token the
    model saw before documents and the prompt, both read with the model's own tokenizer; returns
    the text the new tokens add to the prompt."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    sequence = [start_id, *prompt_ids]
    # A padded embedding matrix has rows past the tokenizer's vocabulary: no text to write.
    vocabulary = tokenizer.get_vocab_size()
    for _ in range(new_tokens):
        inputs = torch.tensor([sequence[-seq_len:]], device=device)
        next_id = int(model(inputs)[0, -1, :vocabulary].argmax())
        if next_id == eos_id:
            break
        sequence.append(next_id)
    return added_text(tokenizer, prompt_ids, sequence[1 + len(prompt_ids) :])


def added_text(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """What `new_ids` add to the prompt's text, decoded after the prompt: a SentencePiece tokenizer
    drops the space that starts a text decoded alone."""
    whole, head = tokenizer.decode(prompt_ids + new_ids), tokenizer.decode(prompt_ids)
    return whole[len(head) :] if whole.startswith(head) else tokenizer.decode(new_ids)
