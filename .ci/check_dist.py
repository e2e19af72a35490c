"""Check the built wheel and sdist in DIST_DIR against the source tree; exit 1 with the reasons.

The wheel holds exactly the package's files (every module and subpackage, ``py.typed``), the
license and the metadata, and nothing else (no tests, benchmarks, CI files or caches); its
version is the package's. The sdist holds what a rebuild needs: pyproject, README, CHANGELOG,
LICENSE and the package, and no caches or virtual environments.

    python .ci/check_dist.py dist/
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CACHES = re.compile(
    r"(^|/)(__pycache__|\.venv|\.ci-venv|\.ci-wheel-venv|\.mypy_cache|\.ruff_cache|\.pytest_cache|\.hypothesis)(/|$)|\.pyc$"
)


def package_files() -> set[str]:
    """The package's files in the source tree, as paths relative to the root."""
    files = (p.relative_to(ROOT).as_posix() for p in (ROOT / "agentloop").rglob("*") if p.is_file())
    return {f for f in files if not _CACHES.search(f)}


def version() -> str:
    match = re.search(
        r'^__version__ = "([^"]+)"', (ROOT / "agentloop" / "__init__.py").read_text(), re.MULTILINE
    )
    assert match, "agentloop/__init__.py has no __version__"
    return match.group(1)


def check_wheel(path: Path, expected: set[str]) -> list[str]:
    names = set(zipfile.ZipFile(path).namelist())
    info = f"agentloop-{version()}.dist-info/"
    problems = [f"wheel: missing {n}" for n in sorted(expected - names)]
    problems += [
        f"wheel: should not hold {n}" for n in sorted(names) if n not in expected and not n.startswith(info)
    ]
    for needed in ("METADATA", "RECORD", "entry_points.txt", "licenses/LICENSE"):
        if info + needed not in names:
            problems.append(f"wheel: missing {info}{needed}")
    if info + "METADATA" in names:
        metadata = zipfile.ZipFile(path).read(info + "METADATA").decode()
        if f"\nVersion: {version()}\n" not in metadata:
            problems.append(f"wheel: METADATA does not give version {version()}")
    return problems


def check_sdist(path: Path, expected: set[str]) -> list[str]:
    with tarfile.open(path) as tar:
        top = f"agentloop-{version()}/"
        names = {m.name.removeprefix(top) for m in tar.getmembers() if m.isfile()}
    needed = expected | {"pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", "PKG-INFO"}
    problems = [f"sdist: missing {n}" for n in sorted(needed - names)]
    problems += [f"sdist: should not hold {n}" for n in sorted(names) if _CACHES.search(n)]
    return problems


def main(argv: list[str]) -> int:
    dist = Path(argv[1])
    wheels, sdists = sorted(dist.glob("agentloop-*.whl")), sorted(dist.glob("agentloop-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(
            f"check_dist: expected one wheel and one sdist in {dist}, found {wheels + sdists}",
            file=sys.stderr,
        )
        return 1
    expected = package_files()
    problems = check_wheel(wheels[0], expected) + check_sdist(sdists[0], expected)
    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {wheels[0].name} and {sdists[0].name} hold what they should")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
