"""The shell commands README.md and docs/*.md show: found, and split into the programs they run.

Found (markdown-it, the CommonMark parser the report tests use, with GFM tables):
- every line of a fenced block tagged sh, bash, shell, console (its `$ ` lines), or untagged
  when every line starts with a known program (a grammar or a message is not shell);
  `\\` continuations joined, comments out;
- every inline code span that starts with a known program (`edge-agent`, `python3`, `sudo`,
  `./scripts/…`, …) and is more than a bare program name;
- an inline span of options only, two words or more (`--n 100 --faults camera`), after a
  `python -m MODULE` span in the same table cell or paragraph: more arguments documented for
  that module (a lone `--sim` there is an option named in the prose).

tests/test_readme_commands.py runs or parse-checks each one, or names why it cannot run here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"sh", "bash", "shell", "console", "shell-session", "zsh"}
PROGRAMS = {
    "edge-agent", "python", "python3", "pip", "pip3", "mosquitto", "mosquitto_pub",
    "mosquitto_sub", "mosquitto_passwd", "sudo", "sudoedit", "systemctl", "journalctl",
    "systemd-analyze", "grep", "ls", "printf", "install", "curl", "git", "bash", "sh", "ruff",
    "mypy", "pytest", "npm", "npx", "apt", "apt-get", "chmod", "chown", "chgrp", "useradd",
    "userdel", "rm", "cp", "mv", "cat", "tee", "timedatectl", "openssl", "env", "export",
}
PATH_PROGRAMS = ("./", ".venv/bin/", "/opt/", "scripts/")
_OPERATORS = {"|", "||", "&&", ";", "&"}
_REDIRECTS = {">", ">>", "<", ">&", "<&", ">|"}


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class DocCommand:
    """One documented command line. `module` is set for an options-only span: the
    `python -m MODULE` named before it in the same cell or paragraph."""

    doc: str  # relative to the repository: "README.md", "docs/INSTALL.md"
    line: int  # 1-based, where the block or paragraph starts
    text: str
    block: bool  # from a fenced block (else an inline span)
    module: str | None = None

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Invocation:
    """A program run in one segment of a command line (after sudo, VAR=value)."""

    program: str  # "edge-agent", "pip", "python -m hil.rig", or the first word
    argv: tuple[str, ...]


def _first_word(text: str) -> str:
    words = text.split()
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[i]):
        i += 1  # VAR=value before the program
    return words[i] if i < len(words) else ""


def is_program(word: str) -> bool:
    return word in PROGRAMS or word.startswith(PATH_PROGRAMS)


def _block_lines(content: str, console: bool) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in content.splitlines():
        if console and not pending:
            if not raw.startswith("$ "):
                continue  # output
            raw = raw[2:]
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment (none sits in quotes)
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def discover(paths: list[Path] | None = None) -> list[DocCommand]:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table")
    found: list[DocCommand] = []
    for path in paths or documents():
        doc = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        for tok in md.parse(path.read_text()):
            line = (tok.map[0] + 1) if tok.map else 0
            if tok.type == "fence":
                info = tok.info.strip().split()[0] if tok.info.strip() else ""
                lines = _block_lines(tok.content, console=info == "console")
                if info in SHELL_FENCES or (info == "" and lines and all(
                        is_program(_first_word(ln)) for ln in lines)):
                    found += [DocCommand(doc, line, ln, True) for ln in lines]
            elif tok.type == "inline":
                module = None  # the last `python -m MODULE` span in this cell / paragraph
                for child in tok.children or []:
                    if child.type != "code_inline":
                        continue
                    text = " ".join(child.content.split())
                    first = _first_word(text)
                    if is_program(first) and (len(text.split()) > 1 or first.startswith(
                            ("./", ".venv/bin/"))):  # else a program's or a file's name
                        found.append(DocCommand(doc, line, text, False))
                        inv = invocations(text)
                        module = (inv[0].program.removeprefix("python -m ")
                                  if inv and inv[0].program.startswith("python -m ") else None)
                    elif module and text.startswith("--") and len(text.split()) > 1:
                        found.append(DocCommand(doc, line, text, False, module))
    return found


def segments(text: str) -> list[list[str]]:
    """The words of each simple command in a line (split at |, &&, ;; redirections out)."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    skip = False
    for word in lex:
        if skip:
            skip = False
        elif word in _OPERATORS:
            out.append([])
        elif word in _REDIRECTS:
            skip = True  # and its target
        else:
            out[-1].append(word)
    return [s for s in out if s]


def invocation(words: list[str]) -> Invocation | None:
    i = 0
    if words[:1] == ["sudo"]:
        i = 1
        while i < len(words) and words[i].startswith("-"):
            i += 2 if words[i] in ("-u", "-g") else 1
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    if i >= len(words):
        return None
    prog, rest = words[i], words[i + 1:]
    name = prog.rsplit("/", 1)[-1]
    if name == "edge-agent":
        return Invocation("edge-agent", tuple(rest))
    if name in ("pip", "pip3"):
        return Invocation("pip", tuple(rest))
    if re.fullmatch(r"python3?(\.\d+)?", name) and rest[:1] == ["-m"] and len(rest) > 1:
        if rest[1] == "pip":
            return Invocation("pip", tuple(rest[2:]))
        return Invocation(f"python -m {rest[1]}", tuple(rest[2:]))
    return Invocation(name, tuple(rest))


def invocations(text: str) -> list[Invocation]:
    try:
        segs = segments(text)
    except ValueError:  # unbalanced quotes: the parse check names it
        return [Invocation("<unparsable>", (text,))]
    return [inv for s in segs if (inv := invocation(s)) is not None]


def is_synopsis(argv: tuple[str, ...]) -> bool:
    """`[--n 100] [--faults …]`: a usage line, not a command (its options are checked)."""
    return any(w.startswith("[") or "…" in w for w in argv)
