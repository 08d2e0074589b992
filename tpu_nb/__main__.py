"""`python -m tpu_nb doctor`: the environment report in a terminal.

Exit status: 0 when torch_xla can run, 1 when a problem blocks it, 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_nb",
                                     description="tpu_nb command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check this machine's torch/torch_xla set-up")
    doctor.add_argument("--import-check", action="store_true",
                        help="also import torch_xla in a subprocess to prove it loads")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from tpu_nb.runtime.environment import detect

        env = detect(check_import=args.import_check)
        print(env.report())
        return 0 if env.ok else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
