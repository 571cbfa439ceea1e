"""What scripts/setup.sh installs, read from pyproject.toml (the one list of the package's
requirements): run by setup.sh with the Python of .venv, imported by tests/test_packaging.py.

    python scripts/requirements.py unmet KIND...     # unmet requirements, one a line
    python scripts/requirements.py installed NAME    # NAME's version and where it is installed
    python scripts/requirements.py torch-cuda        # torch.version.cuda (None: CPU-only)
    python scripts/requirements.py test-extra CUDA   # the test extra for torch.version.cuda
    python scripts/requirements.py foreign-cupy EXTRA

KIND: ``build`` ([build-system] requires), ``project`` (the core dependencies) or an extra's name;
the package's own extras named in a requirement (``recoverssm_rs[gpu-cu13]``) are expanded.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy, in an environment without packaging
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_CUPY_WHEEL = re.compile(r"^cupy-cuda(\d+)x$")


def _doc() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def normalize(name: str) -> str:
    """A distribution name in its canonical form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(*kinds: str) -> list[Requirement]:
    """The requirements of ``kinds`` for this platform, the package's own extras expanded."""
    doc = _doc()
    own = normalize(doc["project"]["name"])
    extras = doc["project"]["optional-dependencies"]
    out: list[Requirement] = []
    seen: set[str] = set()

    def walk(kind: str) -> None:
        if kind in seen:
            return
        seen.add(kind)
        if kind == "build":
            texts = doc["build-system"]["requires"]
        elif kind == "project":
            texts = doc["project"]["dependencies"]
        else:
            texts = extras[kind]
        for text in texts:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if normalize(req.name) == own:
                for extra in sorted(req.extras):
                    walk(extra)
            else:
                out.append(req)

    for kind in kinds:
        walk(kind)
    return out


def unmet(*kinds: str) -> list[str]:
    """The requirements of ``kinds`` this environment does not satisfy (without their markers)."""
    missing = []
    for req in requirements(*kinds):
        try:
            ok = req.specifier.contains(md.version(req.name), prereleases=True)
        except md.PackageNotFoundError:
            ok = False
        if not ok:
            missing.append(f"{req.name}{req.specifier}")
    return missing


def installed(name: str) -> str:
    """``NAME VERSION in FOLDER`` for an installed distribution (torch: with the CUDA it was built
    for), read from its metadata without importing it."""
    dist = md.distribution(name)
    where = Path(str(dist.locate_file(""))).resolve()
    built = ""
    if normalize(name) == "torch":
        cuda = torch_cuda()
        built = f" (CUDA {cuda})" if cuda else " (CPU-only)"
    return f"{dist.metadata['Name']} {dist.version}{built} in {where}"


def torch_cuda() -> str | None:
    """``torch.version.cuda`` of the installed torch, read from its ``torch/version.py`` without
    importing torch (seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("requirements.py: torch is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    version_spec = importlib.util.spec_from_file_location("_torch_version", path)
    assert version_spec is not None and version_spec.loader is not None
    module = importlib.util.module_from_spec(version_spec)
    version_spec.loader.exec_module(module)
    return module.cuda


def extra_for_cuda(torch_cuda: str | None) -> str:
    """The test extra for a torch built with CUDA ``torch_cuda`` (``torch.version.cuda``):
    ``test-cu12`` for CUDA 12, ``test`` (CUDA 13) otherwise, a CPU-only torch included."""
    return "test-cu12" if (torch_cuda or "").split(".")[0] == "12" else "test"


def foreign_cupy(extra: str) -> list[str]:
    """CuPy wheels installed in this environment (under ``sys.prefix``) for another CUDA major than
    the one ``extra`` installs: they would shadow it."""
    wanted = {normalize(r.name) for r in requirements(extra) if _CUPY_WHEEL.match(normalize(r.name))}
    prefix = Path(sys.prefix).resolve()
    found = set()
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"] or "")
        if _CUPY_WHEEL.match(name) and name not in wanted:
            if Path(str(dist.locate_file(""))).resolve().is_relative_to(prefix):
                found.add(name)
    return sorted(found)


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "unmet":
        lines = unmet(*args)
    elif cmd == "installed":
        lines = [installed(args[0])]
    elif cmd == "torch-cuda":
        lines = [str(torch_cuda())]
    elif cmd == "test-extra":
        lines = [extra_for_cuda(args[0] if args and args[0] != "None" else None)]
    elif cmd == "foreign-cupy":
        lines = foreign_cupy(args[0])
    else:
        print(f"requirements.py: unknown command {cmd!r}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
