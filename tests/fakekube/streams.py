"""The streaming subresources of a running pod: ``pods/exec`` over WebSocket and ``pods/log`` (with ``follow``).

Exec speaks the channel protocol kubectl 1.30+ uses first, ``v5.channel.k8s.io`` (``v4`` too): every binary
message starts with its channel byte, 0 stdin, 1 stdout, 2 stderr, 3 the final ``metav1.Status`` (with an
``ExitCode`` cause when the command failed), 4 terminal resizes, 255 "this stream is closed" (v5: the client's
``[255, 0]`` closes the command's stdin). The framing is wsproto's; the process runs inside the container
(:meth:`Container.exec_argv`): its exit status is kubectl's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import subprocess
import termios
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Message, Ping
from wsproto.utilities import LocalProtocolError, generate_accept_token

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024
LOG_POLL_SECONDS = 0.1
CLOSE_SECONDS = 5.0
"""How long the client has to answer our close frame before the connection is shut down."""


def choose_protocol(offered: str) -> str | None:
    """The channel protocol to speak, from the client's ``Sec-WebSocket-Protocol`` list (v5 first)."""
    names = [p.strip() for p in offered.split(",")]
    return next((p for p in PROTOCOLS if p in names), None)


def handshake_headers(key: str, protocol: str) -> dict[str, str]:
    """The 101 answer's headers."""
    return {"Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Accept": generate_accept_token(key.encode()).decode(), "Sec-WebSocket-Protocol": protocol}


def exit_status_document(code: int, command: Sequence[str]) -> dict[str, Any]:
    """The channel-3 Status kubectl turns into its own exit code."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command {list(command)}, "
                       f"exit code {code}",
            "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class _Stdin:
    """The command's stdin (a pipe, or the terminal's master side), closed exactly once whoever closes it."""

    def __init__(self, fd: int, owned: bool) -> None:
        self._fd, self._owned, self._lock = fd, owned, threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    _write_all(self._fd, data)

    def resize(self, width: int, height: int) -> None:
        with self._lock:
            if self._fd >= 0:
                fcntl.ioctl(self._fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def close(self) -> None:
        """Close it (a terminal stays open for its output until :meth:`release`)."""
        if self._owned:
            self.release()

    def release(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class ExecSession:
    """One exec: a WebSocket (``rfile``/``wfile`` of the upgraded connection) bound to a process's streams;
    ``hang_up`` shuts the connection down (to end a client that never answers the close)."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO, protocol: str, hang_up: Callable[[], None]) -> None:
        self._rfile, self._wfile, self._hang_up = rfile, wfile, hang_up
        self._ws = Connection(ConnectionType.SERVER)
        self._send_lock = threading.Lock()
        self._v5 = protocol.startswith("v5.")

    def _send_event(self, event: Any) -> None:
        with self._send_lock:
            self._wfile.write(self._ws.send(event))
            self._wfile.flush()

    def send(self, channel: int, data: bytes) -> None:
        """One binary message on ``channel``."""
        self._send_event(Message(data=bytes([channel]) + data))

    def run(self, argv: Sequence[str], command: Sequence[str], *, stdin: bool, stdout: bool, stderr: bool,
            tty: bool) -> int:
        """Run ``argv`` (``command`` inside the container) wired to this session; return its exit status once
        the status went out and the WebSocket is closed."""
        if tty:
            master, slave = os.openpty()
            process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                       start_new_session=True, preexec_fn=_take_terminal)
            os.close(slave)
            outputs, sink = [(STDOUT, master)], _Stdin(master, owned=False)
        else:
            pipe, none = subprocess.PIPE, subprocess.DEVNULL
            process = subprocess.Popen(argv, stdin=pipe if stdin else none, stdout=pipe if stdout else none,
                                       stderr=pipe if stderr else none, bufsize=0)
            outputs = [(ch, s.fileno()) for ch, s in ((STDOUT, process.stdout), (STDERR, process.stderr)) if s]
            sink = _Stdin(os.dup(process.stdin.fileno()) if process.stdin else -1, owned=True)
            if process.stdin:
                process.stdin.close()
        pumps = [threading.Thread(target=self._pump, args=(ch, fd), daemon=True) for ch, fd in outputs]
        reader = threading.Thread(target=self._read_client, args=(sink,), daemon=True)
        for thread in (*pumps, reader):
            thread.start()
        code = process.wait()
        code = 128 - code if code < 0 else code
        for pump in pumps:
            pump.join()
        with contextlib.suppress(OSError, LocalProtocolError):
            self.send(ERROR, json.dumps(exit_status_document(code, command)).encode())
            self._send_event(CloseConnection(code=1000))
        reader.join(CLOSE_SECONDS)
        if reader.is_alive():
            with contextlib.suppress(OSError):
                self._hang_up()
            reader.join()
        sink.release()
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()
        return code

    def _pump(self, channel: int, fd: int) -> None:
        """Copy one output of the process to its channel until EOF (EIO: a terminal whose last writer left)."""
        while True:
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                return
            with contextlib.suppress(OSError, LocalProtocolError):  # the client left: drain, do not block
                self.send(channel, data)

    def _read_client(self, sink: _Stdin) -> None:
        """Client messages: stdin data, resizes, stdin close; ends when the connection does (stdin closed then)."""
        pending = b""
        try:
            while data := self._rfile.read1(CHUNK):  # type: ignore[attr-defined]
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, Ping):
                        self._send_event(event.response())
                    elif isinstance(event, CloseConnection):
                        return
                    elif isinstance(event, BytesMessage):
                        pending += bytes(event.data)
                        if event.message_finished:
                            self._message(pending, sink)
                            pending = b""
        except (OSError, ValueError, LocalProtocolError):  # the connection went away or was shut down
            return
        finally:
            sink.close()

    def _message(self, message: bytes, sink: _Stdin) -> None:
        """Act on one client message."""
        channel, data = message[:1], message[1:]
        if channel == bytes([STDIN]) and data:
            sink.write(data)
        elif channel == bytes([RESIZE]):
            size = json.loads(data or b"{}")
            sink.resize(int(size.get("Width", 80)), int(size.get("Height", 24)))
        elif channel == bytes([CLOSE]) and self._v5 and data[:1] == bytes([STDIN]):
            sink.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _take_terminal() -> None:
    """In the exec'd child: make its terminal (stdin) the controlling one."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def stream_log(write: Callable[[bytes], None], path: Path, ended: threading.Event, follow: bool) -> None:
    """Write the log at ``path``; with ``follow``, keep writing what is appended until its container ended."""
    with path.open("rb") as log:
        while True:
            chunk = log.read(CHUNK)
            if chunk:
                write(chunk)
                continue
            if not follow or ended.is_set():
                rest = log.read()
                if rest:
                    write(rest)
                    continue
                return
            ended.wait(LOG_POLL_SECONDS)
