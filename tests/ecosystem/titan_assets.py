"""Builds the local assets TorchTitan's llama3 debug model trains on (its wheel ships
none): a byte-level BPE tokenizer trained with `tokenizers` on generated text, and a
text dataset in the JSON-lines layout its `c4_test` loader reads from a local path."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "the", "a", "one", "small", "large", "red", "blue", "green", "quick", "slow", "tensor",
    "device", "program", "graph", "kernel", "compiler", "model", "layer", "loss", "step",
    "train", "learn", "token", "batch", "shard", "rank", "gradient", "optimizer", "runs",
    "falls", "rises", "moves", "reads", "writes", "jumps", "over", "under", "into", "from",
    "with", "and", "or", "but",
]


def _sentence(rng: random.Random) -> str:
    # A weak grammar so the model has something learnable in a few steps.
    n = rng.randint(5, 14)
    words = [rng.choice(WORDS[:7])] + [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def build(root: Path, vocab_size: int = 2000, docs: int = 400, seed: int = 0) -> dict:
    """Writes <root>/tokenizer and <root>/dataset; returns their paths."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    texts = [" ".join(_sentence(rng) for _ in range(rng.randint(3, 12))) for _ in range(docs)]

    data_dir = root / "dataset"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)

    tok_dir = root / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    )
    return {"tokenizer": str(tok_dir), "dataset": str(data_dir)}


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
