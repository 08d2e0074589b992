"""The environment of the processes tests start (kernels, scripts, servers, hosts).

The suite's own XLA flags (`make test`'s: XLA:CPU's backend without LLVM's optimisation
passes, the same graphs compiled several times faster) are read when this module is first
imported, by tests/conftest.py before torch_xla's import adds its defaults. Every process a
test starts gets them, and none of this process's latched XLA settings: each kernel's
%tpu_setup, each script's own variables choose those.
"""

from __future__ import annotations

import contextlib
import os

SUITE_XLA_FLAGS = os.environ.get("XLA_FLAGS")


def without_xla_settings(environ, prefixes=("PT_XLA", "XLA_")) -> dict[str, str]:
    """`environ` without the variables starting with `prefixes`, with the suite's XLA flags."""
    env = {k: v for k, v in environ.items() if not k.startswith(prefixes)}
    if SUITE_XLA_FLAGS:
        env["XLA_FLAGS"] = SUITE_XLA_FLAGS
    return env


@contextlib.contextmanager
def kernel_environment():
    """This process's environment as a kernel started inside the block should inherit it."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("PT_XLA", "XLA_"))}
    if SUITE_XLA_FLAGS:
        os.environ["XLA_FLAGS"] = SUITE_XLA_FLAGS
    try:
        yield
    finally:
        os.environ.pop("XLA_FLAGS", None)
        os.environ.update(saved)
