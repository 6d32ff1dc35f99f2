"""``flashlight-fold``'s messages, through Python's ``logging`` (logger ``flashlight.fold``).

On the console, INFO messages go to stdout and warnings and errors to stderr, as plain
text (the messages name their level: ``warning:``, ``error:``); ``--quiet`` drops the
INFO ones. Console lines go through ``tqdm.write`` so they do not break progress bars
(which are drawn only on a terminal). Once the output folder is claimed, every message
is also appended to ``<out_dir>/flashlight-fold.log`` with a timestamp, its level and
the worker, after one header line per run naming the command and run id.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from typing import Iterator, List, Optional

LOGGER = "flashlight.fold"
LOG_NAME = "flashlight-fold.log"
log = logging.getLogger(LOGGER)


class _Console(logging.Handler):
    """Plain messages to stdout (below WARNING) or stderr, through ``tqdm.write``."""

    def __init__(self, quiet: bool, prefix: str):
        super().__init__(logging.WARNING if quiet else logging.INFO)
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "file_only", False):
            return
        try:
            from tqdm import tqdm

            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            text = record.getMessage()
            if self.prefix:
                text = "\n".join(self.prefix + line for line in text.splitlines())
            tqdm.write(text, file=stream)
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must not end the run
            self.handleError(record)


@contextlib.contextmanager
def console(quiet: bool, worker: int, workers: int) -> Iterator[logging.Logger]:
    """Send ``flashlight.fold`` messages to the console for the block."""
    handler = _Console(quiet, f"[worker {worker}] " if workers > 1 else "")
    saved = (log.level, log.propagate)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def add_log_file(out_dir: str, argv: List[str], run_id: Optional[str], worker: int) -> Optional[logging.Handler]:
    """Append the run's messages to ``<out_dir>/flashlight-fold.log`` (INFO and up);
    returns the handler (for :func:`remove_log_file`), or None when it cannot be opened."""
    try:
        handler = logging.FileHandler(os.path.join(out_dir, LOG_NAME), mode="a", encoding="utf-8")
    except OSError as err:
        log.warning(f"warning: cannot write {os.path.join(out_dir, LOG_NAME)}: {err.strerror or err}")
        return None
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)-7s [worker {worker}] %(message)s", "%Y-%m-%d %H:%M:%S"
    ))
    log.addHandler(handler)
    if worker == 0:
        command = " ".join(["flashlight-fold"] + list(argv))
        log.info(f"run {run_id}: {command} (pid {os.getpid()} on {socket.gethostname()})",
                 extra={"file_only": True})
    return handler


def remove_log_file(handler: Optional[logging.Handler]) -> None:
    """Stop writing the log file of :func:`add_log_file`."""
    if handler is not None:
        log.removeHandler(handler)
        handler.close()
