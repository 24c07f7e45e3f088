"""The ``gpvi`` command as a process: one-line warnings, Ctrl-C (:func:`install_sigint`)."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

__all__ = ["Abort", "one_line_warning", "install_sigint"]


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
