"""`uv pip ...`: dispatch, plus the small read/remove commands (uninstall, list, freeze, show)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fake_uv import cli, dists, reqs, venvs
from fake_uv.errors import UvExit
from fake_uv.output import Console, plural

_USAGE: Final = "uv pip [OPTIONS] <COMMAND>"
UNINSTALL_SPEC: Final = cli.spec(
    "uv pip uninstall --python <PYTHON> <PACKAGE|--requirements <REQUIREMENTS>>",
    flags={"--system", "--dry-run"}, valued={"--python", "--requirements"},
    aliases={"-p": "--python", "-r": "--requirements", "--requirement": "--requirements"},
)
LIST_SPEC: Final = cli.spec(
    "uv pip list --python <PYTHON> [OPTIONS]",
    flags={"--editable", "--exclude-editable", "--strict", "--system"},
    valued={"--python", "--format", "--exclude"},
    aliases={"-p": "--python", "-e": "--editable"},
)
SHOW_SPEC: Final = cli.spec("uv pip show --python <PYTHON> [PACKAGE]...",
                            flags={"--files", "--strict", "--system"}, valued={"--python"},
                            aliases={"-p": "--python", "-f": "--files"})


def main(args: Sequence[str]) -> int:
    """Dispatch `uv pip <command>`; global options may come before the command."""
    command, rest = cli.split_command(args)
    if command is None:
        raise UvExit(2, f"error: 'uv pip' requires a subcommand\n\nUsage: {_USAGE}")
    if command == "install":
        from fake_uv.install import install

        return install(rest)
    if command == "compile":
        from fake_uv.lock import compile_

        return compile_(rest)
    handlers = {"uninstall": uninstall, "list": list_, "freeze": freeze, "show": show}
    if command not in handlers:
        raise UvExit(2, f"error: unrecognized subcommand '{command}'\n\nUsage: {_USAGE}\n\n"
                        "For more information, try '--help'.")
    return handlers[command](rest)


def uninstall(args: Sequence[str]) -> int:
    opts = cli.parse(args, UNINSTALL_SPEC)
    console = Console(opts.flag("--quiet"))
    venv = venvs.locate(opts.value("--python"))
    console.say(f"Using Python {venv.version} environment at: {venv.shown}")
    names = list(opts.positionals)
    for path in opts.values("--requirements"):
        requests = reqs.Requests()
        requests.read(Path(path))
        names += [r.name for r in requests.requirements]
    if not names:
        raise UvExit(2, "error: the following required arguments were not provided:\n"
                        f"  <PACKAGE|--requirements <REQUIREMENTS>>\n\nUsage: "
                        f"{UNINSTALL_SPEC.usage}\n\nFor more information, try '--help'.")
    installed = dists.scan(venv.site)
    chosen: dict[str, dists.Dist] = {}
    for name in names:
        norm = reqs.normalize(_bare_name(name))
        if norm in installed:
            chosen[norm] = installed[norm]
        else:
            console.say(f"warning: Skipping {name} as it is not installed")
    if not chosen:
        console.say("warning: No packages to uninstall")
        return 0
    lines = [f" - {dist.described()}" for _, dist in sorted(chosen.items())]
    if not opts.flag("--dry-run"):
        for dist in chosen.values():
            dists.remove(venv, dist)
    console.say(f"Uninstalled {plural(len(chosen))} in {console.elapsed()}")
    for line in lines:
        console.say(line)
    return 0


def list_(args: Sequence[str]) -> int:
    """`uv pip list`: JSON objects like uv's (`editable_project_location` only for editables)."""
    opts = cli.parse(args, LIST_SPEC)
    venv = venvs.locate(opts.value("--python"))
    Console(opts.flag("--quiet")).say(f"Using Python {venv.version} environment at: {venv.shown}")
    excluded = {reqs.normalize(n) for n in opts.values("--exclude")}
    rows: list[dict[str, str]] = []
    for norm, dist in sorted(dists.scan(venv.site).items()):
        location = dist.editable_location()
        wanted = (not opts.flag("--editable") or location) and not (
            opts.flag("--exclude-editable") and location)
        if wanted and norm not in excluded:
            row = {"name": norm, "version": dist.version}
            if location:
                row["editable_project_location"] = str(location)
            rows.append(row)
    output = opts.value("--format") or "columns"
    if output == "json":
        print(json.dumps(rows, separators=(",", ":")))
    elif output == "freeze":
        for row in rows:
            print(f"{row['name']}=={row['version']}")
    elif output == "columns":
        _print_columns(rows)
    else:
        raise UvExit(2, f"error: invalid value '{output}' for '--format <FORMAT>'\n  "
                        "[possible values: columns, freeze, json]")
    return 0


def freeze(args: Sequence[str]) -> int:
    opts = cli.parse(args, LIST_SPEC)
    venv = venvs.locate(opts.value("--python"))
    for norm, dist in sorted(dists.scan(venv.site).items()):
        location = dist.editable_location()
        print(f"-e {location.as_uri()}" if location else f"{norm}=={dist.version}")
    return 0


def show(args: Sequence[str]) -> int:
    """`uv pip show`: Name, Version, Location, Requires, Required-by, Editable location."""
    opts = cli.parse(args, SHOW_SPEC)
    console = Console(opts.flag("--quiet"))
    venv = venvs.locate(opts.value("--python"))
    installed = dists.scan(venv.site)
    missing = [n for n in opts.positionals if reqs.normalize(n) not in installed]
    if missing:
        console.say(f"warning: Package(s) not found for: {', '.join(missing)}")
    found = [installed[reqs.normalize(n)] for n in opts.positionals if n not in missing]
    for number, dist in enumerate(found):
        if number:
            print("---")
        _print_dist(dist, installed, venv)
    return 0 if found and not missing else 1


def _print_dist(dist: dists.Dist, installed: dict[str, dists.Dist], venv: venvs.Venv) -> None:
    requires = sorted({reqs.normalize(_bare_name(r)) for r in dist.metadata("Requires-Dist")})
    required_by = sorted(norm for norm, other in installed.items() if dist.norm in {
        reqs.normalize(_bare_name(r)) for r in other.metadata("Requires-Dist")})
    print(f"Name: {dist.norm}\nVersion: {dist.version}\nLocation: {venv.site}")
    location = dist.editable_location()
    if location:
        print(f"Editable project location: {location}")
    print(f"Requires: {', '.join(requires)}\nRequired-by: {', '.join(required_by)}")


def _bare_name(requirement: str) -> str:
    try:
        return reqs.parse(requirement).name
    except ValueError:
        return requirement


def _print_columns(rows: list[dict[str, str]]) -> None:
    headers = ["Package", "Version"]
    if any("editable_project_location" in row for row in rows):
        headers.append("Editable project location")
    keys = ["name", "version", "editable_project_location"][: len(headers)]
    table = [headers] + [[row.get(key, "") for key in keys] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    table.insert(1, ["-" * width for width in widths])
    for line in table:
        sys.stdout.write(" ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                         + "\n")
