"""Print pip requirements pinning each of pagetrace's dependencies to the lowest version
pyproject.toml declares (`name>=X` becomes `name==X`), for CI's run of the suite at the floor.

    python scripts/min_requirements.py [EXTRA ...] > floor.txt
    pip install torch==2.13.0 -r floor.txt -e '.[test]'

torch and Triton are left out: they stay at the build the machine has (CI's CPU build of torch
and the Triton it depends on). A dependency declared without a lower bound is an error, so
every bound pyproject states is one the floor run has tried.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

KEPT = {"torch", "triton"}  # the machine's build, not the floor
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def floor(requirement: str) -> str | None:
    """`name==lowest` for one requirement string, or None for a kept package."""
    m = REQUIREMENT.match(requirement)
    if m is None:
        raise SystemExit(f"min_requirements: cannot read {requirement!r}")
    name, spec, marker = m[1], m[2], m[3] or ""
    if name.lower() in KEPT:
        return None
    lows = [v for op, v in re.findall(r"(>=|==|~=)\s*([0-9][^,\s]*)", spec)]
    if not lows:
        raise SystemExit(f"min_requirements: {name} has no lower bound in pyproject.toml ({requirement!r})")
    return f"{name}=={lows[0]}{(' ' + marker) if marker else ''}"


def main(extras: list[str]) -> None:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    for line in filter(None, map(floor, requirements)):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
