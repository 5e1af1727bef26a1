"""Benchmark: pushing a skill of N small files through an exec prefix, three ways.

(a) baseline, what the harness we replace did: one ``PREFIX sh -c 'cat > path'`` per file with
    the bytes on stdin, then one ``PREFIX chmod +x path`` per executable file, one at a time;
(b) the same calls all at once (``asyncio.gather``), its later "fix";
(c) ``kernel-bootstrap push``'s exec runtime: one ``PREFIX sh -c SCRIPT`` fed one tar stream.

Rounds are interleaved (a, b, c, a, b, c, ...) so drift hits every method alike; each cell is the
median of ``--rounds`` runs into a fresh destination. Usage::

    .venv/bin/python scripts/bench_push.py [--rounds 7] [--prefix env] [--markdown]

With ``--skills DIR`` (a directory of skills, e.g. ``skills/`` of a checkout of
github.com/anthropics/skills: 17 skills, 409 files) it measures what a push sends again instead:
into ``--sandboxes`` sandboxes (default 4; each a directory reached through PREFIX), a first
push into empty ones, a second push of the same skills, and a push after one file changed, per
round (fresh sandboxes each round). Wall time is that of ``push()`` from the source paths (as
the command runs it, without the interpreter's start); bytes are those every sandbox got on
stdin, counted by a wrapper around PREFIX (``testing.counting``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path line, so the script runs from a checkout without installing.
from bootstrap.trees.push import load_trees, push
from bootstrap.trees.skilltree import SkillTree
from bootstrap.trees.targets import ExecTarget, tar_stream
from testing.counting import Counted
from testing.skills import make_skill

SIZES = (32, 128)
Method = Callable[[ExecTarget, SkillTree, Path], Coroutine[None, None, int]]


def bench_skill(parent: Path, n_files: int) -> Path:
    """A skill with ``n_files`` files of a few KiB in a few subdirectories, every 4th executable."""
    files = {f"part{i % 4}/file{i:03}.py": os.urandom(1024 + (i * 97) % 3072)
             for i in range(n_files - 1)}
    return make_skill(parent, f"bench-{n_files}", files, description="bench",
                      executables=[rel for i, rel in enumerate(files) if i % 4 == 0])


async def _call(argv: Sequence[str], data: bytes | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate(data)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: exit {proc.returncode}: {err.decode()}")


async def _one_file(rt: ExecTarget, tree: SkillTree, dest: Path, rel: str) -> int:
    """The baseline's unit of work: write one file (its bytes held in memory), then chmod."""
    entry = next(e for e in tree.entries if e.rel == rel)
    target = dest / tree.name / rel
    write = "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\""
    await _call([*rt.argv, "sh", "-c", write, "sh", str(target)], entry.path.read_bytes())
    if entry.mode & 0o111:
        await _call([*rt.argv, "chmod", "+x", str(target)])
        return 2
    return 1


def _files(tree: SkillTree) -> list[str]:
    return [e.rel for e in tree.entries if e.kind == "file"]


async def per_file_sequential(rt: ExecTarget, tree: SkillTree, dest: Path) -> int:
    return sum([await _one_file(rt, tree, dest, rel) for rel in _files(tree)])


async def per_file_gather(rt: ExecTarget, tree: SkillTree, dest: Path) -> int:
    return sum(await asyncio.gather(*(_one_file(rt, tree, dest, rel) for rel in _files(tree))))


async def tar_stream_push(rt: ExecTarget, tree: SkillTree, dest: Path) -> int:
    report = await rt.push([tree], str(dest))
    assert report.ok, report.error
    return 1


METHODS: dict[str, Method] = {
    "per-file write + chmod, sequential (baseline)": per_file_sequential,
    "per-file write + chmod, asyncio.gather": per_file_gather,
    "kernel-bootstrap push (one tar stream)": tar_stream_push,
}


def run(rounds: int, prefix: str, work: Path) -> dict[tuple[int, str], tuple[float, int]]:
    rt = ExecTarget.from_prefix(prefix)
    trees = {n: load_trees([bench_skill(work / "src", n)])[0] for n in SIZES}
    times: dict[tuple[int, str], list[float]] = {}
    calls: dict[tuple[int, str], int] = {}
    for _ in range(rounds):
        for n in SIZES:
            for label, method in METHODS.items():
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                start = time.perf_counter()
                calls[n, label] = asyncio.run(method(rt, trees[n], dest))
                times.setdefault((n, label), []).append(time.perf_counter() - start)
                _check(trees[n], dest)
    return {k: (statistics.median(v), calls[k]) for k, v in times.items()}


def _check(tree: SkillTree, dest: Path) -> None:
    """Every method must produce the same files with the same exec bits."""
    for e in tree.entries:
        if e.kind == "file":
            out = dest / tree.name / e.rel
            assert out.read_bytes() == e.path.read_bytes(), out
            assert bool(out.stat().st_mode & 0o100) == bool(e.mode & 0o100), out


def table(results: dict[tuple[int, str], tuple[float, int]], markdown: bool) -> str:
    head = ["files", "method", "exec calls", "median ms", "vs baseline"]
    rows = []
    baseline_label = next(iter(METHODS))
    for n in SIZES:
        base = results[n, baseline_label][0]
        for label in METHODS:
            seconds, n_calls = results[n, label]
            rows.append([str(n), label, str(n_calls), f"{seconds * 1000:.1f}",
                         f"{seconds / base:.3f}x"])
    return _render(head, rows, markdown)


def _render(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                     for r in [head, *rows])


AGAIN = ("first push (empty sandboxes)", "second push, nothing changed", "one file changed")


def again(rounds: int, prefix: str, skills_dir: Path, sandboxes: int,
          work: Path) -> tuple[dict[str, list[tuple[float, int]]], int, int]:
    """Per label, (seconds, bytes on stdin summed over the sandboxes) of every round; the
    number of skills, and the size of the skill whose file changes (its files' bytes)."""
    src = work / "skills"
    shutil.copytree(skills_dir, src, symlinks=True)
    sources = sorted(p for p in src.iterdir() if (p / "SKILL.md").is_file())
    changing = next((p for p in sources if p.name == "pdf"), sources[0])
    out: dict[str, list[tuple[float, int]]] = {label: [] for label in AGAIN}
    for r in range(rounds):
        counters = []
        for i in range(sandboxes):
            box = work / f"round{r}" / f"box{i}"
            box.mkdir(parents=True)
            # Each sandbox its own directory: PREFIX runs there, and DEST is relative to it.
            inner = ("sh", "-c", 'cd "$0" && exec "$@"', str(box), *shlex.split(prefix))
            counters.append((box, Counted(work / f"count{r}-{i}", inner)))
        for label in AGAIN:
            if label == AGAIN[2]:
                with (changing / "SKILL.md").open("a") as f:
                    f.write(f"\nround {r}\n")
            start = time.perf_counter()
            reports = asyncio.run(push(sources, "skills", [c.runtime for _, c in counters]))
            seconds = time.perf_counter() - start
            assert all(rep.ok for rep in reports), [rep.error for rep in reports]
            out[label].append((seconds, sum(c.last_stdin() for _, c in counters)))
        for box, _ in counters:  # a full push's tree, whatever was sent
            _check_tree(load_trees(sources), box / "skills")
    # The changed skill as a push sends it alone (its files, their tar headers and padding).
    size = sum(len(piece) for piece in tar_stream(load_trees([changing])))
    return out, len(sources), size


def _check_tree(trees: Sequence[SkillTree], dest: Path) -> None:
    for tree in trees:
        _check(tree, dest)
        for e in tree.entries:
            if e.kind == "file":
                got = (dest / tree.name / e.rel).stat().st_mtime_ns // 1_000_000_000
                assert got == e.mtime_ns // 1_000_000_000, dest / tree.name / e.rel


def again_table(results: dict[str, list[tuple[float, int]]], size: int, markdown: bool) -> str:
    head = ["push", "median ms", "wall vs first", "bytes sent (all sandboxes)", "bytes vs first"]
    first_s = statistics.median(s for s, _ in results[AGAIN[0]])
    first_b = statistics.median(b for _, b in results[AGAIN[0]])
    rows = []
    for label in AGAIN:
        seconds = statistics.median(s for s, _ in results[label])
        sent = statistics.median(b for _, b in results[label])
        rows.append([label, f"{seconds * 1000:.1f}", f"{seconds / first_s:.3f}x",
                     f"{sent:,.0f}", f"{sent / first_b:.4f}x"])
    return _render(head, rows, markdown) + (
        f"\nthe changed skill pushed alone: {size:,} bytes per sandbox; the bound for the "
        f"changed-file push, its size + 10 KiB per sandbox: {size + 10240:,}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prefix", default="env", help="the exec prefix (default: env)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--skills", type=Path, metavar="DIR",
                        help="measure pushing these skills again (see the docstring)")
    parser.add_argument("--sandboxes", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        if args.skills is not None:
            found, count, size = again(args.rounds, args.prefix, args.skills, args.sandboxes,
                                       Path(tmp))
            print(f"{count} skills from {args.skills} into {args.sandboxes} sandboxes, exec "
                  f"prefix {args.prefix!r}, median of {args.rounds} rounds, "
                  f"{os.cpu_count()} CPUs")
            print(again_table(found, size, args.markdown))
            return 0
        results = run(args.rounds, args.prefix, Path(tmp))
    print(f"exec prefix {args.prefix!r}, median of {args.rounds} interleaved rounds, "
          f"{os.cpu_count()} CPUs")
    print(table(results, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
