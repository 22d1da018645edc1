"""One writer per (work_dir, lang, stage): an advisory lock on `${work_dir}/${lang}/.<stage>.lock`.

Two runs of one stage on one work folder (two terminals, a job array run twice) would share the
partial folder: one would read the other's half-written files or remove them. `stage_lock` takes
`flock(2)` on the lock file for as long as the stage runs; a second run fails at once, naming the
holder's host and pid (written into the file). The kernel drops the lock when its process ends,
however it ends, so a lock left by a killed run (its pid dead) is simply taken over.

Shared file systems: NFS carries flock to the server. Lustre does only when mounted with `-o flock`;
with `-o localflock` the lock holds between the processes of one node only, and without either
option flock fails (ENOSYS). In that last case the lock falls back to the holder written in the
file: a live pid on this host or any holder on another host refuses, a dead pid on this host is
taken over; two runs that start in the same instant are not kept apart, and a holder on another host
that died leaves a file to delete by hand.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import Iterator, Optional

from pipeline.errors import StageError

log = logging.getLogger(__name__)

# What flock(2) fails with where the file system does not support it (Lustre without -o flock, some
# FUSE).
_NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


def lock_path(stage_folder: Path) -> Path:
    return stage_folder.with_name(f".{stage_folder.name}.lock")


def _read_holder(handle) -> Optional[dict]:
    handle.seek(0)
    text = handle.read()
    try:
        holder = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        return None
    return holder if isinstance(holder, dict) else None


def _alive_here(holder: dict) -> bool:
    """Whether the holder is a running process of this host (False for a dead one, True for any
    other host)."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True  # another user's live process, or a record we cannot read: do not take it over
    return True


def _describe(holder: Optional[dict]) -> str:
    if holder is None:
        return "a process that did not say who it is"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('started')}"


@contextlib.contextmanager
def stage_lock(stage_folder: Path, what: str) -> Iterator[None]:
    """Hold the lock of the stage whose output folder is `stage_folder` (`what` names it in
    messages, e.g. "pretrain for nob"); raises StageError at once if another run holds it."""
    path = lock_path(stage_folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            raise StageError(
                f"{what} is already running on this work folder "
                f"({_describe(_read_holder(handle))}; "
                f"lock {path}). Wait for it to finish, or stop that process; two runs of one stage "
                f"would write the same files."
            ) from None
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            locked = False
            log.warning(
                "The file system of %s does not support flock (%s; on Lustre, mount with -o "
                "flock): "
                "only the holder recorded in the lock file keeps a second run of %s out.",
                path,
                os.strerror(error.errno),
                what,
            )
        # A holder recorded in the file: with flock held, one that ended without clearing it
        # (killed).
        previous = _read_holder(handle)
        if not locked and previous is not None and _alive_here(previous):
            raise StageError(
                f"{what} is already running on this work folder ({_describe(previous)}; lock "
                f"{path}, not enforced by the file system). Wait for it to finish; if that run is "
                f"gone, delete {path}."
            ) from None
        if previous is not None:
            log.info(
                "Taking over the lock of an earlier run of %s that ended without releasing it (%s).",
                what,
                _describe(previous),
            )
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
