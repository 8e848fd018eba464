from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing in these tests may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

HF_TINY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +=?"


@pytest.fixture
def hf_tiny_lm(tmp_path: Path) -> tuple[str, object]:
    """A randomly initialised 2-layer Qwen2 causal LM with a character tokenizer, saved to a folder.

    Returns (folder, tokenizer): TRL loads the policy and its reference model from the folder.
    Built in code: no download.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in HF_TINY_CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    folder = tmp_path / "tiny-lm"
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), tokenizer


@pytest.fixture
def keep_logging() -> Iterator[None]:
    """AReaL's ``areal.utils.logging.getLogger`` replaces the logging module's root logger and
    manager on every call (``Logger.root = RootLogger(...)``; ``Logger.manager = Manager(...)``):
    afterwards ``logging.getLogger("otel_rl")`` is a new object that otel-rl's modules do not hold,
    and a later test's ``caplog.at_level`` sets the level of the wrong one. Put them back."""
    root, manager = logging.root, logging.Logger.manager
    yield
    logging.root = logging.Logger.root = root
    logging.Logger.manager = manager
