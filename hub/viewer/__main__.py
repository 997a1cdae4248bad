"""``python3 -m hub.viewer --check``: exit 1 when the shipped viewer build does not match
``web/`` (hub.viewer.build); without ``--check`` it prints the source hash."""

from __future__ import annotations

import argparse
import sys

from hub.viewer.build import WEB_DIR, check_build, source_hash


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m hub.viewer")
    parser.add_argument("--check", action="store_true", help="fail if the build is stale")
    args = parser.parse_args(argv)
    if not WEB_DIR.is_dir():
        print("no web/ sources here (an installed package): nothing to check")
        return 0
    if not args.check:
        print(source_hash())
        return 0
    problem = check_build()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print("viewer build matches web/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
