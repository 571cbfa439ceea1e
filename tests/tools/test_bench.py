"""``python -m recoverssm_rs bench``: JSON, tables, progress, the plot, option errors, the GPU
bridge, and the old benches/ scripts. Timings are only checked to exist, never against a speed."""

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from recoverssm_rs.errors import BackendUnavailableError
from recoverssm_rs.tools.bench import gpu_copy, host_copy, plan_step
from recoverssm_rs.tools.bench.progress import Progress

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
# Small enough for a test (a few seconds on 2 cores), still every method and case kind.
TINY = ["--quick", "--requests", "1,3", "--layers", "2", "--sizes", "4K,64K", "--batches", "4",
        "--budget", "0.002"]


def bench(*args, env=None):
    return subprocess.run([sys.executable, "-m", "recoverssm_rs", "bench", *args],
                          capture_output=True, text=True, timeout=300, check=False, env=env)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run with --json FILE and --plot FILE (when matplotlib is there)."""
    out = tmp_path_factory.mktemp("bench")
    args = [*TINY, "--json", str(out / "r.json")]
    has_mpl = True
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        has_mpl = False
    if has_mpl:
        args += ["--plot", str(out / "r.png")]
    r = bench(*args)
    assert r.returncode == 0, r.stderr
    return r, out, has_mpl


def test_json_holds_every_benchmark_method_and_case(tiny_run):
    _, out, _ = tiny_run
    doc = json.loads((out / "r.json").read_text())
    assert {"benchmark", "date", "settings", "machine", "plan_step", "host_copy", "wall_s"} <= set(doc)
    assert doc["settings"]["requests"] == [1, 3] and doc["settings"]["layers"] == 2
    assert doc["settings"]["quick"] is True
    ps = doc["plan_step"]
    assert ps["baselines"] == ["numpy", "loop"]
    assert [res["requests"] for res in ps["results"]] == [1, 3]
    for res in ps["results"]:
        assert res["copies"] == res["requests"] * 2 * 2
        assert res["check"].startswith("identical")
        assert set(res["methods"]) == set(plan_step.METHODS)
        for m in res["methods"].values():
            assert m["median_s"] > 0 and m["reps"] >= 2
            assert m["copies_per_s"] == pytest.approx(res["copies"] / m["median_s"])
    hc = doc["host_copy"]
    assert [(x["size"], x["batch"]) for x in hc["results"]] == [("4K", 4), ("64K", 4)]
    for x in hc["results"]:
        assert x["payload_bytes"] == 4 * x["state_bytes"]
        assert set(x["methods"]) == set(host_copy.METHODS)
        assert all(m["GBps"] > 0 for m in x["methods"].values())


def test_tables_on_stdout_progress_on_stderr(tiny_run):
    r, out, _ = tiny_run
    assert "plan step:" in r.stdout and "host copy:" in r.stdout
    assert "loop/plan" in r.stdout and "exec/copy_" in r.stdout
    assert "bench: [" not in r.stdout
    progress = [line for line in r.stderr.splitlines() if line.startswith("bench: [")]
    assert any("plan step, 3 requests x 2 layers" in line for line in progress)
    assert any("host copy, 64K states x 4" in line for line in progress)
    assert f"results written to {out / 'r.json'}" in r.stderr


def test_plot_file_written(tiny_run):
    _, out, has_mpl = tiny_run
    if not has_mpl:
        pytest.skip("matplotlib is not installed")
    png = out / "r.png"
    assert png.stat().st_size > 20_000
    width, height = _png_size(png)
    assert width > height > 300  # two panels side by side


def test_json_to_stdout_moves_the_tables_to_stderr():
    r = bench(*TINY, "--only", "plan", "--no-progress", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "plan_step" in doc and "host_copy" not in doc
    assert "plan step:" in r.stderr and "bench: [" not in r.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (["--requests", "0"], "--requests"),
    (["--requests", "1,x"], "--requests"),
    (["--layers", "-1"], "--layers"),
    (["--sizes", "3K"], "--sizes"),
    (["--budget", "0"], "--budget"),
    (["--only", "gpu"], "--only"),
])
def test_bad_options_end_in_one_usage_line(args, flag):
    r = bench(*args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"python -m recoverssm_rs bench: error: argument {flag}")


def test_output_into_a_missing_folder_fails_before_measuring(tmp_path):
    r = bench(*TINY, "--json", str(tmp_path / "no" / "r.json"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        (f"python -m recoverssm_rs bench: error: argument --json: the folder of '{tmp_path / 'no' / 'r.json'}' "
         "does not exist")]


def test_plot_without_matplotlib_fails_before_measuring(tmp_path):
    png = tmp_path / "x.png"
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from recoverssm_rs.__main__ import main\n"
            f"sys.exit(main(['bench', *{TINY!r}, '--plot', {str(png)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1
    assert r.stdout == ""  # nothing measured
    assert [line.split(": error: ", 1)[-1] for line in r.stderr.strip().splitlines()] == [
        ("BackendUnavailableError: `bench --plot` needs matplotlib, which is not installed: "
         "pip install 'recoverssm_rs[plot]'")]
    assert not png.exists()


def test_gpu_without_a_device_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = bench(*TINY, "--gpu")
    assert r.returncode == 1 and r.stdout == ""
    assert [line.split(": error: ", 1)[-1] for line in r.stderr.strip().splitlines()] == [
        "BackendUnavailableError: bench --gpu: torch sees no CUDA device"]


# ------------------------------------------------------------------------------------------------
# The GPU bridge, the progress bar, the old scripts
# ------------------------------------------------------------------------------------------------


def test_gpu_bridge_finds_the_checkout_script(tmp_path):
    assert gpu_copy.find_script() == ROOT / "benches" / "gpu_copy.py"
    assert gpu_copy.find_script(tmp_path) is None


def _fake_script(tmp_path: Path, doc: dict) -> Path:
    script = tmp_path / "fake_gpu_copy.py"
    script.write_text("import json, sys\n"
                      "def main(argv):\n"
                      "    assert argv[0] == '--json'\n"
                      "    print('table line', file=sys.stderr)\n"
                      f"    print(json.dumps({doc!r} | {{'argv': argv}}))\n"
                      "    return 0\n")
    return script


def test_gpu_bridge_returns_the_document_and_passes_arguments(tmp_path):
    doc = {"measured": True, "gpu": {"name": "FakeGPU"}, "targets": ["R=1: met"],
           "results": [{"requests": 1, "layers": 8, "methods": {
               "fused[temporal]": {"gbps": 3400.0, "pct_d2d": 85.5, "host_us": 120.0}}}]}
    got = gpu_copy.run(["--requests", "1"], _fake_script(tmp_path, doc))
    assert got["argv"] == ["--json", "--requests", "1"]
    table = gpu_copy.format_table(got)
    assert "FakeGPU" in table and "fused[temporal]" in table and "85.5%" in table and "target: R=1: met" in table


def test_gpu_bridge_reports_why_nothing_was_measured(tmp_path):
    script = _fake_script(tmp_path, {"measured": False, "reason": "no CUDA GPU: nothing measured (x)"})
    with pytest.raises(BackendUnavailableError, match=r"bench --gpu: no CUDA GPU: nothing measured \(x\)"):
        gpu_copy.run([], script)


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_redraws_on_a_terminal_and_logs_cases_elsewhere():
    log = io.StringIO()
    p = Progress(4, log)
    for case in ("a", "a", "b", "b"):
        p.advance(case, "m")
    p.close()
    lines = log.getvalue().splitlines()
    assert [line.rsplit(" s  ", 1)[1] for line in lines] == ["a", "b"]
    assert lines[0].startswith("bench: [1/4]") and lines[1].startswith("bench: [3/4]")
    tty = _Tty()
    p = Progress(4, tty, width=8)
    p.advance("a", "m")
    p.advance("a", "n")
    p.close()
    text = tty.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "[##------] 1/4" in text and "[####----] 2/4" in text and "a: n" in text
    quiet = io.StringIO()
    Progress(2, quiet, enabled=False).advance("a")
    assert quiet.getvalue() == ""


def test_old_bench_scripts_still_run():
    r = subprocess.run([sys.executable, str(ROOT / "benches" / "plan_step.py"), "--requests", "2", "--sweep",
                        "--layers", "1", "--budget", "0.002", "--json"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert [x["requests"] for x in json.loads(r.stdout)["results"]] == [2]
    r = subprocess.run([sys.executable, str(ROOT / "benches" / "host_copy.py"), "--sizes", "4K", "--batches", "2",
                        "--budget", "0.002"], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "exec/copy_" in r.stdout


def test_methods_are_timed_interleaved_each_with_its_own_repetitions():
    from recoverssm_rs.tools.bench.timing import Budget, measure_interleaved

    calls: list[str] = []
    done: list[str] = []
    fns = {"a": (lambda: calls.append("a"), Budget(1e9, min_reps=4, max_reps=4, warmup=1)),
           "b": (lambda: calls.append("b"), Budget(1e9, min_reps=1, max_reps=1, warmup=1))}
    out = measure_interleaved(fns, done.append, rounds=2)
    assert calls == ["a", "a", "b", "b",   # warm-up: (warmup + 1) calls each, in turn
                     "a", "a",             # round 1: half of a's calls (b's one call is due in round 2)
                     "a", "a", "b"]        # round 2: the rest of each
    assert done == ["a", "b"]
    assert (out["a"]["reps"], out["b"]["reps"]) == (4, 1)
    assert all(0 < v["p10_s"] <= v["median_s"] <= v["p90_s"] for v in out.values())
