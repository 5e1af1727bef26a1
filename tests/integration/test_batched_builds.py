"""Editable builds batched in one backend process (bootstrap.skills.builds), with the real uv.

What must hold: the venv ends up as uv's own editable installs would leave it (same files, same
records, and uv's freshness check sees them as fresh); a skill the batch cannot build is left to
uv; a session killed inside the batched build leaves a marker the next one resumes from, and
its scratch directory is reaped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from tests.integration.conftest import RealWorld

# A hatchling build hook that waits while a HANG file sits in the project: it runs inside
# build_editable, so inside our one backend process (an in-tree backend would not be batched).
HANG_HOOK = textwrap.dedent("""\
    import os, time
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface

    class CustomBuildHook(BuildHookInterface):
        def initialize(self, version, build_data):
            while os.path.exists(os.path.join(self.root, "HANG")):
                time.sleep(0.1)
    """)


def dist_info(venv: Path, project: str) -> Path:
    [found] = venv.glob(f"lib/python*/site-packages/{project.replace('-', '_')}-*.dist-info")
    return found


def installed_files(venv: Path, project: str) -> dict[str, bytes]:
    """The skill's dist-info files and its .pth, by name (RECORD compared as a set of paths)."""
    info = dist_info(venv, project)
    files = {p.name: p.read_bytes() for p in info.iterdir() if p.name != "RECORD"}
    files["RECORD"] = b"\n".join(sorted(line.split(b",")[0] for line in
                                        (info / "RECORD").read_bytes().splitlines()))
    for pth in info.parent.glob(f"*{project.replace('-', '_')}*.pth"):
        files[pth.name] = pth.read_bytes()
    return files


def flat_skill(real: RealWorld, name: str) -> None:
    """A flat-layout skill (no src/: uv records that directory as absent), with a setup.cfg."""
    real.skill(name, flat=True, files={"setup.cfg": "[metadata]\n"})


def test_batched_installs_match_uvs_own_and_stay_fresh_for_uv(real: RealWorld) -> None:
    real.skill("alpha")
    beta = real.skill("beta")
    real.skill("gamma", deps=("alpha",))
    flat_skill(real, "delta")
    # What uv compares is not what `ls -l` shows: a key file's ctime, src/'s creation time.
    # Here they part from the mtimes, as a checkout, an editor or bytecode written into src/
    # make them part (under load, even src/ and the package made in it a tick apart do).
    os.utime(beta / "pyproject.toml", ns=(0, 0))
    os.utime(beta / "src", ns=(0, 0))
    names = ["alpha", "beta", "delta", "gamma"]
    out = json.loads(real.ensure("--json").stdout)
    assert sorted(out["installed"]) == names
    [skills_call] = real.installs()
    assert skills_call.wheels == 4 and sorted(skills_call.editables) == names
    assert real.build_env_calls(), "no build environment was made: nothing was batched"
    assert real.imports("alpha") and real.imports("gamma")

    # The same skills through uv's own editable builds, into another venv.
    by_uv = real.root / "venv-by-uv"
    real.ensure(env={"KERNEL_BOOTSTRAP_VENV": str(by_uv),
                 "KERNEL_BOOTSTRAP_BATCH_BUILDS": "0"})
    for project in names:
        assert installed_files(real.venv, project) == installed_files(by_uv, project), project

    # uv's freshness check agrees that nothing is to be done (no build, nothing installed).
    reqs = real.root / "reqs.txt"
    reqs.write_text("".join(f"-e {real.skills_dir / n}\n" for n in names))
    check = subprocess.run([str(real.uv), "pip", "install", "--python", str(real.python),
                            "-r", str(reqs)], env=real.env, capture_output=True, text=True,
                           check=True)
    assert "Checked 4 packages" in check.stderr, check.stderr
    assert "Built" not in check.stderr and "Installed" not in check.stderr, check.stderr


def test_a_skill_the_batch_cannot_build_goes_to_uv_alone(real: RealWorld) -> None:
    real.skill("alpha")
    real.skill("beta")
    real.skill("broken", version="not a version")  # hatchling refuses it, ours and uv's
    result = real.ensure("--json", "--strict", ok=False)
    assert result.returncode == 3
    out = json.loads(result.stdout)
    assert sorted(out["installed"]) == ["alpha", "beta"]
    assert [f["name"] for f in out["failed"]] == ["broken"]
    first = real.installs()[0]
    assert first.wheels == 2 and "broken" in first.editables  # sent to uv as `-e`
    assert real.imports("alpha") and real.imports("beta")


def test_killed_inside_the_batched_build_then_resumed(real: RealWorld) -> None:
    real.skill("alpha")
    real.ensure()
    real.skill("beta")
    slow = real.skill("gamma")
    (slow / "hatch_build.py").write_text(HANG_HOOK)
    with (slow / "pyproject.toml").open("a") as f:
        f.write("\n[tool.hatch.build.hooks.custom]\n")
    (slow / "HANG").write_text("")
    real.clear_log()
    proc = subprocess.Popen(real.command("ensure"), env=real.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    # The backend process asks uv for hatchling's editable requirement just before building.
    while not any("editables~=0.3" in c for c in real.build_env_calls()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert real.status()["runtime"] == "current"
    assert [p.name for p in real.root.iterdir() if ".venv.work-" in p.name]

    (slow / "HANG").unlink()
    real.clear_log()
    out = json.loads(real.ensure("--json").stdout)
    assert out["action"] == "skills" and sorted(out["installed"]) == ["beta", "gamma"]
    assert real.venv_calls() == []
    assert sorted(e for c in real.installs() for e in c.editables) == ["beta", "gamma"]
    assert not [p.name for p in real.root.iterdir() if ".venv.work-" in p.name]
    assert real.imports("alpha") and real.imports("beta") and real.imports("gamma")
