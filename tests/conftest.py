"""Shared fixtures: tiny random Hugging Face checkpoints written to disk, and the embedded MiniLM.

Random-init checkpoints are built locally with `transformers` (no download) and saved as real
Hugging Face folders, so tests exercise the same import path a user's checkpoint takes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# Tests import the working tree (this checkout), not whichever copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The tests compile the same tiny train step many times (every train() call builds a new jit);
# a persistent compilation cache shared by the test process and its subprocesses makes every
# compilation after the first a cache hit.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/dil_jax_test_jax_cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def tiny_hf_config(arch: str, **overrides):
    import transformers

    # initializer_range 0.2 (not 0.02): with BERT's tiny default init a 32-wide model is nearly
    # linear and attention nearly uniform, so a wrong mask or split would hide under 1e-4.
    common = dict(vocab_size=99, max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, initializer_range=0.2)
    if arch == "bert":
        values = dict(common, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=37)
        values.update(overrides)
        return transformers.BertConfig(**values)
    if arch == "albert":
        values = dict(common, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37)
        values.update(overrides)
        return transformers.AlbertConfig(**values)
    if arch in ("roberta", "xlm-roberta"):
        # type_vocab_size 1 and pad_token_id 1 as the released checkpoints; positions start at
        # pad_token_id + 1 = 2, so 66 rows leave 64 positions, as the other tiny configs have.
        values = dict(common, max_position_embeddings=66, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37, type_vocab_size=1,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
        values.update(overrides)
        config_class = (transformers.RobertaConfig if arch == "roberta"
                        else transformers.XLMRobertaConfig)
        return config_class(**values)
    if arch == "electra":
        # embedding_size 16 < hidden 32 by default (ELECTRA-small's factorisation, 128 -> 256);
        # pass embedding_size=32 for the unfactorised form (no embeddings_project).
        values = dict(common, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37)
        values.update(overrides)
        return transformers.ElectraConfig(**values)
    if arch == "distilbert":
        values = dict(vocab_size=99, max_position_embeddings=64, dim=32, n_layers=4, n_heads=4,
                      hidden_dim=37, dropout=0.0, attention_dropout=0.0,
                      initializer_range=0.2)
        values.update(overrides)
        return transformers.DistilBertConfig(**values)
    raise ValueError(arch)


# Special-token ids of the tiny configs' pair layout, as each family's tokenizer builds it:
# (first token, tokens closing the question, token closing the passage). BERT-like:
# `[CLS] q [SEP]` + `p [SEP]`; RoBERTa-like: `<s> q </s></s>` + `p </s>` (<s> 0, </s> 2, the
# ids of RobertaTokenizer's vocabulary, <pad> 1 = pad_token_id).
BERT_PAIR_SPECIALS = (2, (3,), 3)
PAIR_SPECIALS = {"roberta": (0, (2, 2), 2), "xlm-roberta": (0, (2, 2), 2)}


def pair_specials(arch: str) -> tuple[int, tuple[int, ...], int]:
    return PAIR_SPECIALS.get(arch, BERT_PAIR_SPECIALS)


def hf_token_types(arch: str, question_len: int, passage_len: int):
    """The token_type_ids Hugging Face's tokenizer gives a pair, or None where the model takes
    none (DistilBERT) or they are all 0 (RoBERTa's tokenizers: left to the model's zeros)."""
    if arch in ("distilbert", "roberta", "xlm-roberta"):
        return None
    return [0] * question_len + [1] * passage_len


def build_hf_qa_model(arch: str, seed: int = 0, **overrides):
    """A random-init `*ForQuestionAnswering` torch model in eval mode."""
    import torch
    import transformers

    classes = {"bert": transformers.BertForQuestionAnswering,
               "albert": transformers.AlbertForQuestionAnswering,
               "distilbert": transformers.DistilBertForQuestionAnswering,
               "roberta": transformers.RobertaForQuestionAnswering,
               "xlm-roberta": transformers.XLMRobertaForQuestionAnswering,
               "electra": transformers.ElectraForQuestionAnswering}
    torch.manual_seed(seed)
    model = classes[arch](tiny_hf_config(arch, **overrides)).eval()
    # Default init leaves LayerNorm at scale 1 / bias 0 and every Linear bias at 0; perturb so
    # a mapping mix-up can't hide. The backbones added with issue 16 perturb EVERY tensor
    # (biases, the padding row of the embeddings, the type table included).
    perturb_all = arch in ("roberta", "xlm-roberta", "electra")
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if perturb_all or "LayerNorm" in name or "layer_norm" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model


def train_tokenizer(arch: str, texts: list[str], vocab_size: int):
    """A `tokenizers.Tokenizer` of the family `arch` belongs to, trained on `texts`, with the
    pair template of that family's released tokenizers."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    if arch == "roberta":  # GPT-2 byte-level BPE, as roberta-base's tokenizer.json
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
        return tokenizer
    if arch == "xlm-roberta":  # SentencePiece Unigram with the metaspace, as xlm-roberta-base's
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token="<unk>", show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", 0), ("</s>", 2)])
        return tokenizer
    # ELECTRA: BERT's uncased WordPiece
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                        show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def save_fast_tokenizer(arch: str, texts: list[str], vocab_size: int, folder) -> None:
    """`train_tokenizer` wrapped as the architecture's transformers fast class, saved to
    `folder` as a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)."""
    import transformers

    classes = {"roberta": transformers.RobertaTokenizerFast,
               "xlm-roberta": transformers.XLMRobertaTokenizerFast,
               "electra": transformers.ElectraTokenizerFast}
    wrapped = classes[arch](tokenizer_object=train_tokenizer(arch, texts, vocab_size))
    wrapped.save_pretrained(str(folder))


def state_dict_numpy(model) -> dict[str, np.ndarray]:
    return {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="session")
def hf_folder_factory(tmp_path_factory):
    """Saves a tiny random HF QA model to a folder; returns (folder, torch model)."""
    cache = {}

    def make(arch: str, **overrides):
        key = (arch, tuple(sorted(overrides.items())))
        if key not in cache:
            model = build_hf_qa_model(arch, **overrides)
            folder = tmp_path_factory.mktemp(f"hf-{arch}")
            model.save_pretrained(str(folder), safe_serialization=True)
            cache[key] = (folder, model)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from dil_jax.defaults import default_checkpoint_dir

    folder = default_checkpoint_dir()
    assert (folder / "model.safetensors").is_file(), folder
    return folder


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), (
        f"{SHARED_DATA} is missing: tests need the shared data folder beside the repo root")
    return SHARED_DATA


def edit_json(path: Path, **changes) -> None:
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


def random_prescreener(minilm_dir, seed: int = 0, encoder_name: str | None = None):
    """An untrained prescreener (random scores are enough to check where they lead)."""
    import jax

    from dil_jax.checkpoints import load_reader
    from dil_jax.prescreening.model import PrescreenConfig, Prescreener
    from dil_jax.prescreening.prescreener import SentencePrescreener

    config = PrescreenConfig(embedding_dim=384, width=16, num_layers=1, num_heads=2, mlp_dim=16,
                             max_sentences=8, dropout=0.0)
    params = Prescreener(config).init(jax.random.key(seed), np.zeros((1, 384), np.float32),
                                      np.zeros((1, 8, 384), np.float32),
                                      np.ones((1, 8), np.int32))["params"]
    return SentencePrescreener(config, params, load_reader(str(minilm_dir), None, 32),
                               encoder_name or str(minilm_dir), 32)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Runs `dil-jax ARGV` in this process -> (exit status, stdout, stderr).

    argparse's own errors (exit status 2) are returned like any other exit, so a test asserts
    on the status and the message the user sees, not on how the CLI got there.
    """
    from dil_jax.cli import main

    capsys.readouterr()  # drop what earlier steps printed
    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err
