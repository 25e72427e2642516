"""``python -m infer.core.testing [--device NAME] [pytest options]``: the conformance kit on one
platform (default: the one infer would select here). Exit code: pytest's; 2 for a bad device."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infer.core.testing",
        description="Check every op the installed plugins register for a platform against the "
                    "core's plain-torch references. Other options go to pytest (-k, -x, -v, ...).")
    parser.add_argument("--device", default=os.environ.get("INFER_DEVICE"),
                        help="platform name (cpu, cuda, ascend, ...); default: INFER_DEVICE, "
                             "else the platform infer would select on this machine")
    parser.add_argument("--page-sizes", default="1,16", metavar="N,N",
                        help="KV page sizes to check attention with (default: 1,16)")
    args, pytest_args = parser.parse_known_args(argv)
    try:
        sizes = [int(p) for p in args.page_sizes.split(",")]
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        print(f"--page-sizes {args.page_sizes}: expected positive integers separated by commas, "
              f"such as 16,128", file=sys.stderr)
        return 2
    try:
        import pytest
    except ImportError:
        print("the conformance kit runs with pytest: pip install pytest", file=sys.stderr)
        return 2
    from infer.core.plugins import PlatformSelectionError, get_plugin_host

    host = get_plugin_host()
    if args.device and args.device not in host.registries.platforms:
        known = ", ".join(sorted(host.registries.platforms)) or "none"
        print(f"--device {args.device}: no installed plugin provides this platform (installed: "
              f"{known})", file=sys.stderr)
        return 2
    try:
        name = args.device or host.select(None).name
    except PlatformSelectionError as e:
        print(f"conformance kit: {e}", file=sys.stderr)
        return 2
    os.environ["INFER_DEVICE"] = name
    os.environ["INFER_CONFORMANCE_PAGE_SIZES"] = ",".join(map(str, sizes))
    module = str(Path(__file__).with_name("test_platform.py"))
    return int(pytest.main([module, "-p", "no:cacheprovider", "-rs", *pytest_args]))


if __name__ == "__main__":
    sys.exit(main())
