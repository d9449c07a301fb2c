"""A tiny Llama that real vLLM serves on a CPU, built locally in about a second, no hub.

The tokenizer is a byte-level BPE trained with `tokenizers` on text made here, wrapped as
a ``PreTrainedTokenizerFast`` with a chat template; the model is a random-weight
``LlamaForCausalLM`` (hidden 128, 2 layers) written as safetensors by hand, so building it
needs neither torch nor transformers: the gateway's own virtualenv can run this file.

Everything is a function of the constants below, so two builds are byte-identical.
Run as a script: ``python tests/support/tiny_model.py DIRECTORY``.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 1024
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS  # 32: vLLM's CPU attention supports it
MAX_POSITIONS = 2048
SEED = 20_240_517

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
END = "<|eot|>"
SPECIAL_TOKENS = (BOS, EOS, END, "<|system|>", "<|user|>", "<|assistant|>")

# Every message ends in "<|eot|>\n", a special token then a newline, so a conversation's
# tokens are a prefix of its continuation's: the property prefix caching rests on.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|eot|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

_VOCABULARY_TEXT = (
    "the cache block token prefix model replica gateway router tenant salt hash chain "
    "queue batch decode prefill stream chunk usage price cost ledger record window "
    "context prompt answer signal vector matrix kernel memory latency budget invoice "
    "statement rate hit miss evict reuse warm cold fast steady exact simple quiet bright "
    "river stone cloud field orbit harbor lantern meadow summit thread anchor beacon "
    "canvas delta you are a helpful assistant please summarise explain list compare why "
    "how what when where which who system user question document section chapter page "
    "one two three four five six seven eight nine ten hundred thousand million"
)


def corpus() -> list[str]:
    """The training text: deterministic sentences over a fixed word list."""
    vocabulary = _VOCABULARY_TEXT.split()
    lines: list[str] = []
    state = SEED
    for _ in range(2_000):
        words: list[str] = []
        for _ in range(12):
            # A 64-bit LCG: the same text on every platform and Python.
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            words.append(vocabulary[(state >> 33) % len(vocabulary)])
        lines.append(" ".join(words).capitalize() + ".")
    lines.append("0123456789 .,:;!?'\"()[]{}<>/\\|-_+=*&^%$#@~`")
    return lines


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE with the special tokens, adding BOS when asked for special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    """The safetensors format: an 8-byte header length, a JSON header, raw little-endian data."""
    header: dict[str, object] = {}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw + b"".join(chunks)


def _weights(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)

    def dense(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 0.08, size=(rows, cols)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": dense(vocab, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        tensors[prefix + "self_attn.q_proj.weight"] = dense(HEADS * HEAD_DIM, HIDDEN)
        tensors[prefix + "self_attn.k_proj.weight"] = dense(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[prefix + "self_attn.v_proj.weight"] = dense(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[prefix + "self_attn.o_proj.weight"] = dense(HIDDEN, HEADS * HEAD_DIM)
        tensors[prefix + "mlp.gate_proj.weight"] = dense(INTERMEDIATE, HIDDEN)
        tensors[prefix + "mlp.up_proj.weight"] = dense(INTERMEDIATE, HIDDEN)
        tensors[prefix + "mlp.down_proj.weight"] = dense(HIDDEN, INTERMEDIATE)
        tensors[prefix + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[prefix + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    return tensors


def build_tiny_model(directory: Path | str) -> Path:
    """Write the tiny model (config, weights, tokenizer, chat template) into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab_size()
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    end_id = tokenizer.token_to_id(END)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10_000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": bos_id, "eos_token_id": [eos_id, end_id]}
    for name, value in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}),
        ("generation_config.json", generation),
    ):
        (out / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    (out / "model.safetensors").write_bytes(_safetensors(_weights(vocab)))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/support/tiny_model.py DIRECTORY")
    print(build_tiny_model(sys.argv[1]))
