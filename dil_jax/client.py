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
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from dil_jax.errors import DilJaxError

DEFAULT_URL = "http://127.0.0.1:8000"
API_KEY_ENV = "DIL_JAX_API_KEY"


class ServiceError(DilJaxError):
    """The server refused a request: status, the field it named, its message."""

    def __init__(self, status: int, field: str, message: str, retry_after: int | None = None):
        super().__init__(f"HTTP {status}: {field}: {message}")
        self.status, self.field, self.message, self.retry_after = status, field, message, \
            retry_after


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
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise _service_error(error) from None
        except urllib.error.URLError as error:
            raise ServiceError(0, "server", f"cannot reach {self.url}: {error.reason} (is "
                                            "`dil-jax serve` running?)") from None

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


def _service_error(error: urllib.error.HTTPError) -> ServiceError:
    retry = error.headers.get("Retry-After")
    try:
        detail = json.loads(error.read()).get("error", {})
    except (ValueError, AttributeError):
        detail = {}
    return ServiceError(error.code, detail.get("field", "server"),
                        detail.get("message", error.reason),
                        int(retry) if retry and retry.isdigit() else None)


def format_answer(payload: dict) -> str:
    """An answer of /v1/answer for a person, as `dil-jax ask` shows one."""
    lines = [f"Q: {payload['question']}"]
    answers = payload["answers"]
    if not answers:
        return "\n".join(lines + [f"A: (no answer: {payload['no_answer_reason']})"])
    best = answers[0]
    if payload["no_answer"]:
        lines += [f"A: (no answer found in the corpus: {payload['no_answer_reason']})",
                  f"   best guess: {best['text']}"]
    else:
        lines.append(f"A: {best['text']}")
    lines.append(f"   from {best['title']!r} ({best['passage_id']}), BM25 rank "
                 f"{best['bm25_rank']}; reader {payload['reader']} (k = {payload['k']}), "
                 f"score {best['reader_score']:.2f}, BM25 {best['bm25_score']:.2f}")
    for other in answers[1:]:
        lines.append(f"   also: {other['text']} ({other['title']!r})")
    lines.append("   time: " + ", ".join(f"{phase} {ms:.0f} ms"
                                        for phase, ms in payload["timings_ms"].items()))
    return "\n".join(lines)


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
