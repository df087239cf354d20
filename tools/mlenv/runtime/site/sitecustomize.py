"""Put first on the ranks' PYTHONPATH by mlenv's runtime: arms ``faulthandler`` in the user's training process on
SIGRTMIN+6 (``mlenv stacks`` without ptrace rights) and starts its collective record (which rank is behind in
sequence), then runs the ``sitecustomize`` this one hides (Debian and many images ship one). Standard library only;
never stops the interpreter from starting."""

import faulthandler
import importlib.machinery
import importlib.util
import os
import sys
import threading


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path, the one Python would have imported without us."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _arm() -> None:
    """Dump to $MLENV_FAULTHANDLER_FILE (set by the rank wrapper for the user's process only), after a line naming
    this process and its main thread: every thread's stack on SIGRTMIN+6, the handling thread's alone on SIGRTMIN+7
    (which mlenv sends to the main thread)."""
    path = os.environ.pop("MLENV_FAULTHANDLER_FILE", None)  # not inherited by what the rank starts
    if not path:
        return
    try:
        # here: this module runs in every Python of the user's job, and imports only where it arms the rank
        from mlenv.runtime.forensics.stacks import (  # the one place the signals are chosen
            MAIN_STACK_SIGNAL,
            STACK_SIGNAL,
        )

        os.makedirs(os.path.dirname(path), exist_ok=True)
        dump = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
        dump.write(f"mlenv: pid {os.getpid()} main thread 0x{threading.main_thread().ident:016x}\n")
        faulthandler.register(STACK_SIGNAL, file=dump, all_threads=True, chain=False)
        faulthandler.register(MAIN_STACK_SIGNAL, file=dump, all_threads=False, chain=False)
        _arm.dump = dump  # type: ignore[attr-defined]  # kept open
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        print(f"mlenv: faulthandler not armed: {exc}", file=sys.stderr)


def _record_collectives() -> None:
    """Start the thread that writes this rank's collective progress to $MLENV_COLLECTIVES_FILE (set by the rank
    wrapper for the user's process only)."""
    if "MLENV_COLLECTIVES_FILE" not in os.environ:
        return
    try:
        from mlenv.runtime.forensics.collectives import start_recorder  # here: only where it records (see _arm)

        start_recorder(os.environ)
    except (OSError, ImportError, RuntimeError) as exc:
        print(f"mlenv: collective record not started: {exc}", file=sys.stderr)


_arm()
_record_collectives()
_chain()
