"""The ``gpvi`` command as a process: one-line warnings, Ctrl-C (:func:`install_sigint`), a reader of its output
that goes away (:func:`closed_pipe_status`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

__all__ = ["Abort", "one_line_warning", "install_sigint", "closed_pipe_status"]


class Abort(BaseException):
    """A second Ctrl-C: not a KeyboardInterrupt, so no library catches it."""


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` of the command: the first line of the message, on stderr."""
    text = str(message).strip().splitlines()[0] if str(message).strip() else ""
    print(f"gpvi: warning: {category.__name__}: {text}", file=sys.stderr)


def install_sigint(state: list[bool]) -> Any:
    """Ctrl-C: the first raises KeyboardInterrupt (engines stop and warn) and is remembered; a second aborts."""
    def handler(signum: int, frame: Any) -> None:
        if state:
            raise Abort()
        state.append(True)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGINT, handler)
    except (ValueError, OSError):       # pragma: no cover - embedded interpreters without signal support
        return None


def closed_pipe_status() -> int:
    """After a ``BrokenPipeError`` on stdout (``gpvi ... | head`` closed its end): stdout is pointed at
    ``os.devnull``, so that the interpreter's last flush at exit writes nowhere instead of printing another error
    (Python docs, "Note on SIGPIPE"), and the exit status is 128 + SIGPIPE, that of a command SIGPIPE ended
    (1 where there is no SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):      # a stdout without a file descriptor (e.g. captured)
        pass
    return 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1
