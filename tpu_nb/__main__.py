"""`tpu-nb doctor` (or `python -m tpu_nb doctor`): the environment report in a terminal.

Exit status: 0 when torch_xla can run, 1 when a problem blocks it, 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import sys

from tpu_nb._version import __version__

# One name in usage lines and messages whichever way it was started: the console script is
# `tpu-nb`; `python -m tpu_nb` is the same program.
PROG = "tpu-nb"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="tpu_nb command-line tools (also: python -m tpu_nb)"
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    doctor = sub.add_parser("doctor", help="check this machine's torch/torch_xla set-up")
    doctor.add_argument(
        "--import-check",
        action="store_true",
        help="also import torch_xla in a subprocess to prove it loads",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # "doctor", the one command, or a usage error (exit 2)
    from tpu_nb.runtime.environment import detect

    env = detect(check_import=args.import_check)
    print(f"tpu_nb {__version__}")
    print(env.report())
    return 0 if env.ok else 1


if __name__ == "__main__":
    sys.exit(main())
