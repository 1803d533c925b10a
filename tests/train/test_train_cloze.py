"""Cloze questions (dil_jax.train.cloze, data.cloze_per_paragraph): rule-made unlabelled questions
on the training paragraphs. Expected values are worked out by hand from the sentences."""

import json
import random

import numpy as np

from dil_jax.data.squad import SquadExample, load_squad, select_articles
from dil_jax.open_domain.index.corpus import read_wikipedia_leads
from dil_jax.train.cloze import (
    AnswerSpan,
    answer_spans,
    cloze_examples,
    cloze_question,
    paragraph_cloze_examples,
    sentence_spans,
    squad_json,
)
from dil_jax.train.config_rules import config_problems
from dil_jax.train.default_config import base_config
from dil_jax.train.squad_data import featurize, training_cloze_examples

from tests.helpers import V11, squad_file


def _sentences(text: str) -> list[str]:
    return [text[start:end] for start, end in sentence_spans(text)]


def test_sentences_end_at_stops_but_not_after_abbreviations_or_initials():
    text = ("Dr. Smith reached St. Louis in 1850.  John F. Kennedy spoke there! "
            "Was it cold? yes. The U.S. Army left")
    # "Dr.", "St.", "F." and "U.S." end no sentence; "? yes" does not either (lower case).
    assert _sentences(text) == ["Dr. Smith reached St. Louis in 1850.",
                                "John F. Kennedy spoke there!",
                                "Was it cold? yes.",
                                "The U.S. Army left"]
    assert _sentences("   ") == []


def test_answer_spans_find_dates_years_numbers_and_names_without_overlap():
    sentence = "In May 1945 about 3 million soldiers of the Red Army reached Berlin in 1945."
    spans = [(sentence[s.start:s.end], s.kind) for s in answer_spans(sentence)]
    # The date "May 1945" takes its year; "In" opens the sentence and is no name.
    assert spans == [("May 1945", "date"), ("3 million", "number"), ("Red Army", "name"),
                     ("Berlin", "name"), ("1945", "year")]
    # A name that opens the sentence is skipped; joined names keep their "of".
    sentence = "Normans served the Duchy of Normandy."
    assert [sentence[s.start:s.end] for s in answer_spans(sentence)] == ["Duchy of Normandy"]


def test_cloze_question_replaces_the_span_and_crops_around_it():
    sentence = "The Normans conquered England in 1066."
    year = AnswerSpan(33, 37, "year")
    assert sentence[33:37] == "1066"
    assert cloze_question(sentence, year) == "The Normans conquered England in what year?"
    name = AnswerSpan(22, 29, "name")
    assert cloze_question(sentence, name) == "The Normans conquered what in 1066?"
    # 4 words at most: "what" and 3 around it. Before the gap: max(3 // 2, 3 - 2 after) = 1
    # word, the other 2 after it.
    assert cloze_question(sentence, name, max_words=4) == "Conquered what in 1066?"


def test_paragraph_cloze_examples_record_the_rule_answer_and_cap_the_count():
    context = "Paris hosted the games in 1900. Later Rome hosted them in 1960."
    examples = paragraph_cloze_examples("T", context, "cloze-0", max_per_paragraph=10,
                                        rng=random.Random(0))
    # "Paris" and "Later Rome" open their sentences: no name questions.
    assert [(e.qid, e.question, e.answer_texts[0]) for e in examples] == [
        ("cloze-0-0", "Paris hosted the games in what year?", "1900"),
        ("cloze-0-1", "Later Rome hosted them in what year?", "1960")]
    for example in examples:
        start, = example.answer_starts
        assert context[start:start + len(example.answer_texts[0])] == example.answer_texts[0]
        assert example.answer_texts[0] not in example.question
    capped = paragraph_cloze_examples("T", context, "c", max_per_paragraph=1,
                                      rng=random.Random(0))
    assert len(capped) == 1 and {e.question for e in capped} < {e.question for e in examples}


def test_cloze_examples_number_paragraphs_once_and_round_trip_as_squad_json(tmp_path):
    a = SquadExample("q1", "A", "Rome grew in 1900. It fell.", "?", ("Rome",), (0,))
    b = SquadExample("q2", "A", "Rome grew in 1900. It fell.", "?", ("1900",), (13,))
    c = SquadExample("q3", "B", "It was built in 1850 by Smith.", "?", ("1850",), (16,))
    examples = cloze_examples([(e.title, e.context) for e in (a, b, c)], max_per_paragraph=5)
    assert [e.qid for e in examples] == ["cloze-0-0", "cloze-1-0", "cloze-1-1"]
    assert [e.title for e in examples] == ["A", "B", "B"]
    path = tmp_path / "cloze.json"

    path.write_text(json.dumps(squad_json(examples)))
    assert load_squad(path).examples == examples


def test_config_refuses_cloze_without_a_teacher_loss():
    config = base_config()
    config.data.cloze_per_paragraph = 3
    assert any("config.data.cloze_per_paragraph = 3" in p and "kd_weight" in p
               for p in config_problems(config))
    config.loss.kd_weight = 1.0
    assert config_problems(config) == []


def test_training_gets_unlabelled_cloze_windows_on_training_paragraphs_only():
    config = base_config()
    config.data.squad_file = str(squad_file(V11))
    config.data.tokenizer = "default"
    config.data.max_questions = 50
    config.data.cloze_per_paragraph = 2
    plain_config = base_config()
    plain_config.data.update(config.data.to_dict())
    plain_config.data.cloze_per_paragraph = 0
    plain = featurize(plain_config.data, "train", max_question_len=32)
    with_cloze = featurize(config.data, "train", max_question_len=32)
    squad = load_squad(squad_file(V11))
    training = select_articles(squad.examples, config.data.train_articles)
    validation = select_articles(squad.examples, config.data.validation_articles)
    n_paragraphs = len({e.context for e in training})
    expected = cloze_examples([(e.title, e.context) for e in training], max_per_paragraph=2)
    assert n_paragraphs < len(expected) <= 2 * n_paragraphs  # all paragraphs, not 50 questions'
    assert not {e.context for e in expected} & {e.context for e in validation}
    # The labelled part is unchanged; every added window is unlabelled (-1 / -1).
    n = plain.p_ids.shape[0]
    np.testing.assert_array_equal(with_cloze.p_ids[:n], plain.p_ids)
    assert with_cloze.q_ids.shape[0] == plain.q_ids.shape[0] + len(expected)
    assert not with_cloze.is_unlabelled[:n].any() and with_cloze.is_unlabelled[n:].all()
    assert (with_cloze.start_positions[n:] == -1).all()
    assert (with_cloze.end_positions[n:] == -1).all()


def test_wikipedia_cloze_paragraphs_leave_out_the_validation_articles_leads():
    config = base_config()
    config.data.squad_file = str(squad_file(V11))
    config.data.cloze_per_paragraph = 1
    config.data.cloze_sources = "wikipedia"
    squad = load_squad(squad_file(V11))
    training = select_articles(squad.examples, config.data.train_articles)
    validation_titles = sorted({e.title for e in select_articles(
        squad.examples, config.data.validation_articles)})
    chosen = training_cloze_examples(config.data, training, validation_titles)
    leads = {document.title: document.text for document in read_wikipedia_leads()}
    # Of the validation articles, Steam_engine, Warsaw and Yuan_dynasty have a lead there
    # (docs/training.md, distractors): none of their text may come back as a cloze paragraph.
    held_out = [leads[title.replace("_", " ")] for title in validation_titles
                if title.replace("_", " ") in leads]
    assert len(held_out) == 3
    assert not {e.title.replace(" ", "_") for e in chosen} & set(validation_titles)
    assert not any(e.context in lead for e in chosen for lead in held_out)
    assert not {e.context for e in chosen} & {e.context for e in training}
    assert len(chosen) > 5000 and all(e.answer_texts == () for e in chosen)
    config.data.cloze_sources = "paragraphs,wikipedia"
    both = training_cloze_examples(config.data, training, validation_titles)
    alone = cloze_examples([(e.title, e.context) for e in training], max_per_paragraph=1)
    # The training paragraphs first, as they are alone (so adding Wikipedia leaves their
    # questions as they were), then the same Wikipedia paragraphs.
    assert [e.question for e in both[:len(alone)]] == [e.question for e in alone]
    assert [e.context for e in both[len(alone):]] == [e.context for e in chosen]


def test_config_refuses_an_unknown_cloze_source():
    config = base_config()
    config.data.cloze_sources = "paragraphs,books"
    assert any("config.data.cloze_sources" in p for p in config_problems(config))
