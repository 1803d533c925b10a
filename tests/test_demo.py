"""The README's main job, on a small corpus: the bundled readers answer a factual question."""

from __future__ import annotations

from dil_jax.cli import main
from dil_jax.defaults import bundled_reader


def test_demo_answers_with_the_bundled_readers(tmp_path, capsys):
    assert bundled_reader("full") is not None and bundled_reader("delayed") is not None
    code = main(["demo", "--index", str(tmp_path / "index"), "--distractors", "20",
                 "--top-p", "5", "What is the fifth planet from the Sun?"])
    assert code == 0
    out = capsys.readouterr().out
    full, delayed = out.split("[delayed reader, k=4 of 6]")
    assert "[full reader, k=0 of 6]" in full
    # Jupiter's lead section ("Jupiter is the fifth planet from the Sun") is in the corpus;
    # both readers must find it and answer with its name.
    assert "A: Jupiter\n" in full
    assert "A: Jupiter\n" in delayed and "from 'Jupiter'" in delayed
    assert "reader time over 1 questions" in out
    assert out.count("reader score (logits)") == 2  # the default rule, both readers

    # The same index again (reused), both readers scoring spans over their no-answer score.
    code = main(["demo", "--index", str(tmp_path / "index"), "--distractors", "20",
                 "--top-p", "5", "--span-score", "margin",
                 "What is the fifth planet from the Sun?"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("reader score (margin)") == 2
    assert out.count("A: Jupiter\n") == 2
