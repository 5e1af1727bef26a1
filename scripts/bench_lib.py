"""Shared pieces of the benchmarks: an isolated workspace that drives the real uv, generated
skills and configs, a logging uv shim, the one-skill-per-call baseline, interleaved timing.

Nothing here touches the real home: :func:`open_workspace` points HOME, the XDG directories
and uv's cache at a temporary directory, in this process's environment (so the in-process
figures and every child see the same world).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
import timeit
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from testing.skills import Package, make_skill

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the dev venv running the benchmarks
KERNEL_BOOTSTRAP = BIN / "kernel-bootstrap"
# The interpreter both sides build their venvs from (the base of the one running us).
BASE_PYTHON = str(getattr(sys, "_base_executable", None) or sys.executable)
# What a kernel venv holds besides the skills: the README's example runtime.
RUNTIME: tuple[str, ...] = ("ipykernel>=6",)


@dataclass(frozen=True)
class Settings:
    """How many rounds each kind of figure runs (``--quick``: a smoke run, not a result)."""

    quick: bool
    fast_rounds: int  # figures of milliseconds
    cold_rounds: int  # figures of seconds
    kill_trials: int
    growth_cold_rounds: int
    push_rounds: int


def settings(quick: bool, rounds: int | None) -> Settings:
    if rounds:
        return Settings(quick, rounds, rounds, rounds, rounds, rounds)
    if quick:
        return Settings(True, 5, 1, 1, 1, 3)
    return Settings(False, 31, 9, 3, 3, 7)


# --- the workspace ---------------------------------------------------------------------------


@dataclass
class Workspace:
    root: Path
    uv: Path  # the real uv
    shim: Path  # the real uv behind a shim that logs every argv (and -r file) to uv_log
    uv_log: Path
    _serial: int = 0

    def fresh(self, tag: str) -> Path:
        """A new, empty directory: every round gets new paths, so no build cache is reused."""
        while True:
            self._serial += 1
            path = self.root / "runs" / f"{tag}-{self._serial:04}"
            if not path.exists():
                path.mkdir(parents=True)
                return path


def open_workspace(root: Path, uv: Path) -> Workspace:
    """Point HOME, XDG dirs and UV_CACHE_DIR at ``root`` (in os.environ); write the shim."""
    for sub in ("home", "xdg-cache", "xdg-data", "xdg-config", "uv-cache", "bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for var in ("PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH",
                "PYTHONHOME", "UV_OFFLINE", "KERNEL_BOOTSTRAP_VENV", "KERNEL_BOOTSTRAP_PYTHON",
                "KERNEL_BOOTSTRAP_CONFIG", "KERNEL_BOOTSTRAP_SNAPSHOTS"):
        os.environ.pop(var, None)
    os.environ.update({
        "HOME": str(root / "home"),
        "XDG_CACHE_HOME": str(root / "xdg-cache"),
        "XDG_DATA_HOME": str(root / "xdg-data"),
        "XDG_CONFIG_HOME": str(root / "xdg-config"),
        "UV_CACHE_DIR": str(root / "uv-cache"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        "KERNEL_BOOTSTRAP_UV": str(uv),
        # Bytecode is cached, as in any installed copy (this checkout's shell may say
        # PYTHONDONTWRITEBYTECODE, which would compile every module on every start); the
        # cache lives in the workspace, not in the checkout.
        "PYTHONPYCACHEPREFIX": str(root / "pycache"),
    })
    log = root / "uv.log"
    shim = root / "bin" / "uv"
    # bash, not Python: the shim must not add an interpreter start to every uv call it logs.
    shim.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        {{
          printf 'CALL\\t%s' "$EPOCHREALTIME"; printf '\\t%s' "$@"; printf '\\n'
          prev=
          for a in "$@"; do
            if [ "$prev" = -r ] && [ -f "$a" ]; then sed 's/^/REQ\\t/' "$a"; fi
            prev=$a
          done
        }} >> {shlex.quote(str(log))}
        exec {shlex.quote(str(uv))} "$@"
        """), encoding="utf-8")
    shim.chmod(0o755)
    return Workspace(root, uv, shim, log)


def warm_uv_cache(ws: Workspace) -> None:
    """One online install of the runtime and one hatchling skill; everything after is offline.

    Offline (UV_OFFLINE=1, for both sides) keeps index revalidations out of the timings: uv
    would otherwise go to the network whenever a cached index page expires (10 min on PyPI).
    """
    run = ws.fresh("warmup")
    skill = make_skill(run / "skills", "warmup", package=Package())
    venv = run / "venv"
    check([ws.uv, "venv", "--quiet", "--python", BASE_PYTHON, venv])
    check([ws.uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python",
           *RUNTIME, "--editable", skill])
    os.environ["UV_OFFLINE"] = "1"
    # One cold and one warm run: the workspace's bytecode cache then holds kernel-bootstrap's
    # modules, as an installed copy's would after its first run.
    world = make_world(ws, "warmup", 1)
    check(ours_argv(world))
    check(ours_argv(world))
    rmtree(world.dir)


# --- skills and configs ----------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """A config with ``n`` Python skills (and optionally one plain skill) in a fresh directory."""

    dir: Path
    config: Path
    venv: Path
    skills: tuple[Path, ...]  # the Python skills, in install order

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


# A hatchling build hook that appends the skill's name to a log once its wheel is built: uv's
# builds and kernel-bootstrap's run it alike, so the log counts every backend build.
COUNT_HOOK = """\
import os
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

class CustomBuildHook(BuildHookInterface):
    def finalize(self, version, build_data, artifact_path):
        with open({log!r}, "a") as f:
            f.write(os.path.basename(self.root) + "\\n")
"""


def make_world(ws: Workspace, tag: str, n: int, *, plain: bool = True,
               count_builds: Path | None = None) -> World:
    """``n`` Python skills (and a plain one); with ``count_builds``, each build of a skill
    appends its name to that file."""
    root = ws.fresh(tag)
    hook = {"hatch_build.py": COUNT_HOOK.format(log=str(count_builds))} if count_builds else {}
    skills = tuple(make_skill(root / "skills", f"skill-{i:03}", hook, package=Package())
                   for i in range(n))
    for skill in skills if count_builds else ():
        with (skill / "pyproject.toml").open("a", encoding="utf-8") as f:
            f.write("\n[tool.hatch.build.hooks.custom]\n")
    if plain:
        make_skill(root / "skills", "notes")
    config = root / "kernel-bootstrap.toml"
    config.write_text(
        f"venv = {json.dumps(str(root / 'venv'))}\n"
        f"python = {json.dumps(BASE_PYTHON)}\n"
        f"requirements = {json.dumps(list(RUNTIME))}\n"
        'skills = ["skills/*"]\n', encoding="utf-8")
    return World(root, config, root / "venv", skills)


def requirements_file(world: World) -> Path:
    """The same runtime and skills as uv's own requirements file (``-e`` lines)."""
    path = world.dir / "reqs.txt"
    path.write_text("\n".join([*RUNTIME, *(f"-e {s}" for s in world.skills)]) + "\n", "utf-8")
    return path


def skills_only_file(world: World) -> Path:
    path = world.dir / "skills.txt"
    path.write_text("".join(f"-e {s}\n" for s in world.skills), "utf-8")
    return path


# --- the baseline: one uv call per skill -----------------------------------------------------

# The system we replace (issue 2, "Why"): one `uv pip install --editable DIR` per skill (each
# rebuilt from scratch), and a marker written once, after the last skill: a killed session left
# nothing behind, so the next one wiped the venv and paid the runtime and every skill again.
# MODE=each is a stronger baseline that records the base and each skill as it lands.
BASELINE_SH = """\
#!/usr/bin/env bash
# usage: baseline MODE VENV PYTHON SKILL_DIR...   (MODE: once | each; runtime from $RUNTIME)
set -euo pipefail
mode=$1 venv=$2 python=$3; shift 3
uv=${KERNEL_BOOTSTRAP_UV:?}
marker=$venv/.baseline-marker
if [ -f "$marker" ] && grep -qx done "$marker"; then echo "$venv/bin/python"; exit 0; fi
if ! { [ "$mode" = each ] && [ -f "$marker" ] && grep -qx base "$marker"; }; then
  rm -rf "$venv"
  "$uv" venv --quiet --python "$python" "$venv"
  # shellcheck disable=SC2086  # RUNTIME is a list of requirements
  "$uv" pip install --quiet --python "$venv/bin/python" $RUNTIME
  if [ "$mode" = each ]; then echo base >> "$marker"; fi
fi
for dir in "$@"; do
  if [ "$mode" = each ] && grep -qx "skill $dir" "$marker"; then continue; fi
  "$uv" pip install --quiet --python "$venv/bin/python" --editable "$dir"
  if [ "$mode" = each ]; then echo "skill $dir" >> "$marker"; fi
done
echo done >> "$marker"
echo "$venv/bin/python"
"""


def baseline_script(ws: Workspace) -> Path:
    path = ws.root / "bin" / "baseline"
    if not path.exists():
        path.write_text(BASELINE_SH, encoding="utf-8")
        path.chmod(0o755)
    return path


def baseline_argv(ws: Workspace, world: World, mode: str = "once") -> list[str]:
    return [str(baseline_script(ws)), mode, str(world.venv), BASE_PYTHON,
            *map(str, world.skills)]


def baseline_env() -> dict[str, str]:
    return {**os.environ, "RUNTIME": " ".join(RUNTIME)}


def ours_argv(world: World) -> list[str]:
    return [str(KERNEL_BOOTSTRAP), "ensure", "--config", str(world.config)]


# --- running and timing ----------------------------------------------------------------------


def check(argv: Sequence[str | Path], env: Mapping[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          env=dict(env) if env is not None else None, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(map(str, argv))}: exit {proc.returncode}\n"
                           f"{proc.stderr[-2000:]}")
    return proc.stdout


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float  # user + system seconds of the whole process tree (every child is waited for)


def run_timed(argv: Sequence[str | Path], env: Mapping[str, str] | None = None) -> Timing:
    """One run of ``argv`` (stdout discarded); a failure stops the benchmark.

    CPU time is the other half of the story on a shared machine: neighbours' load stretches
    wall time, while the work a command does shows in its CPU seconds.
    """
    args = [str(a) for a in argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          env=dict(env) if env is not None else None, check=False)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)}: exit {proc.returncode}\n"
                           f"{proc.stderr.decode(errors='replace')[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing(elapsed, cpu)


def timed(argv: Sequence[str | Path], env: Mapping[str, str] | None = None) -> float:
    """Wall seconds of one run of ``argv``."""
    return run_timed(argv, env).wall


T = TypeVar("T")


def interleave(variants: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Run every variant once per round, rotating the order, so drift and neighbours' load hit
    every variant alike. Each callable returns what it measured."""
    names = list(variants)
    out: dict[str, list[T]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(variants[name]())
    return out


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def per_call(fn: Callable[[], object], budget: float = 0.05) -> Callable[[], float]:
    """A callable timing ``fn`` over enough calls to fill ~``budget`` s; returns s per call."""
    start = time.perf_counter()
    fn()
    number = max(1, int(budget / max(time.perf_counter() - start, 1e-6)))
    return lambda: timeit.timeit(fn, number=number) / number


def settle() -> None:
    """Wait until files just written count as settled for skills/python_skill.py's hash cache (it
    caches a pyproject's digest only once the file is 2 s old)."""
    time.sleep(2.1)


def cold_pair(ws: Workspace, n: int) -> dict[str, Callable[[], Timing]]:
    """A cold ``ensure`` and a cold baseline session, each on its own fresh world of n skills."""
    def ours() -> Timing:
        world = make_world(ws, f"cold{n}-ours", n)
        timing = run_timed([*ours_argv(world), "--strict"])
        rmtree(world.dir)
        return timing

    def base() -> Timing:
        world = make_world(ws, f"cold{n}-base", n)
        timing = run_timed(baseline_argv(ws, world), env=baseline_env())
        rmtree(world.dir)
        return timing
    return {"`kernel-bootstrap ensure` (cold)": ours,
            "baseline: `uv venv`, runtime, one `uv pip install -e` per skill": base}


# --- the uv log ------------------------------------------------------------------------------


@dataclass
class UvCall:
    started: float  # time.time() when the shim ran
    argv: list[str]
    requirements: list[str] = field(default_factory=list)  # lines of its -r files

    @property
    def fills_build_env(self) -> bool:
        """Creates or fills a build environment of bootstrap.skills.builds, not a kernel venv."""
        return any(re.search(r"\.work-\d+-[0-9a-f]+/build-\d+/env", a) for a in self.argv)

    @property
    def is_venv(self) -> bool:
        return self.argv[:1] == ["venv"] and not self.fills_build_env

    @property
    def editables(self) -> list[str]:
        """The skills this call installs, as paths whose last part is the skill's directory
        name: -e/--editable, ``-e`` lines of a -r file, and the editable wheels kernel-bootstrap
        built (``NAME @ file:///.../SKILL/NAME-VERSION-TAGS.whl``)."""
        out = [b for a, b in zip(self.argv, self.argv[1:], strict=False)
               if a in ("-e", "--editable")]
        out += [line.split(None, 1)[1] for line in self.requirements
                if line.startswith(("-e ", "--editable "))]
        return out + [str(Path(urllib.parse.urlsplit(line.rsplit(" @ ", 1)[-1]).path).parent)
                      for line in self.requirements if line.strip().endswith(".whl")]


def read_uv_log(path: Path, start: int = 0) -> list[UvCall]:
    """The calls logged by the shim, from byte offset ``start``."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    calls: list[UvCall] = []
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "CALL":
            stamp, _, args = rest.partition("\t")
            calls.append(UvCall(float(stamp), args.split("\t") if args else []))
        elif kind == "REQ" and calls:
            calls[-1].requirements.append(rest)
    return calls


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_venv(venv: Path) -> None:
    """Remove a managed venv whole: the link at ``venv`` and every generation and scratch tree
    beside it (``.<name>.*``). rmtree alone leaves a link in place, and the next ``ensure``
    would then be warm, or adopt the generation it names, instead of building anything."""
    if venv.is_symlink():
        venv.unlink()
    else:
        rmtree(venv)
    for leftover in venv.parent.glob(f".{venv.name}.*"):
        rmtree(leftover)


def bench_parser(doc: str, rounds: int, rounds_help: str, uv_help: str) -> argparse.ArgumentParser:
    """The options every interleaved benchmark takes: ``--rounds``, ``--markdown``, ``--uv``
    (default: the dev venv's uv, beside this interpreter)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=rounds,
                   help=f"{rounds_help} (default {rounds})")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--uv", type=Path, default=BIN / "uv",
                   help=f"{uv_help} (default: the dev venv's)")
    return p
