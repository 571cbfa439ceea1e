"""The CUDA sources agree with the core on every kernel's calling convention, every record layout and
every shared constant (the core owns them: ``_core.kernel_abi()``). The sources are parsed as text,
so a change on one side that misses the other fails here, without a GPU or a compiler."""

from __future__ import annotations

import re

import pytest
from recoverssm_rs import _core
from recoverssm_rs.cuda.module import KERNEL_DIR
from recoverssm_rs.plan_format import ABI, CONSTANTS, record_dtype

_C_SIZES = {"uint8_t": 1, "uint16_t": 2, "uint32_t": 4, "uint64_t": 8, "int32_t": 4, "int64_t": 8}


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _sources() -> dict[str, str]:
    return {p.name: _strip_comments(p.read_text()) for p in sorted(KERNEL_DIR.iterdir()) if p.suffix in (".cu", ".cuh")}


def parse_entries(text: str) -> dict[str, list[tuple[str, str]]]:
    """``extern "C" __global__`` entry points: name -> [(parameter, C type without qualifiers)]."""
    out = {}
    for m in re.finditer(r'extern\s+"C"\s+__global__\s+void\s+(?:RS_LAUNCH_BOUNDS\s+)?(\w+)\s*\(([^)]*)\)', text):
        params = []
        for p in m.group(2).split(","):
            p = " ".join(p.replace("__restrict__", "").split())
            ty, name = _split_param(p)
            params.append((name, ty))
        out[m.group(1)] = params
    return out


def _split_param(p: str) -> tuple[str, str]:
    m = re.match(r"^(.*?[\s*])(\w+)$", p)
    assert m, p
    ty = m.group(1).replace(" *", "*").strip()
    return " ".join(ty.split()), m.group(2)


def parse_structs(text: str) -> dict[str, list[tuple[str, int, str]]]:
    """``struct Name { type field; ... };`` -> [(field, offset, C type)] with C's layout rules."""
    out = {}
    for m in re.finditer(r"struct\s+(\w+)\s*\{([^{}]*)\};", text):
        fields, off = [], 0
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            ty, name = decl.rsplit(" ", 1)
            size = _C_SIZES.get(ty)
            if size is None:
                break  # not a plain record (a helper struct of the kernels)
            off = (off + size - 1) // size * size
            fields.append((name, off, ty))
            off += size
        else:
            out[m.group(1)] = fields
    return out


def parse_defines(text: str) -> dict[str, int]:
    """Numeric ``#define RS_NAME value`` lines."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*#define\s+(RS_\w+)\s+(\d+)u?\s*$", text, re.M)}


def abi_entries() -> dict[str, list[tuple[str, str]]]:
    return {k["name"]: [tuple(p) for p in k["params"]] for k in ABI["kernels"]}


def diff_entries(sources: dict[str, str]) -> list[str]:
    problems = []
    found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    for fname, text in sources.items():
        for name, params in parse_entries(text).items():
            found[name] = (fname, params)
    for k in ABI["kernels"]:
        if k["name"] not in found:
            problems.append(f"{k['name']}: not declared in the sources")
            continue
        fname, params = found[k["name"]]
        if fname != k["file"]:
            problems.append(f"{k['name']}: declared in {fname}, the core says {k['file']}")
        if params != [tuple(p) for p in k["params"]]:
            problems.append(f"{k['name']}: sources {params} != core {k['params']}")
    for name in set(found) - {k["name"] for k in ABI["kernels"]}:
        problems.append(f"{name}: an entry point the core does not know")
    return problems


def diff_structs(sources: dict[str, str]) -> list[str]:
    structs: dict[str, list[tuple[str, int, str]]] = {}
    for text in sources.values():
        structs.update(parse_structs(text))
    problems = []
    for name in ("Segment", "Tile", "StateMeta", "CommitRow", "CommitMeta"):
        if name not in structs:
            problems.append(f"struct {name}: not in the sources")
            continue
        core = [(f, off, c) for f, off, _np, c in ABI["records"][name]["fields"]]
        if structs[name] != core:
            problems.append(f"struct {name}: sources {structs[name]} != core {core}")
    return problems


def diff_defines(sources: dict[str, str]) -> list[str]:
    defines: dict[str, int] = {}
    for text in sources.values():
        defines.update(parse_defines(text))
    problems = []
    for name in ABI["cuda_defines"]:
        if name not in defines:
            problems.append(f"{name}: not defined in the sources")
        elif defines[name] != CONSTANTS[name]:
            problems.append(f"{name}: sources {defines[name]} != core {CONSTANTS[name]}")
    for name in set(defines) - set(ABI["cuda_defines"]):
        problems.append(f"{name} = {defines[name]}: a constant the core does not own")
    return problems


def test_entry_signatures_match_the_core():
    assert diff_entries(_sources()) == []
    assert set(abi_entries()) == {"rs_copy_tiles", "rs_state_copy", "rs_recover_commit"}


def test_struct_layouts_match_the_core():
    assert diff_structs(_sources()) == []


def test_constants_match_the_core():
    assert diff_defines(_sources()) == []


@pytest.mark.parametrize(
    "mutate, expect",
    [
        # two parameters swapped
        (lambda s: s.replace("int32_t block_size,\n    int32_t num_requests", "int32_t num_requests,\n    int32_t block_size"),
         "rs_state_copy: sources"),
        # a field widened
        (lambda s: s.replace("uint32_t row_bytes;", "uint64_t row_bytes;"), "struct Segment"),
        # a constant changed
        (lambda s: s.replace("#define RS_ERR_META 8", "#define RS_ERR_META 32"), "RS_ERR_META: sources 32"),
        # a new constant the core does not own
        (lambda s: s + "\n#define RS_NEW_THING 3\n", "RS_NEW_THING = 3"),
    ],
)
def test_the_checks_catch_a_one_sided_change(mutate, expect):
    sources = _sources()
    mutated = {name: mutate(text) for name, text in sources.items()}
    assert mutated != sources, "the mutation must apply to some source"
    problems = diff_entries(mutated) + diff_structs(mutated) + diff_defines(mutated)
    assert any(expect in p for p in problems), problems


def test_numpy_dtypes_are_built_from_the_core():
    for name, spec in ABI["records"].items():
        dt = record_dtype(name)
        assert dt.itemsize == spec["size"]
        assert [(f, dt.fields[f][1]) for f, *_ in spec["fields"]] == [(f, off) for f, off, *_ in spec["fields"]]
    assert record_dtype("StateMeta").itemsize == 64 and record_dtype("CommitMeta").itemsize == 128


def test_packed_buffer_follows_the_declared_order():
    # Distinct values in every slot, unpacked by the declared C types with natural alignment.
    from support.fakes import unpack_args

    k = next(k for k in ABI["kernels"] if k["name"] == "rs_state_copy")
    values = [1000 + i for i in range(len(k["params"]))]
    kl = _core.pack_launch("rs_state_copy", (1, 1, 1), (256, 1, 1), values)
    assert unpack_args("rs_state_copy", kl.args) == values and kl.args_size == len(kl.args) == 120
    assert [v for _, v in kl.values()] == values
    with pytest.raises(_core.PlanError, match="metas = -1 does not fit const StateMeta"):
        _core.pack_launch("rs_state_copy", (1, 1, 1), (256, 1, 1), [-1] * len(values))
