"""``benches/bench.py`` (the checkout's benchmark; the wheel's ``bench`` command says how to run it):
JSON, tables, progress, the plot, option errors, the thread default, the GPU bridge. Timings are
only checked to exist, never against a speed."""

import io
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from recoverssm_dev.bench import gpu_copy, host_copy, plan_step
from recoverssm_dev.bench.progress import Progress
from recoverssm_rs.errors import BackendUnavailableError

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
# Small enough for a test (a few seconds on 2 cores), still every method and case kind.
TINY = ["--quick", "--requests", "1,3", "--layers", "2", "--sizes", "4K,64K", "--batches", "4", "--budget", "0.002"]


def bench(*args, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "benches" / "bench.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


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


def test_json_to_stdout_replaces_the_tables():
    r = bench(*TINY, "--only", "plan", "--quiet", "--json", "-")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout holds the JSON document alone
    assert "plan_step" in doc and "host_copy" not in doc
    assert "plan step:" not in r.stderr and "bench: [" not in r.stderr  # --quiet: no progress


def test_each_figure_comes_with_its_spread_over_the_rounds(tiny_run):
    from recoverssm_dev.bench.timing import ROUNDS

    r, out, _ = tiny_run
    doc = json.loads((out / "r.json").read_text())
    for res in doc["plan_step"]["results"]:
        for m in res["methods"].values():
            assert len(m["rounds_s"]) == ROUNDS and any(m["rounds_s"])
            lo, hi = m["copies_per_s_range"]
            assert 0 < lo <= hi
            rates = [res["copies"] / x for x in m["rounds_s"] if x]
            assert (lo, hi) == (min(rates), max(rates))
        for key in ("loop_over_plan", "numpy_over_plan", "plan_over_core"):
            lo, hi = res[f"{key}_range"]
            assert 0 < lo <= res[key] <= hi
    for res in doc["host_copy"]["results"]:
        for key in ("execute_over_copy_", "execute_over_index"):
            lo, hi = res[f"{key}_range"]
            assert 0 < lo <= res[key] <= hi
        assert all(0 < m["GBps_range"][0] <= m["GBps_range"][1] for m in res["methods"].values())
    # the tables print each ratio, and each method's figure, with its range
    assert re.search(r"\d+x \(\d[\d.]*-\d[\d.]*\)", r.stdout)
    assert "median (min-max of the timing rounds)" in r.stdout
    for line in r.stdout.splitlines():
        if re.match(r"\s+(\d+\s+\d+ |4K |64K )", line):  # a row of either table
            spreads = re.findall(r"\d[\d.]*x? \((\d[\d.]*)-(\d[\d.]*)\)", line)
            width = len(plan_step.METHODS) if "K" not in line.split()[0] else len(host_copy.METHODS)
            assert len(spreads) >= width + 2, line  # every method's figure and both ratios


def test_ratio_and_round_ranges():
    from recoverssm_dev.bench.timing import format_ratio, format_spread, ratio, round_range

    a = {"median_s": 2.0, "rounds_s": [2.0, None, 4.0, 1.0]}
    b = {"median_s": 1.0, "rounds_s": [1.0, 1.0, None, 0.5]}
    assert round_range(a) == [1.0, 4.0]
    assert round_range(a, lambda s: 8 / s) == [2.0, 8.0]
    assert ratio(a, b) == (2.0, [2.0, 2.0])  # rounds 0 and 3: both ran; 2/1 and 1/0.5
    c = {"median_s": 1.0, "rounds_s": [4.0, 1.0, 1.0, 1.0]}
    assert ratio(a, c) == (1.0, [0.5, 4.0])  # 2/4, 4/1, 1/1: the median of the rounds' ratios
    assert ratio(a, {"median_s": 4.0, "rounds_s": [None, 1.0, None, None]}) == (0.5, [0.5, 0.5])  # none shared
    assert round_range({"median_s": 3.0}) == [3.0, 3.0]
    assert format_ratio({"x": 0.625, "x_range": [0.5, 0.75]}, "x") == "0.62x (0.50-0.75)"
    assert format_ratio({"x": 1686.2, "x_range": [95.0, 2277.4]}, "x") == "1686x (95.0-2277)"
    assert format_spread(12.34, [11.0, 13.5]) == "12.3 (11.0-13.5)"
    assert format_spread(4.8e-5, [4.5e-5, 5.25e-5], scale=1e6) == "48.0 (45.0-52.5)"


def test_plot_without_matplotlib_fails_before_measuring(tmp_path):
    png = tmp_path / "x.png"
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "from recoverssm_dev.bench.command import main\n"
        f"sys.exit(main([*{TINY!r}, '--plot', {str(png)!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1
    assert r.stdout == ""  # nothing measured
    assert [line.split(": error: ", 1)[-1] for line in r.stderr.strip().splitlines()] == [
        (
            "BackendUnavailableError: `benches/bench.py --plot` needs matplotlib, which is not installed: "
            "pip install 'recoverssm_rs[plot]'"
        )
    ]
    assert not png.exists()


# ------------------------------------------------------------------------------------------------
# The GPU bridge, the progress bar, the old scripts
# ------------------------------------------------------------------------------------------------


def test_gpu_bridge_finds_the_checkout_script(tmp_path):
    assert gpu_copy.find_script() == ROOT / "benches" / "gpu_copy.py"
    assert gpu_copy.find_script(tmp_path) is None


def _fake_script(tmp_path: Path, doc: dict) -> Path:
    script = tmp_path / "fake_gpu_copy.py"
    script.write_text(
        "import json, sys\n"
        "def main(argv):\n"
        "    assert argv[0] == '--json'\n"
        "    print('table line', file=sys.stderr)\n"
        f"    print(json.dumps({doc!r} | {{'argv': argv}}))\n"
        "    return 0\n"
    )
    return script


def test_gpu_bridge_returns_the_document_and_passes_arguments(tmp_path):
    doc = {
        "measured": True,
        "gpu": {"name": "FakeGPU"},
        "targets": ["R=1: met"],
        "results": [
            {
                "requests": 1,
                "layers": 8,
                "methods": {
                    "fused[temporal]": {
                        "gbps": 3400.0,
                        "gpu_us": 10.0,
                        "gpu_us_min": 8.0,
                        "pct_d2d": 85.5,
                        "host_us": 120.0,
                    }
                },
            }
        ],
    }
    got = gpu_copy.run(["--requests", "1"], _fake_script(tmp_path, doc))
    assert got["argv"] == ["--json", "--requests", "1"]
    table = gpu_copy.format_table(got)
    assert "FakeGPU" in table and "fused[temporal]" in table and "85.5%" in table and "target: R=1: met" in table
    assert " 3400     4250 " in table  # the median's GB/s and the best repetition's (10 us -> 8 us)


def test_gpu_bridge_refuses_arguments_the_script_refuses_before_it_measures(tmp_path):
    script = tmp_path / "fake_gpu_copy.py"
    script.write_text(
        "import argparse\n"
        "def main(argv):\n"
        "    ap = argparse.ArgumentParser()\n"
        "    ap.add_argument('--json', action='store_true')\n"
        "    ap.add_argument('--layers', type=int)\n"
        "    ap.parse_args(argv)\n"
        "    raise AssertionError('measured')\n"
    )
    with pytest.raises(gpu_copy.GpuArgsError, match=r"fake_gpu_copy.py: argument --layers: invalid int value: 'x'"):
        gpu_copy.run(["--layers", "x"], script)
    with pytest.raises(gpu_copy.GpuArgsError, match="unrecognized arguments: --nope"):
        gpu_copy.run(["--nope"], script)


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


def test_torch_runs_with_one_thread_unless_told(tiny_run):
    r, out, _ = tiny_run
    doc = json.loads((out / "r.json").read_text())
    assert doc["machine"]["torch_threads"] == 1 and doc["host_copy"]["torch_threads"] == 1
    assert "torch threads 1" in r.stdout
    from recoverssm_dev.bench.command import build_parser

    assert build_parser().parse_args([]).threads == 1


def test_methods_are_timed_interleaved_each_with_its_own_repetitions():
    from recoverssm_dev.bench.timing import Budget, measure_interleaved

    calls: list[str] = []
    done: list[str] = []
    fns = {
        "a": (lambda: calls.append("a"), Budget(1e9, min_reps=4, max_reps=4, warmup=1)),
        "b": (lambda: calls.append("b"), Budget(1e9, min_reps=1, max_reps=1, warmup=1)),
    }
    out = measure_interleaved(fns, done.append, rounds=2)
    assert calls == [
        "a",
        "a",
        "b",
        "b",  # warm-up: (warmup + 1) calls each, in turn
        "a",
        "a",  # round 1: half of a's calls (b's one call is due in round 2)
        "a",
        "a",
        "b",
    ]  # round 2: the rest of each
    assert done == ["a", "b"]
    assert (out["a"]["reps"], out["b"]["reps"]) == (4, 1)
    # each round's median, None where a method had no calls in that round
    assert out["b"]["rounds_s"][0] is None and out["b"]["rounds_s"][1] > 0
    assert all(x > 0 for x in out["a"]["rounds_s"])
    assert all(0 < v["p10_s"] <= v["median_s"] <= v["p90_s"] for v in out.values())
