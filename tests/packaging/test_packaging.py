"""Package metadata, the entry point's missing-dependency line, the optional-dependency checks and
the package namespace."""

import re
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


def test_every_build_path_gets_the_configured_wheel_tag(monkeypatch):
    compatibility = PYPROJECT["tool"]["maturin"]["compatibility"]
    assert compatibility == "pypi" or compatibility.startswith("manylinux_")
    backend = _backend(monkeypatch)
    # pip wheel . / pip install . / python -m build: maturin's hook would pass --compatibility off.
    assert backend._with_compatibility(None) == {"build-args": ["--compatibility", compatibility]}
    monkeypatch.setenv("MATURIN_PEP517_ARGS", "--features python")
    assert backend._with_compatibility({}) == {
        "build-args": ["--features", "python", "--compatibility", compatibility]}
    # A caller's own choice wins.
    mine = {"build-args": "--compatibility linux"}
    assert backend._with_compatibility(mine) == mine
    assert backend.build_sdist is __import__("maturin").build_sdist


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
    code = ("import sys; sys.modules['torch'] = None\n"
            "from recoverssm_rs.__main__ import main\n"
            "sys.exit(main(['demo', '--steps', '2']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    # The entry point's line, or the same sentence raised by a check the demo makes up front.
    assert ": error: " in lines[-1] and len(lines) == 1
    assert "`demo` needs torch, which is not installed: pip install 'recoverssm_rs[torch]' (CPU)" in lines[-1]


def test_entry_point_leaves_other_missing_modules_to_surface():
    code = ("import sys\n"
            "import recoverssm_rs.tools.cli as cli\n"
            "def boom(argv=None, prog=None):\n"
            "    import recoverssm_rs_no_such_module\n"
            "cli.main = boom\n"
            "from recoverssm_rs.__main__ import main\n"
            "main(['presets'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       check=False)
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
