"""A small byte-level BPE tokenizer made offline with the ``tokenizers`` library, saved as
``tokenizer.json`` and ``tokenizer_config.json`` with a ChatML chat template (MLX-LM and
``transformers`` load it as any checkpoint's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

#: the special tokens, in id order: ChatML's, as Qwen2 checkpoints have them
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS = "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: what the merges are learnt from when no text is given
SENTENCES = (
    "Distributed inference of a large language model splits its weights over the machines.",
    "Tensor parallel shards every layer; pipeline parallel gives each machine some of the layers.",
    "The notebook loads the model once and then prompts it as often as you like.",
    "Hello! How are you today? I am a tiny model with random weights, so my answers mean nothing.",
    "MLX is an array framework for machine learning on Apple silicon.",
    "Each rank holds a part of the model, and the ranks talk over the network.",
)


def _byte_chars(data: bytes) -> list[str]:
    """The characters byte-level BPE writes ``data``'s bytes as (GPT-2's table: printable bytes
    stand for themselves, the others for the code points from 256 up, in byte order)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return [table[b] for b in data]


#: the bytes the tokenizer knows: printable ASCII and the newline (the chat template's), so that a
#: random model's tokens are letters, pieces of words and words, never stray control bytes; other
#: characters of a prompt are dropped
ALPHABET = _byte_chars(bytes([10, *range(32, 127)]))


def write_tokenizer(folder: Path, vocab_size: int = 384, texts: Sequence[str] = SENTENCES) -> int:
    """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts`` and save it in
    ``folder``; return the tokenizer's size (ids 0..size-1, the special tokens first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=ALPHABET, limit_alphabet=len(ALPHABET))
    tok.train_from_iterator(list(texts), trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": SPECIAL[0],
        "unk_token": None,
        "add_prefix_space": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return int(tok.get_vocab_size())


def eos_id(folder: Path) -> int:
    """The id of :data:`EOS` in the tokenizer saved in ``folder``."""
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(EOS)
    if found is None:
        raise ValueError(f"{folder / 'tokenizer.json'} has no {EOS} token")
    return int(found)
