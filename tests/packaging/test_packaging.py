"""Package metadata, the entry point's missing-dependency line, the optional-dependency checks and
the package namespace."""

import ast
import importlib.metadata
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import recoverssm_rs
from recoverssm_rs import backend_check
from recoverssm_rs.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CARGO = tomllib.loads((ROOT / "Cargo.toml").read_text())
PROJECT = PYPROJECT["project"]


def _abi3_floor() -> tuple[int, int]:
    features = CARGO["dependencies"]["pyo3"]["features"]
    (abi3,) = [f for f in features if f.startswith("abi3-py")]
    digits = abi3.removeprefix("abi3-py")
    return int(digits[0]), int(digits[1:])


def test_requires_python_is_the_abi3_floor():
    floor = _abi3_floor()
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)", PROJECT["requires-python"])
    assert m, PROJECT["requires-python"]
    assert (int(m.group(1)), int(m.group(2))) == floor


def test_python_version_classifiers_start_at_the_floor():
    floor = _abi3_floor()
    versions = sorted(
        tuple(int(x) for x in c.rsplit(" ", 1)[1].split("."))
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert versions[0] == floor
    assert {(3, 11), (3, 12), (3, 13)} <= set(versions)


def test_classifiers_name_os_language_and_topic():
    cls = set(PROJECT["classifiers"])
    assert "Operating System :: POSIX :: Linux" in cls
    assert "Programming Language :: Rust" in cls
    assert any(c.startswith("Topic :: ") for c in cls)
    # The license is the SPDX expression; a License classifier beside it is refused by indexes.
    assert not any(c.startswith("License :: ") for c in cls)


def test_license_file_and_expression_agree():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == CARGO["package"]["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]


def _backend(monkeypatch):
    """build_backend/pep517_backend.py, imported from the checkout, run from the repository root."""
    pytest.importorskip("maturin")
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / PYPROJECT["build-system"]["backend-path"][0]))
    monkeypatch.delenv("MATURIN_PEP517_ARGS", raising=False)
    return __import__(PYPROJECT["build-system"]["build-backend"])


# ------------------------------------------------------------------------------------------------
# The wheel's platform tag: manylinux_2_28 (glibc 2.28, vLLM's own wheel's tag) on every build path
# ------------------------------------------------------------------------------------------------

TARGET_GLIBC = (2, 28)


def test_the_configured_tag_is_manylinux_2_28(monkeypatch):
    compatibility = PYPROJECT["tool"]["maturin"]["compatibility"]
    assert compatibility == "manylinux_2_28"
    assert _backend(monkeypatch).target_glibc(compatibility) == TARGET_GLIBC


def _glibc_versions_needed(path: Path) -> set[tuple[int, int]]:
    """The GLIBC_x.y symbol versions an ELF64 little-endian shared library needs (.gnu.version_r)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit LE ELF file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found: set[tuple[int, int]] = set()
    for _, sh_type, _, _, offset, _, link, count, _, _ in sections:
        if sh_type != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strtab = sections[link][4]
        entry = offset
        for _ in range(count):
            _, aux_count, _, aux, nxt = struct.unpack_from("<HHIII", data, entry)
            at = entry + aux
            for _ in range(aux_count):
                _, _, _, name, aux_next = struct.unpack_from("<IHHII", data, at)
                text = data[strtab + name : data.index(b"\0", strtab + name)].decode()
                m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", text)
                if m:
                    found.add((int(m.group(1)), int(m.group(2))))
                at += aux_next
            entry += nxt
    return found


def test_the_elf_reader_reads_this_python():
    # The interpreter needs glibc; a reader that found nothing would pass any library.
    exe = Path(sys.executable).resolve()
    needed = _glibc_versions_needed(exe)
    assert needed and min(needed) >= (2, 2), needed
    if shutil.which("readelf"):  # binutils' reading of the same section agrees
        out = subprocess.run(["readelf", "-V", "-W", str(exe)], capture_output=True, text=True, check=True).stdout
        assert needed == {(int(a), int(b)) for a, b in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", out)}


def test_the_installed_extension_is_the_manylinux_2_28_build():
    """scripts/setup.sh installs the package through the build backend (pip install -e), so the
    extension every test uses is the one a wheel ships: tagged manylinux_2_28 and needing no glibc
    symbol newer than 2.28 (this machine's glibc is newer: it is the zig link that makes it so)."""
    dist = importlib.metadata.distribution("recoverssm_rs")
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag:")
    ]
    floor = "".join(str(x) for x in _abi3_floor())
    assert tags == [f"cp{floor}-abi3-manylinux_2_28_x86_64"], (
        f"the installed recoverssm_rs is tagged {tags}, not manylinux_2_28: install it with "
        "`bash scripts/setup.sh` (maturin develop tags linux_x86_64 and links for this machine's glibc)"
    )
    needed = _glibc_versions_needed(Path(recoverssm_rs._core.__file__))
    assert needed and max(needed) <= TARGET_GLIBC, sorted(needed)
    # The built metadata carries every extra of pyproject.toml.
    assert sorted(dist.metadata.get_all("Provides-Extra") or []) == sorted(PROJECT["optional-dependencies"])


def test_every_build_path_gets_the_configured_tag_and_zig(monkeypatch):
    backend = _backend(monkeypatch)
    newer, zig = (2, 36), "/opt/zig/zig"
    # pip wheel . / pip install . / pip install -e .: maturin's hook would pass --compatibility off.
    assert backend.build_args(None, host=newer, zig=zig) == (
        {"build-args": ["--compatibility", "manylinux_2_28", "--zig"]},
        zig,
    )
    monkeypatch.setenv("MATURIN_PEP517_ARGS", "--features python")
    assert backend.build_args({}, host=newer, zig=zig) == (
        {"build-args": ["--features", "python", "--compatibility", "manylinux_2_28", "--zig"]},
        zig,
    )
    monkeypatch.delenv("MATURIN_PEP517_ARGS")
    # On glibc 2.28 or older the plain link already fits: no zig.
    assert backend.build_args(None, host=(2, 28), zig=zig) == (
        {"build-args": ["--compatibility", "manylinux_2_28"]},
        None,
    )
    # A caller's own choice wins: a local linux_x86_64 wheel needs no zig; a caller's --zig stays one.
    mine = {"build-args": "--compatibility linux"}
    assert backend.build_args(mine, host=newer, zig=zig) == (mine, None)
    assert backend.build_args({"build-args": "--compatibility=manylinux_2_17"}, host=newer, zig=zig) == (
        {"build-args": ["--compatibility=manylinux_2_17", "--zig"]},
        zig,
    )
    assert backend.build_args({"build-args": ["--zig"]}, host=newer, zig=zig) == (
        {"build-args": ["--zig", "--compatibility", "manylinux_2_28"]},
        None,
    )
    assert backend.build_sdist is __import__("maturin").build_sdist


def test_without_zig_the_backend_refuses_with_the_fix(monkeypatch):
    backend = _backend(monkeypatch)
    monkeypatch.setattr(backend, "find_zig", lambda: None)
    with pytest.raises(backend.ZigNotFound) as err:
        backend.build_args(None, host=(2, 36))
    msg = str(err.value)
    assert "manylinux_2_28" in msg and "glibc 2.36" in msg and "--compatibility linux" in msg
    (ziglang,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("ziglang")]
    assert f"pip install '{ziglang.split(';')[0].strip()}'" in msg
    # An isolated build (pip's default) always has ziglang: it is a build requirement on Linux.
    assert "sys_platform == 'linux'" in ziglang


def test_find_zig_prefers_the_variable_then_the_ziglang_package(monkeypatch, tmp_path):
    backend = _backend(monkeypatch)
    monkeypatch.setenv(backend.ZIG_PATH_ENV, "/given/zig")
    assert backend.find_zig() == "/given/zig"
    monkeypatch.delenv(backend.ZIG_PATH_ENV)
    pkg = tmp_path / "ziglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "zig").write_text("#!/bin/sh\n")
    (pkg / "zig").chmod(0o755)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ziglang", raising=False)
    assert backend.find_zig() == str(pkg / "zig")


@pytest.mark.parametrize("hook", ["build_wheel", "build_editable"])
def test_the_hooks_hand_maturin_the_args_and_the_zig(monkeypatch, hook):
    backend = _backend(monkeypatch)
    monkeypatch.setattr(backend, "host_glibc", lambda: (2, 36))
    monkeypatch.setattr(backend, "find_zig", lambda: "/opt/zig/zig")
    monkeypatch.delenv(backend.ZIG_PATH_ENV, raising=False)
    seen = {}

    def fake(wheel_directory, config_settings, metadata_directory):
        seen.update(settings=config_settings, zig=os.environ.get(backend.ZIG_PATH_ENV))
        return "x.whl"

    monkeypatch.setattr(backend.maturin, hook, fake)
    assert getattr(backend, hook)("out") == "x.whl"
    assert seen == {"settings": {"build-args": ["--compatibility", "manylinux_2_28", "--zig"]}, "zig": "/opt/zig/zig"}
    assert backend.ZIG_PATH_ENV not in os.environ  # restored


def test_console_script_resolves_to_the_entry_point():
    module, _, attr = PROJECT["scripts"]["recoverssm"].partition(":")
    mod = __import__(module, fromlist=[attr])
    assert callable(getattr(mod, attr))


def test_extras_named_in_messages_exist_and_install_the_module():
    extras = PROJECT["optional-dependencies"]
    for module, extra in backend_check.EXTRAS.items():
        assert any(req.startswith(module) for req in extras[extra]), (module, extra)
    for major in (12, 13):
        name = backend_check.cupy_extra(major)
        assert any(req.startswith(f"cupy-cuda{major}x") for req in extras[name]), name
        assert any(req.startswith("torch") for req in extras[name])


# ------------------------------------------------------------------------------------------------
# The extras, and what scripts/setup.sh installs from them (scripts/requirements.py)
# ------------------------------------------------------------------------------------------------


def _setup_requirements():
    spec = importlib.util.spec_from_file_location("setup_requirements", ROOT / "scripts" / "requirements.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_nixl_extra_installs_the_tested_nixl():
    reqs = _setup_requirements()
    (req,) = reqs.requirements("nixl")
    assert reqs.normalize(req.name) == "nixl-cu12" and req.specifier.contains("1.5.1")


@pytest.mark.parametrize("torch_cuda, major", [("13.2", 13), ("13.0", 13), (None, 13), ("12.8", 12), ("12.4", 12)])
def test_setup_installs_the_test_extra_of_torchs_cuda_major(torch_cuda, major):
    reqs = _setup_requirements()
    extra = reqs.extra_for_cuda(torch_cuda)
    names = {reqs.normalize(r.name) for r in reqs.requirements(extra)}
    cupy = sorted(n for n in names if n.startswith("cupy"))
    assert cupy == [f"cupy-cuda{major}x"]
    if torch_cuda is not None:  # the package's own check agrees with setup's choice
        assert backend_check.cuda_match_problem(torch_cuda, cupy) is None
    nvrtc = re.split(r"[<>=!~ ]", backend_check.nvrtc_requirement(major), maxsplit=1)[0]
    assert reqs.normalize(nvrtc) in names
    assert {"torch", "triton", "nixl-cu12", "pytest", "hypothesis", "matplotlib", "mypy", "ruff"} <= names


def test_setup_reads_torchs_cuda_without_importing_it():
    torch = pytest.importorskip("torch")
    assert _setup_requirements().torch_cuda() == torch.version.cuda


#: Modules the tests import that no distribution provides: tests/support/vllm_oracle.py makes it.
_MADE_AT_RUN_TIME = {"vllm_oracle_triton"}
# Imported only by the end-to-end scripts that run in vLLM's own environment (scripts/vllm_cpu_env.sh).
_VLLM_ENVIRONMENT = {"vllm", "transformers"}


def _imported_modules(paths) -> set[str]:
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.add(str(node.args[0].value).split(".")[0])
    return found


def test_the_test_extras_provide_every_module_the_tests_import():
    reqs = _setup_requirements()
    tests = ROOT / "tests"
    local = {p.stem for p in tests.rglob("*.py")} | {p.name for p in tests.rglob("*") if p.is_dir()}
    modules = _imported_modules(tests.rglob("*.py")) - set(sys.stdlib_module_names) - local
    # the package, the checkout's tools, what only vLLM's own environment imports
    modules -= {"recoverssm_rs", "recoverssm_dev"} | _MADE_AT_RUN_TIME | _VLLM_ENVIRONMENT
    provided = {reqs.normalize(r.name) for r in reqs.requirements("build", "project", "test", "test-cu12")}
    by_module = importlib.metadata.packages_distributions()
    missing = {
        m: by_module.get(m) for m in sorted(modules) if not {reqs.normalize(d) for d in by_module.get(m, [])} & provided
    }
    assert not missing, f"imported by the tests but in no test extra (module: installed from): {missing}"
    assert {"cupy", "torch", "triton", "hypothesis", "matplotlib"} <= modules


def test_setup_removes_only_this_environments_cupy_of_another_major(monkeypatch, tmp_path):
    reqs = _setup_requirements()
    inside, outside = tmp_path / "venv", tmp_path / "elsewhere"

    class Dist:
        def __init__(self, name, where):
            self.metadata = {"Name": name}
            self._where = where

        def locate_file(self, _):
            return self._where

    monkeypatch.setattr(reqs.sys, "prefix", str(inside))
    monkeypatch.setattr(
        reqs.md,
        "distributions",
        lambda: [
            Dist("cupy-cuda12x", inside / "lib"),
            Dist("cupy_cuda13x", inside / "lib"),
            Dist("cupy-cuda11x", outside / "lib"),
            Dist("numpy", inside / "lib"),
        ],
    )
    assert reqs.foreign_cupy("test") == ["cupy-cuda12x"]
    assert reqs.foreign_cupy("test-cu12") == ["cupy-cuda13x"]


# ------------------------------------------------------------------------------------------------
# backend_check
# ------------------------------------------------------------------------------------------------


def test_matching_cupy_is_accepted():
    assert backend_check.cuda_match_problem("13.2", ["cupy-cuda13x"]) is None
    assert backend_check.cuda_match_problem("12.8", ["cupy-cuda12x"]) is None
    assert backend_check.cuda_match_problem("12.8", ["cupy"]) is None  # built from source


def test_cupy_for_another_cuda_major_is_named_with_the_fix():
    msg = backend_check.cuda_match_problem("13.2", ["cupy-cuda12x"])
    assert msg is not None and "\n" not in msg
    assert "cupy-cuda12x" in msg and "CUDA 12" in msg and "CUDA 13.2" in msg
    assert "recoverssm_rs[gpu-cu13]" in msg and "pip uninstall cupy-cuda12x" in msg
    msg = backend_check.cuda_match_problem("12.4", ["cupy-cuda13x"])
    assert msg is not None and "recoverssm_rs[gpu-cu12]" in msg


def test_missing_or_duplicate_cupy_and_cpu_torch():
    msg = backend_check.cuda_match_problem("13.0", [])
    assert msg is not None and "not installed" in msg and "gpu-cu13" in msg
    msg = backend_check.cuda_match_problem("13.0", ["cupy-cuda12x", "cupy-cuda13x"])
    assert msg is not None and "several" in msg and "keep only cupy-cuda13x" in msg
    msg = backend_check.cuda_match_problem(None, ["cupy-cuda13x"])
    assert msg is not None and "CPU-only" in msg


def test_gpu_stack_problem_reads_this_environment():
    torch = pytest.importorskip("torch")
    expected = backend_check.cuda_match_problem(torch.version.cuda, backend_check.cupy_distributions())
    assert backend_check.gpu_stack_problem() == expected
    if expected is None:
        backend_check.require_gpu_stack()
    else:
        with pytest.raises(BackendUnavailableError, match=re.escape(expected)):
            backend_check.require_gpu_stack()


def test_missing_torch_raises_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailableError, match=r"the demo needs torch.*recoverssm_rs\[torch\]"):
        backend_check.require_torch("the demo")
    assert "torch is not installed" in backend_check.gpu_stack_problem()


def test_missing_module_message_only_for_optional_dependencies():
    msg = backend_check.missing_module_message(ModuleNotFoundError("x", name="matplotlib.pyplot"), "`bench`")
    assert msg == "`bench` needs matplotlib, which is not installed: pip install 'recoverssm_rs[plot]'"
    msg = backend_check.missing_module_message(ModuleNotFoundError("x", name="cupy"))
    assert msg is not None and "gpu-cu13" in msg and "gpu-cu12" in msg
    assert backend_check.missing_module_message(ModuleNotFoundError("x", name="numpyy")) is None


def test_entry_point_answers_a_missing_torch_with_one_line():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from recoverssm_rs.__main__ import main\n"
        "sys.exit(main(['demo', '--steps', '2']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    # The entry point's line, or the same sentence raised by a check the demo makes up front.
    assert ": error: " in lines[-1] and len(lines) == 1
    assert "`demo` needs torch, which is not installed: pip install 'recoverssm_rs[torch]' (CPU)" in lines[-1]


def test_entry_point_leaves_other_missing_modules_to_surface():
    code = (
        "import sys\n"
        "import recoverssm_rs.tools.cli as cli\n"
        "def boom(argv=None, prog=None):\n"
        "    import recoverssm_rs_no_such_module\n"
        "cli.main = boom\n"
        "from recoverssm_rs.__main__ import main\n"
        "main(['presets'])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1 and "ModuleNotFoundError" in r.stderr and "Traceback" in r.stderr


# ------------------------------------------------------------------------------------------------
# The package namespace
# ------------------------------------------------------------------------------------------------


def test_dir_lists_the_public_api_and_not_module_helpers():
    names = dir(recoverssm_rs)
    for name in recoverssm_rs.__all__:
        assert name in names
    assert "StateCache" in names
    for leaked in ("annotations", "logging", "_logging"):
        assert leaked not in names
    assert not hasattr(recoverssm_rs, "annotations")
