"""A fake model provider: a real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions
(``POST /v1/chat/completions``) and Anthropic messages (``POST /v1/messages``) wire formats.

It records every request's headers and body, answers a repeated Idempotency-Key with the
first (successful) answer, as a provider would, and is scriptable: ``fail(model, 503)``
makes a model answer errors, ``hold()`` keeps the next requests in flight until
``release()`` (so a test can kill the caller mid-call), and a ``Script`` decides each answer
from the conversation it is sent, so a re-sent turn gets the same answer.

A Script is a list of turns; turn N (the request's N-th assistant turn to come) answers with
text or with tool calls ``[(tool, arguments), ...]``. Usage is 10 input tokens per message and
5 output tokens per answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Turn = str | list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def key(self) -> str | None:
        return self.headers.get("idempotency-key")

    @property
    def model(self) -> str:
        return str(self.body.get("model"))


@dataclass
class Script:
    turns: Sequence[Turn] = ("ok",)

    def answer(self, turn: int) -> Turn:
        return self.turns[min(turn, len(self.turns) - 1)]


def _assistant_turns(api: str, body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


def _last_user_text(api: str, body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages", [])):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])
    return ""


@dataclass
class FakeProvider:
    script: Script = field(default_factory=Script)
    echo: bool = False  # answer with the last user message instead of the script
    # a request whose last user message starts with a key gets its value (a rating, say)
    replies: dict[str, str] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)  # model -> statuses to answer
    _answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _held: bool = False
    _hold_after: int = 0
    _release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                status, payload = fake._handle(request)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller died mid-request: the point of the crash tests

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # --- control -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def env(self) -> dict[str, str]:
        """Point both SDKs here (what a user does with a compatible endpoint)."""
        return self.env_for(self.url)

    @staticmethod
    def env_for(url: str) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": f"{url}/v1",
            "OPENAI_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "sk-ant-test",
        }

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def fail(self, model: str, *statuses: int) -> None:
        with self._lock:
            self.failures.setdefault(model, []).extend(statuses)

    def hold(self, after: int = 0) -> None:
        """Keep requests in flight until ``release()``, once ``after`` more have been answered."""
        with self._lock:
            self._held = True
            self._hold_after = len(self.requests) + after
            self._release.clear()
            self.arrived.clear()

    def release(self) -> None:
        with self._lock:
            self._held = False
        self._release.set()

    def keys(self) -> list[str | None]:
        """Every request's Idempotency-Key, in arrival order."""
        with self._lock:
            return [r.key for r in self.requests]

    def calls(self, model: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if model is None or r.model == model]

    # --- answering -----------------------------------------------------------------------
    def _handle(self, request: Request) -> tuple[int, bytes]:
        api = "anthropic" if request.path.endswith("/messages") else "openai"
        with self._lock:
            self.requests.append(request)
            if request.key is not None and request.key in self._answers:
                return self._answers[request.key]
            statuses = self.failures.get(request.model)
            failure = statuses.pop(0) if statuses else None
            held = self._held and len(self.requests) > self._hold_after
        if held:
            self.arrived.set()
            self._release.wait(60)
        if failure is not None:
            error = {"error": {"type": "overloaded_error", "message": f"fake {failure}"}}
            if api == "anthropic":
                error["type"] = "error"
            return failure, json.dumps(error).encode()
        last = _last_user_text(api, request.body)
        reply = next((r for prefix, r in self.replies.items() if last.startswith(prefix)), None)
        answer = (
            reply
            if reply is not None
            else last
            if self.echo
            else self.script.answer(_assistant_turns(api, request.body))
        )
        body = (_anthropic if api == "anthropic" else _openai)(request, answer)
        result = (200, json.dumps(body).encode())
        with self._lock:
            if request.key is not None:
                self._answers.setdefault(request.key, result)
                result = self._answers[request.key]
        return result


def _usage(request: Request) -> tuple[int, int]:
    return 10 * len(request.body.get("messages", [])), 5


def _openai(request: Request, answer: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(answer, str):
        message["content"] = answer
        finish = "stop"
    else:
        finish = "tool_calls"
        message["tool_calls"] = [
            {
                "id": f"call_{len(request.body['messages'])}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for k, (name, args) in enumerate(answer)
        ]
    prompt, completion = _usage(request)
    return {
        "id": f"chatcmpl-{len(request.body['messages'])}",
        "object": "chat.completion",
        "created": 0,
        "model": request.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _anthropic(request: Request, answer: Turn) -> dict[str, Any]:
    if isinstance(answer, str):
        content: list[dict[str, Any]] = [{"type": "text", "text": answer}]
        stop = "end_turn"
    else:
        stop = "tool_use"
        content = [
            {
                "type": "tool_use",
                "id": f"toolu_{len(request.body['messages'])}_{k}",
                "name": name,
                "input": args,
            }
            for k, (name, args) in enumerate(answer)
        ]
    prompt, completion = _usage(request)
    return {
        "id": f"msg_{len(request.body['messages'])}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion},
    }


@contextmanager
def running(**kwargs: Any) -> Iterator[FakeProvider]:
    fake = FakeProvider(**kwargs).start()
    try:
        yield fake
    finally:
        fake.close()
