"""The subpackage's old import path (``recoverssm_rs.recoverssm``, renamed ``speculative``) keeps
working for one release: it warns, and every module under it gives the new path's classes and
functions (the same objects)."""

import importlib
import subprocess
import sys

import pytest


def test_old_path_warns_and_aliases_the_new_modules() -> None:
    # A fresh interpreter: the warning fires once per process, on the first import of the old path.
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    import recoverssm_rs.recoverssm
except DeprecationWarning as w:
    assert "recoverssm_rs.speculative" in str(w), w
else:
    raise SystemExit("no DeprecationWarning")
"""
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_old_submodules_are_the_new_objects() -> None:
    pytest.importorskip("torch")
    old_rec = importlib.import_module("recoverssm_rs.recoverssm.recurrence")
    new_rec = importlib.import_module("recoverssm_rs.speculative.recurrence")
    assert old_rec.verify is new_rec.verify and old_rec.Kind is new_rec.Kind
    from recoverssm_rs.recoverssm.state_cache import StateCache as Old
    from recoverssm_rs.speculative.state_cache import StateCache as New

    assert Old is New
    from recoverssm_rs.recoverssm.recurrence.commit import commit
    from recoverssm_rs.recoverssm.recurrence.gates import NORM_EPS, _of_kind

    assert commit is new_rec.commit
    assert NORM_EPS == new_rec.NORM_EPS
    assert _of_kind is importlib.import_module("recoverssm_rs.speculative.recurrence.gates")._of_kind
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("recoverssm_rs.recoverssm.no_such_module")
