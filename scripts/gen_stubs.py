"""Writes ``python/recoverssm_rs/_core.pyi``, the type stub of the compiled core, from the bindings.

The Rust bindings (``rust/python/*.rs``) own every fact of the stub. What exists, each callable's
parameters (names, kinds, defaults), the docstrings, the exception classes and their bases come from
the built extension (``import recoverssm_rs._core``: build it first, ``bash scripts/setup.sh``);
the types come from the Rust source: PyO3's annotated signatures, ``#[pyo3(signature = (a: "int",
*, b: "str | None" = None) -> "Layout")]``, else the Rust types of a plain parameter, return value,
getter or ``#[pyo3(get)]`` field (``u64`` is ``int``, ``Option<T>`` is ``T | None``, ...). A getter
whose Rust type says too little carries a ``// stub: -> TYPE`` line among its attributes. A
parameter or result with no type either way is an error: every public signature is typed.

    python scripts/gen_stubs.py           # writes the stub
    python scripts/gen_stubs.py --check   # exits 1 with a diff when the committed stub differs
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "python" / "recoverssm_rs" / "_core.pyi"
SOURCES = ROOT / "rust" / "python"
COMMAND = "python scripts/gen_stubs.py"

# The names the annotations of the bindings may use beside builtins and the module's own classes.
IMPORTS = {
    "os": ["os"],
    "collections.abc": ["Callable", "Iterable", "Mapping", "Sequence"],
    "pathlib": ["Path"],
    "typing": ["Any", "ClassVar", "Literal", "TypeVar", "final"],
}
PREAMBLE = """\
_T = TypeVar("_T")

_Role = Literal["persistent", "workspace"]
_CopyKindName = Literal["conv", "temporal"]
_ConvLayoutName = Literal["SD", "DS"]
_Location = Literal["memory", "disk"]
# A tensor or array the core describes without reading it (a torch tensor, a CuPy array, a host
# array); an int32 / int64 host vector or table (a numpy array, a CPU tensor, a list of ints).
_Tensor = Any
_IntArray = Any
# A dtype the core reads by name: a torch or numpy dtype.
_DType = Any
# Bytes the core reads through the buffer protocol (bytes, a numpy uint8 array, a memoryview).
_Buffer = Any
"""

# Rust types and what Python sees of them.
RUST_TYPES = {
    **{t: "int" for t in ("u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize", "u128", "i128")},
    **{t: "float" for t in ("f32", "f64")},
    "bool": "bool",
    "str": "str",
    "String": "str",
    "PyString": "str",
    "PyBytes": "bytes",
    "PathBuf": "Path",
    "()": "None",
}
# Dunder methods and their types when the source gives none.
DUNDERS = {
    "__len__": "(self) -> int",
    "__repr__": "(self) -> str",
    "__str__": "(self) -> str",
    "__hash__": "(self) -> int",
}
# Dunders left out of the stub (object's own, or comparisons the stub need not spell).
SKIPPED_DUNDERS = {
    "__repr__",
    "__str__",
    "__hash__",
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__richcmp__",
}


class StubError(Exception):
    """A binding the stub cannot be generated for (no type for a parameter, an unreadable attribute)."""


# ---------------------------------------------------------------------------------------------
# The Rust source: a small lexer (strings, chars, lifetimes and comments skipped when matching
# brackets) and the items the bindings define.


def _skip_literal(src: str, i: int) -> int:
    """The index after the string, char or comment starting at ``src[i]`` (``i`` when none does)."""
    c = src[i]
    if src.startswith("//", i):
        j = src.find("\n", i)
        return len(src) if j < 0 else j
    if src.startswith("/*", i):
        return src.index("*/", i) + 2
    m = (
        re.match(r'(b?r)(#*)"', src[i : i + 10])
        if c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_"))
        else None
    )
    if m:
        end = '"' + m.group(2)
        return src.index(end, i + m.end()) + len(end)
    if c == '"' or (c == "b" and src.startswith('b"', i) and (i == 0 or not src[i - 1].isalnum())):
        j = i + (2 if c == "b" else 1)
        while src[j] != '"':
            j += 2 if src[j] == "\\" else 1
        return j + 1
    if c == "'":
        m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", src[i : i + 12])
        if m:
            return i + m.end()
    return i


def _matching(src: str, i: int) -> int:
    """The index after the bracket closing the one at ``src[i]``."""
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    stack = [pairs[src[i]]]
    j = i + 1
    while stack:
        k = _skip_literal(src, j)
        if k != j:
            j = k
            continue
        c = src[j]
        if c in "([{" or (c == "<" and stack[0] == ">"):
            stack.append(pairs[c])
        elif c == stack[-1] and not (c == ">" and src[j - 1] == "-"):
            stack.pop()
        j += 1
    return j


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets and strings."""
    parts, depth, start, j = [], 0, 0, 0
    while j < len(text):
        k = _skip_literal(text, j) if text[j] in "\"'" else j
        if k != j:
            j = k
            continue
        c = text[j]
        if c in "([{<":
            depth += 1
        elif c in ")]}>" and not (c == ">" and text[j - 1] == "-"):
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:j].strip())
            start = j + 1
        j += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


@dataclass
class Param:
    name: str
    annotation: str | None


@dataclass
class RustFn:
    rust_name: str
    py_name: str
    flags: set[str]
    params: list[Param]
    returns: str | None
    where: str


@dataclass
class RustClass:
    rust_name: str
    py_name: str
    subclass: bool
    fields: dict[str, str | None] = field(default_factory=dict)
    methods: dict[str, RustFn] = field(default_factory=dict)


@dataclass
class Source:
    classes: dict[str, RustClass] = field(default_factory=dict)  # by Python name
    functions: dict[str, RustFn] = field(default_factory=dict)  # by Python name


ATTR = re.compile(r"#\[")


def _attributes(src: str, i: int) -> tuple[list[str], int]:
    """The attributes (and ``// stub:`` lines) from ``src[i]`` on, and the index after them."""
    attrs = []
    while True:
        m = re.match(r"\s*(///[^\n]*\n|//[^\n]*\n)", src[i:])
        if m:
            line = m.group(1).strip()
            if line.startswith("// stub:"):
                attrs.append(line)
            i += m.end()
            continue
        m = re.match(r"\s*#\[", src[i:])
        if not m:
            return attrs, i
        start = i + m.end() - 1
        end = _matching(src, start)
        attrs.append(src[start + 1 : end - 1].strip())
        i = end


def _rust_params(text: str) -> list[tuple[str, str]]:
    """The parameters of a Rust function but the receiver (``self``, ``slf``)."""
    out = []
    for p in _split_top(text):
        if ":" not in p:  # self, &self, &mut self
            continue
        name, ty = p.split(":", 1)
        if name.strip() == "slf":
            continue
        out.append((name.strip().removeprefix("mut ").strip(), ty.strip()))
    return out


def _signature_attr(attrs: list[str]) -> tuple[str | None, str | None]:
    """The ``signature = (...) [-> "R"]`` and ``name = "..."`` of a function's ``#[pyo3(...)]`` or
    ``#[pyfunction(...)]``."""
    sig = name = None
    for a in attrs:
        m = re.match(r"(pyo3|pyfunction)\s*\(", a)
        if not m:
            continue
        for item in _split_top(a[m.end() - 1 + 1 : -1]):
            if item.startswith("signature"):
                sig = item.split("=", 1)[1].strip()
            elif item.startswith("name"):
                name = ast.literal_eval(item.split("=", 1)[1].strip())
    return sig, name


def _parse_signature(sig: str) -> tuple[list[Param], str | None]:
    """The parameters and return annotation of a PyO3 ``signature`` value."""
    close = _matching(sig, 0)
    items = _split_top(sig[1 : close - 1])
    rest = sig[close:].strip()
    returns = ast.literal_eval(rest[2:].strip()) if rest.startswith("->") else None
    params = []
    for item in items:
        if item in ("*", "/"):
            continue
        m = re.match(r"(\*{0,2})\s*(r#)?(\w+)\s*(?::\s*(\"(?:[^\"\\]|\\.)*\"))?", item)
        if not m:
            raise StubError(f"cannot read signature item {item!r}")
        params.append(Param(m.group(1) + m.group(3), ast.literal_eval(m.group(4)) if m.group(4) else None))
    return params, returns


def _fn_at(src: str, i: int, attrs: list[str], where: str) -> tuple[RustFn, int]:
    m = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?fn\s+(\w+)\s*").match(src, i)
    assert m, where
    j = m.end()
    if src[j] == "<":
        j = _matching(src, j)
    close = _matching(src, j)
    rust_params = _rust_params(src[j + 1 : close - 1])
    body = src.index("{", close)
    ret_text = src[close:body].strip()
    ret_text = re.split(r"\bwhere\b", ret_text)[0].strip()
    rust_ret = ret_text[2:].strip() if ret_text.startswith("->") else "()"
    flags = {a.split("(")[0].strip() for a in attrs if not a.startswith("// stub:")}
    sig, name = _signature_attr(attrs)
    stub_ret = next((a.split("->", 1)[1].strip() for a in attrs if a.startswith("// stub:")), None)
    rust_name = m.group(1)
    fn = RustFn(rust_name, name or rust_name, flags, [], None, f"{where}: fn {rust_name}")
    if sig is not None:
        fn.params, fn.returns = _parse_signature(sig)
        by_name = dict(rust_params)
        for p in fn.params:
            if p.annotation is None and p.name.lstrip("*") in by_name:
                p.annotation = _py_type(by_name[p.name.lstrip("*")], param=True)
    else:
        fn.params = [Param(n, _py_type(t, param=True)) for n, t in rust_params if _py_type(t, param=True) != "<skip>"]
    fn.returns = fn.returns or stub_ret or _py_type(rust_ret)
    fn.params = [p for p in fn.params if p.annotation != "<skip>"]
    return fn, _matching(src, body)


def _list_text(group: str) -> str:
    """A shared list's group, ``(Struct { a: "T", ... } * { b: "U" = None, ... })``, as a PyO3
    signature fragment (``a: "T", ..., *, b: "U" = None, ...``)."""
    parts, k = [], 0
    for star in (False, True):
        b = group.find("{", k)
        if b < 0 or (star and "*" not in group[k:b]):
            break
        k = _matching(group, b)
        items = group[b + 1 : k - 1].strip().rstrip(",").strip()
        parts += (["*"] if star else []) + ([re.sub(r"\s+", " ", items)] if items else [])
    return ", ".join(parts)


def _shared_lists(sources: list[str]) -> dict[str, str]:
    """The shared parameter lists (``rust/python/params.rs``): each list macro's name and its
    parameters as a PyO3 signature fragment."""
    out = {}
    for src in sources:
        for m in re.finditer(r"macro_rules!\s+(\w+)\s*\{", src):
            body = src[m.end() : _matching(src, m.end() - 1) - 1]
            w = body.find("with_params!")
            if w >= 0 and m.group(1) != "with_params":
                group = body[body.index("(", w) :]
                out[m.group(1)] = _list_text(group[: _matching(group, 0)])
    return out


def _expand_lists(src: str, lists: dict[str, str]) -> str:
    """``src`` with each ``#[signature((before) ..a (after) -> "R")]`` inside a list macro's (or
    ``with_params!``'s) invocation written out as the ``#[pyo3(signature = ...)]`` it emits."""
    edits = []
    invocations = []
    for name, text in lists.items():
        invocations += [(m, text) for m in re.finditer(rf"(?<![\w!]){name}!\s*\{{", src)]
    for m in re.finditer(r"(?<![\w!])with_params!\s*\{\s*\(", src):
        group = src[m.end() - 1 : _matching(src, m.end() - 1)]
        if "$" not in group:  # a list given in place, not a list macro's definition
            invocations.append((m, _list_text(group)))
    for m, text in invocations:
        end = _matching(src, m.group(0).rindex("{") + m.start())
        for a in re.finditer(r"#\[signature\(", src[:end]):
            if a.start() < m.end():
                continue
            i = a.end()
            close = _matching(src, i)
            before = src[i + 1 : close - 1]
            rest = re.compile(r"\s*\.\.\s*\w+\s*").match(src, close)
            if not rest:
                raise StubError(f"cannot read {src[a.start() : close]!r}")
            j, after = rest.end(), ""
            if src[j] == "(":
                k = _matching(src, j)
                after, j = src[j + 1 : k - 1], k
            ret = re.compile(r"\s*(->\s*\"[^\"]*\")\s*\)\]").match(src, j)
            if not ret:
                raise StubError(f"cannot read the return of {src[a.start() : j]!r}")
            items = [x for x in (before.strip().rstrip(","), text, after.strip().rstrip(",")) if x]
            edits.append((a.start(), ret.end(), f"#[pyo3(signature = ({', '.join(items)}) {ret.group(1)})]"))
    for start, end, new in sorted(edits, reverse=True):
        src = src[:start] + new + src[end:]
    return src


def read_source(files: list[Path]) -> Source:
    out = Source()
    by_rust: dict[str, RustClass] = {}
    impls: list[tuple[str, list[RustFn]]] = []
    texts = [path.read_text() for path in files]
    lists = _shared_lists(texts)
    for path, text in zip(files, texts):
        src = _expand_lists(text, lists)
        rel = f"rust/python/{path.name}"
        i = 0
        while True:
            m = ATTR.search(src, i)
            if not m:
                break
            attrs, j = _attributes(src, m.start())
            head = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?(struct|fn|impl|unsafe fn)\b\s*").match(src, j)
            kinds = [a.split("(")[0].strip() for a in attrs]
            if head and head.group(1) == "struct" and "pyclass" in kinds:
                cls_attr = next(a for a in attrs if a.startswith("pyclass"))
                name = re.search(r'name\s*=\s*"(\w+)"', cls_attr)
                sm = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?struct\s+(\w+)[^{;(]*").match(src, j)
                assert sm
                rc = RustClass(sm.group(1), name.group(1) if name else sm.group(1), "subclass" in cls_attr)
                k = sm.end()
                if src[k] == "{":
                    end = _matching(src, k)
                    get_all = "get_all" in cls_attr
                    for fm in re.finditer(
                        r"((?:\s*(?:#\[[^\]]*\]|///[^\n]*|// stub:[^\n]*))*)\s*(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:\s*([^,\n]+),",
                        src[k + 1 : end - 1],
                    ):
                        fattrs = fm.group(1)
                        if get_all or "pyo3(get" in fattrs:
                            stub = re.search(r"// stub:\s*->\s*(.+)", fattrs)
                            rc.fields[fm.group(2)] = stub.group(1).strip() if stub else _py_type(fm.group(3).strip())
                    i = end
                else:
                    i = k
                by_rust[rc.rust_name] = rc
                continue
            if head and head.group(1) == "impl" and "pymethods" in kinds:
                im = re.compile(r"\s*impl(?:<[^>]*>)?\s+(\w+)\s*\{").match(src, j)
                assert im, f"{rel}: impl"
                end = _matching(src, im.end() - 1)
                fns = []
                k = im.end()
                while True:
                    fm = re.compile(
                        r"\s*(?:///[^\n]*\n|//[^\n]*\n|#\[|(?:pub(?:\([^)]*\))?\s+)?(?:(?:unsafe\s+)?fn|const)\b)"
                    ).match(src, k)
                    if not fm or k >= end - 1:
                        break
                    fattrs, fstart = _attributes(src, k)
                    cm = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?const\b[^;]*;").match(src, fstart)
                    if cm:  # a #[classattr] constant: the stub reads its type from the module
                        k = cm.end()
                        continue
                    fn, k = _fn_at(src, fstart, fattrs, f"{rel} impl {im.group(1)}")
                    fns.append(fn)
                impls.append((im.group(1), fns))
                i = end
                continue
            named = re.compile(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?fn\s+\w").match(src, j)
            if head and named and any(k.startswith("pyfunction") for k in kinds):
                fn, i = _fn_at(src, j, attrs, rel)
                out.functions[fn.py_name] = fn
                continue
            i = j if j > m.start() else m.end()
    for rust_name, fns in impls:
        rc = by_rust[rust_name]
        for fn in fns:
            rc.methods[fn.py_name] = fn
    out.classes = {rc.py_name: rc for rc in by_rust.values()}
    return out


def _generic(ty: str, name: str) -> str | None:
    m = re.fullmatch(rf"{name}\s*<(.*)>", ty, re.S)
    return m.group(1).strip() if m else None


def _py_type(ty: str, param: bool = False) -> str | None:
    """The Python type of the Rust type ``ty``; ``None`` when it says too little (``PyAny``),
    ``"<skip>"`` for what Python never passes (``Python<'py>``, the receiver)."""
    ty = re.sub(r"\s+", " ", ty.strip())
    ty = re.sub(r"^&\s*(?:'\w+\s+)?(?:mut\s+)?", "", ty)
    ty = re.sub(r"^(?:pyo3::|std::path::|crate::python::\w+::|super::\w+::)", "", ty)
    if re.fullmatch(r"Python\s*<[^>]*>", ty):
        return "<skip>"
    if ty == "Self" or re.fullmatch(r"(Bound|PyRef|PyRefMut|Py)\s*<[^,]*,?\s*Self>", ty):
        return "<class Self>"
    for wrapper in ("PyResult", "Result"):
        inner = _generic(ty, wrapper)
        if inner is not None:
            return _py_type(_split_top(inner)[0], param)
    inner = _generic(ty, "Option")
    if inner is not None:
        t = _py_type(inner, param)
        return None if t is None else f"{t} | None"
    inner = _generic(ty, "Vec")
    if inner is not None:
        if inner == "u8" and not param:
            return "bytes"
        t = _py_type(inner, param)
        return None if t is None else (f"Sequence[{t}]" if param else f"list[{t}]")
    if ty.startswith("(") and ty.endswith(")") and ty != "()":
        parts = [_py_type(p, param) for p in _split_top(ty[1:-1])]
        return None if None in parts else "tuple[" + ", ".join(p for p in parts if p) + "]"
    for wrapper in ("Bound", "Py", "Borrowed", "PyRef"):
        inner = _generic(ty, wrapper)
        if inner is not None:
            return _py_type(_split_top(inner)[-1], param)
    if ty.startswith("'"):
        ty = ty.split(" ", 1)[1]
    if ty in RUST_TYPES:
        return RUST_TYPES[ty]
    if re.fullmatch(r"[A-Z]\w*", ty) and ty not in ("PyAny", "PyDict", "PyTuple", "PyList", "PyObject", "PyType"):
        return f"<class {ty}>"  # a pyclass, named by its Python name later
    return None


# ---------------------------------------------------------------------------------------------
# The stub, from the module and the source.


def _resolve(ty: str | None, source: Source, where: str) -> str:
    if ty is None:
        raise StubError(f"{where}: no type (annotate it in the binding's #[pyo3(signature = ...)])")

    def cls(m: re.Match[str]) -> str:
        rust = m.group(1)
        if rust == "Self" and "." in where:
            return where.split(".")[0]
        for rc in source.classes.values():
            if rc.rust_name == rust:
                return rc.py_name
        raise StubError(f"{where}: Rust type {rust} is no Python class (annotate it)")

    return re.sub(r"<class (\w+)>", cls, ty)


def _default_text(default: object) -> str:
    """A default as the stub spells it: a simple literal, else ``...``."""
    if default is None:
        return "None"
    if isinstance(default, bool | int | str) and not isinstance(default, float):
        return repr(default)
    return "..."


def _render_callable(
    name: str, obj: object, fn: RustFn | None, source: Source, where: str, *, method: bool, decorator: str | None = None
) -> list[str]:
    text_sig = getattr(obj, "__text_signature__", None)
    if fn is None:
        raise StubError(f"{where}: not found in rust/python/*.rs")
    annotations = {p.name.lstrip("*"): p.annotation for p in fn.params}
    parts: list[str] = []
    if text_sig is None and name in DUNDERS:
        text_sig = DUNDERS[name].split(" ->")[0]
    if text_sig is None:
        if fn.params:
            raise StubError(f"{where}: the extension gives no signature (__text_signature__) to render")
        text_sig = "($self)" if method and decorator != "@staticmethod" else "()"
    sig = _sig_of(text_sig.replace("$", ""))
    last_kind = None
    for p in sig.parameters.values():
        if p.name in ("self", "cls", "module") and last_kind is None and (method or p.name == "module"):
            if p.name == "module":
                continue
            parts.append(p.name)
            last_kind = p.kind
            continue
        if p.kind == p.KEYWORD_ONLY and last_kind not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            parts.append("*")
        if last_kind == p.POSITIONAL_ONLY and p.kind != p.POSITIONAL_ONLY:
            parts.append("/")
        ann = _resolve(annotations.get(p.name), source, f"{where}: parameter {p.name}")
        if p.default is None and not re.search(r"\bNone\b|^(Any|_Tensor|_IntArray)$", ann):
            ann += " | None"  # PyO3's `= None`: the binding applies its default
        prefix = "*" if p.kind == p.VAR_POSITIONAL else "**" if p.kind == p.VAR_KEYWORD else ""
        text = f"{prefix}{p.name}: {ann}"
        if p.default is not p.empty:
            text += " = " + _default_text(p.default)
        parts.append(text)
        last_kind = p.kind
    if last_kind == inspect.Parameter.POSITIONAL_ONLY and parts != ["self"]:
        parts.append("/")
    if method and (not parts or parts[0] not in ("self", "cls")) and decorator != "@staticmethod":
        parts.insert(0, "cls" if decorator == "@classmethod" or name == "__new__" else "self")
    returns = fn.returns
    if name in DUNDERS and returns is None:
        returns = DUNDERS[name].split("-> ")[1]
    ret = _resolve(returns, source, f"{where}: return")
    lines = [decorator] if decorator else []
    head = f"def {name}({', '.join(parts)}) -> {ret}:"
    doc = inspect.getdoc(obj) if _own_doc(obj) else None
    if doc:
        lines += [head, *_docstring(doc, "    ")]
    else:
        lines.append(head + " ...")
    return lines


def _sig_of(text: str) -> inspect.Signature:
    """The signature a ``__text_signature__`` spells (``inspect``'s own reading of it)."""

    class _F:
        __text_signature__ = text

    return inspect._signature_fromstr(inspect.Signature, _F, text)  # type: ignore[attr-defined]


def _own_doc(obj: object) -> bool:
    doc = getattr(obj, "__doc__", None)
    return bool(doc) and doc is not getattr(type(obj), "__doc__", None)


def _docstring(doc: str, indent: str) -> list[str]:
    doc = doc.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = doc.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    out = [f'{indent}"""{lines[0]}']
    out += [f"{indent}{line}" if line else "" for line in lines[1:]]
    out.append(f'{indent}"""')
    return out


def render(module: object, source: Source) -> str:
    names = list(vars(module)["__all__"])
    body = [
        "",
        PREAMBLE,
        "__version__: str",
        "__all__ = [",
        *[f'    "{n}",' for n in sorted(names)],
        "]",
    ]
    blocks: list[list[str]] = []
    for name in sorted(names):
        obj = getattr(module, name)
        if name == "__version__":
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            blocks.append(
                [f"class {name}({bases}):", *_docstring(inspect.getdoc(obj) or "", "    ")]
                if _own_doc(obj)
                else [f"class {name}({bases}): ..."]
            )
        elif isinstance(obj, type):
            blocks.append(_render_class(name, obj, source))
        elif callable(obj):
            blocks.append(_render_callable(name, obj, source.functions.get(name), source, name, method=False))
        else:
            raise StubError(
                f"{name}: a module attribute of type {type(obj).__name__} (the generator renders classes and functions)"
            )
    for b in blocks:
        body += ["", *b] if len(b) > 1 else b
    text = "\n".join(body) + "\n"
    imports = []
    for mod, names in IMPORTS.items():
        used = [n for n in names if re.search(rf"(?<![\w.]){n}\b", text)]
        if mod == "os" and used:
            imports.append("import os")
        elif used:
            imports.append(f"from {mod} import {', '.join(used)}")
    head = [
        '"""Type stubs of ``recoverssm_rs._core``, generated from the bindings (rust/python/*.rs): do not edit.',
        "",
        f"Regenerate after changing a binding: ``{COMMAND}`` (after ``bash scripts/setup.sh``);",
        f'``{COMMAND} --check`` fails when this file differs (scripts/test.sh runs it)."""',
        "",
        *imports,
    ]
    return "\n".join(head) + text


def _render_class(name: str, cls: type, source: Source) -> list[str]:
    rc = source.classes.get(name)
    if rc is None:
        raise StubError(f"class {name}: no #[pyclass] named so in rust/python/*.rs")
    lines = ([] if rc.subclass else ["@final"]) + [f"class {name}:"]
    body: list[str] = []
    if _own_doc(cls):
        body += [*_docstring(inspect.getdoc(cls) or "", ""), ""]
    new = rc.methods.get("new") or next((f for f in rc.methods.values() if "new" in f.flags), None)
    if new is not None:
        new_sig = types.SimpleNamespace(__text_signature__=cls.__text_signature__, __doc__=None)  # type: ignore[attr-defined]
        body += _render_callable("__new__", new_sig, _with_return(new, name), source, f"{name}.__new__", method=True)
    for attr in sorted(vars(cls)):
        raw = inspect.getattr_static(cls, attr)
        if attr.startswith("__") and attr not in DUNDERS and attr != "__len__":
            continue
        if attr in SKIPPED_DUNDERS or attr == "__new__":
            continue
        where = f"{name}.{attr}"
        if type(raw).__name__ in ("getset_descriptor", "member_descriptor"):
            ty = rc.fields.get(attr)
            getter = rc.methods.get(attr)
            if getter is not None and "getter" in getter.flags:
                ty = getter.returns
            prop = ["@property", f"def {attr}(self) -> {_resolve(ty, source, where)}:"]
            doc = raw.__doc__
            body += [prop[0], prop[1] + " ..."] if not doc else [*prop, *_docstring(inspect.cleandoc(doc), "    ")]
        elif isinstance(raw, staticmethod) or type(raw).__name__ == "builtin_function_or_method":
            body += _render_callable(
                attr, getattr(cls, attr), _method(rc, attr), source, where, method=True, decorator="@staticmethod"
            )
        elif isinstance(raw, classmethod) or type(raw).__name__ == "classmethod_descriptor":
            body += _render_callable(
                attr, getattr(cls, attr), _method(rc, attr), source, where, method=True, decorator="@classmethod"
            )
        elif callable(raw):
            body += _render_callable(attr, raw, _method(rc, attr), source, where, method=True)
        else:
            body.append(f"{attr}: ClassVar[{type(raw).__name__}]")
    if not body:
        body = ["..."]
    while body and body[-1] == "":
        body.pop()
    return lines + [f"    {b}" if b else "" for b in body]


def _method(rc: RustClass, name: str) -> RustFn | None:
    fn = rc.methods.get(name)
    if fn is None and name in DUNDERS:
        return RustFn(name, name, set(), [], None, name)
    return fn


def _with_return(fn: RustFn, name: str) -> RustFn:
    r = fn.returns
    if r is None or r.startswith("<class") or r == "Self":
        r = name
    return RustFn(fn.rust_name, "__new__", fn.flags, fn.params, r, fn.where)


def generate() -> str:
    sys.path.insert(0, str(ROOT / "python"))
    module = importlib.import_module("recoverssm_rs._core")
    source = read_source(sorted(SOURCES.glob("*.rs")))
    text = render(module, source)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(STUB), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if formatted.returncode != 0:
        raise StubError(f"ruff format refused the generated stub:\n{formatted.stderr}")
    return formatted.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when the committed stub differs")
    args = parser.parse_args(argv)
    try:
        text = generate()
    except StubError as e:
        print(f"gen_stubs: {e}", file=sys.stderr)
        return 2
    current = STUB.read_text() if STUB.exists() else ""
    if args.check:
        if current == text:
            print(f"gen_stubs: {STUB.relative_to(ROOT)} matches the bindings")
            return 0
        rel = str(STUB.relative_to(ROOT))
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(True), text.splitlines(True), f"{rel} (committed)", f"{rel} (from the bindings)"
            )
        )
        print(f"gen_stubs: {rel} differs from the bindings: run `{COMMAND}` and commit it", file=sys.stderr)
        return 1
    if current != text:
        STUB.write_text(text)
        print(f"gen_stubs: wrote {STUB.relative_to(ROOT)}")
    else:
        print(f"gen_stubs: {STUB.relative_to(ROOT)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
