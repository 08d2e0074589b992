"""tpu_nb's exceptions: one base type, so the layers above can show any of them as one line.

Every message says what is wrong and ends with the exact fix ("Fix: ..."). Catch `TpuNbError`
for all of them, or one of its three kinds:

    TpuNbError
    ├── TpuNbUsageError     the call itself is wrong: an argument, a value, an order of calls
    ├── EnvironmentProblem  this machine or install cannot do it: torch/torch_xla, the device
    └── RuntimeStateError   this process's state forbids it now: the XLA runtime already
                            started, a run already in progress; often fixed by a restart

The three only classify: code that raises a plain `TpuNbError` (or catches one) keeps working.
"""


class TpuNbError(Exception):
    """A mistake the user can fix: the message says what is wrong and the exact fix."""


class TpuNbUsageError(TpuNbError):
    """The call is wrong: a bad argument or value, or calls in the wrong order."""


class EnvironmentProblem(TpuNbError):
    """The machine or the install cannot do it: missing or mismatched torch/torch_xla, no
    such device, a platform torch_xla 2.9 no longer supports."""


class RuntimeStateError(TpuNbError):
    """The process's current state forbids it: the XLA runtime has already started (settings
    are latched), or another run is in progress. Often fixed by restarting the kernel."""
