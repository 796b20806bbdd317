"""Read the installed vLLM's source without importing it: where a module's file is, a class's methods.

Registration checks the interfaces the overlay patches against the release's
source (an import of vLLM's model code is heavy, and impossible in a vLLM
built with VLLM_TARGET_DEVICE=empty); the patch itself waits for the import
(`after_import`) and checks the live objects again.
"""

from __future__ import annotations

import ast
import importlib.util
import os

MISSING = object()  # a parameter without a default


def module_file(module: str) -> str | None:
    """The .py file of `module` inside the installed vLLM, or None (imports nothing but `vllm`'s spec)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = os.path.join(base, *rest.split(".")) + ".py"
        if os.path.isfile(path):
            return path
    return None


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def signature(fn: ast.FunctionDef) -> tuple[tuple[str, object], ...]:
    """(name, default | MISSING) per positional parameter; '*name' / '*,name' / '**name' (no default) for the rest."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [MISSING] * (len(positional) - len(args.defaults)) + [_literal(d) for d in args.defaults]
    out = [(a.arg, d) for a, d in zip(positional, defaults)]
    if args.vararg:
        out.append((f"*{args.vararg.arg}", MISSING))
    out.extend((f"*,{a.arg}", MISSING) for a in args.kwonlyargs)  # as engram.hook.signature_of has them
    if args.kwarg:
        out.append((f"**{args.kwarg.arg}", MISSING))
    return tuple(out)


def class_methods(path: str, cls: str) -> dict[str, tuple[tuple[str, object], ...]] | None:
    """Method name -> signature of class `cls` in the file at `path`, or None when there is no such class."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    node = _class(tree, cls)
    if node is None:
        return None
    return {n.name: signature(n) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def class_names(path: str, cls: str) -> set[str]:
    """Names defined on class `cls` itself (methods, properties, class attributes)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    node = _class(tree, cls)
    names: set[str] = set()
    for n in node.body if node else []:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
    return names


def attributes_read(path: str, owner: str) -> set[str]:
    """Every `X` in `<...>.{owner}.X` in the file (e.g. owner "embed_tokens": what the model reads of it)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == owner:
            out.add(n.attr)
    return out


def self_reads(path: str, cls: str, methods: set[str]) -> set[str]:
    """Every `self.X` read inside the given methods of class `cls`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    node = _class(tree, cls)
    out = set()
    for fn in node.body if node else []:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in methods:
            for n in ast.walk(fn):
                if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                        and isinstance(n.ctx, ast.Load)):
                    out.add(n.attr)
    return out
