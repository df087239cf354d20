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
from wsproto.utilities import generate_accept_token

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024
LOG_POLL_SECONDS = 0.1


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


class ExecSession:
    """One exec: a WebSocket (``rfile``/``wfile`` of the upgraded connection) bound to a process's streams."""

    def __init__(self, rfile: BinaryIO, wfile: BinaryIO, protocol: str) -> None:
        self._rfile, self._wfile = rfile, wfile
        self._ws = Connection(ConnectionType.SERVER)
        self._send_lock = threading.Lock()
        self._v5 = protocol.startswith("v5.")

    def _send_raw(self, data: bytes) -> None:
        with self._send_lock:
            self._wfile.write(data)
            self._wfile.flush()

    def send(self, channel: int, data: bytes) -> None:
        """One binary message on ``channel``."""
        with self._send_lock:
            self._wfile.write(self._ws.send(Message(data=bytes([channel]) + data)))
            self._wfile.flush()

    def run(self, argv: Sequence[str], command: Sequence[str], *, stdin: bool, stdout: bool, stderr: bool,
            tty: bool) -> int:
        """Run ``argv`` (``command`` inside the container) wired to this session; return its exit status once
        the status went out and the WebSocket is closed."""
        if tty:
            master, slave = os.openpty()
            process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,  # noqa: S603
                                       start_new_session=True, preexec_fn=_take_terminal)
            os.close(slave)
            outputs, sink = [(STDOUT, master)], master
        else:
            pipe, none = subprocess.PIPE, subprocess.DEVNULL
            process = subprocess.Popen(argv, stdin=pipe if stdin else none, stdout=pipe if stdout else none,  # noqa: S603
                                       stderr=pipe if stderr else none)
            outputs = [(ch, s.fileno()) for ch, s in ((STDOUT, process.stdout), (STDERR, process.stderr)) if s]
            sink = process.stdin.fileno() if process.stdin else -1
        pumps = [threading.Thread(target=self._pump, args=(ch, fd), daemon=True) for ch, fd in outputs]
        for pump in pumps:
            pump.start()
        reader = threading.Thread(target=self._read_client, args=(process, sink, tty), daemon=True)
        reader.start()
        code = process.wait()
        code = 128 - code if code < 0 else code
        for pump in pumps:
            pump.join()
        if tty:
            os.close(master)
        with contextlib.suppress(OSError):
            self.send(ERROR, json.dumps(exit_status_document(code, command)).encode())
            self._send_raw(self._ws.send(CloseConnection(code=1000)))
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
            try:
                self.send(channel, data)
            except OSError:  # the client left; keep draining so the process is not blocked
                continue

    def _read_client(self, process: subprocess.Popen[bytes], sink: int, tty: bool) -> None:
        """Client messages: stdin data, resizes, stdin close; ends when the connection does (stdin closed then)."""
        pending = b""
        try:
            while True:
                data = self._rfile.read1(CHUNK)  # type: ignore[attr-defined]
                if not data:
                    return
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, Ping):
                        self._send_raw(self._ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        return
                    elif isinstance(event, BytesMessage):
                        pending += bytes(event.data)
                        if event.message_finished:
                            sink = self._message(pending, sink, tty)
                            pending = b""
        except OSError:
            return
        finally:
            if sink >= 0 and not tty:
                with contextlib.suppress(OSError):
                    os.close(sink)

    def _message(self, message: bytes, sink: int, tty: bool) -> int:
        """Act on one client message; the stdin fd afterwards (-1 once closed)."""
        channel, data = message[:1], message[1:]
        if channel == bytes([STDIN]) and sink >= 0 and data:
            with contextlib.suppress(OSError):
                os.write(sink, data) if tty else _write_all(sink, data)
        elif channel == bytes([RESIZE]) and tty and sink >= 0:
            size = json.loads(data or b"{}")
            fcntl.ioctl(sink, termios.TIOCSWINSZ, struct.pack("HHHH", size.get("Height", 24), size.get("Width", 80),
                                                              0, 0))
        elif channel == bytes([CLOSE]) and self._v5 and data[:1] == bytes([STDIN]) and sink >= 0 and not tty:
            os.close(sink)
            return -1
        return sink


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
