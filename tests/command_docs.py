"""The "Usage and options" section of each docs/commands page, written from the command's own parameters (what
`trtforge CMD --help` prints), so that the pages cannot drift from the CLI. `python tests/command_docs.py` rewrites
the sections; tests/test_command_docs.py fails when a page differs from what this writes."""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "commands"
HEADING = "## Usage and options"


def commands() -> Iterator[tuple[str, Any]]:
    """(name, click command) for every leaf command, groups' subcommands as 'group sub'."""
    import typer.main

    from trtforge.cli.app import app

    def walk(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    yield from walk(typer.main.get_command(app), "")


def type_name(annotation: Any) -> str:
    """Path -> path, Optional[int] -> int, list[str] -> list[str]."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return type_name(args[0])
    if typing.get_origin(annotation) is list:
        return f"list[{type_name(args[0])}]"
    return "path" if annotation is Path else getattr(annotation, "__name__", str(annotation))


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.metavar or param.name.upper()}`"
    else:
        name = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    kind, description = type_name(param.type_descriptor.annotation), param.help or ""
    bounds = [f"x>={param.min}" if param.min is not None else "", f"x<={param.max}" if param.max is not None else ""]
    if any(bounds):  # an IntRange / FloatRange, as --help shows it
        kind, description = f"{kind} range", f"[{'; '.join(b for b in bounds if b)}] {description}"
    default = param.default
    if param.param_type_name == "option" and param.show_default and _shown(default):
        if default is True and param.secondary_opts:  # an on/off pair: the flag that is on
            shown = param.opts[0].lstrip("-")
        else:
            shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        description += f" [default: {shown}]"
    if param.required:
        name += " (required)"
        description += " [required]"
    return f"| {name} | {kind} | {_escape(description)} |"


def _shown(default: Any) -> bool:
    return not (default is None or default is False or callable(default) or (isinstance(default, (list, tuple)) and not default))


def _usage(name: str, command: Any) -> str:
    arguments = " ".join("{" + (p.metavar or p.name.upper()) + "}" for p in command.params if p.param_type_name == "argument")
    return f"trtforge {name} [OPTIONS]" + (f" {arguments}" if arguments else "")


def section(name: str, command: Any) -> str:
    """The page's last section, for one command."""
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    lines = [HEADING, "", f"As `trtforge {name} --help` prints them.", "", "```", _usage(name, command), "```", ""]
    if command.help:
        lines += [" ".join(command.help.split()), ""]
    for title, kind in (("Arguments", "argument"), ("Options", "option")):
        rows = [_row(p) for p in params if p.param_type_name == kind]
        if kind == "option":
            rows.append("| `--help` | bool | Show this message and exit. |")
        if rows:
            lines += [f"**{title}**", "", "| name | type | description |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)


def page_sections() -> dict[Path, str]:
    """{page: its expected Usage and options section(s)}: one page per command, a group's subcommands on one page."""
    pages: dict[Path, list[str]] = {}
    for name, command in commands():
        text = section(name, command)
        if " " in name:  # a group's subcommand: a heading of its own under the page's section
            text = text.replace(HEADING, f"### trtforge {name}", 1)
        pages.setdefault(PAGES / f"{name.split()[0]}.md", []).append(text)
    out = {}
    for page, parts in pages.items():
        out[page] = parts[0] if len(parts) == 1 and not parts[0].startswith("###") else "\n".join([HEADING, "", *parts])
    return out


def current_section(page: Path) -> str | None:
    text = page.read_text() if page.exists() else ""
    at = text.find(HEADING)
    return None if at < 0 else text[at:].rstrip("\n") + "\n"


def write() -> None:
    for page, expected in page_sections().items():
        text = page.read_text() if page.exists() else ""
        at = text.find(HEADING)
        head = text if at < 0 else text[:at]
        page.write_text(head.rstrip("\n") + "\n\n" + expected.rstrip("\n") + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write()
