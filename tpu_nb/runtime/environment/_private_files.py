"""Files tpu_nb writes into the shared temp directory: private to this user, removed when done.

The compile-cause log names the user's files and functions, and torch_xla opens it by path at
every compile, for the life of the process. On a shared host (a JupyterHub, a university
server) anyone can create `/tmp/tpu_nb-<uid>` first, or re-create it after a tmp cleaner
removed ours, so nothing found there is trusted: the directory must be a real directory (not a
symlink) owned by this user and closed to everyone else, and the log file is created by us,
0600, without following a symlink. When the usual directory fails that check, a fresh `mkdtemp`
one is used instead and the user is told why.

The file is then held open, and torch_xla is given `/proc/self/task/<pid>/fd/<n>` instead of
its name: opening that reaches the very file we created, whatever happens to its directory
afterwards (removed, re-created by someone else, a symlink planted at the name). And it reaches
it from this process only: `/proc/self` is whoever opens the path, and `task/<pid>` (this
process's main thread) exists in no other process. A child process inherits PT_XLA_DEBUG_FILE
until this process's first compile (torch_xla reads it then, and there is no call that makes it
read it sooner); the child's torch_xla, forked or started anew, then finds no such file and
writes its compile analysis nowhere, instead of into this process's log (as the plain
`/proc/<pid>/fd/<n>` let it: same user). Where /proc is missing, torch_xla gets the name, and
the metrics layer re-creates the file when a read finds it gone.

Cleanup: this process's log is removed at interpreter exit; logs of processes that no longer
exist are swept when `setup()` prepares a new one.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
import time
from contextlib import suppress

from tpu_nb.runtime.errors import EnvironmentProblem

LOG_NAME = re.compile(r"^compile-analysis-(\d+)\.log$")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# pid -> (directory, note): the directory this process uses, and why it is not the usual one.
_chosen: dict[int, tuple[str, str | None]] = {}
_removed_at_exit: set[str] = set()
_exited: dict[str, int] = {}  # logs removed at exit -> by which process
# `/proc/self/task/<pid>/fd/<n>` given to torch_xla -> (the log's name, n): held open for the
# process.
_held: dict[str, tuple[str, int]] = {}
# A descriptor path another process gave its torch_xla (older tpu_nb: without `self/task/`).
_PINNED = re.compile(r"^/proc/(?:self/task/)?(\d+)/fd/\d+$")


def usual_dir() -> str:
    """`$TMPDIR/tpu_nb-<uid>`: where this user's compile logs go when it is safe."""
    return os.path.join(tempfile.gettempdir(), f"tpu_nb-{os.getuid()}")


def _open_private(path: str) -> tuple[int | None, str | None]:
    """An fd on `path` if it is a directory of ours that no one else can use, else why not.
    Our own directory with only read/search bits open to others (older tpu_nb made it 0755)
    is closed to 0700; one writable by others may hold anything and is not used."""
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as exc:
        if os.path.islink(path):
            return None, "is a symbolic link"
        if os.path.exists(path) and not os.path.isdir(path):
            return None, "is not a directory"
        return None, f"cannot be opened ({exc.strerror})"
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        problem = f"is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    elif info.st_mode & 0o077:
        os.fchmod(fd, 0o700)
    if problem:
        os.close(fd)
        return None, problem
    return fd, None


def private_dir() -> tuple[str, str | None]:
    """This process's directory for its logs, and a note when it is not the usual one."""
    chosen = _chosen.get(os.getpid())
    if chosen is not None and os.path.isdir(chosen[0]):
        return chosen
    path = usual_dir()
    with suppress(OSError):  # it exists, or cannot be made: _open_private says which
        os.mkdir(path, 0o700)
    fd, problem = _open_private(path)
    note = None
    if fd is None:
        fresh = tempfile.mkdtemp(prefix=f"tpu_nb-{os.getuid()}-")  # 0700, random name
        note = (
            f"{path} {problem}: it was not used; the compile log of this process is in "
            f"{fresh} instead (removed at exit). Fix: remove that directory, or make it "
            "yours with mode 0700, to get rid of this note"
        )
        atexit.register(_remove_dir, fresh, os.getpid())
        path = fresh
    else:
        os.close(fd)
    _chosen[os.getpid()] = (path, note)
    return path, note


def default_log_path() -> str:
    """A per-process compile-cause log in this user's private directory."""
    folder, _ = private_dir()
    return os.path.join(folder, f"compile-analysis-{os.getpid()}.log")


def prepare_log(path: str) -> tuple[str, list[str]]:
    """Create the compile log before torch_xla opens it (as the module docstring says); return
    the path to give torch_xla (PT_XLA_DEBUG_FILE) and notes for the user. A stale file of
    ours (an earlier process with this pid) is replaced; a path the user chose elsewhere is
    created 0600 if missing, and handed over by name."""
    folder, note = private_dir()
    try:
        if os.path.dirname(path) != folder:
            _prepare_chosen(path)
            return path, []
        fd, problem = _open_private(folder)
        if fd is None:  # changed under us since private_dir() checked it
            raise OSError(0, f"{folder} {problem}")
        try:
            _sweep_dead_logs(fd)
            log_fd = _create_private(os.path.basename(path), fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create the compile log {path}: {exc.strerror or exc}. Fix: "
            "debug_file='<a file in a directory of yours>', or "
            "compile_analysis=False."
        ) from None
    given = _pin(log_fd, path)
    if path not in _removed_at_exit:
        _removed_at_exit.add(path)
        atexit.register(remove_log, path, os.getpid())
    return given, [note] if note else []


def _pin(fd: int, path: str) -> str:
    """`/proc/self/task/<pid>/fd/<fd>` when it reaches the file `fd` holds (the fd stays open
    for the life of the process), else `path` (the fd is closed)."""
    pinned = f"/proc/self/task/{os.getpid()}/fd/{fd}"  # reachable from this process only
    try:
        held, seen = os.fstat(fd), os.stat(pinned)
        if (held.st_dev, held.st_ino) == (seen.st_dev, seen.st_ino):
            _held[pinned] = (path, fd)
            return pinned
    except OSError:
        pass
    os.close(fd)
    return path


def held_fd(path: str) -> int | None:
    """The descriptor held for a handed-over log path (inherited as is by a forked child)."""
    return _held.get(path, (path, None))[1]


def log_name(path: str) -> str:
    """The name a handed-over log was created under (for messages), else `path` itself."""
    return _held.get(path, (path, None))[0]


def inherited_from_another_process(path: str | None) -> bool:
    """Whether `path` is a log descriptor of another process (`/proc/self/task/<pid>/fd/<n>`
    in an inherited environment): its file is that process's, not one to log into."""
    match = _PINNED.match(path or "")
    return match is not None and int(match.group(1)) != os.getpid()


def _create_private(name: str, dir_fd: int, *, replace: bool = True) -> int:
    """Create `name` 0600 in the directory `dir_fd`, never through a symlink: its fd (-1 when
    it exists and `replace` is False)."""
    try:
        fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    except FileExistsError:  # only we can write here: our own stale file
        if not replace:
            return -1
        os.unlink(name, dir_fd=dir_fd)
        fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    os.fchmod(fd, 0o600)  # whatever the umask says, torch_xla must be able to write
    return fd


def _prepare_chosen(path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    if os.path.islink(path):
        return  # the user's own link: torch_xla opens it as given
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)


def ensure_log(path: str) -> bool:
    """Re-create our log after something removed it (a tmp cleaner, a user clearing /tmp),
    before torch_xla recreates it with default permissions. False if it is not ours to make."""
    if path in _removed_at_exit and _exited.get(path) == os.getpid():
        return False  # removed by us at exit: stays removed
    folder, _ = private_dir()
    if os.path.dirname(path) != folder:
        return False
    with suppress(OSError):
        os.mkdir(folder, 0o700)
    fd, _ = _open_private(folder)
    if fd is None:
        return False
    try:
        made = _create_private(os.path.basename(path), fd, replace=False)
    except OSError:
        return False
    finally:
        os.close(fd)
    if made >= 0:
        os.close(made)
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        pass
    return True


def _sweep_dead_logs(dir_fd: int) -> None:
    for name in os.listdir(dir_fd):
        match = LOG_NAME.match(name)
        if match and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1))):
            with suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)


def remove_log(path: str, owner: int) -> None:
    """At exit: remove this process's log (not in a forked child, whose exit is not ours)."""
    if os.getpid() != owner:
        return
    _exited[path] = owner
    held = next((fd for name, fd in _held.values() if name == path), None)
    with suppress(OSError):
        if held is not None:  # only the file we hold: the name may be someone else's now
            ours, there = os.fstat(held), os.lstat(path)
            if (ours.st_dev, ours.st_ino) != (there.st_dev, there.st_ino):
                return
        os.unlink(path)


def _remove_dir(path: str, owner: int) -> None:
    if os.getpid() != owner:
        return
    shutil.rmtree(path, ignore_errors=True)


def sweep_dead_runs(prefix: str, stale_unnamed: float | None = None) -> None:
    """Remove the run directories that processes left when they died without removing theirs
    (a host stopped by the launch is killed, not asked; a kernel killed mid-launch): named
    `prefix` + the pid of a process that no longer runs — or, with `stale_unnamed`, made by an
    older tpu_nb without a pid in the name and untouched for that many seconds."""
    folder = tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        match = re.match(re.escape(prefix) + r"(\d+)-", name)
        if match and pid_alive(int(match.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
            continue
        if match or (
            stale_unnamed is not None and time.time() - _last_touched(path, info) > stale_unnamed
        ):
            shutil.rmtree(path, ignore_errors=True)


def _last_touched(path: str, info: os.stat_result) -> float:
    newest = info.st_mtime
    with suppress(OSError):
        for entry in os.scandir(path):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest
