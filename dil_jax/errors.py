"""The one error type the command line reports without a traceback.

Every problem a user can cause — a bad flag or config value, a missing, corrupt or mismatched
file, input the model cannot take — is raised as a `DilJaxError` (or a subclass, where a caller
needs to tell cases apart) whose message names the file / flag / field / value and, where there
is one, the fix. `dil_jax.cli.main` catches `DilJaxError` once and prints the message; anything
else is a bug and keeps its traceback.

Subclasses that describe a bad value also derive from `ValueError`, so library callers that
catch `ValueError` keep working.
"""

from __future__ import annotations

import errno


class DilJaxError(Exception):
    """A problem with the user's input, files, flags or environment; the message names it."""


class UsageError(DilJaxError, ValueError):
    """A command-line flag or config value is out of range or of the wrong type."""


class InputFileError(DilJaxError, ValueError):
    """A file the user gave (or one a manifest names) is missing, unreadable, corrupt or stale."""


class CheckpointError(DilJaxError, ValueError):
    """A checkpoint cannot be found or read, or does not fit the model; the message says which
    file or tensor. (Here, not in `dil_jax.checkpoints`: `dil_jax.hub` raises it too, and the
    tokenizer loads through the hub without importing the checkpoints package.)"""


class OutputPathError(DilJaxError, ValueError):
    """An output location cannot be written, or writing it would destroy an input."""


class BusyError(DilJaxError):
    """Another process holds the lock on a folder this command needs to write."""


class InterruptedRun(DilJaxError):
    """A long run stopped on a signal; the message says how far it got."""


class TrainingDiverged(DilJaxError):
    """Training reached a non-finite (NaN/Inf) loss, gradient norm or params; the message names
    the first such step, the last finite checkpoint and what to change.

    first_step: the first optimizer step whose loss, gradient norm or updated params were not
    finite; last_finite_step: the newest checkpoint of the workdir (None when none was saved).
    """

    def __init__(self, message: str, first_step: int, last_finite_step: int | None):
        super().__init__(message)
        self.first_step = first_step
        self.last_finite_step = last_finite_step


# What a disk says when it refuses a write: errno and its message (tensorstore reports the
# message in its own exception types, without an OSError in the chain).
DISK_REFUSALS = {errno.ENOSPC: "No space left on device", errno.EROFS: "Read-only file system",
                 errno.EFBIG: "File too large", errno.EDQUOT: "Disk quota exceeded"}
# What to do about each, for the messages that name one.
DISK_FIXES = {errno.ENOSPC: "free space on that disk", errno.EROFS: "make that disk writable",
              errno.EFBIG: "raise the file-size limit (ulimit -f)",
              errno.EDQUOT: "free space within your disk quota"}


def disk_refusal(error: BaseException) -> str | None:
    """"No space left on device (ENOSPC)" etc. when `error` or one in its chain is the disk
    refusing a write; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_REFUSALS:
            return f"{DISK_REFUSALS[current.errno]} ({errno.errorcode[current.errno]})"
        reason = disk_refusal_in_text(str(current))
        if reason:
            return reason
        current = current.__cause__ or current.__context__
    return None


def disk_refusal_in_text(text: str) -> str | None:
    """"No space left on device (ENOSPC)" etc. when `text` (a message, a log line) says the
    disk refused a write; None otherwise."""
    for number, message in DISK_REFUSALS.items():
        if message in text:
            return f"{message} ({errno.errorcode[number]})"
    return None


def disk_fix(reason: str) -> str:
    """What to do about `reason` (a `disk_refusal`): a file-size limit is not fixed by freeing
    space."""
    for number, fix in DISK_FIXES.items():
        if reason.endswith(f"({errno.errorcode[number]})"):
            return fix
    return DISK_FIXES[errno.ENOSPC]


def is_late_loop_callback(unraisable) -> bool:
    """Whether an unraisable exception (`sys.unraisablehook`'s argument) is a tensorstore
    operation finishing after orbax closed the event loop waiting for it: tensorstore's thread
    calls `call_soon_threadsafe` on that closed loop ("Event loop is closed", raised where
    nothing can catch it). Orbax closes the loop as soon as one write of a save fails (a full
    disk, a file-size limit) or a restore fails (a damaged checkpoint), and every other write
    or read then in flight prints one such traceback: dozens, pages of them, saying nothing
    about the failure (which is raised, and reported, where orbax was called). It comes from
    orbax + tensorstore alone (a CheckpointManager restoring two damaged steps shows it without
    dil_jax)."""
    import threading
    import traceback

    frames = traceback.extract_tb(unraisable.exc_traceback)
    return (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"
            and threading.current_thread() is not threading.main_thread()
            and any(frame.name == "call_soon_threadsafe" for frame in frames))
