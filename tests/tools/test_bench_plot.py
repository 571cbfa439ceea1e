"""``benches/bench.py --plot``: the figure drawn from given results (axes, labels, data, baselines) and the PNG."""

import struct

import pytest
from recoverssm_dev.bench.plot import HOST_METHODS, PLAN_METHODS, make_figure, save_plot

matplotlib = pytest.importorskip("matplotlib")


def _plan_doc(layers=7, requests=(1, 10, 100)):
    results = []
    for i, r in enumerate(requests):
        methods = {m: {"copies_per_s": (j + 1) * 1e6 * (i + 1)} for j, m in enumerate(PLAN_METHODS)}
        methods["plan+view"] = {"copies_per_s": 1.0}
        results.append({"requests": r, "methods": methods})
    return {"layout": "some-layout", "layers": layers, "baselines": ["numpy", "loop"], "results": results}


def _host_doc(batches=(8, 32)):
    results = []
    for k, (name, size) in enumerate([("4K", 4096), ("64K", 65536), ("2M", 2 << 20)]):
        for n in batches:
            results.append(
                {
                    "size": name,
                    "state_bytes": size,
                    "batch": n,
                    "methods": {m: {"GBps": 10.0 * (j + 1) + k + n / 100} for j, m in enumerate(HOST_METHODS)},
                }
            )
    return {"dtype": "float32", "baselines": ["copy_", "index"], "results": results}


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plan_panel_draws_the_given_throughput_with_dashed_baselines():
    doc = _plan_doc()
    fig = make_figure({"plan_step": doc})
    (ax,) = fig.axes
    assert ax.get_xlabel() == "requests per step (7 layers x 2 states each)"
    assert ax.get_ylabel() == "copies planned per second"
    assert "some-layout" in ax.get_title()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = _lines(ax)
    assert set(lines) == {"plan", "core", "numpy (baseline)", "loop (baseline)"}
    assert list(lines["plan"].get_xdata()) == [1, 10, 100]
    assert list(lines["core"].get_ydata()) == [2e6, 4e6, 6e6]
    assert lines["loop (baseline)"].get_linestyle() == "--" and lines["plan"].get_linestyle() == "-"


def test_host_panel_draws_bandwidth_against_state_size_at_the_largest_batch():
    fig = make_figure({"host_copy": _host_doc()})
    (ax,) = fig.axes
    assert ax.get_xlabel() == "state size (bytes per block; float32)"
    assert ax.get_ylabel() == "GB/s (bytes read + written)"
    assert "32 random blocks per call" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4K", "64K", "2M"]
    lines = _lines(ax)
    assert set(lines) == {"execute", "plan+execute", "copy_ (baseline)", "index (baseline)"}
    assert list(lines["execute"].get_xdata()) == [4096, 65536, 2 << 20]
    assert list(lines["copy_ (baseline)"].get_ydata()) == pytest.approx([30.32, 31.32, 32.32])


def test_the_spread_is_a_band_around_each_line():
    doc = _plan_doc()
    for r in doc["results"]:
        for m in r["methods"].values():
            m["copies_per_s_range"] = [0.5 * m["copies_per_s"], 2.0 * m["copies_per_s"]]
    (ax,) = make_figure({"plan_step": doc}).axes
    bands = ax.collections
    assert len(bands) == len(PLAN_METHODS)
    lines = _lines(ax)
    for band, label in zip(bands, ["plan", "core", "numpy (baseline)", "loop (baseline)"], strict=True):
        ys = band.get_paths()[0].vertices[:, 1]
        line = lines[label].get_ydata()
        assert min(ys) == pytest.approx(0.5 * min(line)) and max(ys) == pytest.approx(2.0 * max(line))
        assert tuple(band.get_facecolor()[0][:3]) == pytest.approx(matplotlib.colors.to_rgb(lines[label].get_color()))
    # without ranges (results of an older run): lines only
    (ax,) = make_figure({"host_copy": _host_doc()}).axes
    assert not ax.collections


def test_both_panels_and_the_png(tmp_path):
    path = tmp_path / "bench.png"
    fig = save_plot({"plan_step": _plan_doc(layers=3), "host_copy": _host_doc(batches=(16,))}, path, title="a title")
    assert [ax.get_xlabel() for ax in fig.axes] == [
        "requests per step (3 layers x 2 states each)",
        "state size (bytes per block; float32)",
    ]
    assert fig.get_suptitle() == "a title"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert struct.unpack(">II", data[16:24]) == (round(2 * 6.4 * 120), round(4.8 * 120))


def test_nothing_to_plot_is_an_error():
    with pytest.raises(ValueError, match="nothing to plot"):
        make_figure({"machine": {}})
