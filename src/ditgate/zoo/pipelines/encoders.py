"""Tiny seeded text encoders and offline tokenizers for the pipeline zoo.

Every encoder is a real `transformers` model built from a config (2 layers, 4 heads, width `d`), put in eval mode;
every tokenizer is built in memory over the byte alphabet of `ditgate.zoo.tokenizers`, so nothing is downloaded.
Language-model tokenizers carry a minimal chat template for the pipelines that call `apply_chat_template`.
"""

from __future__ import annotations

from ditgate.zoo.builders import _seeded, _t5
from ditgate.zoo.tokenizers import _byte_alphabet, clip_tokenizer, qwen2_tokenizer, t5_tokenizer

__all__ = ["t5", "t5_tokenizer", "clip_tokenizer", "qwen2_tokenizer", "umt5", "clip", "llama", "gemma2", "qwen3", "glm",
           "bert", "qwen25vl", "qwen25vl_text", "qwen2vl", "llm_tokenizer", "byt5_tokenizer", "bert_tokenizer",
           "CHAT_TEMPLATE"]

# A chat template in the shape of Qwen's: each message's text between role markers; the generation prompt opens an
# assistant turn. Pipelines that encode with `apply_chat_template` need one; the tiny tokenizers have none otherwise.
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{% if message['content'] is string %}{{ message['content'] }}"
                 "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
                 "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def t5(seed: int, d: int = 32):
    return _t5(seed, d)


def umt5(seed: int, d: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    return _seeded(seed, lambda: UMT5EncoderModel(UMT5Config(
        vocab_size=256, d_model=d, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)))


def clip(seed: int, d: int = 32, projection: bool = False, projection_dim: int | None = None):
    """A 2-layer CLIP text model (with a projection head when `projection`) for the 514-token `clip_tokenizer`."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return _seeded(seed, lambda: cls(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=d, intermediate_size=64, num_attention_heads=4,
        num_hidden_layers=2, vocab_size=600, projection_dim=projection_dim or d)))


def _lm_config(config_cls, d: int, vocab: int, **extra):
    return config_cls(hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, head_dim=d // 4, vocab_size=vocab, max_position_embeddings=512,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)


def llama(seed: int, d: int = 32, causal: bool = False, vocab: int = 300):
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    cls = LlamaForCausalLM if causal else LlamaModel
    return _seeded(seed, lambda: cls(_lm_config(LlamaConfig, d, vocab)))


def gemma2(seed: int, d: int = 32, vocab: int = 300):
    from transformers import Gemma2Config, Gemma2Model

    return _seeded(seed, lambda: Gemma2Model(_lm_config(Gemma2Config, d, vocab, sliding_window=64,
                                                        attn_implementation="eager")))


def qwen3(seed: int, d: int = 32, causal: bool = False, vocab: int | None = None):
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    cls = Qwen3ForCausalLM if causal else Qwen3Model
    return _seeded(seed, lambda: cls(_lm_config(Qwen3Config, d, vocab or len(qwen2_tokenizer()) + 8)))


def glm(seed: int, d: int = 32, vocab: int = 300):
    from transformers import GlmConfig, GlmModel

    return _seeded(seed, lambda: GlmModel(_lm_config(GlmConfig, d, vocab)))


def bert(seed: int, d: int = 32):
    from transformers import BertConfig, BertModel

    return _seeded(seed, lambda: BertModel(BertConfig(
        vocab_size=300, hidden_size=d, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=512)))


def _qwen_vl_config(config_cls, d: int, **vision):
    from ditgate.zoo.tokenizers import QWEN_SPECIAL_TOKENS

    tokenizer = qwen2_tokenizer()
    ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in QWEN_SPECIAL_TOKENS}
    vocab_size = len(tokenizer) + 8
    return config_cls(
        text_config={"hidden_size": d, "intermediate_size": 2 * d, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "vocab_size": vocab_size, "bos_token_id": 0, "eos_token_id": 0,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": d, **vision},
        hidden_size=d, vocab_size=vocab_size, vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"], image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|image_pad|>"])


def qwen25vl(seed: int, d: int = 32):
    """A tiny Qwen2.5-VL (2 text layers of width `d`, a 2-layer vision tower) for `qwen2_tokenizer`."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return _seeded(seed, lambda: Qwen2_5_VLForConditionalGeneration(_qwen_vl_config(Qwen2_5_VLConfig, d)))


def qwen25vl_text(seed: int, d: int = 32):
    """The text model of `qwen25vl` alone (HunyuanVideo 1.5 takes it without the vision tower)."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = _qwen_vl_config(lambda text_config, **_: Qwen2_5_VLTextConfig(**text_config), d)
    return _seeded(seed, lambda: Qwen2_5_VLTextModel(config))


def qwen2vl(seed: int, d: int = 32):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    return _seeded(seed, lambda: Qwen2VLForConditionalGeneration(_qwen_vl_config(Qwen2VLConfig, d, embed_dim=16)))


def llm_tokenizer(kind: str = "qwen2", chat: bool = True):
    """A character-level tokenizer of a language-model family ("qwen2", "llama", "gemma") with a chat template."""
    import transformers

    if kind == "qwen2":
        tok = qwen2_tokenizer()
    else:
        specials = {"llama": ["<unk>", "<s>", "</s>"], "gemma": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]}[kind]
        vocab = {s: i for i, s in enumerate(specials)}
        for ch in _byte_alphabet() + ["\u2581"]:
            vocab.setdefault(ch, len(vocab))
        cls = {"llama": transformers.LlamaTokenizer, "gemma": transformers.GemmaTokenizer}[kind]
        tok = cls(vocab=vocab, merges=[], **({"pad_token": "<unk>"} if kind == "llama" else {}))
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def byt5_tokenizer():
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer(extra_ids=0)


def bert_tokenizer():
    from transformers import BertTokenizer

    vocab = {s: i for i, s in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
    for ch in _byte_alphabet():
        vocab.setdefault(ch, len(vocab))
    return BertTokenizer(vocab=vocab, model_max_length=77)
