"""A warm start for the tests' fresh Python processes (conftest.run_python).

A fresh interpreter spends most of its first seconds importing torch and what torch_xla
imports of it and of other libraries (torch._inductor, sympy, ...), about 9 s of 10 here.
This process imports all of that once, then forks a child per script: the child has none of
torch_xla or tpu_nb loaded, so what torch_xla latches at import and at its first compile
(XLA_IR_DEBUG, PT_XLA_DEBUG_*, PJRT_DEVICE, CPU_NUM_DEVICES) is read from the script's own
environment, as in `python script.py`.

Protocol, one request at a time on stdin, one JSON object a line:
    {"script", "env", "cwd", "out", "err"}  ->  {"pid": N}, then {"code": returncode}
(returncode as subprocess gives it: negative for a signal). The preload is what a child that
imports torch_xla adds to sys.modules beside torch_xla's own modules, found by forking one
such child first; none of it starts a thread, so forking stays safe (checked).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys


def _modules_torch_xla_imports() -> list[str]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a throwaway child: import torch_xla, say what came with it
        os.close(read)
        try:
            before = set(sys.modules)
            import torch_xla  # noqa: F401

            names = [
                m
                for m in sys.modules
                if m not in before and not m.startswith(("torch_xla", "_XLAC"))
            ]
            os.write(write, json.dumps(names).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"[]")


def _preload() -> None:
    import torch  # noqa: F401

    for name in _modules_torch_xla_imports():
        with contextlib.suppress(Exception):  # one importable only by another: the child's
            importlib.import_module(name)
    if len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("zygote: the preload started a thread; forking would not be safe")


def _run(request: dict) -> None:
    """In the forked child: become `python script` with the request's environment."""
    import atexit
    import runpy
    import tempfile
    import traceback

    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    script = request["script"]
    sys.argv = [script]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script` has it
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
