"""Console-script entry point: replay a cached read-only result, else run the click CLI (and cache it)."""

from __future__ import annotations

import sys


def main() -> int:
    """Run ``mlenv`` with ``sys.argv``."""
    from mlenv import fastpath

    argv = sys.argv[1:]
    inputs, cached = fastpath.lookup(argv)
    if cached is not None:
        sys.stderr.write(cached["stderr"])
        sys.stdout.write(cached["stdout"])
        return 0
    from mlenv.cli import main as cli_main

    if inputs is None:
        return _exit_code(cli_main)
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _exit_code(cli_main)
    sys.stderr.write(err.getvalue())
    sys.stdout.write(out.getvalue())
    if code == 0:
        fastpath.store(inputs, out.getvalue(), err.getvalue())
    return code


def _exit_code(cli_main: object) -> int:
    try:
        cli_main()  # type: ignore[operator]
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
