"""Files tpu_nb leaves in the temp directory: private to the user, safe from a second local
user, removed when done.

The attacks run as a real second uid (created with useradd, commands run through setpriv), in a
sticky world-writable directory standing in for /tmp (TMPDIR), so nothing here touches the
real /tmp/tpu_nb-<uid> that other kernels on this machine use. Without root (or without
useradd/setpriv) those tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile

import pytest

OTHER = "tpu_nb_other"
pytestmark = pytest.mark.timeout(240)

# The victim: sets up, compiles twice in a tracked block, reports what it used.
VICTIM = """
import json, os, stat, sys, tpu_nb, torch, torch_xla
before = globals().get("before_setup")
if before: before()
env = tpu_nb.setup("cpu")
path = env.debug_file  # the file's name (torch_xla is given /proc/<pid>/fd/<n> where it can)
with tpu_nb.track() as report:
    x = torch.ones(4, device=torch_xla.device()) * 3
    torch_xla.sync()
    (x + 1).sum().item()
mode = lambda p: oct(stat.S_IMODE(os.lstat(p).st_mode))
print("RESULT", json.dumps({
    "path": path, "dir": os.path.dirname(path), "dir_mode": mode(os.path.dirname(path)),
    "file_mode": mode(path), "regular": stat.S_ISREG(os.lstat(path).st_mode),
    "notes": list(env.applied), "pid": os.getpid(),
    "causes": [e.cause for e in report.compile_events],
    "compiles": report.metrics.compiles}))
"""


def _result(proc) -> dict:
    return json.loads(proc.stdout.split("RESULT", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def other_user():
    """A second local user (uid, gid), created if needed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user (useradd) and act as it")
    if not (shutil.which("useradd") and shutil.which("setpriv")):
        pytest.skip("needs useradd and setpriv (util-linux) to act as a second local user")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            pytest.skip(f"useradd failed: {made.stderr.strip()}")
    entry = pwd.getpwnam(OTHER)
    return entry.pw_uid, entry.pw_gid


def enterable_tmp() -> str:
    """The temp folder, when a second user can reach into it (every folder on its path open
    to others, as /tmp is); else /tmp: a private TMPDIR (mode 0700) would stop that user at
    its door, not at the check under test. Tests remove what they make there."""
    folder = tempfile.gettempdir()
    path = folder
    while True:
        if not os.stat(path).st_mode & 0o001:
            return "/tmp"
        parent = os.path.dirname(path)
        if parent == path:
            return folder
        path = parent


def as_other(user, *command: str) -> subprocess.CompletedProcess:
    uid, gid = user
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *command],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture
def shared_tmp():
    """A stand-in for /tmp: world-writable with the sticky bit."""
    path = tempfile.mkdtemp(prefix="tpu_nb_shared_tmp_", dir=enterable_tmp())
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _usual(shared_tmp: str) -> str:
    return os.path.join(shared_tmp, f"tpu_nb-{os.getuid()}")


def test_log_is_private_by_default_and_other_users_cannot_read_it(py, shared_tmp, other_user):
    script = (
        VICTIM
        + """
import subprocess
seen = subprocess.run(["setpriv", "--reuid={}", "--regid={}", "--clear-groups", "cat", path],
                      capture_output=True, text=True)
print("OTHER", seen.returncode, "Compilation Analysis" in seen.stdout)
""".format(*other_user)
    )
    proc = py(script, env={"TMPDIR": shared_tmp})
    got = _result(proc)
    assert got["dir"] == _usual(shared_tmp)
    assert (got["dir_mode"], got["file_mode"], got["regular"]) == ("0o700", "0o600", True)
    assert got["compiles"] >= 1 and len(got["causes"]) == got["compiles"]
    assert "OTHER 1 False" in proc.stdout  # the second user is refused
    assert not os.path.exists(got["path"])  # removed when the process exited


def test_directory_owned_by_another_user_is_not_used(py, shared_tmp, other_user):
    usual = _usual(shared_tmp)
    assert as_other(other_user, "mkdir", "-m", "0777", usual).returncode == 0
    got = _result(py(VICTIM, env={"TMPDIR": shared_tmp}))
    assert got["dir"] != usual and os.path.basename(got["dir"]).startswith(f"tpu_nb-{os.getuid()}-")
    assert (got["dir_mode"], got["file_mode"]) == ("0o700", "0o600")
    note = " ".join(got["notes"])
    assert f"{usual} belongs to uid {other_user[0]}" in note and "Fix:" in note
    assert os.listdir(usual) == []  # nothing of ours landed in their directory
    assert not os.path.exists(got["dir"])  # the fresh directory removed at exit
    assert got["compiles"] >= 1 and len(got["causes"]) == got["compiles"]


def _fill(template: str, *values) -> str:
    """A test script with values filled in by %: its own f-strings keep their {} braces."""
    return template % values  # noqa: UP031  str.format would need every brace doubled


def test_symlink_planted_at_the_log_path_is_not_followed(py, shared_tmp, other_user, tmp_path):
    """The second user owns the usual directory and, having guessed the pid, links the log
    path to a file of the victim's; and the victim's own directory holds a stale link."""
    usual = _usual(shared_tmp)
    assert as_other(other_user, "mkdir", "-m", "0755", usual).returncode == 0
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    script = (
        _fill(
            """
import os, subprocess
def before_setup():
    link = os.path.join(%r, f"compile-analysis-{os.getpid()}.log")
    subprocess.run(["setpriv", "--reuid=%d", "--regid=%d", "--clear-groups", "ln", "-s",
                    %r, link], check=True)
""",
            usual,
            *other_user,
            str(precious),
        )
        + VICTIM
    )
    got = _result(py(script, env={"TMPDIR": shared_tmp}))
    assert precious.read_text() == "keep me\n"
    assert got["dir"] != usual and got["regular"]

    # Our own private directory with a link left at the path (only we or root could put it
    # there): the link is replaced by a new file, its target untouched.
    os.rmdir(usual) if not os.listdir(usual) else shutil.rmtree(usual)
    os.mkdir(usual, 0o700)
    script = (
        _fill(
            """
import os
def before_setup():
    os.symlink(%r, os.path.join(%r, f"compile-analysis-{os.getpid()}.log"))
""",
            str(precious),
            usual,
        )
        + VICTIM
    )
    got = _result(py(script, env={"TMPDIR": shared_tmp}))
    assert got["dir"] == usual and got["regular"] and got["file_mode"] == "0o600"
    assert precious.read_text() == "keep me\n"


def test_world_writable_log_with_a_forged_block_is_not_read(py, shared_tmp, other_user):
    usual = _usual(shared_tmp)
    forged = (
        "Compilation Analysis: " + "=" * 40 + "\nCompilation Analysis: Compilation "
        "Cause\nCompilation Analysis:   FORGED by another user\nCompilation Analysis: "
        + "=" * 40
        + "\n"
    )
    script = (
        _fill(
            """
import os, subprocess
def before_setup():
    log = os.path.join(%r, f"compile-analysis-{os.getpid()}.log")
    run = ["setpriv", "--reuid=%d", "--regid=%d", "--clear-groups"]
    subprocess.run(run + ["mkdir", "-m", "0777", %r], check=True)
    subprocess.run(run + ["sh", "-c", 'umask 0; cat > "$0"', log], input=%r, text=True,
                   check=True)
""",
            usual,
            *other_user,
            usual,
            forged,
        )
        + VICTIM
    )
    got = _result(py(script, env={"TMPDIR": shared_tmp}))
    assert got["dir"] != usual
    assert got["causes"] and not any("FORGED" in c for c in got["causes"])
    (planted,) = os.listdir(usual)
    with open(os.path.join(usual, planted)) as f:
        assert f.read() == forged  # nothing of ours was appended


def test_own_directory_from_an_older_version_is_closed_and_dead_logs_swept(py, shared_tmp):
    usual = _usual(shared_tmp)
    os.mkdir(usual)
    os.chmod(usual, 0o755)  # what tpu_nb made before: readable by all
    stale = [os.path.join(usual, "compile-analysis-999999999.log")]  # no such process
    stale.append(os.path.join(usual, f"compile-analysis-{os.getpid()}.log"))  # alive: kept
    for path in stale:
        with open(path, "w") as f:
            f.write("old\n")
    got = _result(py(VICTIM, env={"TMPDIR": shared_tmp}))
    assert got["dir"] == usual and got["dir_mode"] == "0o700"
    assert not os.path.exists(stale[0]) and os.path.exists(stale[1])
    assert os.listdir(usual) == [os.path.basename(stale[1])]  # the victim's own log removed


def test_user_chosen_debug_file_is_created_private(py, tmp_path):
    chosen = tmp_path / "logs" / "analysis.log"
    out = py(f"""
        import os, stat, tpu_nb
        tpu_nb.setup("cpu", debug_file={str(chosen)!r})
        print(oct(stat.S_IMODE(os.stat({str(chosen)!r}).st_mode)))
    """).stdout.split()
    assert out[-1] == "0o600"
    assert chosen.exists()  # the user's own file: kept at exit
    assert stat.S_IMODE(os.stat(chosen.parent).st_mode) == 0o700


# After the victim's first compile a tmp cleaner removes its directory; the second user
# re-creates it and plants, at the log's name (the pid is public), a file anyone can read, then
# a symlink to a 0600 file of the victim's. The victim compiles in a tracked block and in plain
# code between each step.
TAKEOVER = """
import json, os, shutil, subprocess, sys, tpu_nb, torch, torch_xla
env = tpu_nb.setup("cpu")
name, given = env.debug_file, os.environ["PT_XLA_DEBUG_FILE"]
run = ["setpriv", "--reuid=%d", "--regid=%d", "--clear-groups"]
dev = torch_xla.device()
shape = [2]
def compile_some():
    with tpu_nb.track() as report:
        shape[0] += 1
        (torch.ones(shape[0], device=dev) * 2).sum().item()
    shape[0] += 1
    torch.ones(shape[0], device=dev).sum().item()       # a plain compile, outside tracking
    return [report.metrics.compiles, len(report.compile_events), report.compile_log_problem]
out = {"given": given, "first": compile_some()}
shutil.rmtree(os.path.dirname(name))                     # rm -rf /tmp/* by a tmp cleaner
subprocess.run(run + ["mkdir", "-m", "0777", os.path.dirname(name)], check=True)
subprocess.run(run + ["sh", "-c", 'umask 0; : > "$0"', name], check=True)
out["readable"] = compile_some()
out["planted bytes"] = os.path.getsize(name)
subprocess.run(run + ["rm", "-f", name], check=True)
subprocess.run(run + ["ln", "-s", %r, name], check=True)
out["symlink"] = compile_some()
seen = subprocess.run(run + ["cat", given], capture_output=True, text=True)
out["other reads given"] = seen.returncode == 0 and "Compilation" in seen.stdout
print("RESULT", json.dumps(out))
"""


def test_log_cannot_be_taken_over_after_its_directory_is_removed(py, shared_tmp, other_user):
    if not os.path.isdir(f"/proc/{os.getpid()}/fd"):
        pytest.skip("no /proc/<pid>/fd here: the log is given to torch_xla by name")
    precious = os.path.join(shared_tmp, "precious.txt")
    with open(precious, "w") as f:
        f.write("keep me\n")
    os.chmod(precious, 0o600)
    got = _result(py(_fill(TAKEOVER, *other_user, precious), env={"TMPDIR": shared_tmp}))
    assert got["planted bytes"] == 0  # nothing of the victim's landed in the planted file
    with open(precious) as f:
        assert f.read() == "keep me\n"  # nor through the planted symlink
    for step in ("first", "readable", "symlink"):
        compiles, events, problem = got[step]
        assert compiles == 1 and events == 1 and not problem, (step, got[step])
    assert not got["other reads given"]  # the descriptor's path is closed to other users
    assert got["given"].startswith("/proc/"), got["given"]


def test_log_by_name_where_there_is_no_proc(py, shared_tmp):
    """Without /proc/<pid>/fd (simulated), torch_xla gets the file's name, as before."""
    out = py(
        """
        from tpu_nb.runtime.environment import _private_files as private_files
        private_files._pin = lambda fd, path: (__import__("os").close(fd), path)[1]
        import os, tpu_nb, torch, torch_xla
        env = tpu_nb.setup("cpu")
        with tpu_nb.track() as report:
            torch.ones(3, device=torch_xla.device()).sum().item()
        from tpu_nb.runtime.backend import current  # in effect, kept from children
        print("RESULT", current().process.settings()["PT_XLA_DEBUG_FILE"] == env.debug_file,
              len(report.compile_events), report.metrics.compiles)
        """,
        env={"TMPDIR": shared_tmp},
    ).stdout
    assert out.split("RESULT", 1)[1].split() == ["True", "1", "1"]


def test_a_child_tpu_nb_process_logs_to_a_file_of_its_own(py, shared_tmp):
    """A child started before its parent's first compile inherits PT_XLA_DEBUG_FILE, which
    names the parent's descriptor: the child's setup() takes a log of its own, every compile
    cause lands there, and nothing reaches the parent's log."""
    got = py(
        f"""
        import json, os, subprocess, sys, tpu_nb
        env = tpu_nb.setup("cpu")  # nothing compiled: the child inherits PT_XLA_DEBUG_*
        child = subprocess.run([sys.executable, "-c", {VICTIM!r}], capture_output=True,
                               text=True, check=True)
        out = json.loads(child.stdout.split("RESULT", 1)[1])
        out["inherited"] = os.environ["PT_XLA_DEBUG_FILE"]
        out["parent log"], out["parent bytes"] = env.debug_file, os.path.getsize(env.debug_file)
        print("RESULT", json.dumps(out))
        """,
        env={"TMPDIR": shared_tmp},
    )
    got = _result(got)
    assert got["inherited"].startswith("/proc/self/task/"), got["inherited"]
    assert got["path"] != got["parent log"] and str(got["pid"]) in got["path"]
    assert got["compiles"] == 2 and len(got["causes"]) == 2, got  # the child's own causes
    assert got["parent bytes"] == 0  # and none of them in the parent's log
