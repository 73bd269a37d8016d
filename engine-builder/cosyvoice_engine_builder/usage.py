"""An argparse parser that raises :class:`UsageError` instead of printing and exiting.

Both entry points, ``cosyvoice-engine-builder`` (the Jobs) and ``cosyvoice-serve`` (the
serving pods), catch it to also write the termination message, so a typo in a rendered Job
or Deployment shows up in the resource's status and not only in the pod's log.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(Exception):
    """An invalid command line; ``usage`` is the parser's usage line."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class RaisingParser(argparse.ArgumentParser):
    # argparse would print and exit on its own; raising lets main() also write the
    # termination message. Subparsers are of the same class.
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())
