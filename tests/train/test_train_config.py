"""Config files, --config.key=value overrides, and the train command's argument handling."""

import argparse

import pytest

from dil_jax.train.config_files import (
    ConfigFileError,
    load_config,
    load_config_file,
    parse_value,
    split_overrides,
)

from tests.helpers import REPO
from tests.helpers.training import TINY_CONFIG


def test_overrides_are_typed_by_the_field_they_replace():
    config = load_config(TINY_CONFIG, [("optim.learning_rate", "1e-4"), ("batch_size", "16"),
                                       ("model.checkpoint", "1e-3"), ("log.progress", "no"),
                                       ("distributed.coordinator_address", "localhost:1234"),
                                       ("distributed.num_processes", "2")])
    assert config.optim.learning_rate == 1e-4
    assert config.batch_size == 16 and isinstance(config.batch_size, int)
    assert config.model.checkpoint == "1e-3"  # a str field keeps the text
    assert config.log.progress is False
    assert config.distributed.coordinator_address == "localhost:1234"
    assert config.distributed.num_processes == 2


@pytest.mark.parametrize("key,value,message", [
    ("optim.learnig_rate", "1", "unknown key"),
    ("nosuch.field", "1", "no section"),
    ("batch_size", "abc", "cannot parse"),
    ("batch_size", "1.5", "batch_size"),
    ("log.progress", "maybe", "boolean"),
    ("optim", "1", "is a section"),
])
def test_bad_overrides_name_the_key(key, value, message):
    with pytest.raises(ConfigFileError, match=message):
        load_config(TINY_CONFIG, [(key, value)])


def test_renamed_key_names_its_new_name():
    from dil_jax.errors import UsageError
    from dil_jax.train.config_rules import validate_config

    with pytest.raises(ConfigFileError, match="renamed config.data.doc_stride"):
        load_config(TINY_CONFIG, [("data.stride", "64")])
    config = load_config_file(TINY_CONFIG)
    config.data.stride = 64  # an old config file's line
    with pytest.raises(UsageError, match="config.data.stride was renamed config.data.doc_stride"):
        validate_config(config)


def test_reader_keys_are_named_as_encoder_config_fields():
    """config.model.lsh_layers became lsh_attention_layers (the EncoderConfig field it sets):
    the old key is refused by its new name, and an old workdir's config.json with it resumes
    without the rename counting as a change."""
    from dil_jax.errors import UsageError
    from dil_jax.train.config_rules import validate_config

    with pytest.raises(ConfigFileError, match="renamed config.model.lsh_attention_layers"):
        load_config(TINY_CONFIG, [("model.lsh_layers", "lower")])
    config = load_config_file(TINY_CONFIG)
    config.model.lsh_layers = "lower"  # an old config file's line
    with pytest.raises(UsageError, match="config.model.lsh_layers was renamed "
                                         "config.model.lsh_attention_layers"):
        validate_config(config)


def test_an_old_workdir_config_with_a_renamed_key_resumes_unchanged(tmp_path):
    import json

    from dil_jax.train.workdir import record_config

    (tmp_path / "config.json").write_text(json.dumps(
        {"model": {"lsh_layers": "", "num_lower_layers": 2}, "data": {"stride": 64}}))
    new = {"model": {"lsh_attention_layers": "", "num_lower_layers": 2},
           "data": {"doc_stride": 64}}
    assert record_config(tmp_path, json.dumps(new), 100) == []
    assert not (tmp_path / "config_history.jsonl").exists()
    assert json.loads((tmp_path / "config.json").read_text()) == new


def test_split_overrides_accepts_both_spellings():
    rest, overrides = split_overrides(["--config.a.b=1", "--config.c", "x y", "--other"])
    assert overrides == [("a.b", "1"), ("c", "x y")]
    assert rest == ["--other"]
    with pytest.raises(ConfigFileError):
        split_overrides(["--config.a"])


def test_parse_value_tuples_and_none():
    assert parse_value("[1, 2]", (0,)) == (1, 2)
    assert parse_value("some/path", None) == "some/path"
    assert parse_value("3", None) == 3


def test_every_shipped_config_loads():
    for name in ("tiny", "bert_base_squad", "albert_base_squad"):
        load_config_file(REPO / "configs" / f"{name}.py")
    for variant in ("full", "k4", "k4_distill"):
        config = load_config_file(f"{REPO}/configs/minilm_squad.py:{variant}")
        assert config.model.num_lower_layers == (0 if variant == "full" else 4)
        assert (config.loss.kd_weight > 0) == (variant == "k4_distill")
    warm = load_config_file(f"{REPO}/configs/minilm_squad.py:k5_warm,shared")
    assert warm.model.num_lower_layers == 5 and warm.model.passage_position_offset == 14
    assert warm.model.checkpoint == warm.teacher.checkpoint == (
        "runs/minilm_squad_full_shared/params")
    assert warm.loss.shared_norm and warm.data.windows_per_question == 4
    assert warm.workdir == "runs/minilm_squad_k5_warm_shared"
    # The control of the students' ratios: the bundled full reader, trained on with their recipe.
    control = load_config_file(f"{REPO}/configs/minilm_squad.py:full_warm")
    assert control.model.num_lower_layers == 0 and not control.model.passage_position_offset
    assert control.model.checkpoint == control.teacher.checkpoint == (
        "dil_jax/assets/minilm-squad-full")
    assert (control.optim.learning_rate, control.loss.kd_weight, control.loss.lrs_weight) == (
        1e-4, 1.0, 1.0)
    assert control.workdir == "runs/minilm_squad_full_warm"
    for spec in ("k6", "k0", "k4_cold", "full_distill", "k0_warm"):
        with pytest.raises(ValueError, match=f"unknown variant '{spec}'"):
            load_config_file(f"{REPO}/configs/minilm_squad.py:{spec}")
    paper = load_config_file(REPO / "configs" / "bert_base_squad.py")
    assert (paper.model.num_lower_layers, paper.optim.learning_rate, paper.num_epochs,
            paper.batch_size) == (10, 3e-5, 2.0, 12)
    assert paper.model.max_question_len + paper.data.max_passage_len == 384
    assert paper.data.doc_stride == 128
    with pytest.raises(ValueError, match="unknown variant"):
        load_config_file(f"{REPO}/configs/minilm_squad.py:k7")


def test_the_complete_set_configs_suffixes():
    stage = load_config_file(f"{REPO}/configs/minilm_squad_v11.py:k4_warm,multi,shared")
    assert stage.model.num_lower_layers == 4 and stage.loss.shared_norm
    assert (stage.data.distractors_per_question, stage.data.windows_per_question) == (2, 4)
    assert stage.data.answer_candidates_file.endswith("train-v1.1.ambiguous-offsets.json")
    assert stage.workdir == "runs/minilm_squad_v11_k4_warm_multi_shared"
    plain = load_config_file(f"{REPO}/configs/minilm_squad_v11.py:full")
    assert not plain.loss.shared_norm and plain.data.distractors_per_question == 0
    for spec in ("full,cloze", "full,shared,shared"):
        with pytest.raises(ValueError, match="bad suffix"):
            load_config_file(f"{REPO}/configs/minilm_squad_v11.py:{spec}")


def test_cli_passes_overrides_to_train_only(monkeypatch, capsys):
    from dil_jax import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.train",))
    code = cli.main(["train", "--config", str(TINY_CONFIG), "--print-config",
                     "--config.model.num_lower_layers=2", "--config.seed", "7"])
    assert code == 0
    printed = capsys.readouterr().out
    assert '"num_lower_layers": 2' in printed and '"seed": 7' in printed
    assert cli.main(["train", "--config", str(TINY_CONFIG), "--print-config",
                     "--config.nope=1"]) == 1
    assert "unknown key" in capsys.readouterr().err
    assert cli.main(["train", "--config", str(TINY_CONFIG), "--bogus"]) == 1
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_train_command_registers_a_subparser():
    from dil_jax.commands import train as command

    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--config", "x.py"])
    assert args.accepts_config_overrides and args.func is command.run


def test_validate_config_returns_the_typed_config_the_trainer_reads():
    """validate_config converts the ConfigDict once: typed, frozen sections with the file's
    values (an override included), and the ConfigDict itself kept for the featurizer and the
    evaluator."""
    import dataclasses

    from dil_jax.model.encoder_config import ReaderOverrides
    from dil_jax.train.config_rules import validate_config
    from dil_jax.train.train_config import TrainConfig

    config = load_config(TINY_CONFIG, [("optim.learning_rate", "1e-4"),
                                       ("model.num_lower_layers", "1"),
                                       ("model.lsh_attention_layers", "lower")])
    settings = validate_config(config)
    assert isinstance(settings, TrainConfig) and settings.source is config
    assert settings.optim.learning_rate == 1e-4 and settings.batch_size == config.batch_size
    assert settings.data.max_passage_len == config.data.max_passage_len
    assert settings.model.reader_overrides() == ReaderOverrides(
        num_lower_layers=1, max_question_len=config.model.max_question_len,
        dtype=config.model.dtype, passage_position_offset=0, lsh_attention_layers=(0,),
        lsh_num_hashes=config.model.lsh_num_hashes, lsh_bucket_size=config.model.lsh_bucket_size)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.optim.learning_rate = 1.0  # type: ignore[misc]


def test_every_typed_field_is_a_key_of_the_schema():
    """A field of a TrainConfig section takes the key of its own name, and its default where the
    key is absent: a field named unlike the schema's key would silently keep its default."""
    import dataclasses

    from dil_jax.train.default_config import base_config
    from dil_jax.train.train_config import TrainConfig

    schema = base_config()
    for section in dataclasses.fields(TrainConfig):
        if section.name == "source":
            continue
        value = getattr(TrainConfig.of(schema), section.name)
        if not dataclasses.is_dataclass(value):
            assert section.name in schema, section.name
            continue
        for field in dataclasses.fields(value):
            assert field.name in schema[section.name], f"{section.name}.{field.name}"
