"""Real tokenizers built in memory, so zoo pipelines need no download.

Each builder returns a `transformers` tokenizer with a tiny vocabulary. They go through
`save_pretrained` / `from_pretrained` like any hub tokenizer.
"""

from __future__ import annotations

import string


def _byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE uses for raw bytes (GPT-2's table)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def clip_tokenizer(max_length: int = 77):
    """Character-level CLIP BPE tokenizer (no merges): 514 tokens."""
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in _byte_alphabet():
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def t5_tokenizer(max_length: int = 512):
    """Unigram T5 tokenizer over ASCII letters, digits and punctuation (about 200 pieces)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    for ch in string.ascii_letters + string.digits + string.punctuation:
        pieces += [(ch, -5.0), ("\u2581" + ch, -4.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=max_length)


QWEN_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]


def qwen2_tokenizer():
    """Byte-level Qwen2 tokenizer with the chat and vision special tokens Qwen-Image's template uses."""
    from transformers import Qwen2Tokenizer

    vocab = {"<|endoftext|>": 0}
    for ch in _byte_alphabet():
        vocab.setdefault(ch, len(vocab))
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, pad_token="<|endoftext|>",
                         eos_token="<|endoftext|>", bos_token=None)
    tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS})
    return tok
