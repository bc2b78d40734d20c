"""Stand-ins for the GPU image's own packages, so that pip on this machine can resolve
Octavo for the image's interpreter as if those packages were installed there.

    stand_ins.py PACKAGES_TXT FREEZE OUT_DIR
        write an empty wheel NAME-VERSION+image for each package of PACKAGES_TXT (a bare
        name takes its version from FREEZE, a ``pip freeze`` of the tested install); print
        pip constraints that pin exactly those wheels, and every other package of FREEZE
        at its tested version (so that the carried wheels are the versions CI tests)
    stand_ins.py --summary REPORT_JSON
        say what a ``pip install --dry-run --report`` would install, split into Octavo,
        carried wheels and the image's own packages

The ``+image`` local version keeps pip from taking the real release of the same version
from an index: ``==2.11.0+image`` matches the stand-in alone, and it still satisfies
requirements such as ``torch>=2.11``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name

LOCAL = "image"


def read_freeze(path: Path) -> dict[str, str]:
    """Versions by canonical name from ``pip freeze`` output (editables, URLs and local
    versions such as torch's ``+cpu`` dropped)."""
    versions = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.]*)", line.strip())
        if match:
            versions[canonicalize_name(match[1])] = match[2]
    return versions


def read_packages(path: Path, tested: dict[str, str]) -> list[tuple[str, str]]:
    """``(name, version)`` from ``name==version`` or bare ``name`` lines (a bare name at its
    ``tested`` version); ``#`` starts a comment."""
    packages = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:==([0-9][A-Za-z0-9.]*))?", line)
        if match is None:
            raise SystemExit(f"{path}:{number}: expected name or name==version, got {line!r}")
        version = match[2] or tested.get(canonicalize_name(match[1]))
        if version is None:
            raise SystemExit(f"{path}:{number}: {match[1]} has no version here and none in "
                             "the tested install")
        packages.append((match[1], version))
    return packages


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_stand_in(name: str, version: str, out_dir: Path) -> Path:
    """An installable wheel that holds nothing but metadata (and so needs nothing)."""
    project = canonicalize_name(name).replace("-", "_")
    full = f"{version}+{LOCAL}"
    info = f"{project}-{full}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {full}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: octavo-stand-ins\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = out_dir / f"{project}-{full}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        record = []
        for member, text in files.items():
            wheel.writestr(member, text)
            record.append(_record_line(member, text.encode()))
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def summary(report_path: Path) -> None:
    """Print the resolved set, and fail if it is empty."""
    groups: dict[str, list[str]] = {"Octavo": [], "carried wheels": [], "the image": []}
    for item in json.loads(report_path.read_text())["install"]:
        metadata = item["metadata"]
        name, version = metadata["name"], metadata["version"]
        if version.endswith(f"+{LOCAL}"):
            groups["the image"].append(f"{name} {version.removesuffix('+' + LOCAL)}")
        elif name.startswith("octavo"):
            groups["Octavo"].append(f"{name} {version}")
        else:
            groups["carried wheels"].append(f"{name} {version}")
    if not groups["Octavo"]:
        raise SystemExit("the report installs none of Octavo's distributions")
    for group, entries in groups.items():
        print(f"resolved from {group} ({len(entries)}): {', '.join(sorted(entries))}")


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--summary":
        summary(Path(argv[1]))
        return
    if len(argv) != 3:
        raise SystemExit(__doc__)
    tested = read_freeze(Path(argv[1]))
    out_dir = Path(argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    image = read_packages(Path(argv[0]), tested)
    for name, version in image:
        write_stand_in(name, version, out_dir)
        print(f"{name}=={version}+{LOCAL}")
    on_image = {canonicalize_name(name) for name, _ in image}
    for name, version in sorted(tested.items()):
        if name not in on_image and not name.startswith("octavo"):
            print(f"{name}=={version}")


if __name__ == "__main__":
    main(sys.argv[1:])
