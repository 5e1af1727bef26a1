"""Output of the benchmarks: tables (text or Markdown), BENCHMARKS.md blocks, the PNG chart.

Nothing here imports kernel-bootstrap or any third-party module except matplotlib, lazily, so
``bench.py --chart-from RESULTS.json`` runs under any interpreter that has matplotlib.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Curves = dict[str, dict[str, list[tuple[int, float]]]]


@dataclass
class Table:
    title: str
    head: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def render(self, markdown: bool) -> str:
        if markdown:
            lines = [f"### {self.title}", "",
                     "| " + " | ".join(self.head) + " |",
                     "|" + "|".join("---" for _ in self.head) + "|"]
            lines += ["| " + " | ".join(r) + " |" for r in self.rows]
            if self.notes:
                lines += [""] + [f"- {n}" for n in self.notes]
            return "\n".join(lines) + "\n"
        widths = [max(len(r[i]) for r in [self.head, *self.rows]) for i in range(len(self.head))]
        lines = [self.title, "-" * len(self.title)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                  for r in [self.head, *self.rows]]
        lines += [f"  - {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


@dataclass
class Verdict:
    target: str
    goal: str
    measured: str
    met: bool


@dataclass
class Results:
    tables: dict[str, list[Table]] = field(default_factory=dict)
    curves: Curves = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)

    def summary(self) -> Table:
        rows = [[v.target, v.goal, v.measured, "met" if v.met else "**not met**"]
                for v in self.verdicts]
        return Table("Targets", ["target", "goal", "measured (medians)", "verdict"], rows)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"tables": {k: [asdict(t) for t in v]
                                               for k, v in self.tables.items()},
                                    "curves": self.curves,
                                    "verdicts": [asdict(v) for v in self.verdicts]}, indent=1))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def secs(seconds: float) -> str:
    return f"{seconds:.2f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def machine(uv: Path) -> list[str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True,
                             check=False).stdout.strip()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [f"- CPU: {cpu}, {os.cpu_count()} cores (`nproc`); 1-minute load average "
            f"{load:.2f} when the run started (the machine is shared with other developers' "
            "test runs)",
            f"- {platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"{version}"]


def write_markdown(path: Path, sections: dict[str, str]) -> None:
    """Replace each ``<!-- begin NAME -->...<!-- end NAME -->`` block (append missing ones),
    so a run of a subset of figures leaves the other figures' tables alone."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    for name, body in sections.items():
        block = f"<!-- begin {name} -->\n{body.rstrip()}\n<!-- end {name} -->"
        pattern = re.compile(
            rf"<!-- begin {re.escape(name)} -->.*?<!-- end {re.escape(name)} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(block.replace("\\", "\\\\"), text)  # the block, literally
        else:
            text = text.rstrip() + ("\n\n" if text else "") + block + "\n"
    path.write_text(text, encoding="utf-8")


_TITLES = {"warm": ("warm path vs skills", "Python skills", "ms"),
           "cold": ("cold path vs skills", "Python skills", "s"),
           "push": ("push vs files", "files", "ms")}


def draw(curves: Curves, path: Path, saved: Path | None = None) -> str:
    """A PNG of the growth curves; matplotlib is the optional `bench` extra. Without it the
    curves stay in ``saved`` (the --save-json file) or a temporary file, to draw later."""
    if not curves:
        return "chart skipped: no growth figure ran"
    try:
        import matplotlib  # type: ignore[import-not-found]  # optional: the `bench` extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]  # as above
    except ImportError:
        if saved is None:
            fd, name = tempfile.mkstemp(prefix="kb-bench-curves-", suffix=".json")
            os.close(fd)
            saved = Path(name)
            saved.write_text(json.dumps({"curves": curves}, indent=1))
        return (f"chart skipped: matplotlib is not installed (uv pip install -e '.[bench]'); "
                f"draw it later, under an interpreter that has it: python scripts/bench.py "
                f"--chart-from {saved} --chart {path}")
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    for ax, (key, series) in zip(axes[0], curves.items(), strict=True):
        title, xlabel, unit = _TITLES.get(key, (key, "n", ""))
        for label, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"chart written to {path}"


def load_curves(path: Path) -> Curves:
    data: dict[str, Any] = json.loads(path.read_text())
    return {k: {label: [(int(n), float(v)) for n, v in pts] for label, pts in series.items()}
            for k, series in data["curves"].items()}
