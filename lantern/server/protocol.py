"""uvicorn's HTTP protocol with a bound on a request's head (its request line and headers).

uvicorn picks its httptools protocol when httptools is installed (``uvicorn[standard]``), and
that one reads a request's head however long it grows: its ``h11_max_incomplete_event_size``
applies to the h11 protocol only. Measured: a `lantern serve` answered 200 to a request with a
2 MiB header, so a client could make the server buffer as much as it cared to send. Here a head
longer than ``MAX_HEAD_BYTES`` is answered 431 (problem+json) and its connection closed, after
at most one read past the bound (two for a request pipelined behind another). A body is
bounded elsewhere (``lantern.server.limits``).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lantern.server.problems import problem

MAX_HEAD_BYTES = 16 * 1024  # what h11's default bound is, and nginx's large header buffers'


class BoundedHttpProtocol(HttpToolsProtocol):
    _head = 0  # bytes of the current request read before its headers were complete
    _in_body = False  # its headers are complete
    _ended = False  # a request ended within the read being parsed

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head = 0
        self._in_body = False

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._in_body = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._ended = True

    def data_received(self, data: bytes) -> None:
        self._ended = False
        super().data_received(data)
        # Counted after the parser had them: the headers may have completed within this read,
        # and then the rest of it is body. Otherwise every byte of it is head, unless a request
        # before it ended within the read (pipelined): how much of the read was that one's is
        # not known, so the new head's count starts with the next read (one read later).
        if self._in_body or self._ended or self.transport.is_closing():
            return
        self._head += len(data)
        if self._head > MAX_HEAD_BYTES:
            self._refuse()

    def _refuse(self) -> None:
        detail = f"a request's line and headers are at most {MAX_HEAD_BYTES // 1024} KiB"
        answer = problem(431, detail)
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/problem+json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(answer.body), answer.body)
        )
        self.transport.close()
