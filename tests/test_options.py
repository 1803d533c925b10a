"""One rule per option (dil_jax/options.py): a training config key and the command-line flag that
set the same option take and refuse the same values, each naming itself in the refusal."""

from __future__ import annotations

import pytest

from dil_jax.options import OPTIONS

from tests.helpers.training import tiny_config

# Every command that takes --max-question-len, with its required arguments.
QUESTION_LEN_COMMANDS = ["predict --data D --output O", "check", "demo",
                         "index --out O --corpus wikipedia", "ask q --index I",
                         "odqa-eval --index I --data D", "serve --index I"]


def _flag_refusal(argv: list[str], capsys) -> str | None:
    """argparse's error for `argv` (exit status 2), or None when it parses."""
    from dil_jax.cli import build_parser

    capsys.readouterr()
    try:
        build_parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 2
        return capsys.readouterr().err
    return None


def _key_refusal(key: str, value: int, tmp_path) -> str | None:
    """The training config's problem with `key` = `value`, or None when the key takes it."""
    from dil_jax.train.config_rules import config_problems

    problems = config_problems(tiny_config(tmp_path, {key: value}))
    named = [problem for problem in problems if problem.startswith(f"config.{key} = ")]
    return named[0] if named else None


@pytest.mark.parametrize("value", [-1, 0, 1, 2, 3, 4, 64])
@pytest.mark.parametrize("command", QUESTION_LEN_COMMANDS)
def test_max_question_len_flag_and_key_refuse_the_same_values(command, value, capsys, tmp_path):
    """The question segment holds its first token, at least one question token and its closing
    token: 3 at the fewest, for --max-question-len and config.model.max_question_len alike."""
    flag = _flag_refusal([*command.split(), "--max-question-len", str(value)], capsys)
    key = _key_refusal("model.max_question_len", value, tmp_path)
    assert (flag is None) == (key is None) == (value >= 3), (flag, key)
    if flag is not None:
        wanted = OPTIONS["max_question_len"].wanted
        assert f"argument --max-question-len: must be {wanted}, got '{value}'" in flag, flag
        assert key == f"config.model.max_question_len = {value}: must be {wanted}", key


def test_question_segment_bound_is_what_the_tokenizer_needs():
    """The bound is the fewest tokens a question segment can hold with a real tokenizer: the
    embedded MiniLM's `[CLS] q [SEP]` refuses one fewer by its own check."""
    from dil_jax.errors import DilJaxError
    from dil_jax.tokenization import encode_questions, load_tokenizer

    assert OPTIONS["max_question_len"](3) is None and OPTIONS["max_question_len"](2)
    tokenizer = load_tokenizer("default")
    segments = encode_questions(tokenizer, ["who?"], 3)
    assert segments.mask.sum() == 3  # [CLS], one question token, [SEP]
    with pytest.raises(DilJaxError, match="max_question_len must be >= 3"):
        encode_questions(tokenizer, ["who?"], 2)
