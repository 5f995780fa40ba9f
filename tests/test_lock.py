"""The lock (constraints.txt, made by scripts/lock.sh) is what a development install holds.

scripts/setup.sh installs with ``uv pip install -c constraints.txt``: every package of the venv the
tests run in must be at its locked version, and every dependency pyproject.toml names must be
locked, so that a fresh clone next month installs what CI tested today.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not pinned with =="
        pins[_canonical(name)] = version
    return pins


def test_every_installed_package_is_at_its_locked_version() -> None:
    locked = _locked()
    wrong = []
    for dist in metadata.distributions():
        name = _canonical(dist.metadata["Name"])
        if name in locked and dist.version != locked[name]:
            wrong.append(f"{name} {dist.version} (locked {locked[name]})")
    assert not wrong, "venv differs from constraints.txt: " + ", ".join(sorted(wrong))


def test_every_dependency_of_pyproject_is_locked() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in ("dev",):
        requirements += project["optional-dependencies"][extra]
    names = {_canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}
    missing = sorted(names - set(_locked()))
    assert not missing, f"not in constraints.txt: {missing}; run bash scripts/lock.sh"
