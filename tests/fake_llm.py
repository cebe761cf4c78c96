"""A fake model provider: a real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions
(``POST /v1/chat/completions``) and Anthropic messages (``POST /v1/messages``) wire formats.

It records every request it receives whole (headers and body; one whose body never arrived,
its sender killed mid-request, is no request), answers a repeated Idempotency-Key with the
first (successful) answer, as a provider would, and is scriptable: ``fail(model, 503)``
makes a model answer errors (``retry_after=`` adds that header, as a rate-limited provider
does), ``hold()`` keeps the next requests in flight until
``release()`` (so a test can kill the caller mid-call), and a ``Script`` decides each answer
from the conversation it is sent, so a re-sent turn gets the same answer.

A Script is a list of turns; turn N (the request's N-th assistant turn to come) answers with
text or with tool calls ``[(tool, arguments), ...]``. Usage is 10 input tokens per message and
5 output tokens per answer; ``window_peak()`` gives the most tokens and requests answered in
any 60 s (what a provider's tokens-per-minute limit counts).

A request with ``"stream": true`` is answered as its API streams: OpenAI's ``chat.completion.chunk``
lines (usage in the last chunk when ``stream_options.include_usage`` asks for it) or
Anthropic's ``message_start`` ... ``message_stop`` events, text a word per chunk, in chunked
transfer encoding, ``chunk_delay`` seconds apart. ``cut(model, after)`` makes the next streamed
answer of ``model`` stop dead after ``after`` text chunks (the connection closed mid-body), as
a provider that falls over mid-answer does.
"""

from __future__ import annotations

import json
import re
import threading
import time
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
    at: float = field(default_factory=time.time)  # when it arrived (wall clock, seconds)

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
    # model -> the headers each of its failures answers with (beside ``failures``)
    failure_headers: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    # (monotonic arrival time, tokens reported) of every answered request
    served: list[tuple[float, int]] = field(default_factory=list)
    _answers: dict[str, Turn] = field(default_factory=dict)  # key -> first successful answer
    chunk_delay: float = 0.0  # seconds between the chunks of a streamed answer
    cuts: dict[str, list[int]] = field(default_factory=dict)  # model -> text chunks before a cut
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
                raw = self.rfile.read(length)
                if len(raw) < length:
                    # The caller died between its headers and its body (a crash test's
                    # SIGKILL): no request arrived, so none is recorded, answered or keyed.
                    # Read as ``{}``, it was once answered as a conversation's first turn and
                    # that answer cached under the key, for the re-sent request to get.
                    self.close_connection = True
                    return
                body = json.loads(raw or b"{}")
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                status, answer, extra = fake._handle(request)
                try:
                    if isinstance(answer, bytes):
                        self.send_response(status)
                        for name, value in extra.items():
                            self.send_header(name, value)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(answer)))
                        self.end_headers()
                        self.wfile.write(answer)
                    else:
                        self._stream(request, answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller died mid-request: the point of the crash tests

            def _stream(self, request: Request, answer: Turn) -> None:
                anthropic = request.path.endswith("/messages")
                frames = (_anthropic_stream if anthropic else _openai_stream)(request, answer)
                with fake._lock:
                    cuts = fake.cuts.get(request.model)
                    cut = cuts.pop(0) if cuts else None
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                texts = 0
                for frame, is_text in frames:
                    if cut is not None and is_text and texts >= cut:
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)  # mid-body: no final chunk
                        return
                    texts += is_text
                    data = frame.encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    if is_text and fake.chunk_delay:
                        time.sleep(fake.chunk_delay)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

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

    def fail(self, model: str, *statuses: int, retry_after: str | None = None) -> None:
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        with self._lock:
            self.failures.setdefault(model, []).extend(statuses)
            self.failure_headers.setdefault(model, []).extend(headers for _ in statuses)

    def window_peak(self, seconds: float = 60.0) -> tuple[int, int]:
        """The most tokens, and the most requests, answered within any ``seconds``."""
        with self._lock:
            served = sorted(self.served)
        tokens = requests = 0
        for i, (start, _) in enumerate(served):
            inside = [t for at, t in served[i:] if at < start + seconds]
            tokens, requests = max(tokens, sum(inside)), max(requests, len(inside))
        return tokens, requests

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

    def cut(self, model: str, after: int) -> None:
        """The next streamed answer of ``model`` breaks off after ``after`` text chunks."""
        with self._lock:
            self.cuts.setdefault(model, []).append(after)

    def keys(self) -> list[str | None]:
        """Every request's Idempotency-Key, in arrival order."""
        with self._lock:
            return [r.key for r in self.requests]

    def calls(self, model: str | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if model is None or r.model == model]

    # --- answering -----------------------------------------------------------------------
    def _handle(self, request: Request) -> tuple[int, bytes | Turn, dict[str, str]]:
        """The status and the JSON body, or, for a streamed request, the answer to stream;
        and the headers to add to an error."""
        api = "anthropic" if request.path.endswith("/messages") else "openai"
        streamed = bool(request.body.get("stream"))
        with self._lock:
            self.requests.append(request)
            if request.key is not None and request.key in self._answers:
                self.served.append((time.monotonic(), sum(_usage(request))))
                answer = self._answers[request.key]
                return 200, self._rendered(api, request, answer, streamed), {}
            statuses = self.failures.get(request.model)
            failure = statuses.pop(0) if statuses else None
            headers = self.failure_headers.get(request.model) or [{}]
            extra = headers.pop(0) if failure is not None and headers else {}
            held = self._held and len(self.requests) > self._hold_after
        if held:
            self.arrived.set()
            self._release.wait(60)
        if failure is not None:
            error: dict[str, Any] = {
                "error": {"type": "overloaded_error", "message": f"fake {failure}"}
            }
            if api == "anthropic":
                error["type"] = "error"
            return failure, json.dumps(error).encode(), extra
        last = _last_user_text(api, request.body)
        reply = next((r for prefix, r in self.replies.items() if last.startswith(prefix)), None)
        answer = (
            reply
            if reply is not None
            else last
            if self.echo
            else self.script.answer(_assistant_turns(api, request.body))
        )
        with self._lock:
            if request.key is not None:
                answer = self._answers.setdefault(request.key, answer)
            self.served.append((time.monotonic(), sum(_usage(request))))
        return 200, self._rendered(api, request, answer, streamed), {}

    @staticmethod
    def _rendered(api: str, request: Request, answer: Turn, streamed: bool) -> bytes | Turn:
        if streamed:
            return answer
        return json.dumps((_anthropic if api == "anthropic" else _openai)(request, answer)).encode()


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


Frame = tuple[str, bool]  # (the bytes of one SSE frame, whether it carries answer text)


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text) or [""]


def _sse(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _openai_stream(request: Request, answer: Turn) -> list[Frame]:
    """What OpenAI's chat completions stream for ``answer``: one chunk per word or tool call,
    then the finish, then (when asked for) a chunk with the usage and no choices."""
    base = {
        "id": f"chatcmpl-{len(request.body['messages'])}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": request.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse({**base, "choices": [choice]})

    frames: list[Frame] = [(chunk({"role": "assistant", "content": ""}), False)]
    if isinstance(answer, str):
        frames += [(chunk({"content": w}), True) for w in _words(answer)]
        finish = "stop"
    else:
        finish = "tool_calls"
        for k, (name, args) in enumerate(answer):
            call_id = f"call_{len(request.body['messages'])}_{k}"
            text = json.dumps(args)
            head = {"index": k, "id": call_id, "type": "function"}
            frames.append(
                (
                    chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}),
                    False,
                )
            )
            half = len(text) // 2  # arguments arrive in pieces
            for piece in (text[:half], text[half:]):
                frames.append(
                    (chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}), False)
                )
    frames.append((chunk({}, finish), False))
    if (request.body.get("stream_options") or {}).get("include_usage"):
        prompt, completion = _usage(request)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        frames.append((_sse({**base, "choices": [], "usage": usage}), False))
    frames.append(("data: [DONE]\n\n", False))
    return frames


def _anthropic_stream(request: Request, answer: Turn) -> list[Frame]:
    """What Anthropic's messages API streams for ``answer``."""
    prompt, completion = _usage(request)
    message: dict[str, Any] = {
        "id": f"msg_{len(request.body['messages'])}",
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    frames: list[Frame] = [
        (_sse({"type": "message_start", "message": message}, "message_start"), False)
    ]
    if isinstance(answer, str):
        block: dict[str, Any] = {"type": "text", "text": ""}
        frames.append(
            (
                _sse(
                    {"type": "content_block_start", "index": 0, "content_block": block},
                    "content_block_start",
                ),
                False,
            )
        )
        for w in _words(answer):
            delta = {"type": "text_delta", "text": w}
            frames.append(
                (
                    _sse(
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                        "content_block_delta",
                    ),
                    True,
                )
            )
        frames.append(
            (_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"), False)
        )
        stop = "end_turn"
    else:
        stop = "tool_use"
        for k, (name, args) in enumerate(answer):
            block = {
                "type": "tool_use",
                "id": f"toolu_{len(request.body['messages'])}_{k}",
                "name": name,
                "input": {},
            }
            frames.append(
                (
                    _sse(
                        {"type": "content_block_start", "index": k, "content_block": block},
                        "content_block_start",
                    ),
                    False,
                )
            )
            text = json.dumps(args)
            half = len(text) // 2
            for piece in (text[:half], text[half:]):
                delta = {"type": "input_json_delta", "partial_json": piece}
                frames.append(
                    (
                        _sse(
                            {"type": "content_block_delta", "index": k, "delta": delta},
                            "content_block_delta",
                        ),
                        False,
                    )
                )
            frames.append(
                (_sse({"type": "content_block_stop", "index": k}, "content_block_stop"), False)
            )
    end = {
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": completion},
    }
    frames.append((_sse(end, "message_delta"), False))
    frames.append((_sse({"type": "message_stop"}, "message_stop"), False))
    return frames


@contextmanager
def running(**kwargs: Any) -> Iterator[FakeProvider]:
    fake = FakeProvider(**kwargs).start()
    try:
        yield fake
    finally:
        fake.close()
