"""A small HTTP/1.1 client on asyncio streams: POST with a JSON body, responses read as they
arrive (chunked transfer encoding, Content-Length or read-to-close), keep-alive connection
reuse, and a Server-Sent Events parser for streaming APIs."""

from __future__ import annotations

import asyncio
import ssl as ssl_module
from typing import AsyncIterator, Dict, List, Optional, Tuple

_MAX_HEADER_LINES = 200
_MAX_ERROR_BODY = 64 * 1024


class HttpError(Exception):
    """A response that is not HTTP/1.x, or a malformed one."""


class Response:
    def __init__(self, status: int, reason: str, headers: Dict[str, str], conn: "_Conn"):
        self.status = status
        self.reason = reason
        self.headers = headers
        self._conn = conn
        self.complete = False  # the body was read to its end

    async def iter_body(self) -> AsyncIterator[bytes]:
        """The body in pieces as they arrive; one piece per chunk for chunked bodies."""
        reader = self._conn.reader
        te = self.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            while True:
                line = await reader.readline()
                if not line:
                    raise HttpError("connection closed inside a chunked body")
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise HttpError(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    for _ in range(_MAX_HEADER_LINES):  # trailers, then the empty line
                        t = await reader.readline()
                        if t in (b"\r\n", b"\n", b""):
                            break
                    self.complete = True
                    return
                data = await reader.readexactly(size)
                await reader.readexactly(2)  # CRLF after the chunk data
                yield data
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            while remaining > 0:
                data = await reader.read(min(65536, remaining))
                if not data:
                    raise HttpError("connection closed before the end of the body")
                remaining -= len(data)
                yield data
            self.complete = True
        else:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                yield data
            self.complete = True
            self._conn.reusable = False

    async def read_body(self, limit: int = _MAX_ERROR_BODY) -> bytes:
        parts: List[bytes] = []
        total = 0
        async for piece in self.iter_body():
            if total < limit:
                parts.append(piece[: limit - total])
            total += len(piece)
        return b"".join(parts)


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.reusable = True
        self.used = False

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (OSError, ssl_module.SSLError):
            pass


class HttpClient:
    """Connections to one host:port, reused while the server keeps them alive."""

    def __init__(self, host: str, port: int, ssl: Optional[ssl_module.SSLContext] = None):
        self.host = host
        self.port = port
        self.ssl = ssl
        self._idle: List[_Conn] = []
        self._open: set = set()

    def _host_header(self) -> str:
        default = 443 if self.ssl else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.ssl, limit=1 << 20,
            server_hostname=self.host if self.ssl else None)
        conn = _Conn(reader, writer)
        self._open.add(conn)
        return conn

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: Optional[Dict[str, str]] = None) -> Tuple[Response, "_Conn"]:
        """Sends the request and reads the status line and headers. Call `release(resp)` when
        done with the body (read to the end, or abandoned)."""
        head = [f"{method} {path} HTTP/1.1", f"Host: {self._host_header()}",
                f"Content-Length: {len(body)}", "Connection: keep-alive"]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        for attempt in range(2):
            conn = self._idle.pop() if self._idle else await self._connect()
            reused = conn.used
            conn.used = True
            try:
                conn.writer.write(data)
                await conn.writer.drain()
                status_line = await conn.reader.readline()
                if not status_line:
                    raise ConnectionResetError("the server closed the connection before answering")
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                self._discard(conn)
                await conn.close()
                if reused and attempt == 0:
                    continue  # a kept-alive connection the server had closed: one fresh try
                raise
            break
        try:
            parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise HttpError(f"not an HTTP/1.x response: {status_line[:60]!r}")
            status = int(parts[1])
            reason = parts[2] if len(parts) > 2 else ""
            hdrs: Dict[str, str] = {}
            for _ in range(_MAX_HEADER_LINES):
                line = await conn.reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, _, v = line.decode("latin-1").partition(":")
                hdrs[k.strip().lower()] = v.strip()
            if hdrs.get("connection", "").lower() == "close" or parts[0] == "HTTP/1.0":
                conn.reusable = False
            return Response(status, reason, hdrs, conn), conn
        except BaseException:
            self._discard(conn)
            await conn.close()
            raise

    def _discard(self, conn: _Conn) -> None:
        self._open.discard(conn)

    async def release(self, resp: Response) -> None:
        conn = resp._conn
        if resp.complete and conn.reusable and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            self._discard(conn)
            await conn.close()

    async def close(self) -> None:
        conns = list(self._open)
        self._open.clear()
        self._idle.clear()
        for conn in conns:
            await conn.close()


class SseParser:
    """Server-Sent Events: `feed(bytes)` returns the `data` of each event completed so far
    (multi-line data joined with newlines); comments and other fields are skipped."""

    def __init__(self):
        self._buf = b""
        self._data: List[str] = []

    def feed(self, data: bytes) -> List[str]:
        self._buf += data
        events: List[str] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            line = self._buf[:nl]
            self._buf = self._buf[nl + 1:]
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line.decode("utf-8", errors="replace"), events)
        return events

    def _line(self, line: str, events: List[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)

    def finish(self) -> List[str]:
        """Events left at the end of the stream (a last line or event without its blank line)."""
        events: List[str] = []
        if self._buf:
            line = self._buf.rstrip(b"\r")
            self._buf = b""
            self._line(line.decode("utf-8", errors="replace"), events)
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events
