"""scripts/gen_stubs.py: the committed ``_core.pyi`` is what the bindings generate, and its check
fails, with a diff naming the binding, when a binding's signature changes without regenerating
(here an annotation of a copy of the Rust source: no rebuild needed), or when a parameter of a
binding has no type at all."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gen_stubs(monkeypatch, tmp_path) -> ModuleType:
    """The generator, reading a copy of rust/python/ (tmp_path/rust) that a test may edit."""
    spec = importlib.util.spec_from_file_location("gen_stubs", ROOT / "scripts" / "gen_stubs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gen_stubs", module)
    spec.loader.exec_module(module)
    shutil.copytree(ROOT / "rust" / "python", tmp_path / "rust")
    monkeypatch.setattr(module, "SOURCES", tmp_path / "rust")
    return module


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not in {path.name} once"
    path.write_text(text.replace(old, new))


def test_the_committed_stub_is_the_generated_one(gen_stubs, capsys):
    assert gen_stubs.main(["--check"]) == 0, capsys.readouterr().out


def test_the_check_fails_with_a_diff_when_a_signature_changes_without_regenerating(gen_stubs, tmp_path, capsys):
    _edit(
        tmp_path / "rust" / "transfer.rs",
        'tp_rank: "int") -> "LayoutFingerprint"',
        'tp_rank: "bool") -> "LayoutFingerprint"',
    )
    assert gen_stubs.main(["--check"]) == 1
    out = capsys.readouterr()
    assert "-    def with_rank(self, tp_rank: int) -> LayoutFingerprint:" in out.out
    assert "+    def with_rank(self, tp_rank: bool) -> LayoutFingerprint:" in out.out
    assert "differs from the bindings: run `python scripts/gen_stubs.py`" in out.err


def test_a_parameter_without_a_type_is_refused(gen_stubs, tmp_path, capsys):
    # `with_rank` takes its argument as any object (`&Bound<'_, PyAny>`, converted by the core), so
    # without the signature's annotation its type is nowhere.
    _edit(
        tmp_path / "rust" / "transfer.rs", 'tp_rank: "int") -> "LayoutFingerprint"', 'tp_rank) -> "LayoutFingerprint"'
    )
    assert gen_stubs.main(["--check"]) == 2
    assert "LayoutFingerprint.with_rank: parameter tp_rank: no type" in capsys.readouterr().err


def test_the_stub_imports_only_the_standard_library():
    """stubtest runs with every import but the standard library skipped (scripts/stubtest.ini): a type
    the stub took from another module would be Any there and check nothing."""
    import ast

    tree = ast.parse((ROOT / "python" / "recoverssm_rs" / "_core.pyi").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
