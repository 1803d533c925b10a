"""Issue 16's backbones (RoBERTa, XLM-RoBERTa, ELECTRA) through the rest of the library.

Parity with Hugging Face PyTorch is tests/model/test_parity.py and delayed interaction against the
NumPy reference tests/model/test_delayed.py; here: export back to a folder `transformers` loads,
what stays unsupported refused by name, and the same API (`PairGrid`, training with KD + LRS) as the
BERT family.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch

from dil_jax.checkpoints import (
    CheckpointError,
    encoder_config_from_hf,
    export_hf_checkpoint,
    load_hf_checkpoint,
)
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ConfigError, EncoderConfig, ReaderOverrides

from tests.helpers import edit_json
from tests.helpers.hf import PARITY_MAX_Q, assert_parity, random_pairs, tiny_hf_config
from tests.helpers.squad import one_question_squad
from tests.helpers.training import distill_steps

BACKBONES = [("roberta", {}), ("xlm-roberta", {}), ("electra", {}),
             ("electra", {"embedding_size": 32})]
QA_CLASS = {"roberta": "RobertaForQuestionAnswering",
            "xlm-roberta": "XLMRobertaForQuestionAnswering",
            "electra": "ElectraForQuestionAnswering"}


@pytest.mark.parametrize("arch,overrides", BACKBONES)
def test_export_round_trips_through_transformers(hf_folder_factory, tmp_path, arch, overrides):
    """ours -> export_hf_checkpoint -> transformers' AutoModelForQuestionAnswering loads the
    folder as the architecture's QA class, with every tensor ours (strict: none left at its
    init), and gives our logits and hidden states (test_parity's 1e-4); reading the folder
    back gives our params bit for bit (float32 export)."""
    from transformers import AutoModelForQuestionAnswering

    folder, _ = hf_folder_factory(arch, **overrides)
    config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=PARITY_MAX_Q))
    # Move every param away from the checkpoint's, so the export cannot pass by echoing it.
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(np.float32),
                          params)
    exported = export_hf_checkpoint(tmp_path / "export", params, config)
    hf_config = json.loads((exported / "config.json").read_text())
    assert hf_config["model_type"] == arch and hf_config["architectures"] == [QA_CLASS[arch]]
    hf_model, loading = AutoModelForQuestionAnswering.from_pretrained(
        str(exported), output_loading_info=True)
    assert type(hf_model).__name__ == QA_CLASS[arch]
    assert not any(loading[key] for key in ("missing_keys", "unexpected_keys",
                                            "mismatched_keys")), loading
    assert_parity(DelayedInteractionModel(config), params, hf_model.eval(), arch,
                  random_pairs(99, seed=2, arch=arch))
    config_back, params_back, report = load_hf_checkpoint(
        exported, ReaderOverrides(max_question_len=PARITY_MAX_Q))
    assert config_back == config and not report.initialized
    jax.tree.map(np.testing.assert_array_equal, params_back, params)


def test_roberta_model_checkpoint_without_prefix(tmp_path):
    """A plain `RobertaModel` folder (tensors without `roberta.`, a pooler) imports: pooler
    ignored by name, the QA head initialised and said so."""
    import transformers

    torch.manual_seed(0)
    model = transformers.RobertaModel(tiny_hf_config("roberta"))
    model.save_pretrained(str(tmp_path / "base"))
    config, _, report = load_hf_checkpoint(tmp_path / "base",
                                           ReaderOverrides(max_question_len=PARITY_MAX_Q))
    assert config.architecture == "roberta" and config.first_position == 2
    assert report.initialized == ["qa_outputs.weight", "qa_outputs.bias"]
    assert "pooler.dense.weight" in report.ignored
    assert "embeddings.word_embeddings.weight" in report.loaded


def test_electra_discriminator_head_ignored_generator_refused(tmp_path):
    """ElectraForPreTraining (the discriminator) imports with its head ignored by name; a
    generator's config.json (ElectraForMaskedLM) is refused by name."""
    import transformers

    torch.manual_seed(0)
    transformers.ElectraForPreTraining(tiny_hf_config("electra")).save_pretrained(
        str(tmp_path / "disc"))
    _, _, report = load_hf_checkpoint(tmp_path / "disc",
                                      ReaderOverrides(max_question_len=PARITY_MAX_Q))
    assert "discriminator_predictions.dense.weight" in report.ignored
    assert "electra.embeddings_project.weight" in report.loaded
    edit_json(tmp_path / "disc" / "config.json", architectures=["ElectraForMaskedLM"])
    with pytest.raises(CheckpointError, match="ElectraForMaskedLM.*ELECTRA generator"):
        load_hf_checkpoint(tmp_path / "disc")


@pytest.mark.parametrize("field,value,message", [
    ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key'"),
    ("is_decoder", True, "is_decoder is true"),
    ("model_type", "longformer", "model_type='longformer': Longformer"),
    ("model_type", "camembert", "model_type='camembert': CamemBERT"),
])
def test_unsupported_settings_are_refused_by_name(field, value, message):
    hf = tiny_hf_config("roberta").to_dict()
    hf[field] = value
    with pytest.raises(CheckpointError, match=message):
        encoder_config_from_hf(hf, "config.json")


def test_config_rules_of_the_new_backbones():
    """Only ALBERT and ELECTRA factorize; RoBERTa needs a type table of >= 1 row, BERT 2."""
    with pytest.raises(ConfigError, match="only ALBERT and ELECTRA factorize.*'roberta'"):
        EncoderConfig(architecture="roberta", embedding_size=128, pad_token_id=1)
    EncoderConfig(architecture="electra", embedding_size=128, hidden_size=256, num_heads=4)
    EncoderConfig(architecture="roberta", type_vocab_size=1, pad_token_id=1,
                  max_position_embeddings=514)
    with pytest.raises(ConfigError, match="type_vocab_size >= 1"):
        EncoderConfig(architecture="xlm-roberta", type_vocab_size=0, pad_token_id=1)
    with pytest.raises(ConfigError, match=r"max_question_len 512 exceeds 510 positions"):
        EncoderConfig(architecture="roberta", pad_token_id=1, max_question_len=512)


@pytest.mark.parametrize("arch", ["roberta", "electra"])
def test_train_step_with_kd_and_lrs(hf_folder_factory, arch):
    """A delayed student (k = 2 of 4) learns under CE + DeFormer's KD and LRS from its frozen
    full-model teacher (the same weights at k = 0), through the jitted, sharded train step."""
    folder, _ = hf_folder_factory(arch)
    teacher_config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=8))
    student = DelayedInteractionModel(teacher_config.replace(num_lower_layers=2))
    teacher = DelayedInteractionModel(teacher_config)
    losses = [{name: row[name] for name in ("loss", "kd", "lrs")}
              for row in distill_steps(student, teacher, params, 15, vocab_size=99)]
    assert all(np.isfinite(list(row.values())).all() for row in losses)
    assert losses[0]["kd"] > 0 and losses[0]["lrs"] > 0, losses[0]
    assert losses[-1]["loss"] < 0.7 * losses[0]["loss"], losses


@pytest.fixture(scope="module")
def reader_folders(tmp_path_factory):
    """{arch: a Hugging Face QA folder with a tokenizer}: a tiny random model (1,000-token
    vocabulary) and a tokenizer of its family trained here on 100 shared SQuAD contexts."""
    from dil_jax.data.squad import load_squad

    from tests.helpers import V11, squad_file
    from tests.helpers.hf import build_hf_qa_model, save_fast_tokenizer

    contexts = sorted({example.context for example in load_squad(squad_file(V11)).examples})
    folders = {}
    for arch in ("roberta", "electra"):
        folder = tmp_path_factory.mktemp(f"reader-{arch}")
        build_hf_qa_model(arch, vocab_size=1000).save_pretrained(str(folder))
        save_fast_tokenizer(arch, contexts[::12], 1000, folder)
        folders[arch] = folder
    return folders


@pytest.mark.parametrize("arch", ["roberta", "electra"])
def test_check_and_predict_commands(reader_folders, tmp_path, capsys, arch):
    """`dil-jax check` (HF parity on the tokenizer's own pairs, the sample grid at k = 1, 3
    equal to the direct forward) and `dil-jax predict` at k = 2 run on the new backbones."""
    from tests.helpers import run_cli

    folder = reader_folders[arch]
    status, out, err = run_cli(["check", "--checkpoint", str(folder), "--k", "1", "3",
                                "--max-question-len", "16", "--max-passage-len", "40",
                                "--repeats", "1"], capsys)
    assert status == 0, out + err
    assert "[OK]" in out and f"model: {arch}" in out
    context = "The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel."
    output = tmp_path / "predictions.json"
    status, out, err = run_cli(["predict", "--checkpoint", str(folder), "--data",
                                str(one_question_squad(tmp_path, context)), "--output",
                                str(output), "--k", "2",
                                "--max-question-len", "16", "--max-passage-len", "32",
                                "--doc-stride", "8", "--no-progress"], capsys)
    assert status == 0, out + err
    predictions = json.loads(output.read_text())
    # An untrained head answers anything, but it is a span of the context's own characters.
    assert set(predictions) == {"q1"} and predictions["q1"] in context


@pytest.mark.parametrize("arch", ["roberta", "electra"])
def test_bench_peer_reads_the_grid_as_we_do(hf_folder_factory, arch):
    """`dil-jax bench`'s PyTorch peer is the architecture's own QA class holding our params
    (strict load), and on a random grid it gives our full model's span scores (1e-4)."""
    from dil_jax import bench
    from dil_jax.mesh import data_mesh
    from dil_jax.reading.grid import PairGrid

    # vocab 200: the random grid's [CLS] / [SEP] are BERT's ids 101 / 102.
    config, params, _ = load_hf_checkpoint(hf_folder_factory(arch, vocab_size=200)[0],
                                           ReaderOverrides(max_question_len=8))
    hf_model = bench.hf_model_from_params(config, params)
    assert type(hf_model).__name__ == QA_CLASS[arch]
    spec = bench.GridSpec(num_questions=2, num_passages=3, question_len=8, passage_len=12)
    inputs = bench.random_grid(spec, config.vocab_size)
    reader = PairGrid(DelayedInteractionModel(config), data_mesh(), batch_size=2, chunk_size=3)
    _, ours = bench.run_delayed_grid(reader, params, inputs)
    _, theirs = bench.run_hf_grid(hf_model, inputs, 3, None, config.segment_token_types)
    assert bench.max_logit_difference(ours, theirs) < 1e-4


@pytest.mark.parametrize("suite,want", [
    ("roberta-base", dict(architecture="roberta", hidden_size=768, num_positions=512,
                          type_vocab_size=1, projects_embeddings=False)),
    ("electra-small", dict(architecture="electra", hidden_size=256, embedding_size=128,
                           num_heads=4, projects_embeddings=True)),
    ("electra-base", dict(architecture="electra", hidden_size=768, embedding_size=768,
                          projects_embeddings=False)),
])
def test_bench_suites_have_the_released_shapes(suite, want):
    from dil_jax import bench
    from dil_jax.bench.suites import _BASE_SHAPES

    assert suite in bench.SUITES and suite in bench.SUITE_GRIDS
    config = EncoderConfig(**_BASE_SHAPES[suite])
    assert config.num_layers == 12
    assert {name: getattr(config, name) for name in want} == want


def test_index_and_ask_with_roberta(reader_folders, tmp_path, capsys):
    """The open-domain path (`dil-jax index`: BM25 + the passage cache of lower states at
    k = 2; `dil-jax ask` reading it) on a RoBERTa reader."""
    from dil_jax.samples import SAMPLE_PASSAGES

    from tests.helpers import run_cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text})
                              + "\n" for i, text in enumerate(SAMPLE_PASSAGES)))
    common = ["--checkpoint", str(reader_folders["roberta"]), "--max-question-len", "16",
              "--batch-size", "2", "--chunk-size", "8"]
    status, out, err = run_cli(["index", "--out", str(tmp_path / "index"), "--corpus",
                                f"jsonl:{corpus}", "--k", "2", "--max-passage-len", "40",
                                "--doc-stride", "20", *common], capsys)
    assert status == 0, out + err
    status, out, err = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index",
                                str(tmp_path / "index"), "--k", "2", "--top-p", "2", *common],
                               capsys)
    assert status == 0, out + err
    assert "Q: Who wrote Pride and Prejudice?" in out and "BM25 rank" in out
