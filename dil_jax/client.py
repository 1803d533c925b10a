"""The reference client of `dil-jax serve` (docs/serving.md): the standard library only.

    from dil_jax.client import Client
    client = Client("http://127.0.0.1:8000")
    client.answer("Who wrote Hamlet?", reader="delayed")["answers"][0]["text"]
    client.read("Who wrote it?", "Hamlet is a tragedy by William Shakespeare.")

    python3 -m dil_jax.client "Who wrote Hamlet?" [--server URL] [--reader delayed] [--top-k 3]

A refusal (4xx, 5xx) is a `ServiceError` carrying the status, the field the server named and
its message; a 503 says how long to wait (`retry_after`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any, TextIO

from dil_jax.errors import DilJaxError, UsageError
from dil_jax.open_domain.answer_text import answer_lines, passage_context

DEFAULT_URL = "http://127.0.0.1:8000"
API_KEY_ENV = "DIL_JAX_API_KEY"


class ServiceError(DilJaxError):
    """The server refused a request (status, the field it named, its message) or could not
    be asked (status 0); the message names the server's URL."""

    def __init__(self, status: int, field: str, message: str, retry_after: int | None = None,
                 url: str = ""):
        where = f"{url}: " if url else ""
        super().__init__(f"{where}HTTP {status}: {field}: {message}" if status else
                         f"{where}{message}")
        self.status, self.field, self.message, self.retry_after = status, field, message, \
            retry_after
        self.url = url


class Client:
    def __init__(self, url: str = DEFAULT_URL, api_key: str | None = None,
                 timeout: float = 120.0):
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.timeout = timeout

    def _call(self, path: str, body: dict | None = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers,
                                         method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as error:
            raise _service_error(error, self.url) from None
        except urllib.error.URLError as error:
            raise ServiceError(0, "server", f"cannot reach the server: {error.reason} (is "
                                            "`dil-jax serve` running there?)",
                               url=self.url) from None
        except TimeoutError:
            raise ServiceError(0, "server", f"no answer within {self.timeout:g} s",
                               url=self.url) from None
        except OSError as error:  # a connection reset or closed mid-answer
            raise ServiceError(0, "server", f"the connection failed: {error}",
                               url=self.url) from None
        try:
            return json.loads(body)
        except ValueError:
            raise ServiceError(0, "server", f"{path} answered something that is not JSON: is "
                                            "this a `dil-jax serve`?", url=self.url) from None

    def answer(self, question: str, **options: Any) -> dict:
        """`POST /v1/answer`; options: top_k, p, reader, span_score, use_ir (None: the
        server's default)."""
        body = {"question": question, **{k: v for k, v in options.items() if v is not None}}
        return self._call("/v1/answer", body)

    def read(self, question: str, context: str, **options: Any) -> dict | list:
        """`POST /v1/read`, Hugging Face pipeline output (a dict when one answer)."""
        body = {"question": question, "context": context,
                **{k: v for k, v in options.items() if v is not None}}
        return self._call("/v1/read", body)

    def info(self) -> dict:
        return self._call("/v1/info")

    def ready(self) -> bool:
        try:
            return bool(self._call("/readyz").get("ready"))
        except ServiceError:
            return False

    def wait_ready(self, timeout: float = 600.0, poll: float = 0.5) -> None:
        """Returns once /readyz says ready; ServiceError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise ServiceError(503, "server", f"{self.url} not ready after {timeout:g} s")
            time.sleep(poll)


def _service_error(error: urllib.error.HTTPError, url: str) -> ServiceError:
    retry = error.headers.get("Retry-After")
    try:
        detail = json.loads(error.read()).get("error", {})
    except (ValueError, AttributeError):
        detail = {}
    return ServiceError(error.code, detail.get("field", "server"),
                        detail.get("message", error.reason),
                        int(retry) if retry and retry.isdigit() else None, url)


def format_answer(payload: dict) -> str:
    """A /v1/answer response for a person, line for line as `dil-jax ask` prints a local read
    (`open_domain.reader.format_answer`), except the time line, which lists the server's
    phases (queue, retrieve, encode_question, read_pairs, decode, fuse); answers past the first
    (top_k > 1) follow as "also:" lines."""
    lines = [f"Q: {payload['question']}"]
    answers = payload["answers"]
    if not answers:
        return "\n".join(lines + [f"A: (no answer: {payload['no_answer_reason']})"])
    best = answers[0]
    lines += answer_lines(
        text=best["text"], title=best["title"], passage_id=best["passage_id"],
        rank=best["bm25_rank"], retrieved=payload["retrieved"],
        span_score=payload["span_score"], reader_score=best["reader_score"],
        bm25_score=best["bm25_score"], mu=payload["mu"], threshold=payload["threshold"],
        retrieval_match=payload.get("retrieval_match"), probability=payload.get("probability"),
        probability_threshold=payload.get("probability_threshold"),
        context=passage_context(best["passage"], best["start"], best["end"], best["text"]))
    lines += [f"   also: {other['text']} ({other['title']!r})" for other in answers[1:]]
    lines.append("   time: " + ", ".join(f"{phase} {ms:.0f} ms"
                                        for phase, ms in payload["timings_ms"].items()))
    return "\n".join(lines)


# The flag of `dil-jax ask` behind each request field, to name it when the server refuses one.
ASK_FLAGS = {"p": "--top-p", "reader": "--k", "span_score": "--span-score",
             "use_ir": "--no-fusion", "question": "the question"}


@dataclasses.dataclass(frozen=True)
class AskOptions:
    """`dil-jax ask`'s reading flags as a server takes them: p = --top-p; k = --k (the
    server's reader of that split; None: its first); mu = --mu (None: --no-fusion); the span
    score rule."""

    p: int
    k: int | None
    mu: float | None
    span_score: str


def check_server_url(url: str) -> None:
    """UsageError naming --server unless url is http(s)://HOST[:PORT][/path]."""
    parsed = urllib.parse.urlparse(url)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise UsageError(f"--server {url!r}: expected http://HOST:PORT, e.g. "
                         f"{DEFAULT_URL}")


def server_info(client: Client) -> dict:
    """GET /v1/info, checked to be a `dil-jax serve` answer (readers with their k, mu)."""
    info = client.info()
    readers = info.get("readers") if isinstance(info, dict) else None
    if not isinstance(readers, dict) or not all(
            isinstance(r, dict) and isinstance(r.get("k"), int) for r in readers.values()) \
            or not isinstance(info.get("mu"), (int, float)):
        raise ServiceError(0, "server", "/v1/info did not answer as `dil-jax serve` does: is "
                                        "this its URL?", url=client.url)
    return info


def request_fields(options: AskOptions, info: dict, url: str) -> dict[str, Any]:
    """The /v1/answer fields of ask's flags, given the server's /v1/info; a UsageError
    naming the flag when the server cannot read as asked (no reader of that k, another mu)."""
    fields: dict[str, Any] = {"p": options.p, "span_score": options.span_score,
                              "use_ir": options.mu is not None}
    if options.k is not None:
        names = [name for name, reader in info["readers"].items() if reader["k"] == options.k]
        if not names:
            served = ", ".join(f"{name} (k = {reader['k']})"
                               for name, reader in info["readers"].items())
            raise UsageError(f"--k {options.k}: the server at {url} has no reader of k = "
                             f"{options.k}; it serves {served}")
        fields["reader"] = names[0]
    # mu is the server's (`dil-jax serve --mu`): fusing with another would not be this ask.
    if options.mu is not None and float(info["mu"]) != options.mu:
        raise UsageError(f"--mu {options.mu}: the server at {url} fuses with mu = "
                         f"{info['mu']} (its --mu); pass --mu {info['mu']}, --no-fusion, or "
                         "start the server with this --mu")
    return fields


def ask_server(url: str, questions: Iterable[str], options: AskOptions,
               out: TextIO | None = None, api_key: str | None = None) -> int:
    """`dil-jax ask --server URL`: each question sent to /v1/answer, its answer printed as a
    local `ask` prints it (`format_answer`). A refusal is a UsageError naming ask's flag behind
    the field the server named, the URL and the status; an unreachable server a ServiceError
    naming the URL."""
    out = out or sys.stdout
    client = Client(url, api_key)
    fields = request_fields(options, server_info(client), client.url)
    for question in questions:
        try:
            payload = client.answer(question, **fields)
        except ServiceError as error:
            flag = ASK_FLAGS.get(error.field)
            if flag is None or error.status != 422:
                raise
            raise UsageError(f"{flag}: {error}") from None
        print(format_answer(payload), file=out, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m dil_jax.client",
                                     description="ask a running `dil-jax serve`")
    parser.add_argument("question")
    parser.add_argument("--server", default=DEFAULT_URL, help="the server's URL")
    parser.add_argument("--reader", default=None, help="full or delayed (default: the "
                                                       "server's first)")
    parser.add_argument("--top-k", type=int, default=None, help="answers to show")
    parser.add_argument("--p", type=int, default=None, help="passages read")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")
    args = parser.parse_args(argv)
    try:
        payload = Client(args.server).answer(args.question, reader=args.reader,
                                             top_k=args.top_k, p=args.p)
    except ServiceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(payload, indent=1) if args.json else format_answer(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
