"""hutch-perf: the command-line entry point of the load generator (see docs/perf.md).

Owns: argv -> exit status. Bad arguments print one line and exit 2; a broker that cannot be reached
prints `hutch-perf: cannot connect to <uri>: <reason>` and exits 1. The work is in `hutch.perf`.
"""

from __future__ import annotations

import os
import sys

from hutch.perf.options import UsageError, parse_args


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(sys.argv[1:] if argv is None else list(argv), dict(os.environ))
    except UsageError as exc:
        print(f"hutch-perf: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    from hutch.perf.runner import run  # after parsing: --help and bad arguments stay fast

    try:
        return run(options, sys.stdout, sys.stderr)
    except KeyboardInterrupt:  # a Ctrl-C before the run started (during connect/declare), or a second one
        print("hutch-perf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
