"""The `flashcheck` command.

    flashcheck check TARGET [--family F] [capability flags] [any pytest option ...]
    flashcheck replay FIXTURE.json ... [--kernel TARGET]
    flashcheck report ...            (the stability report: flashcheck report --help)
    flashcheck kernels               (the registered kernels and their declared capabilities)

TARGET is `path/to/file.py:function`, `package.module:function` or a registered kernel's name.
`check` runs the family's suite on the kernel through pytest (every option it does not know is
passed on: `-n auto`, `-k`, `-x`, `--hypothesis-profile`), writes fixtures of shrunk failures to
./flashcheck-regressions/ (`--fixture-dir` to change it) and replays the ones already there.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

FAMILIES = ("softmax", "attention")


def _capabilities() -> dict:
    from flashcheck.external import CAPABILITIES

    return CAPABILITIES


def _check(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="flashcheck check", description="Run a family's suite on one kernel.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Options not listed here go to pytest unchanged, among them the capability flags:\n"
               "  --kernel-dtypes fp16,bf16  --kernel-min-n N  --kernel-max-n N  --kernel-sizes N,N\n"
               "  --kernel-cap KEY=VALUE (repeatable), --fixture-dir DIR, --no-save-fixtures,\n"
               "  -n auto, -x, -k EXPR, --hypothesis-profile NAME.\nCapability keys:\n"
               + "\n".join(f"  {k:16s} {v[3]}" for k, v in _capabilities().items()))
    p.add_argument("target", help="FILE.py:FUNCTION, package.module:FUNCTION or a registered kernel name")
    p.add_argument("--family", choices=FAMILIES, help="which suite (inferred for registered kernels and KernelSpecs)")
    ns, rest = p.parse_known_args(argv)
    family = ns.family
    # Load once here: a bad target is one line now, not an INTERNALERROR inside pytest, and a
    # KernelSpec's family needs no flag.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from flashcheck.external import KernelLoadError, load_kernel

    try:
        spec = load_kernel(ns.target, family)
    except KernelLoadError as e:
        print(f"flashcheck check: {e}", file=sys.stderr)
        return 2
    family = spec.family
    import pytest

    from flashcheck import suite_paths

    args = [*suite_paths(family), "-p", "flashcheck.plugin", "-p", "no:cacheprovider",
            f"--kernel={ns.target}", f"--family={family}", *rest]
    return int(pytest.main(args))


def _replay(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="flashcheck replay", description="Re-check saved fixtures, bit for bit.")
    p.add_argument("fixtures", nargs="+", type=Path, help="fixture files (or folders of them)")
    p.add_argument("--kernel", help="check this kernel instead of the one the fixture names")
    ns = p.parse_args(argv)
    from flashcheck import harness
    from flashcheck.external import KernelLoadError, load_kernel
    from flashcheck.kernels import DEVICE

    harness.configure(save=False)
    harness.load_properties()
    paths: list[Path] = []
    for f in ns.fixtures:
        if f.is_dir():
            paths.extend(harness.fixture_paths(f))
        elif f.is_file():
            paths.append(f)
        else:
            print(f"flashcheck replay: {f}: no such file or folder", file=sys.stderr)
            return 2
    failed = 0
    for path in paths:
        try:
            payload, case = harness.load_fixture(path, DEVICE)
            spec = (load_kernel(ns.kernel, payload["family"]) if ns.kernel
                    else harness.resolve_fixture_kernel(payload, path))
        except (harness.FixtureError, KernelLoadError) as e:
            print(f"ERROR {e}")
            failed += 1
            continue
        try:
            harness.check(spec, payload["property"], case)
        except Exception as e:  # the property's verdict, whatever the kernel raised
            failed += 1
            print(f"FAIL {path} ({spec.name}, {payload['property']})\n{type(e).__name__}: {e}\n")
        else:
            print(f"pass {path} ({spec.name}, {payload['property']})")
    print(f"{len(paths) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _kernels(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(prog="flashcheck kernels", description="List the registered kernels.").parse_args(argv)
    from flashcheck.kernels.registry import PRODUCTION
    from flashcheck.plugin import describe_capabilities

    for s in PRODUCTION:
        print(f"{s.name:16s} {s.family:10s} {describe_capabilities(s)}")
    return 0


def _delegate(module: str, prog: str) -> "callable":
    def run(argv: Sequence[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(list(argv)) or 0)
    return run


COMMANDS = {
    "check": _check,
    "replay": _replay,
    "kernels": _kernels,
    "report": _delegate("flashcheck.reports.__main__", "flashcheck report"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from flashcheck import __version__

        print(f"flashcheck {__version__}")
        return 0
    cmd = COMMANDS.get(argv[0])
    if cmd is None:
        print(f"flashcheck: unknown command {argv[0]!r} (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    return cmd(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
