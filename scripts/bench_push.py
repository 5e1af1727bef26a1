"""Benchmark: pushing a skill of N small files through an exec prefix, three ways.

(a) baseline, what the harness we replace did: one ``PREFIX sh -c 'cat > path'`` per file with
    the bytes on stdin, then one ``PREFIX chmod +x path`` per executable file, one at a time;
(b) the same calls all at once (``asyncio.gather``), its later "fix";
(c) ``kernel-bootstrap push``'s exec runtime: one ``PREFIX sh -c SCRIPT`` fed one tar stream.

Rounds are interleaved (a, b, c, a, b, c, ...) so drift hits every method alike; each cell is the
median of ``--rounds`` runs into a fresh destination. Usage::

    .venv/bin/python scripts/bench_push.py [--rounds 7] [--prefix env] [--markdown]
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
from bootstrap.trees.push import load_trees
from bootstrap.trees.skilltree import SkillTree
from bootstrap.trees.targets import ExecTarget
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
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                     for r in [head, *rows])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prefix", default="env", help="the exec prefix (default: env)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        results = run(args.rounds, args.prefix, Path(tmp))
    print(f"exec prefix {args.prefix!r}, median of {args.rounds} interleaved rounds, "
          f"{os.cpu_count()} CPUs")
    print(table(results, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
