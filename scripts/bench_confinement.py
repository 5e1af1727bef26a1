"""Benchmark: what issue 35's confinement checks cost a served kernel start, before and after,
in the same run.

Two warm worlds from one uv cache (the README's ipykernel runtime), each with its own venv and
server: *after* runs the tool of this checkout, *before* the tool of ``--before`` (a commit,
extracted with ``git archive``: default 9ce56d8, the last commit before issue 35). Each gets a
kernelspec ``python -m bootstrap run --config C -- -m ipykernel_launcher -f {connection_file}``
with ``PYTHONPATH`` naming its tree, so both start alike. Interleaved rounds, order rotating:
start_kernel -> kernel_info reply (testing/kernels.py's probe) of a served kernel, its server up.

Start-up medians move by tens of milliseconds on a shared host, more than the checks can cost,
so the checks are also timed in process: :func:`bootstrap.kernels.admission.refusal` for a live
launcher (the peer's /proc read and compared, the cwd listed) and
:func:`bootstrap.kernels.context.apply` in a forked child, per call. Usage::

    .venv/bin/python scripts/bench_confinement.py [--rounds 21] [--before REV] [--markdown]
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

# Imported after the sys.path lines, so the script runs from a checkout without installing.
from bench_lib import (
    REPO,
    RUNTIME,
    bench_parser,
    check,
    interleave,
    median,
    open_workspace,
    per_call,
    quartiles,
    rmtree,
)
from bench_report import Table, ms, ratio

from testing import kernels, kernelserver, reaper
from testing.world import World

BEFORE, AFTER = "before", "after"
# A tag per world: testing.kernelserver finds one server per tag, and each world has its own.
TAGS = {BEFORE: reaper.new_tag(), AFTER: reaper.new_tag()}
QUIET: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


def tree(root: Path, rev: str) -> Path:
    """The tool at ``rev``, extracted (never a checkout: the working tree stays as it is)."""
    path = root / f"tree-{rev}"
    path.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "bootstrap"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive, check=True)
    return path


def world(root: Path, name: str, source: Path, data: Path) -> World:
    """A warm world whose kernelspec ``name`` runs the tool in ``source``."""
    w = World(root / name)
    w.env.update(os.environ)
    w.env.pop("KERNEL_BOOTSTRAP_KERNEL_SERVER", None)
    w.env[reaper.TAG] = TAGS[name]
    w.write_config(requirements=list(RUNTIME))
    env = {**w.env, "PYTHONPATH": str(source)}
    check([sys.executable, "-m", "bootstrap", "ensure", "--config", str(w.config)], env)
    spec = data / "kernels" / name
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "bootstrap", "run", "--config", str(w.config), "--", "-m",
            "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": name, "language": "python",
        "env": {"PYTHONPATH": str(source), reaper.TAG: TAGS[name]}}))
    return w


def served_start(name: str, venv: Path) -> float:
    kernelserver.wait_up(TAGS[name], venv)
    kernel = kernels.start(name, **QUIET)
    kernels.stop(kernel)
    kernelserver.settle(TAGS[name])
    return kernel.seconds


def check_costs(rounds: int) -> dict[str, list[float]]:
    """Seconds per call of the admission check and of applying a context, in this process
    against a live launcher (a child sleeping under ``nice`` and ``ulimit``, as a wrapper
    leaves it)."""
    from bootstrap.kernels import admission, context

    peer = subprocess.Popen(["sh", "-c", 'ulimit -n 256; exec nice -n 5 "$@"', "sh",
                             sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.5)
        server = admission.Server.now("/v", "/g", "", dict(os.environ), None)
        message = {"venv": "/v", "generation": "/g", "config": "", "securebits": 0}
        theirs = context.read(peer.pid, 0)
        check_one = per_call(lambda: admission.refusal(server, message, dict(os.environ),
                                                       os.getcwd(), peer.pid))
        return interleave({"admission": check_one, "apply": lambda: _apply_in_child(theirs)},
                          rounds)
    finally:
        peer.kill()
        peer.wait()


def _apply_in_child(theirs: object) -> float:
    """Seconds ``context.apply`` takes in a forked child (it changes the process for good)."""
    from bootstrap.kernels import context

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        start = time.perf_counter()
        context.apply(theirs)  # type: ignore[arg-type]
        os.write(write_end, repr(time.perf_counter() - start).encode())
        os._exit(0)
    os.close(write_end)
    took = float(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(pid, 0)
    return took


def tables(starts: dict[str, list[float]], costs: dict[str, list[float]],
           rounds: int) -> list[Table]:
    rows = []
    for name in (BEFORE, AFTER):
        q1, q3 = quartiles(starts[name])
        rows.append([name, ms(median(starts[name])), f"{ms(q1)}-{ms(q3)}",
                     ratio(median(starts[name]), median(starts[BEFORE]))])
    start_table = Table(f"Served start before and after the checks ({rounds} rounds)",
                        ["tool", "median (ms)", "IQR (ms)", "/ before"], rows)
    per = [[name, f"{median(v) * 1e6:.0f} us"] for name, v in costs.items()]
    total = sum(median(v) for v in costs.values())
    per.append(["both, per start", f"{total * 1e3:.2f} ms (bar: 2 ms)"])
    return [start_table, Table("The checks, per call (in process)", ["step", "median"], per)]


def main(argv: Sequence[str] | None = None) -> int:
    p = bench_parser(__doc__ or "", 21, "interleaved rounds", "the real uv")
    p.add_argument("--before", default="9ce56d8", help="the commit to compare with (9ce56d8)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="kb-bench-confinement-"))
    try:
        ws = open_workspace(root, args.uv)
        os.environ["KERNEL_BOOTSTRAP_UV"] = str(ws.shim)
        data = root / "jupyter"
        os.environ["JUPYTER_DATA_DIR"] = str(data)
        worlds = {BEFORE: world(root, BEFORE, tree(root, args.before), data),
                  AFTER: world(root, AFTER, REPO, data)}
        for name in worlds:  # the first start spawns the server, untimed
            kernels.stop(kernels.start(name, **QUIET))
        starts = interleave({name: functools.partial(served_start, name, w.venv)
                             for name, w in worlds.items()}, args.rounds)
        costs = check_costs(args.rounds)
        print("\n".join(t.render(args.markdown) for t in tables(starts, costs, args.rounds)))
    finally:
        try:
            for tag in TAGS.values():
                kernelserver.stop(tag)
            for tag in TAGS.values():
                kernels.assert_no_orphans(tag, [root])
        finally:
            rmtree(root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
