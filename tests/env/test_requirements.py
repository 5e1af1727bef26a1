"""Requirements are judged as PEP 508 judges them, with or without importing packaging."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap.config import load_config
from bootstrap.errors import ConfigError
from testing.world import World


@pytest.mark.parametrize("text", [
    "ipykernel>=6", "numpy==1.26.*", "x!=1.*", "x[a, b] >= 1.0, <2", "x~=1.2", "x<=01",
    "x >= 1,", "x[]", "x; python_version >= '3.8'", "x @ https://example.org/x.whl",
    "x~=1", "x>=1.*", "x==1.0-", "x.", "-x", "x>=", "x[a,]", "x==1.0a1", "x>=1 <2",
])
def test_requirements_are_judged_as_pep_508_judges_them(tmp_path: Path, text: str) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    from bootstrap.env.requirements import validate_requirements

    world = World(tmp_path)
    world.write_config(requirements=[text])
    try:
        Requirement(text)
    except InvalidRequirement:
        with pytest.raises(ConfigError, match="requirements\\[0\\]"):
            validate_requirements(load_config(world.config))
    else:
        validate_requirements(load_config(world.config))
