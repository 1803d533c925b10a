"""The service's requests: JSON in, checked values out, or a `RequestError` naming the field.

Plain functions of already-parsed JSON (no web framework, no model), so every rule is tested
on its own and the app only maps `RequestError.status` to an HTTP status. Unknown fields are
refused too: a client's typo (`topk`) would otherwise be silently ignored and the default used.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dil_jax.defaults import SPAN_SCORES
from dil_jax.tokenization import lone_surrogate, surrogate_problem


class RequestError(Exception):
    """A request the service refuses: HTTP `status`, the `field` at fault (or "body"), and a
    message naming the field and the value."""

    def __init__(self, status: int, field: str, message: str, value: Any = None):
        super().__init__(message)
        self.status, self.field, self.message, self.value = status, field, message, value

    def payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {"field": self.field, "message": self.message}
        if self.value is not None:
            error["value"] = _shown(self.value)
        return {"error": error}


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask for (the server's flags)."""

    max_question_chars: int = 1000
    max_context_chars: int = 20000
    max_top_k: int = 20
    max_p: int = 29                 # passages the worker reads per question (its top_p)
    max_answer_len: int = 30        # tokens (the reader's own decoding limit)
    max_body_bytes: int = 64 * 1024


@dataclasses.dataclass(frozen=True)
class AnswerRequest:
    """`POST /v1/answer`."""

    question: str
    reader: str
    top_k: int
    p: int
    span_score: str
    use_ir: bool


@dataclasses.dataclass(frozen=True)
class ReadRequest:
    """`POST /v1/read`: extractive QA on a given text, Hugging Face pipeline style."""

    question: str
    context: str
    reader: str
    top_k: int
    max_answer_len: int
    handle_impossible_answer: bool


ANSWER_FIELDS = ("question", "top_k", "p", "reader", "span_score", "use_ir")
READ_FIELDS = ("question", "context", "reader", "top_k", "max_answer_len",
               "handle_impossible_answer")
# Hugging Face's pipeline answers at most this many tokens by default (max_answer_len=15).
PIPELINE_MAX_ANSWER_LEN = 15


# Digits an integer of a request may have: a count here has a few, and Python refuses to convert
# strings of more than 4,300 digits (sys.get_int_max_str_digits) with a ValueError.
MAX_INT_DIGITS = 100


@dataclasses.dataclass(frozen=True)
class LongNumber:
    """A JSON integer of more than MAX_INT_DIGITS digits, kept as its digit count: no field
    takes one, and each field's check names it as a number of that many digits."""

    digits: int

    def __repr__(self) -> str:
        return f"<a number of {self.digits} digits>"


def _json_int(text: str) -> int | LongNumber:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else LongNumber(digits)


def type_name(value: Any) -> str:
    """A JSON value's type as an error message names it."""
    return "number" if isinstance(value, LongNumber) else type(value).__name__


def _shown(value: Any, limit: int = 80) -> Any:
    """A value as an error message may show it, and JSON can carry it: long strings cut,
    containers summarised, NaN / infinities and oversized numbers as text."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"... ({len(value)} chars)"
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, LongNumber):
        return repr(value)
    return value


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; RequestError 400 naming what is wrong with it."""
    if not raw.strip():
        raise RequestError(400, "body", "the request body is empty: send a JSON object")
    try:
        # Decoded here: json.loads would guess UTF-16 or -32 from a byte order mark, and JSON
        # on the wire is UTF-8 (RFC 8259).
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, "body", f"the body is not UTF-8 text ({error.reason} at byte "
                                        f"{error.start})") from error
    try:
        # NaN, Infinity and 1e400 (a float overflowing to inf) are kept as floats and a long
        # integer as a LongNumber: each field's check then names the field and the value.
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as error:
        raise RequestError(400, "body", f"the body is not valid JSON: {error.msg} at line "
                                        f"{error.lineno} column {error.colno}") from error
    except RecursionError as error:  # the C scanner recurses once per nested array / object
        raise RequestError(400, "body", "the body's arrays or objects are nested deeper than "
                                        "this server reads") from error
    if not isinstance(data, dict):
        raise RequestError(400, "body", f"the body must be a JSON object, got "
                                        f"{type(data).__name__}", _shown(data))
    return data


def _unknown_fields(data: Mapping[str, Any], known: Sequence[str]) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise RequestError(422, unknown[0], f"unknown field(s) {unknown}: this route takes "
                                            f"{list(known)}", unknown[0])


def text_field(data: Mapping[str, Any], field: str, max_chars: int) -> str:
    """A required, non-blank string of at most max_chars characters, valid Unicode."""
    if field not in data or data[field] is None:
        raise RequestError(422, field, f"{field} is required (a non-empty string)")
    value = data[field]
    if not isinstance(value, str):
        raise RequestError(422, field, f"{field} must be a string, got "
                                       f"{type_name(value)} {_shown(value)!r}", value)
    if not value.strip():
        raise RequestError(422, field, f"{field} is empty: {value!r}", value)
    if len(value) > max_chars:
        raise RequestError(422, field, f"{field} has {len(value)} characters, more than the "
                                       f"{max_chars} this server takes", value)
    if (index := lone_surrogate(value)) is not None:
        raise RequestError(422, field, f"{field}: {surrogate_problem(value, index)}")
    return value


def int_field(data: Mapping[str, Any], field: str, default: int, low: int, high: int) -> int:
    """An integer in [low, high] (default when absent). Booleans and 2.0 are refused: JSON
    true is not 1, and a float count is a client bug worth naming."""
    value = data.get(field, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, field, f"{field} must be an integer from {low} to {high}, got "
                                       f"{type_name(value)} {_shown(value)!r}", value)
    if not low <= value <= high:
        raise RequestError(422, field, f"{field} {value} is out of range: must be from {low} "
                                       f"to {high}", value)
    return value


def bool_field(data: Mapping[str, Any], field: str, default: bool) -> bool:
    value = data.get(field, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, field, f"{field} must be true or false, got "
                                       f"{type_name(value)} {_shown(value)!r}", value)
    return value


def choice_field(data: Mapping[str, Any], field: str, default: str,
                 choices: Sequence[str]) -> str:
    value = data.get(field, default)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise RequestError(422, field, f"{field} {_shown(value)!r} is not one of "
                                       f"{list(choices)}", value)
    return value


def parse_answer_request(data: Mapping[str, Any], limits: Limits, readers: Sequence[str],
                         default_span_score: str = "logits") -> AnswerRequest:
    """`POST /v1/answer`'s body -> AnswerRequest. readers: the served readers' names, the
    first being the default."""
    _unknown_fields(data, ANSWER_FIELDS)
    question = text_field(data, "question", limits.max_question_chars)
    p = int_field(data, "p", limits.max_p, 1, limits.max_p)
    return AnswerRequest(
        question=question,
        reader=choice_field(data, "reader", readers[0], readers),
        top_k=int_field(data, "top_k", 1, 1, min(limits.max_top_k, p)),
        p=p,
        span_score=choice_field(data, "span_score", default_span_score, SPAN_SCORES),
        use_ir=bool_field(data, "use_ir", True))


def parse_read_request(data: Mapping[str, Any], limits: Limits,
                       readers: Sequence[str]) -> ReadRequest:
    """`POST /v1/read`'s body -> ReadRequest (Hugging Face pipeline arguments and defaults:
    top_k 1, max_answer_len 15, handle_impossible_answer false)."""
    _unknown_fields(data, READ_FIELDS)
    return ReadRequest(
        question=text_field(data, "question", limits.max_question_chars),
        context=text_field(data, "context", limits.max_context_chars),
        reader=choice_field(data, "reader", readers[0], readers),
        top_k=int_field(data, "top_k", 1, 1, limits.max_top_k),
        max_answer_len=int_field(data, "max_answer_len",
                                 min(PIPELINE_MAX_ANSWER_LEN, limits.max_answer_len), 1,
                                 limits.max_answer_len),
        handle_impossible_answer=bool_field(data, "handle_impossible_answer", False))


def finite(value: float) -> float | None:
    """A float JSON can carry (NaN and infinities are not JSON): None for those."""
    return value if math.isfinite(value) else None
