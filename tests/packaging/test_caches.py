"""Where the test tooling keeps files: vLLM's wheel downloaded once into one cache that every test
reading vLLM's code shares; the host emulation's libraries in a private per-user folder; and
scripts/gpu_check.sh's installed wheel in a private folder of its own run (no fixed /tmp path)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest
from support import emulation, vllm_oracle

ROOT = Path(__file__).resolve().parents[2]
MAMBA_UTILS = "vllm/model_executor/layers/mamba/mamba_utils.py"

# ------------------------------------------------------------------------------------------------
# vLLM's wheel: one download, one cache
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """vllm_oracle's `pip download`, answered by writing a small stand-in wheel; counts the calls."""
    monkeypatch.setenv("RECOVERSSM_VLLM_CACHE", str(tmp_path / "cache"))
    for var in ("RECOVERSSM_VLLM_WHEEL", "RECOVERSSM_NO_DOWNLOAD"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / f"vllm-{vllm_oracle.VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as z:
            for rel in vllm_oracle.FILES.values():
                z.writestr(rel, f"# {rel}\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(vllm_oracle.subprocess, "run", run)
    return calls


def test_every_reader_of_vllms_code_shares_one_download(fake_pip, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "calculator_params", ROOT / "tests" / "core" / "test_calculator_params.py"
    )
    assert spec is not None and spec.loader is not None
    test_calculator_params = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test_calculator_params)
    source = test_calculator_params._mamba_utils_source()  # the calculator test (first, by name)
    paths = vllm_oracle._extract()  # the conformance oracle
    assert len(fake_pip) == 1 and fake_pip[0][3:6] == ["download", f"vllm=={vllm_oracle.VERSION}", "--no-deps"]
    cache = tmp_path / "cache"
    assert source == paths["vllm.model_executor.layers.mamba.mamba_utils"] == cache / "extracted" / MAMBA_UTILS
    assert [p.name for p in cache.iterdir() if p.suffix == ".whl"] == [vllm_oracle.wheel().name]
    assert not [p for p in cache.iterdir() if p.name.startswith(".download-")]  # no leftover folder
    assert len(fake_pip) == 1


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("RECOVERSSM_VLLM_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vllm_oracle.cache_dir() == tmp_path / "recoverssm_rs" / f"vllm-{vllm_oracle.VERSION}"


def test_a_given_wheel_or_no_download_means_no_pip(fake_pip, monkeypatch, tmp_path):
    monkeypatch.setenv("RECOVERSSM_NO_DOWNLOAD", "1")
    with pytest.raises(vllm_oracle.OracleUnavailable, match="RECOVERSSM_NO_DOWNLOAD"):
        vllm_oracle.wheel()
    given = tmp_path / "given.whl"
    with zipfile.ZipFile(given, "w") as z:
        z.writestr(MAMBA_UTILS, "# given\n")
    monkeypatch.setenv("RECOVERSSM_VLLM_WHEEL", str(given))
    assert vllm_oracle.extracted(MAMBA_UTILS).read_text() == "# given\n"
    assert fake_pip == []


def test_a_failed_download_leaves_nothing_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RECOVERSSM_VLLM_CACHE", str(tmp_path / "cache"))
    for var in ("RECOVERSSM_VLLM_WHEEL", "RECOVERSSM_NO_DOWNLOAD"):
        monkeypatch.delenv(var, raising=False)

    def run(cmd, **kwargs):
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / f"vllm-{vllm_oracle.VERSION}-partial.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 1, "", "network is unreachable")

    monkeypatch.setattr(vllm_oracle.subprocess, "run", run)
    with pytest.raises(vllm_oracle.OracleUnavailable, match="network is unreachable"):
        vllm_oracle.wheel()
    assert list((tmp_path / "cache").iterdir()) == []


# ------------------------------------------------------------------------------------------------
# The host emulation's libraries: a private per-user folder
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_cache(monkeypatch):
    monkeypatch.setattr(emulation, "_cache", None)  # restored afterwards


def test_host_builds_go_to_a_private_user_cache(fresh_cache, monkeypatch, tmp_path):
    monkeypatch.delenv("RECOVERSSM_HOST_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    d = emulation._cache_dir()
    assert d == tmp_path / "recoverssm_rs" / "host-kernels"
    st = os.lstat(d)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


@pytest.mark.parametrize("how", ["open to others", "a link", "another owner"])
def test_a_folder_that_is_not_private_is_not_used(fresh_cache, monkeypatch, tmp_path, how):
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    target = tmp_path / "cache"
    if how == "open to others":
        planted.chmod(0o777)
        target = planted
    elif how == "a link":
        target.symlink_to(planted)
    else:
        if os.getuid() != 0:
            pytest.skip("changing a folder's owner needs root")
        os.chown(planted, 12345, 12345)
        target = planted
    monkeypatch.setenv("RECOVERSSM_HOST_CACHE", str(target))
    d = emulation._cache_dir()
    assert d not in (target, planted) and d.resolve() != planted.resolve()
    assert emulation.private_dir(d) and d.name.startswith("recoverssm_rs-host-kernels-")
    shutil.rmtree(d)


# ------------------------------------------------------------------------------------------------
# scripts/gpu_check.sh: the wheel it installs goes to a private folder of its own run
# ------------------------------------------------------------------------------------------------


def test_gpu_check_installs_into_a_private_folder_of_its_own(tmp_path):
    """gpu_check.sh run in a copy of its layout, with a stand-in for Python that cannot import the
    package (so the script installs the wheel) and records PYTHONPATH and CUPY_CACHE_DIR."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_check.sh", repo / "scripts")
    (repo / "wheelhouse").mkdir()
    (repo / "wheelhouse" / "recoverssm_rs-0.1.0-cp311-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"")
    log = tmp_path / "calls.log"
    stub = tmp_path / "python"
    stub.write_text(
        "#!/bin/sh\n"
        f'd=$(dirname "${{PYTHONPATH%%:*}}"); echo "$PYTHONPATH|$CUPY_CACHE_DIR|$(stat -c %a "$d" 2>/dev/null)" >>{log}\n'
        'case "$*" in *"import recoverssm_rs._core"*) exit 1;; *"pip install"*) exit 0;; *) exit 3;; esac\n'
    )
    stub.chmod(0o755)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **os.environ,
        "PYTHON": str(stub),
        "TMPDIR": str(temp),
        "GPU_TESTS_TIMEOUT": "10",
        "GPU_BENCH_TIMEOUT": "10",
        "COMMIT_BENCH_TIMEOUT": "10",
        "LAUNCH_HOST_TIMEOUT": "10",
    }
    env.pop("RECOVERSSM_SITE", None)
    env.pop("CUPY_CACHE_DIR", None)
    sites = []
    for _ in range(2):
        r = subprocess.run(
            ["bash", "scripts/gpu_check.sh", str(tmp_path / "results")],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 1, r.stderr  # every stage "failed" (the stand-in runs nothing)
        last = log.read_text().splitlines()[-1]
        pythonpath, cupy_cache, mode = last.split("|")
        site = Path(pythonpath.split(":")[0])
        assert site.parent.parent == temp and mode == "700", last
        assert Path(cupy_cache).parent == site.parent
        assert not site.parent.exists()  # removed at exit
        sites.append(site)
    assert sites[0] != sites[1]
