"""Parse documented arguments with a program's own argparse parser, without running it.

Run as a script: stdin is a JSON list of [module, argv, mode]; stdout a JSON list of
{"ok": bool, "error": str}. `module` is a `python -m` module, or "edge-agent" (edge_agent.cli's
main). mode "parse": the exact argv, through the module's real `main` up to its
`parse_args` — which is patched to raise once it returns, so nothing after parsing runs.
mode "options" (a synopsis such as `[--n 100] [--faults …]`): each `--option` it names must be
one the parser knows. A module that reaches no argparse parser fails (it would have run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import sys
from typing import Any


class _Parsed(BaseException):  # not an error: the way out of main once parsing is done
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _check(module: str, argv: list[str], mode: str) -> dict[str, Any]:
    ap = argparse.ArgumentParser
    orig_parse, orig_known = ap.parse_args, ap.parse_known_args
    depth = [0]

    def parse_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        if mode == "options":
            raise _Parsed(self)
        depth[0] += 1
        try:
            orig_parse(self, args, namespace)
        finally:
            depth[0] -= 1
        raise _Parsed(self)

    def parse_known_args(self: argparse.ArgumentParser, args: Any = None,
                         namespace: Any = None) -> Any:
        if depth[0]:  # inside parse_args (or a subparser's): argparse's own call
            return orig_known(self, args, namespace)
        if mode == "options":
            raise _Parsed(self)
        orig_known(self, args, namespace)
        raise _Parsed(self)

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    err = io.StringIO()
    parser = None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if module == "edge-agent":
                from edge_agent.cli import main

                main(argv)
            else:
                sys.argv = [module, *argv]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed as p:
        parser = p.parser
    except SystemExit as exc:
        return {"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip()[-500:]}"}
    except Exception as exc:  # reported, not raised: the next job still runs
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        argparse.ArgumentParser.parse_args = orig_parse  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = orig_known  # type: ignore[method-assign]
    if parser is None:
        return {"ok": False, "error": "reached no argparse parser (it would have run)"}
    if mode == "options":
        known = set(parser._option_string_actions)
        named = {w.strip("[]") for w in argv if w.strip("[]").startswith("-")}
        unknown = sorted(named - known)
        return {"ok": not unknown, "error": f"unknown options {unknown}" if unknown else ""}
    return {"ok": True, "error": ""}


if __name__ == "__main__":
    jobs = json.load(sys.stdin)
    out = [_check(m, list(a), mode) for m, a, mode in jobs]
    sys.stdout.write(json.dumps(out))
