"""No-GPU checks of the CUDA kernels (docs/design.md section 8).

* NVRTC compiles every kernel source for sm_80 and sm_90 with CuPy's RawModule options; ptxas
  reports no spills, no stack frame (local memory) and no barriers.
* The same sources, compiled as host C++ through tests/support/host_shim.h, run over the whole grid on
  numpy buffers and must match the numpy reference byte for byte -- on random plans, in natural,
  reversed and shuffled thread orders (a race in the work decomposition changes the bytes), with no
  misaligned and no out-of-range data access.
* The fused kernel reproduces vLLM 0.33's align-copy conformance vectors.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recoverssm_rs import BackendUnavailableError, PlanError, cuda
from recoverssm_rs.backend_check import nvrtc_install_hint  # noqa: E402
from recoverssm_rs.cuda import nvrtc
from recoverssm_rs.plan_format import ABI
from support import emulation, generators, references
from support.fakes import FakeDeviceArray, FakeStream, install_fake_cupy

DATA = Path(__file__).parents[1] / "data"
ORDERS = (0, 1, 12345)
# The host emulation builds the kernels with a C++17 compiler (g++ by default, RECOVERSSM_CXX).
needs_cxx = pytest.mark.skipif(
    shutil.which(emulation.HOST_CXX) is None, reason="no C++ compiler for the host emulation"
)


# ------------------------------------------------------------------------------------------------
# Records and sources
# ------------------------------------------------------------------------------------------------


def _fields(kernel: str, values: list[int], order: Sequence[str] | None = None) -> Any:
    """A recorded launch's values (its parameter record's fields, in the record's order) by field
    name, or those of ``order`` as a list."""
    spec = next(k for k in ABI["kernels"] if k["name"] == kernel)
    by_name = dict(zip([f for f, _ in spec["params"]], values, strict=True))
    return by_name if order is None else [by_name[n] for n in order]


def test_record_layouts_match_the_planner():
    seg, tile, meta = cuda.SEGMENT_DTYPE, cuda.TILE_DTYPE, cuda.STATE_META_DTYPE
    assert (seg.itemsize, tile.itemsize, meta.itemsize) == (32, 16, 64)
    assert [seg.fields[f][1] for f in seg.names] == [0, 8, 16, 20, 24, 28, 30, 31]
    assert [tile.fields[f][1] for f in tile.names] == [0, 4, 8, 12]
    assert [meta.fields[f][1] for f in meta.names] == [0, 8, 16, 24, 28, 32, 36, 40, 44, 48, 56, 60]
    # The C side pins the same numbers with static_asserts (offsets in the host build) -- see the
    # header the core generates, rs_abi.cuh.
    text = (cuda.KERNEL_DIR / "rs_abi.cuh").read_text()
    assert "static_assert(sizeof(Segment) == 32" in text and "static_assert(sizeof(StateMeta) == 64" in text


def test_sources_inline_headers_once():
    src = cuda.module_source()
    assert "#include" not in src.replace("#include <stdint.h>", "")
    assert src.count("struct Segment {") == 1
    for name in cuda.KERNEL_NAMES:
        assert f"RS_LAUNCH_BOUNDS {name}(" in src
    for f in cuda.KERNEL_FILES:
        assert "struct StateMeta {" in cuda.kernel_source(f)


# ------------------------------------------------------------------------------------------------
# NVRTC
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nvrtc_reports():
    if nvrtc.find_nvrtc() is None:
        # CI (scripts/test.sh) sets RECOVERSSM_REQUIRE_NVRTC: there the compile check must run.
        if os.environ.get("RECOVERSSM_REQUIRE_NVRTC"):
            pytest.fail(f"NVRTC not found but RECOVERSSM_REQUIRE_NVRTC is set ({nvrtc_install_hint()})")
        pytest.skip(f"NVRTC not installed ({nvrtc_install_hint()})")
    # Kept across runs and shared by pytest-xdist workers (one compile per source and NVRTC).
    return nvrtc.compile_all(cache=nvrtc.default_cache_dir())


_TINY = 'extern "C" __global__ void rs_tiny(float* x) { x[threadIdx.x] += 1.0f; }\n'


def test_compile_reports_are_cached_by_source_options_and_nvrtc(monkeypatch, tmp_path):
    """A report is compiled once per key, shared by concurrent callers (file lock), and compiled
    again when the source, the options or the NVRTC library change."""
    import threading
    import time

    if nvrtc.find_nvrtc() is None:
        pytest.skip(f"NVRTC not installed ({nvrtc_install_hint()})")
    real, compiled = nvrtc._compile, []

    def counting(*a: Any) -> Any:
        compiled.append(a[0])
        time.sleep(0.2)  # long enough for the other thread to wait on the lock
        return real(*a)

    monkeypatch.setattr(nvrtc, "_compile", counting)
    got: list[Any] = []
    threads = [
        threading.Thread(target=lambda: got.append(nvrtc.nvrtc_compile("tiny", 90, source=_TINY, cache=tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiled) == 1 and got[0] == got[1] and got[0].ok and got[0].kernels[0].kernel == "rs_tiny"
    assert nvrtc.nvrtc_compile("tiny", 90, source=_TINY, cache=tmp_path) == got[0] and len(compiled) == 1
    nvrtc.nvrtc_compile("tiny", 90, source=_TINY.replace("1.0f", "2.0f"), cache=tmp_path)  # the source
    assert len(compiled) == 2
    nvrtc.nvrtc_compile("tiny", 80, source=_TINY, cache=tmp_path)  # the options (-arch)
    assert len(compiled) == 3
    identity = nvrtc._library_identity()
    monkeypatch.setattr(nvrtc, "_library_identity", lambda: {**identity, "version": [99, 0]})  # NVRTC
    nvrtc.nvrtc_compile("tiny", 90, source=_TINY, cache=tmp_path)
    assert len(compiled) == 4
    for entry in tmp_path.glob("*.json"):  # an entry that does not parse is compiled again
        entry.write_text("{")
    nvrtc.nvrtc_compile("tiny", 90, source=_TINY, cache=tmp_path)
    assert len(compiled) == 5


def test_the_cache_key_names_the_nvrtc_library_by_content_not_path(monkeypatch, tmp_path):
    # The same library installed into another environment (a fresh clone's venv: another path, a
    # new modification time) must find the reports already made; another library must not.
    nvrtc.nvrtc_version()  # loaded first, so that the patched path below is the one hashed
    same_a, same_b, other = tmp_path / "a" / "libnvrtc.so", tmp_path / "b" / "libnvrtc.so", tmp_path / "c.so"
    for path, data in ((same_a, b"lib" * 1000), (same_b, b"lib" * 1000), (other, b"lib" * 999 + b"LIB")):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    keys = []
    for path in (same_a, same_b, other):
        monkeypatch.setattr(nvrtc, "_nvrtc_path", path)
        keys.append(nvrtc._cache_key("tiny", 90, "ptx", _TINY, ["-arch=compute_90"]))
    assert keys[0] == keys[1] != keys[2]


def test_the_cache_key_names_include_folders_by_content_not_path(tmp_path):
    # CuPy's and CUDA's headers installed into another environment (a fresh clone's venv) must find
    # the reports already made; headers that differ (a file's size, a file more) must not.
    def headers(folder, extra=b""):
        (folder / "sub").mkdir(parents=True)
        (folder / "a.h").write_bytes(b"#define A 1\n" + extra)
        (folder / "sub" / "b.h").write_bytes(b"#define B 2\n")
        return folder

    same_a, same_b = headers(tmp_path / "a"), headers(tmp_path / "b")
    bigger = headers(tmp_path / "c", extra=b"#define C 3\n")
    more = headers(tmp_path / "d")
    (more / "sub" / "c.h").write_bytes(b"")
    keys = [
        nvrtc._cache_key("tiny", 90, "ptx", _TINY, [f"-I{folder}", "-arch=compute_90"])
        for folder in (same_a, same_b, bigger, more)
    ]
    assert keys[0] == keys[1]
    assert len({keys[0], keys[2], keys[3]}) == 3


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RECOVERSSM_CACHE_DIR", str(tmp_path))
    assert nvrtc.default_cache_dir() == tmp_path / "nvrtc"
    monkeypatch.delenv("RECOVERSSM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert nvrtc.default_cache_dir() == tmp_path / "xdg" / "recoverssm_rs" / "nvrtc"


def test_find_nvrtc_honours_the_override(monkeypatch, tmp_path):
    lib = tmp_path / "libnvrtc.so.99"
    lib.write_bytes(b"")
    monkeypatch.setenv("RECOVERSSM_NVRTC", str(lib))
    assert nvrtc.find_nvrtc() == lib
    monkeypatch.setenv("RECOVERSSM_NVRTC", str(tmp_path / "missing.so"))
    with pytest.raises(nvrtc.NvrtcUnavailableError, match="RECOVERSSM_NVRTC=.*missing.so: no such file"):
        nvrtc.find_nvrtc()
    assert issubclass(nvrtc.NvrtcUnavailableError, BackendUnavailableError)


def test_nvrtc_compiles_every_kernel_for_sm80_and_sm90(nvrtc_reports):
    failed = [(r.file, r.arch, r.target, r.log) for r in nvrtc_reports if not r.ok]
    assert not failed, failed
    files = {p.name for p in cuda.KERNEL_DIR.glob("*.cu")}
    assert files == set(cuda.KERNEL_FILES)
    seen = {(r.file, r.arch, r.target) for r in nvrtc_reports}
    for arch in nvrtc.ARCHS:
        for f in files:
            assert (f, arch, "cubin") in seen and (f, arch, "ptx") in seen
        module = [r for r in nvrtc_reports if r.file == "<module>" and r.arch == arch]
        assert {k.kernel for k in module[0].kernels} == set(cuda.KERNEL_NAMES)
    # The options are CuPy's RawModule options (plus ptxas -v for the report).
    opts = nvrtc_reports[0].options
    assert "--std=c++17" in opts and "-ftz=true" in opts and "--device-as-default-execution-space" in opts


def test_no_spills_no_local_memory_no_barriers(nvrtc_reports):
    resources = [k for r in nvrtc_reports for k in r.kernels]
    expected = {
        ("copy_tiles.cu", "rs_copy_tiles"),
        ("state_copy.cu", "rs_state_copy"),
        ("state_copy_slots.cu", "rs_state_copy_slots"),
        ("recover_commit.cu", "rs_recover_commit"),
        ("slot_scatter.cu", "rs_slot_scatter"),
    }
    for arch in nvrtc.ARCHS:
        got = {(k.file, k.kernel) for k in resources if k.arch == arch and k.file != "<module>"}
        assert got == expected
    bad = [k for k in resources if not k.clean or k.barriers != 0]
    assert not bad, "\n" + nvrtc.resource_table(nvrtc_reports)
    # Registers leave room for 3 CTAs of 256 threads per SM (RS_LAUNCH_BOUNDS).
    assert all(k.registers <= 85 for k in resources), nvrtc.resource_table(nvrtc_reports)


def test_ptxas_log_parser():
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
        "ptxas info    : Function properties for k1\n"
        "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 380 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function 'k2' for 'sm_90'\n"
        "ptxas info    : Function properties for k2\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 16 registers, used 0 barriers\n"
    )
    k1, k2 = nvrtc.parse_ptxas_log(log, "f.cu", 90)
    assert (k1.kernel, k1.registers, k1.stack_frame, k1.spill_stores, k1.spill_loads, k1.barriers, k1.cmem) == (
        "k1",
        40,
        8,
        4,
        12,
        1,
        380,
    )
    assert not k1.clean and k2.clean and k2.registers == 16


# ------------------------------------------------------------------------------------------------
# Host emulation: copy_tiles
# ------------------------------------------------------------------------------------------------


@needs_cxx
def test_host_build_is_warning_free():
    for f in cuda.KERNEL_FILES:
        assert emulation.host_build_warnings(f) == ""


def run_plan(rel, arena, *, tile_bytes, rng, order, threads=256, grid=None):
    """Emulate a relative plan on a copy of `arena`; compare with the reference; return stats."""
    emu = arena.copy()
    ref = arena.copy()
    segs = generators.absolute_segments(rel, emu.ctypes.data)
    tiles, starts = references.make_tiles(segs, tile_bytes=tile_bytes, rng=rng)
    stats = emulation.emulate_copy_tiles(segs, tiles, starts, order=order, threads=threads, grid=grid, ranges=[emu])
    references.reference_execute_segments(ref, segs, base=emu.ctypes.data)
    if not np.array_equal(emu, ref):
        bad = np.flatnonzero(emu != ref)
        raise AssertionError(f"{bad.size} bytes differ, first at offset {bad[0]}; plan:\n{rel}\ntiles:\n{tiles}")
    return stats


@needs_cxx
@pytest.mark.parametrize("seed", range(24))
def test_copy_tiles_random_plans(seed):
    rng = np.random.default_rng(1000 + seed)
    arena = rng.integers(0, 256, size=1 << 19, dtype=np.uint8)
    rel = generators.random_segment_plan(rng, arena_size=arena.size, max_bytes=100 * 1024)
    tile_bytes = int(rng.choice([16, 100, 1024, 4096, 64 * 1024]))
    threads = int(rng.choice([256, 256, 64, 33]))
    grid = None if rng.random() < 0.7 else int(rng.integers(1, 8))
    stats = run_plan(rel, arena, tile_bytes=tile_bytes, rng=rng, order=ORDERS[seed % 3], threads=threads, grid=grid)
    assert stats.accesses > 0


@needs_cxx
@pytest.mark.parametrize("seed", range(6))
def test_copy_tiles_right_shifts_are_memmoves_too(seed):
    # Beyond the planner's contract (it emits left shifts only): src < dst still memmoves.
    rng = np.random.default_rng(2000 + seed)
    arena = rng.integers(0, 256, size=1 << 18, dtype=np.uint8)
    rel = generators.random_segment_plan(rng, arena_size=arena.size, max_bytes=32 * 1024, descending=True)
    run_plan(rel, arena, tile_bytes=512, rng=rng, order=ORDERS[seed % 3])


def one_segment(src, dst, row_bytes, rows=1, pitch=0, mode=0, elem=1, wave=0):
    s = np.zeros(1, dtype=cuda.SEGMENT_DTYPE)
    s[0] = (src, dst, row_bytes, rows, pitch, wave, mode, elem)
    return s


@needs_cxx
@pytest.mark.parametrize("src_off,dst_off", [(0, 0), (16, 48), (1, 17), (3, 40), (2, 36), (4, 72), (8, 24), (5, 6)])
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 100, 4097])
def test_copy_tiles_alignment_classes(src_off, dst_off, n):
    # Every (src mod 16, dst mod 16) class and head/body/tail split; the shim counts misaligned words.
    arena = np.arange(16384, dtype=np.uint32).astype(np.uint8)
    rel = one_segment(256 + src_off, 8192 + dst_off, n)
    for order in ORDERS:
        run_plan(rel, arena, tile_bytes=64, rng=None, order=order)


@needs_cxx
def test_copy_tiles_vectorises_when_congruent():
    arena = np.zeros(1 << 16, dtype=np.uint8)
    aligned = run_plan(one_segment(0, 32768, 16384), arena, tile_bytes=1 << 20, rng=None, order=0)
    congruent = run_plan(one_segment(3, 32768 + 3, 16384), arena, tile_bytes=1 << 20, rng=None, order=0)
    bytewise = run_plan(one_segment(3, 32768 + 4, 16384), arena, tile_bytes=1 << 20, rng=None, order=0)
    assert aligned.accesses == 2 * 16384 // 16
    assert congruent.accesses < 2 * (16384 // 16 + 32)
    assert bytewise.accesses == 2 * 16384


@needs_cxx
@pytest.mark.parametrize("src_off,dst_off", [(4, 0), (6, 2), (16, 32), (3, 9), (8, 40)])
@pytest.mark.parametrize(
    "pitch,n,rows", [(20, 16, 300), (20, 12, 7), (32, 16, 64), (10, 4, 33), (200, 127, 5), (48, 48, 257)]
)
def test_copy_tiles_short_disjoint_rows_spread_flat(src_off, dst_off, pitch, n, rows):
    # A DS conv window copied to another block: rows of n < 128 bytes at a pitch, source and
    # destination disjoint. The rows' words are spread flat over the CTA; every word stays aligned.
    rng = np.random.default_rng(pitch * n + rows)
    arena = rng.integers(0, 256, size=2 * rows * pitch + 4096, dtype=np.uint8)
    rel = one_segment(64 + src_off, 64 + rows * pitch + 512 + dst_off, n, rows=rows, pitch=pitch, mode=0, elem=1)
    for order in ORDERS:
        for tile_bytes in (1, 4096):
            stats = run_plan(rel, arena, tile_bytes=tile_bytes, rng=None, order=order)
    # Words as wide as src, dst, pitch and n allow: e.g. 4-byte words for a bf16 [dim, 10] window
    # shifted by 2 (pitch 20, 16 bytes per row).
    x = (64 + src_off) | (64 + rows * pitch + 512 + dst_off) | pitch | n | 16
    w = x & -x
    assert stats.accesses == 2 * rows * (n // w)


@needs_cxx
@pytest.mark.parametrize("width,shift,dim,elem", [(4, 1, 64, 2), (8, 3, 7, 1), (5, 4, 96, 4), (10, 7, 3000, 2)])
def test_copy_tiles_in_block_sd_shift(width, shift, dim, elem):
    # ROWS_ASCENDING: rows overlap (src = dst + shift*pitch); cut in many byte tiles.
    arena = np.random.default_rng(width).integers(0, 256, size=width * dim * elem + 64, dtype=np.uint8)
    pitch = dim * elem
    rel = one_segment(8 + shift * pitch, 8, pitch, rows=width - shift, pitch=pitch, mode=1, elem=elem)
    for order in ORDERS:
        run_plan(rel, arena, tile_bytes=48, rng=None, order=order)
    # The result equals numpy's memmove of the window.
    want = arena.copy()
    want[8 : 8 + (width - shift) * pitch] = arena[8 + shift * pitch : 8 + width * pitch]
    got = arena.copy()
    segs = generators.absolute_segments(rel, got.ctypes.data)
    tiles, starts = references.make_tiles(segs, tile_bytes=48)
    emulation.emulate_copy_tiles(segs, tiles, starts, ranges=[got])
    assert np.array_equal(got, want)


@needs_cxx
def test_copy_tiles_single_row_shift_without_overlap_is_cut_and_parallel():
    # The planner's SD shift by width-1 columns: ROWS_ASCENDING with one row, no overlap; cut into
    # many byte tiles (as the Rust tiler does) and copied cooperatively.
    rng = np.random.default_rng(5)
    dim, width, elem = 8192, 4, 2
    arena = rng.integers(0, 256, size=width * dim * elem + 64, dtype=np.uint8)
    row = dim * elem
    rel = one_segment(16 + 3 * row, 16, row, rows=1, pitch=row, mode=1, elem=elem)
    for order in ORDERS:
        stats = run_plan(rel, arena, tile_bytes=1024, rng=None, order=order)
        assert stats.accesses == 2 * row // 16  # all 16-byte words: the cooperative path


@needs_cxx
@pytest.mark.parametrize("rows,width,shift,elem", [(1, 6, 2, 2), (300, 4, 1, 2), (17, 64, 63, 8), (5, 70, 3, 1)])
def test_copy_tiles_in_block_ds_shift(rows, width, shift, elem):
    # WITHIN_ROW: each row shifts left inside itself.
    rng = np.random.default_rng(rows)
    pitch = width * elem
    arena = rng.integers(0, 256, size=rows * pitch + 32, dtype=np.uint8)
    rel = one_segment(
        2 * elem + shift * elem,
        2 * elem,
        (width - shift) * elem,
        rows=rows,
        pitch=pitch if rows > 1 else 0,
        mode=2,
        elem=elem,
    )
    for order in ORDERS:
        run_plan(rel, arena, tile_bytes=int(rng.choice([1, 64, 4096])), rng=None, order=order)


@needs_cxx
def test_copy_tiles_waves_are_ordered():
    # Wave 1 reads what wave 0 wrote (a chain A -> B -> C).
    arena = np.arange(4096, dtype=np.uint32).astype(np.uint8)
    segs = np.concatenate([one_segment(0, 1000, 300, wave=0), one_segment(1000, 2000, 300, wave=1)])
    for order in ORDERS:
        emu = arena.copy()
        abs_segs = generators.absolute_segments(segs, emu.ctypes.data)
        tiles, starts = references.make_tiles(abs_segs, tile_bytes=64)
        assert len(starts) == 3
        emulation.emulate_copy_tiles(abs_segs, tiles, starts, order=order, ranges=[emu])
        assert np.array_equal(emu[2000:2300], arena[0:300])


@needs_cxx
def test_emulation_reports_bad_accesses():
    # A copy that leaves the registered range is counted (and raises by default).
    arena = np.zeros(256, dtype=np.uint8)
    segs = generators.absolute_segments(one_segment(0, 200, 100), arena.ctypes.data)
    other = np.zeros(512, dtype=np.uint8)
    segs["dst"] = other.ctypes.data
    tiles, starts = references.make_tiles(segs)
    with pytest.raises(emulation.EmulationError, match="out-of-range"):
        emulation.emulate_copy_tiles(segs, tiles, starts, ranges=[arena])
    stats = emulation.emulate_copy_tiles(segs, tiles, starts, ranges=[arena, other], check=False)
    assert stats.out_of_range == 0 and stats.misaligned == 0


# ------------------------------------------------------------------------------------------------
# Host emulation: fused state copy
# ------------------------------------------------------------------------------------------------


def check_state_problem(p, rng, *, order, chunks, threads=256, grid_yz=None):
    arena = rng.integers(0, 256, size=p.arena_size, dtype=np.uint8)
    emu, ref = arena.copy(), arena.copy()
    metas = p.metas(emu.ctypes.data)
    kw = dict(max_accepted=p.max_accepted, num_blocks=p.num_blocks)
    err = emulation.emulate_state_copy(
        metas,
        p.block_table,
        p.src_col,
        p.dst_col,
        p.num_accepted,
        chunks=chunks,
        threads=threads,
        grid_yz=grid_yz,
        order=order,
        ranges=[emu],
        **kw,
    )
    want = references.reference_state_copy(
        ref, metas, p.block_table, p.src_col, p.dst_col, p.num_accepted, base=emu.ctypes.data, **kw
    )
    assert err.tolist() == want.tolist()
    if not np.array_equal(emu, ref):
        bad = np.flatnonzero(emu != ref)
        raise AssertionError(f"{bad.size} bytes differ, first at {bad[0]}; problem {p}")
    return arena, emu, err


@needs_cxx
@pytest.mark.parametrize("seed", range(30))
def test_state_copy_random(seed):
    rng = np.random.default_rng(3000 + seed)
    p = generators.random_state_problem(rng)
    chunks = int(rng.choice([1, 2, 3, 16]))
    grid_yz = None if seed % 4 else (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    threads = 256 if seed % 5 else 64
    check_state_problem(p, rng, order=ORDERS[seed % 3], chunks=chunks, threads=threads, grid_yz=grid_yz)


@needs_cxx
@pytest.mark.parametrize("seed", range(6))
def test_state_copy_large_states_take_their_own_number_of_ctas(seed):
    # States up to 200 KB next to small ones, with up to 64 CTAs per state: each state uses
    # min(chunks, ceil(bytes / 32 KiB)) of them; every byte is still copied exactly once.
    rng = np.random.default_rng(3500 + seed)
    p = generators.random_state_problem(rng, max_state_bytes=200 * 1024)
    check_state_problem(p, rng, order=ORDERS[seed % 3], chunks=int(rng.choice([5, 8, 64])))


@needs_cxx
def test_state_copy_errors_change_nothing():
    rng = np.random.default_rng(7)
    for _ in range(10):
        p = generators.random_state_problem(rng, invalid=1.0, in_place=0.0)
        arena, emu, err = check_state_problem(p, rng, order=2, chunks=4)
        word = cuda.decode_error_word(err, len(p.src_col))
        if word.ok:
            continue
        assert word.first_request is not None and 0 <= word.first_request <= word.last_request < len(p.src_col)
        assert set(word.names) <= set(cuda.ERROR_CODES.values())


@needs_cxx
def test_state_copy_error_word_pins_codes_and_requests():
    # Two states (SD conv, temporal), 4 requests: 0 valid, 1 bad accepted, 2 padding, 3 bad dst block.
    nb = 12
    metas = np.zeros(2, dtype=cuda.STATE_META_DTYPE)
    conv_bytes, tmp_bytes = 3 * 8 * 2, 64
    arena = np.random.default_rng(0).integers(0, 256, size=nb * (conv_bytes + tmp_bytes) + 64, dtype=np.uint8)
    emu = arena.copy()
    b = emu.ctypes.data
    metas[0] = (b, conv_bytes, conv_bytes, cuda.KIND_CONV_SD, 2, 3, 8, 0, 0, nb, 0, 0)
    metas[1] = (b + nb * conv_bytes, tmp_bytes, tmp_bytes, cuda.KIND_TEMPORAL, 4, 0, 0, 0, 1, nb, 0, 0)
    # Row 3: dst column 1 -> block 0, the null block: an invalid destination.
    bt = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 0], [12, 0, 11, 12]], dtype=np.int32)
    src = np.array([0, 0, -1, 0], np.int32)
    dst = np.array([1, 1, 1, 1], np.int32)
    acc = np.array([2, 5, 1, 1], np.int32)
    err = emulation.emulate_state_copy(metas, bt, src, dst, acc, max_accepted=3, num_blocks=nb, ranges=[emu])
    word = cuda.decode_error_word(err, 4)
    assert word.names == ["accepted", "block"] and (word.first_request, word.last_request) == (1, 3)
    ref = arena.copy()
    references.reference_state_copy(ref, metas, bt, src, dst, acc, max_accepted=3, num_blocks=nb, base=b)
    assert np.array_equal(emu, ref)
    # Request 0 did copy: conv block 2 <- columns 1..2 of block 1; temporal block 2 <- block 2 (skip).
    conv = arena[: nb * conv_bytes].reshape(nb, 3, 16)
    assert np.array_equal(emu[: nb * conv_bytes].reshape(nb, 3, 16)[2, :2], conv[1, 1:])


@needs_cxx
@pytest.mark.parametrize("seed", range(10))
def test_state_copy_align_entry(seed):
    rng = np.random.default_rng(4000 + seed)
    p = generators.random_state_problem(rng, invalid=0.15)
    R, cols = p.block_table.shape
    bs = int(rng.choice([1, 2, 3, 4, 16]))
    running = rng.integers(0, (cols + 1) * bs + 1, size=R).astype(np.int32)
    if seed % 3 == 0:
        running[0] = -1  # RS_ERR_ARGS
    arena = rng.integers(0, 256, size=p.arena_size, dtype=np.uint8)
    emu, ref, expl = arena.copy(), arena.copy(), arena.copy()
    metas = p.metas(emu.ctypes.data)
    kw = dict(max_accepted=p.max_accepted, num_blocks=p.num_blocks)
    err = emulation.emulate_state_copy(
        metas,
        p.block_table,
        p.src_col,
        running,
        p.num_accepted,
        block_size=bs,
        chunks=int(rng.choice([1, 5])),
        order=ORDERS[seed % 3],
        ranges=[emu],
        **kw,
    )
    want = references.reference_state_copy(
        ref, metas, p.block_table, p.src_col, running, p.num_accepted, block_size=bs, base=emu.ctypes.data, **kw
    )
    assert err.tolist() == want.tolist()
    assert np.array_equal(emu, ref)
    # Same bytes as the explicit entry fed with the host-side decision (for requests the device
    # accepted without error).
    if err[0] == 0:
        dst = np.full(R, -1, np.int32)
        acc = np.ones(R, np.int32)
        for r in range(R):
            if p.src_col[r] >= 0:
                dec = references.align_decision(int(running[r]), int(p.num_accepted[r]), bs)
                if dec is not None:
                    dst[r], acc[r] = dec
        metas2 = p.metas(expl.ctypes.data)
        err2 = emulation.emulate_state_copy(metas2, p.block_table, p.src_col, dst, acc, ranges=[expl], **kw)
        assert err2.tolist() == [0, 0, 0]
        assert np.array_equal(expl, emu)


def test_state_copy_align_decision_examples():
    # block_size 4: running 6, accepted 3 -> new 8, aligned 8 >= 6 -> dst col 1, a_eff 3.
    assert references.align_decision(6, 3, 4) == (1, 3)
    assert references.align_decision(6, 2, 4) is None  # new 7 -> aligned 4 < running
    assert references.align_decision(8, 1, 4) == (1, 1)  # exactly on the boundary
    assert references.align_decision(0, 3, 4) is None  # aligned 0 < block_size
    assert references.align_decision(3, 2, 4) == (0, 2)  # aligned 4: a_eff = 4 - 3 + 1


def load_vectors():
    path = DATA / "align_copy.npz"
    if not path.exists():
        pytest.skip("conformance vectors missing")
    return np.load(path)


def bf16_bits(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "conv values must be exactly bf16"
    return (bits >> 16).astype(np.uint16)


@needs_cxx
@pytest.mark.parametrize("case", range(14))
def test_state_copy_reproduces_vllm_vectors(case):
    d = load_vectors()
    if case >= int(d["num_cases"]):
        pytest.skip("no such case")
    p = f"case{case}_"
    orient = str(d[p + "orientation"])
    tensors_before, tensors_after, metas_spec = [], [], []
    for layer in (0, 1):
        conv_b = bf16_bits(d[p + f"layer{layer}_conv_before"])
        conv_a = bf16_bits(d[p + f"layer{layer}_conv_after"])
        tmp_b = np.ascontiguousarray(d[p + f"layer{layer}_temporal_before"], dtype=np.float32)
        tmp_a = np.ascontiguousarray(d[p + f"layer{layer}_temporal_after"], dtype=np.float32)
        nb = conv_b.shape[0]
        if orient == "SD":
            width, dim = conv_b.shape[1], conv_b.shape[2]
            kind = cuda.KIND_CONV_SD
        else:
            dim, width = conv_b.shape[1], conv_b.shape[2]
            kind = cuda.KIND_CONV_DS
        metas_spec.append((kind, 2, width, dim, conv_b[0].nbytes, layer, 0))
        metas_spec.append((cuda.KIND_TEMPORAL, 4, 0, 0, tmp_b[0].nbytes, layer, 1))
        tensors_before += [conv_b, tmp_b]
        tensors_after += [conv_a, tmp_a]
    # Lay the four tensors out in one arena.
    offsets, off = [], 0
    for t in tensors_before:
        offsets.append(off)
        off += (t.nbytes + 255) // 256 * 256
    arena = np.zeros(off, dtype=np.uint8)
    for t, o in zip(tensors_before, offsets):
        arena[o : o + t.nbytes] = t.reshape(-1).view(np.uint8)
    metas = np.zeros(4, dtype=cuda.STATE_META_DTYPE)
    base = arena.ctypes.data
    for i, (kind, elem, width, dim, nbytes, layer, state) in enumerate(metas_spec):
        metas[i] = (base + offsets[i], nbytes, nbytes, kind, elem, width, dim, layer, state, nb, 0, 0)
    bt = d[p + "block_table"]
    width0 = int(metas[0]["width"])
    err = emulation.emulate_state_copy(
        metas,
        bt,
        d[p + "src_col"],
        d[p + "dst_col"],
        d[p + "num_accepted"],
        max_accepted=width0,
        num_blocks=nb,
        chunks=3,
        order=case % 3,
        ranges=[arena],
    )
    assert err.tolist() == [0, 0, 0]
    for t, o, want in zip(tensors_before, offsets, tensors_after):
        got = arena[o : o + t.nbytes].view(t.dtype).reshape(t.shape)
        assert np.array_equal(got, want), f"case {case} ({d[p + 'producer']})"


# ------------------------------------------------------------------------------------------------
# gpu.py without a GPU
# ------------------------------------------------------------------------------------------------


def _has_gpu():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present")
def test_gpu_module_unavailable_without_gpu():
    with pytest.raises(BackendUnavailableError, match="pip install cupy-cuda12x"):
        cuda.load_module()


def test_gpu_module_unavailable_without_cupy(monkeypatch):
    from recoverssm_rs.cuda import module

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    monkeypatch.setattr(module, "_module", None)
    monkeypatch.setattr(module, "_cupy_ok", None)
    monkeypatch.setattr(module, "_kernels", {})
    monkeypatch.setattr(module, "_functions", {})
    with pytest.raises(BackendUnavailableError, match=r"CuPy is not importable .*pip (install|uninstall)"):
        cuda.load_module()
    with pytest.raises(BackendUnavailableError):
        module.function_ptr("rs_state_copy", 0)


def test_gpu_launchers_reject_host_tensors_before_touching_cuda():
    torch = pytest.importorskip("torch")
    bt = torch.zeros((2, 3), dtype=torch.int32)
    v = torch.zeros(2, dtype=torch.int32)
    err = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(PlanError, match="reads CUDA memory; got cpu"):
        cuda.launch_state_copy(0, 1, bt, v, v, v, err, max_accepted=2, num_blocks=4, has_temporal=True)
    with pytest.raises(PlanError, match="src_col: expected a CUDA tensor on cuda:0, got a tensor on cpu"):
        cuda.launch_state_copy(
            0, 1, FakeDeviceArray(0x3000, (2, 3)), v, v, v, err, max_accepted=2, num_blocks=4, has_temporal=True
        )
    # Device arrays (described, never read): the core checks dtype, layout and alignment.
    dv = FakeDeviceArray(0x4000, (2,))
    derr = FakeDeviceArray(0x5000, (3,))
    for table, message in [
        (FakeDeviceArray(0x3000, (2, 3), dtype="int64"), "block_table: expected int32, got int64"),
        (FakeDeviceArray(0x3000, (2, 3), strides=(4, 8)), "block_table: the column axis must be contiguous"),
        (FakeDeviceArray(0x3002, (2, 3)), "block_table: address 0x3002 .* not element-aligned"),
        (FakeDeviceArray(0x3000, (1, 3)), "block_table has 1 rows for 2 requests"),
    ]:
        with pytest.raises(PlanError, match=message):
            cuda.launch_state_copy(0, 1, table, dv, dv, dv, derr, max_accepted=2, num_blocks=4, has_temporal=True)
    with pytest.raises(PlanError, match="num_accepted: must be contiguous"):
        cuda.launch_state_copy(
            0,
            1,
            FakeDeviceArray(0x3000, (2, 3)),
            dv,
            dv,
            FakeDeviceArray(0x4000, (2,), (8,)),
            derr,
            max_accepted=2,
            num_blocks=4,
            has_temporal=True,
        )
    with pytest.raises(PlanError, match="max_accepted must be >= 1"):
        cuda.launch_state_copy(
            0, 1, FakeDeviceArray(0x3000, (2, 3)), dv, dv, dv, derr, max_accepted=0, num_blocks=4, has_temporal=True
        )


def test_decode_error_word():
    assert cuda.decode_error_word([0, 0, 0], 5).ok
    w = cuda.decode_error_word(np.array([1 | 4, 5 - 1, 3 + 1], np.int32), 5)
    assert (w.first_request, w.last_request, w.names) == (1, 3, ["accepted", "block"])


def test_gpu_launch_layer_with_a_fake_cupy(monkeypatch):
    fake = install_fake_cupy(monkeypatch)
    calls = fake.calls
    mod = cuda.load_module()
    assert mod.options == cuda.MODULE_OPTIONS and mod.code == cuda.module_source()
    stream = FakeStream(0xABC)

    cuda.launch_copy_tiles(0x1000, 0x2000, 5, 300, stream)
    cuda.launch_copy_tiles(0x1000, 0x2000, 5, 300, stream, max_ctas=64)
    cuda.launch_copy_tiles(0x1000, 0x2000, 5, 0, stream)  # nothing to launch
    (n1, g1, b1, a1, s1), (n2, g2, _, _, _) = calls
    assert (n1, g1, b1, s1) == ("rs_copy_tiles", (300, 1, 1), (256, 1, 1), 0xABC) and g2 == (64, 1, 1)
    assert _fields("rs_copy_tiles", a1) == {"segments": 0x1000, "tiles": 0x2000, "first_tile": 5, "num_tiles": 300}

    calls.clear()
    bt = FakeDeviceArray(0x3000, (70000, 4), strides=(4 * 9, 4))
    vec = FakeDeviceArray(0x4000, (70000,))
    err = FakeDeviceArray(0x5000, (3,))
    cuda.launch_state_copy(
        0x6000, 96, bt, vec, vec, vec, err, max_accepted=4, num_blocks=1 << 40, has_temporal=True, stream=stream
    )
    cuda.launch_state_copy(
        0x6000,
        96,
        bt,
        vec,
        vec,
        vec,
        err,
        block_size=16,
        max_accepted=4,
        num_blocks=100,
        has_temporal=False,
        chunks=2,
        stream=stream,
        num_accepted_out=FakeDeviceArray(0x1000000, (70000,)),
    )
    (n1, g1, _, a1, _), (n2, g2, _, a2, _) = calls
    assert n1 == "rs_state_copy" and g1 == (cuda.MAX_STATE_CHUNKS, 65535, 96)  # requests folded into gridDim.y
    order = (
        "metas num_meta block_table bt_row_stride bt_cols bt_group_stride src_col dst_or_running "
        "num_accepted num_accepted_out block_size num_requests max_accepted num_blocks flags err"
    ).split()
    assert _fields("rs_state_copy", a1, order) == [
        0x6000,
        96,
        0x3000,
        9,
        4,
        0,
        0x4000,
        0x4000,
        0x4000,
        0,
        0,
        70000,
        4,
        1 << 40,
        cuda.FLAG_HAS_TEMPORAL,
        0x5000,
    ]
    assert n2 == "rs_state_copy" and g2 == (2, 65535, 96)
    assert _fields("rs_state_copy", a2, order) == [
        0x6000,
        96,
        0x3000,
        9,
        4,
        0,
        0x4000,
        0x4000,
        0x4000,
        0x1000000,
        16,
        70000,
        4,
        100,
        cuda.FLAG_DECIDE,
        0x5000,
    ]
    with pytest.raises(PlanError, match="dst_col has 5 elements but src_col has 70000"):
        cuda.launch_state_copy(
            0x6000,
            1,
            bt,
            vec,
            FakeDeviceArray(0x4000, (5,)),
            vec,
            err,
            max_accepted=4,
            num_blocks=8,
            has_temporal=True,
            stream=stream,
        )
    with pytest.raises(PlanError, match="block_table has 3 rows for 70000 requests"):
        cuda.launch_state_copy(
            0x6000,
            1,
            FakeDeviceArray(0x3000, (3, 4)),
            vec,
            vec,
            vec,
            err,
            max_accepted=4,
            num_blocks=8,
            has_temporal=True,
            stream=stream,
        )
    assert len(calls) == 2  # the refused launches queued nothing


# ------------------------------------------------------------------------------------------------
# The Rust planner's real plans, executed by the emulated kernel
# ------------------------------------------------------------------------------------------------


def _planner_states(layout, num_layers, nb, torch, seed):
    """State tensors as views into one byte arena (so the reference can address them all)."""
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    sizes = [s.nbytes * nb for _ in range(num_layers) for s in layout.persistent]
    offs = np.cumsum([0] + [(n + 255) // 256 * 256 for n in sizes])
    g = torch.Generator().manual_seed(seed)
    arena = torch.randint(0, 256, (int(offs[-1]),), dtype=torch.uint8, generator=g)
    states, k = [], 0
    for _ in range(num_layers):
        layer = []
        for s in layout.persistent:
            raw = arena[int(offs[k]) : int(offs[k]) + s.nbytes * nb]
            layer.append(raw.view(dtypes[s.dtype]).view(nb, *s.shape))
            k += 1
        states.append(layer)
    return arena, states


@needs_cxx
@pytest.mark.parametrize("seed", range(8))
def test_rust_planner_plans_run_on_the_emulated_kernel(seed):
    torch = pytest.importorskip("torch")
    try:
        from recoverssm_rs import layouts
        from recoverssm_rs.planner import Planner
    except ImportError as exc:  # the planner is built separately
        pytest.skip(f"planner unavailable: {exc}")
    rng = np.random.default_rng(9000 + seed)
    nspec = int(rng.integers(0, 4))
    layout = layouts.gdn(
        num_k_heads=2,
        num_v_heads=2,
        head_k_dim=int(rng.choice([8, 16])),
        head_v_dim=16,
        conv_kernel_size=4,
        num_spec=nspec,
        conv_layout=str(rng.choice(["SD", "DS"])),
    )
    R, cols = int(rng.integers(1, 7)), nspec + 1 + int(rng.integers(0, 3))
    nb = R * cols + 2
    arena, states = _planner_states(layout, 2, nb, torch, seed)
    planner = Planner(layout, states)
    bt = rng.permutation(np.arange(1, nb, dtype=np.int32))[: R * cols].reshape(R, cols)
    acc = rng.integers(1, nspec + 2, size=R).astype(np.int32)
    src = np.array([rng.integers(0, cols - a + 1) for a in acc], np.int32)
    dst = rng.integers(0, cols, size=R).astype(np.int32)
    in_place = rng.random(R) < 0.4
    dst[in_place] = src[in_place]  # some in-block shifts
    plan = planner.plan_align(bt, src, dst, acc)
    metas = planner.state_meta.copy()
    base = arena.data_ptr()
    before = arena.numpy().copy()
    ref = before.copy()
    err = references.reference_state_copy(
        ref, metas, bt, src, dst, acc, max_accepted=nspec + 1, num_blocks=nb, base=base
    )
    assert err.tolist() == [0, 0, 0]
    table = plan.tiles(int(rng.choice([16, 256, 65536])))
    emulation.emulate_copy_tiles(
        plan.segments, table.tiles, table.wave_starts, order=ORDERS[seed % 3], ranges=[arena.numpy()]
    )
    got = arena.numpy()
    assert np.array_equal(got, ref), f"{np.count_nonzero(got != ref)} bytes differ"
    # The fused kernel on the planner's bind-time metadata gives the same bytes.
    got[:] = before
    err = emulation.emulate_state_copy(
        metas, bt, src, dst, acc, max_accepted=nspec + 1, num_blocks=nb, chunks=3, order=ORDERS[seed % 3], ranges=[got]
    )
    assert err.tolist() == [0, 0, 0] and np.array_equal(got, ref)
