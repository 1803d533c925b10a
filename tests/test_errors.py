"""Bad input gets a clear error that names the problem."""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.checkpoints import (
    CheckpointError,
    encoder_config_from_hf,
    load_hf_checkpoint,
    load_params,
    save_params,
)
from dil_jax.model.delayed import DelayedInteractionModel, InputError, with_num_lower_layers
from dil_jax.model.encoder_config import ConfigError, EncoderConfig, ReaderOverrides
from dil_jax.model.span_reader import PASSAGE_SEGMENT
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.upper import project_upper, read_upper
from dil_jax.tokenization import TokenizationError, encode_questions, load_tokenizer

from tests.helpers import edit_json


def _copy(folder, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(folder, target)
    return target


def test_unknown_architecture(hf_folder_factory, tmp_path):
    with pytest.raises(ConfigError, match="unknown architecture 'gpt2'"):
        EncoderConfig(architecture="gpt2")
    folder = _copy(hf_folder_factory("bert")[0], tmp_path)
    edit_json(folder / "config.json", model_type="gpt2")
    with pytest.raises(CheckpointError, match="unknown architecture model_type='gpt2'") as error:
        load_hf_checkpoint(folder)
    assert str(folder / "config.json") in str(error.value)
    # Architectures known not to fit are refused by name, saying why.
    edit_json(folder / "config.json", model_type="deberta-v2")
    with pytest.raises(CheckpointError, match="model_type='deberta-v2': DeBERTa-v2"):
        load_hf_checkpoint(folder)


def test_config_checkpoint_shape_mismatch_names_tensor(hf_folder_factory, tmp_path):
    folder = _copy(hf_folder_factory("bert")[0], tmp_path)
    edit_json(folder / "config.json", intermediate_size=40)
    with pytest.raises(CheckpointError) as error:
        load_hf_checkpoint(folder)
    message = str(error.value)
    assert "bert.encoder.layer.0.intermediate.dense" in message
    assert re.search(r"has shape \(37\b.*config implies \(40\b", message), message


def test_fewer_layers_in_config_reports_unexpected_tensors(hf_folder_factory, tmp_path):
    folder = _copy(hf_folder_factory("bert")[0], tmp_path)
    edit_json(folder / "config.json", num_hidden_layers=3)
    with pytest.raises(CheckpointError, match="unexpected tensor.*encoder.layer.3"):
        load_hf_checkpoint(folder)


def test_more_layers_in_config_reports_missing_tensors(hf_folder_factory, tmp_path):
    folder = _copy(hf_folder_factory("distilbert")[0], tmp_path)
    edit_json(folder / "config.json", n_layers=5)
    with pytest.raises(CheckpointError, match="missing tensor.*transformer.layer.4"):
        load_hf_checkpoint(folder)


@pytest.mark.parametrize("k", [-1, 5])
def test_k_outside_range(hf_folder_factory, k):
    folder, _ = hf_folder_factory("bert")
    with pytest.raises(CheckpointError, match=rf"num_lower_layers \(k\) must be in 0..4.*{k}"):
        load_hf_checkpoint(folder, ReaderOverrides(num_lower_layers=k))
    with pytest.raises(ConfigError, match=r"num_lower_layers \(k\) must be in 0..12"):
        EncoderConfig(num_lower_layers=13)


def test_missing_checkpoint_folder(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        load_hf_checkpoint(str(missing))


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="field 'hidden_size' missing"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="bert", vocab_size=10, hidden_size=8, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=8)))
    with pytest.raises(CheckpointError, match="no model.safetensors, .* or pytorch_model.bin"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_hf_checkpoint(tmp_path)


def test_hub_id_offline_says_both_readings(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="no such local folder, and fetching it"):
        load_hf_checkpoint("some-org/some-model-that-is-not-here")


def test_empty_and_overlong_questions(minilm_dir, caplog):
    tokenizer = load_tokenizer(minilm_dir)
    with pytest.raises(TokenizationError, match="question 1 is empty"):
        encode_questions(tokenizer, ["what?", "   "], 16)
    long_question = " ".join(["word"] * 40) + "?"
    with caplog.at_level(logging.WARNING):
        segments = encode_questions(tokenizer, ["short?", long_question], 16)
    assert segments.truncated == [1]
    assert "1 question(s) longer than max_question_len=16 were truncated" in caplog.text
    assert segments.ids[1, -1] == tokenizer.sep_token_id and segments.mask[1].sum() == 16
    # Offsets point into the original text, and special tokens have none.
    start, end = segments.offsets[0, 1]
    assert "short?"[start:end] == "short"
    assert tuple(segments.offsets[0, 0]) == (-1, -1)


def test_bad_arrays_are_named():
    config = EncoderConfig(vocab_size=20, hidden_size=8, num_layers=2, num_heads=2,
                           intermediate_size=8, embedding_size=8, max_position_embeddings=32,
                           max_question_len=8)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    ids = np.ones((2, 5), np.int32)
    with pytest.raises(InputError, match=r"passage mask shape \(2, 4\) differs"):
        model.encode_lower(params, ids, np.ones((2, 4), np.int32), PASSAGE_SEGMENT)
    with pytest.raises(InputError, match="segment must be 0 .* or 1"):
        model.encode_lower(params, ids, ids, 2)
    with pytest.raises(InputError, match="passage length 40 exceeds max_position_embeddings 32"):
        long = np.ones((1, 40), np.int32)
        model.encode_lower(params, long, long, PASSAGE_SEGMENT)
    with pytest.raises(InputError, match="full model .* 8 \\+ passage length 30 = 38 exceeds"):
        q = np.ones((1, 8), np.int32)
        p = np.ones((1, 30), np.int32)
        model(params, q, q, p, p)


def test_bad_first_upper_projections_are_named():
    config = EncoderConfig(vocab_size=20, hidden_size=8, num_layers=2, num_heads=2,
                           intermediate_size=8, embedding_size=8, max_position_embeddings=32,
                           max_question_len=8, num_lower_layers=1)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    q_lower, p_lower = jnp.ones((2, 8, 8)), jnp.ones((2, 6, 8))
    q_mask, p_mask = np.ones((2, 8), np.int32), np.ones((2, 6), np.int32)
    p_qkv = project_upper(model, params, p_lower)
    with pytest.raises(InputError, match=r"question q/k/v must be 3 arrays of shape "
                                         r"\(2, 2, 8, 4\).*\(2, 2, 6, 4\)"):
        # the passage's projections handed in as the question's
        read_upper(model, params, q_lower, q_mask, p_lower, p_mask, q_qkv=p_qkv)
    no_upper = with_num_lower_layers(model, 2)
    with pytest.raises(InputError, match="k = 2 of 2 layers leaves no upper block"):
        project_upper(no_upper, params, p_lower)
    with pytest.raises(InputError, match="k = 2 of 2 layers leaves no upper block"):
        read_upper(no_upper, params, q_lower, q_mask, p_lower, p_mask, p_qkv=p_qkv)
    reader = PairGrid(with_num_lower_layers(model, 0), batch_size=2, chunk_size=2)
    index = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="q/k/v given, but k = 0 of 2 layers"):
        next(reader.iter_pair_chunks(params, q_lower, q_mask, np.ones((2, 6), np.int32), p_mask,
                                     index, index, q_qkv=p_qkv))
    reader = PairGrid(model, batch_size=2, chunk_size=2)
    with pytest.raises(ValueError, match="p_qkv cannot be combined with positions"):
        next(reader.iter_pair_chunks(params, q_lower, q_mask, p_lower, p_mask, index, index,
                                     positions=np.zeros((1, 2), np.int32), p_qkv=p_qkv))


def test_hf_config_field_types():
    with pytest.raises(CheckpointError, match="hidden_size 30 is not a multiple of num_heads 4"):
        encoder_config_from_hf(dict(model_type="bert", vocab_size=10, hidden_size=30,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=8))


def test_orbax_round_trip_and_atomic_save(hf_folder_factory, tmp_path):
    config, params, _ = load_hf_checkpoint(hf_folder_factory("albert")[0],
                                           ReaderOverrides(max_question_len=8))
    target = save_params(tmp_path / "converted", params, config)
    assert sorted(p.name for p in target.iterdir()) == ["encoder_config.json", "params"]
    assert not list(tmp_path.glob(".converted.tmp-*")), "staging folder left behind"
    loaded_config, loaded = load_params(target, ReaderOverrides(num_lower_layers=3))
    assert loaded_config == config.replace(num_lower_layers=3)
    flat_saved = dict(_flatten(params))
    flat_loaded = dict(_flatten(loaded))
    assert flat_saved.keys() == flat_loaded.keys()
    for name, value in flat_saved.items():
        np.testing.assert_array_equal(np.asarray(flat_loaded[name]), value, err_msg=name)
    with pytest.raises(CheckpointError, match="already exists"):
        save_params(target, params, config)
    with pytest.raises(CheckpointError, match="not a dil_jax checkpoint"):
        load_params(tmp_path)


def _flatten(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def test_export_hf_checkpoint_round_trips_through_transformers(hf_folder_factory, tmp_path):
    """Our export is a real Hugging Face folder: transformers loads it and gives our logits."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    from dil_jax.checkpoints import export_hf_checkpoint

    config, params, _ = load_hf_checkpoint(hf_folder_factory("albert")[0],
                                           ReaderOverrides(max_question_len=8))
    folder = export_hf_checkpoint(tmp_path / "export", params, config, dtype="bfloat16",
                                  manifest={"trained": "nowhere"})
    config2, params2, report = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=8))
    assert config2 == config and not report.initialized
    kernel = np.asarray(params["block_0"]["ffn_in"]["kernel"])
    np.testing.assert_allclose(np.asarray(params2["block_0"]["ffn_in"]["kernel"]), kernel,
                               rtol=1e-2, atol=1e-3)  # bfloat16 keeps 8 bits of mantissa
    hf = AutoModelForQuestionAnswering.from_pretrained(str(folder)).float().eval()
    ids = torch.tensor([[2, 10, 11, 3, 20, 21, 22, 3]])
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=torch.tensor([[0] * 4 + [1] * 4])).start_logits
    q = np.zeros((1, 8), np.int32)
    q[0, :4] = [2, 10, 11, 3]
    ours = DelayedInteractionModel(config2)(params2, q, (q > 0).astype(np.int32),
                                            np.array([[20, 21, 22, 3]], np.int32),
                                            np.ones((1, 4), np.int32))
    np.testing.assert_allclose(np.asarray(ours.start_logits[0]), theirs[0, 4:].numpy(),
                               atol=1e-4)


def test_export_leaving_word_embeddings_to_the_base(tmp_path):
    """A reader exported without its (frozen) word embeddings loads them from the base."""
    from dil_jax.checkpoints import (
        PARTIAL_SAFETENSORS_FILE,
        SAFETENSORS_FILE,
        export_hf_checkpoint,
    )

    config, params, _ = load_hf_checkpoint("default",
                                           ReaderOverrides(max_question_len=8, num_lower_layers=3))
    params["block_2"]["ffn_out"]["bias"] = params["block_2"]["ffn_out"]["bias"] + 1.0
    folder = export_hf_checkpoint(tmp_path / "reader", params, config,
                                  from_base=("default", "embeddings.word_embeddings"))
    # The 47 MB table is left out, under a name transformers does not load (it would fill the
    # table at random): a partial export is dil_jax's alone; `dil-jax export` completes it.
    assert (folder / PARTIAL_SAFETENSORS_FILE).stat().st_size < 60e6
    assert not (folder / SAFETENSORS_FILE).exists()
    loaded_config, loaded, _ = load_hf_checkpoint(folder)
    assert loaded_config == config  # k = 3 and max_question_len = 8 come from the manifest
    np.testing.assert_array_equal(loaded["embeddings"]["word_embeddings"]["embedding"],
                                  params["embeddings"]["word_embeddings"]["embedding"])
    np.testing.assert_array_equal(loaded["block_2"]["ffn_out"]["bias"],
                                  params["block_2"]["ffn_out"]["bias"])


@pytest.mark.parametrize("raised", [
    OSError(errno.EFBIG, "File too large", "/data/index/cache/states.npy"),
    RuntimeError("tensorstore: Error writing local file: [OS error: No space left on device]")])
def test_a_disk_refusing_a_write_anywhere_is_one_line(monkeypatch, capsys, raised):
    """A file-size limit (ulimit -f) during `index` ended in an OSError traceback (errno 27),
    a full disk during `train` in a 485-line tensorstore one."""
    from dil_jax import cli
    from dil_jax.commands import evaluate

    def refused(args):
        raise raised

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.evaluate",))
    monkeypatch.setattr(evaluate, "run", refused)
    assert cli.main(["evaluate", "--data", "d.json", "--predictions", "p.json"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("dil-jax evaluate: error: cannot write")
    if isinstance(raised, OSError):
        assert "/data/index/cache/states.npy: File too large (EFBIG)" in err
    else:
        assert "No space left on device (ENOSPC)" in err


def test_any_other_exception_keeps_its_traceback(monkeypatch):
    from dil_jax import cli
    from dil_jax.commands import evaluate

    def bug(args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.evaluate",))
    monkeypatch.setattr(evaluate, "run", bug)
    with pytest.raises(OSError, match="Input/output error"):
        cli.main(["evaluate", "--data", "d.json", "--predictions", "p.json"])
