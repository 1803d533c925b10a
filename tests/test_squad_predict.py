"""The prediction path: blocked, deduplicated delayed-interaction reading, and `dil-jax predict`."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dil_jax.data.features import featurize
from dil_jax.data.squad import load_squad
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.predict import window_logits
from dil_jax.readers import EncoderReader

from tests.helpers import V11, V20, squad_file


@pytest.mark.parametrize("k", [0, 2])
def test_window_logits_equal_the_model_on_each_window(tokenizer, k):
    """Questions in padded blocks, each distinct passage window encoded once (k > 0), pairs
    gathered by index: the same scores as the whole model run window by window."""
    config = EncoderConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=3,
                           num_heads=4, intermediate_size=37, embedding_size=32,
                           max_position_embeddings=64, max_question_len=16, num_lower_layers=k,
                           hidden_dropout=0.0, attention_dropout=0.0)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    examples = load_squad(squad_file(V11)).examples[:7]  # two paragraphs, several windows each
    f = featurize(examples, tokenizer, max_question_len=16, max_passage_len=40, doc_stride=16)
    assert len(np.unique(f.window_passage_index)) < f.num_windows  # windows are shared
    got = window_logits(EncoderReader(model, params), f, batch_size=4, question_block=3,
                        progress=False)
    q = f.example_index
    want = model(params, f.q_ids[q], f.q_mask[q], f.p_ids, f.p_mask)
    np.testing.assert_allclose(got.start_logits, want.start_logits, atol=2e-5)
    np.testing.assert_allclose(got.end_logits, want.end_logits, atol=2e-5)
    np.testing.assert_allclose(got.null_start_logits, want.null_start_logits, atol=2e-5)
    np.testing.assert_allclose(got.null_end_logits, want.null_end_logits, atol=2e-5)


def test_predict_cli_end_to_end_with_the_default_minilm(tmp_path, monkeypatch, capsys):
    """The real MiniLM (random QA head: answers are arbitrary spans) over 3 v2.0 questions."""
    from dil_jax import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.predict",
                                                 "dil_jax.commands.evaluate"))
    output = tmp_path / "out" / "preds.json"
    code = cli.main(["predict", "--checkpoint", "default", "--data", str(squad_file(V20)),
                     "--output", str(output), "--allow-untrained-head", "--limit", "3", "--k", "3",
                     "--max-question-len", "24",
                     "--max-passage-len", "48", "--doc-stride", "24", "--batch-size", "4",
                     "--no-progress"])
    assert code == 0
    predictions = json.loads(output.read_text())
    examples = load_squad(squad_file(V20)).examples[:3]
    assert list(predictions) == [e.qid for e in examples]
    for example in examples:
        answer = predictions[example.qid]
        assert isinstance(answer, str) and answer in example.context  # "" is a no-answer
    assert cli.main(["evaluate", "--data", str(squad_file(V20)), "--predictions",
                     str(output)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["total"] == 11873 and scores["missing"] == 11870


def test_predict_cli_refuses_lengths_beyond_the_position_table(tmp_path, monkeypatch, capsys):
    from dil_jax import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.predict",))
    code = cli.main(["predict", "--checkpoint", "default", "--data", str(squad_file(V11)),
                     "--output", str(tmp_path / "p.json"), "--limit", "1", "--k", "0",
                     "--allow-untrained-head",
                     "--max-question-len", "200", "--max-passage-len", "384", "--no-progress"])
    assert code == 1
    assert "exceeds max_position_embeddings 512" in capsys.readouterr().err


def test_reading_again_with_the_same_model_compiles_nothing(tokenizer):
    """A training loop evaluates the same model object at every evaluation: its programs must be
    compiled once, not once per evaluation (window_logits reuses one PairGrid per model)."""
    compiled: list[str] = []
    counting = [True]

    def listener(event: str, duration: float, **_: object) -> None:
        if counting[0] and "backend_compile" in event:
            compiled.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    config = EncoderConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2,
                           num_heads=4, intermediate_size=37, embedding_size=32,
                           max_position_embeddings=64, max_question_len=16, num_lower_layers=1,
                           hidden_dropout=0.0, attention_dropout=0.0)
    examples = load_squad(squad_file(V11)).examples[:3]
    f = featurize(examples, tokenizer, max_question_len=16, max_passage_len=40, doc_stride=16)
    model, other = DelayedInteractionModel(config), DelayedInteractionModel(config)
    params = [model.init(jax.random.key(seed)) for seed in (0, 1)]  # not counted: init's own
    try:
        compiled.clear()
        reader = EncoderReader(model, params[0])
        window_logits(reader, f, batch_size=4, progress=False)
        first = len(compiled)
        window_logits(reader.with_params(params[1]), f, batch_size=4, progress=False)  # values
        again = len(compiled) - first
        window_logits(EncoderReader(other, params[0]), f, batch_size=4,
                      progress=False)  # another model object
        other_count = len(compiled) - first - again
    finally:
        counting[0] = False
    assert first > 0 and other_count > 0
    assert again == 0


@pytest.mark.parametrize("k, role", [(None, "full"), (2, "delayed"), (4, "delayed")])
def test_predict_without_a_checkpoint_reads_the_bundled_reader_of_its_k(tmp_path, monkeypatch,
                                                                        capsys, k, role):
    """`ask`'s rule (`ReaderRequest.resolved`): no --checkpoint is the bundled reader of --k
    (k = 2: the default delayed one; k = 4: the bundled k = 4 reader), the full one without
    --k; not the embedded MiniLM, whose QA head is untrained."""
    from dil_jax import cli
    from dil_jax.defaults import bundled_reader

    requested = []

    def stop(request):
        requested.append(request)
        raise SystemExit(3)

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.predict",))
    monkeypatch.setattr("dil_jax.readers.load_requested", stop)
    argv = ["predict", "--data", str(squad_file(V11)), "--output", str(tmp_path / "p.json"),
            "--limit", "1", "--no-progress", *(["--k", str(k)] if k is not None else [])]
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert [r.checkpoint for r in requested] == [str(bundled_reader(role, k))]
    assert bundled_reader(role, k).name == {None: "minilm-squad-full", 2: "minilm-squad-k2-open",
                                            4: "minilm-squad-k4"}[k]
