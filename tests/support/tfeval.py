"""A small Terraform evaluator: what ``terraform plan`` would configure, without Terraform.

No Terraform binary or provider can be downloaded here, so the tests evaluate the module
themselves, the way tests/deploy/test_stack.py evaluates the CloudFormation intrinsics: the
``.tf`` files are parsed by python-hcl2's real HCL grammar (its raw Lark tree), the
``.tf.json`` files by json with each string parsed as an HCL template. Variables (types,
defaults, validation), locals, data sources (their arguments, and ``count``, with attributes from a
given stub), resources with ``count`` / ``for_each`` / ``dynamic`` blocks, outputs and local ``module`` calls are
evaluated with Terraform's rules for the subset of the language the module uses.

Anything outside that subset (a function, a directive, a heredoc, a provider function) is
:class:`Unsupported`, never a guess: a module that used it would fail here, not pass, and try()/can()
do not turn it into a fallback or ``false``. As in Terraform, every reference is checked when the
module is loaded (:class:`InvalidConfig`, also beyond try()/can()), so a typo in an unused branch fails
too. A resource attribute the configuration does not set (``arn``, ``id``) is the placeholder
``<type.name[key].attr>``, as ``(known after apply)`` in a plan.

Not modelled (so ``terraform validate`` is still worth running): provider schemas (argument
names and types of each resource), the type unification of a conditional's two branches,
and sets other than ``toset()`` of strings. Unknown values do not propagate: an operator on one
is refused, but a template or jsonencode() writes its placeholder where Terraform's whole result
would be unknown. ``path.module`` is absolute (Terraform's is relative to the working directory),
and a relative ``file()`` path is read from the process's working directory.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import hcl2
import regex
from lark import Token, Tree


class TfError(Exception):
    """The configuration is invalid or uses something this evaluator does not implement."""


class ValidationFailed(TfError):
    """A variable's value failed its type or a validation block (Terraform refuses to plan)."""


class InvalidConfig(TfError):
    """Invalid whatever the input values (a reference to something not declared, a reference where none is
    allowed): Terraform reports it when it loads the configuration, before any evaluation, so try() and can()
    never catch it (the try docs: ``try(local.nonexist, "fallback")`` is an error)."""


class Unsupported(TfError):
    """Something this evaluator does not implement. try() and can() never catch it: a module that used it
    inside them would otherwise read as 'the expression failed' (false, the fallback) instead of failing here."""


META = {"count", "for_each", "depends_on", "lifecycle", "provider", "provisioner", "connection"}
ROOTS = {"var", "local", "data", "each", "count", "path", "module", "terraform", "self"}


# --- parsing -----------------------------------------------------------------------------


@dataclass
class Block:
    type: str
    labels: list[str]
    body: Body
    source: str


@dataclass
class Body:
    """Attributes (name -> unevaluated expression) and nested blocks, in source order."""

    attrs: dict[str, Any] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    order: list[tuple[str, str]] = field(default_factory=list)  # ("attr", name) | ("block", index)


@dataclass(frozen=True)
class Template:
    """A JSON-syntax string: an HCL template, parsed on first use."""

    text: str


def _children(node: Tree) -> list[Any]:
    return [c for c in node.children if not (isinstance(c, Tree) and c.data == "new_line_or_comment")]


def _trees(node: Tree) -> list[Tree]:
    return [c for c in _children(node) if isinstance(c, Tree)]


def _name(node: Tree | Token) -> str:
    if isinstance(node, Token):
        return str(node)
    if node.data in ("identifier", "keyword", "literal_value"):
        return str(node.children[0])
    if node.data == "string":
        parts = _children(node)[1:-1]
        text = ""
        for part in parts:
            (tok,) = part.children
            if not isinstance(tok, Token):
                raise TfError("a block label cannot hold an interpolation")
            text += _unescape(str(tok))
        return text
    raise TfError(f"not a name: {node.data}")


def parse_hcl(text: str, source: str) -> Body:
    tree = hcl2.parses_to_tree(text)
    (body,) = _trees(tree)
    return _body(body, source)


def _body(node: Tree, source: str) -> Body:
    out = Body()
    for item in _trees(node):
        if item.data == "attribute":
            name_node, _eq, expr = _children(item)
            name = _name(name_node)
            if name in out.attrs:
                raise TfError(f"{source}: attribute {name} set twice")
            out.attrs[name] = expr
            out.order.append(("attr", name))
        elif item.data == "block":
            parts = _children(item)
            head = [p for p in parts if not (isinstance(p, Token) and p.type in ("LBRACE", "RBRACE"))]
            *names, body = head
            out.blocks.append(Block(_name(names[0]), [_name(n) for n in names[1:]], _body(body, source), source))
            out.order.append(("block", str(len(out.blocks) - 1)))
    return out


def parse_directory(directory: Path) -> list[Block]:
    """Every block of a module directory's ``*.tf`` and ``*.tf.json`` files (cached per file content)."""
    blocks: list[Block] = []
    for path in sorted(directory.glob("*.tf")) + sorted(directory.glob("*.tf.json")):
        blocks += _parse_file(path.name, path.read_text(encoding="utf-8"))
    return blocks


@functools.lru_cache(maxsize=64)
def _parse_file(name: str, text: str) -> list[Block]:
    body = parse_json(json.loads(text), name) if name.endswith(".tf.json") else parse_hcl(text, name)
    return body.blocks


def parse_json(obj: dict[str, Any], source: str) -> Body:
    """Terraform's JSON syntax for a file: top-level keys are block types, nested by their labels."""
    labels = {"variable": 1, "output": 1, "resource": 2, "data": 2, "module": 1, "provider": 1}
    out = Body()
    for btype, value in obj.items():
        if btype == "//":
            continue
        if btype == "locals":
            out.blocks.append(Block("locals", [], _json_body(value, source), source))
            continue
        if btype not in labels:
            raise Unsupported(f"{source}: this evaluator does not read JSON {btype!r} blocks")

        def walk(v: Any, got: list[str], btype: str = btype) -> None:
            if len(got) == labels[btype]:
                for body in v if isinstance(v, list) else [v]:
                    out.blocks.append(Block(btype, got, _json_body(body, source, literal=btype == "variable"), source))
                return
            for k, sub in v.items():
                walk(sub, [*got, k])

        walk(value, [])
    return out


def _json_body(obj: dict[str, Any], source: str, literal: bool = False) -> Body:
    out = Body()
    for k, v in obj.items():
        if k == "//":
            continue
        if k in ("validation", "lifecycle") or (k not in ("tags",) and _is_block_list(v) and k != "value"):
            for item in v if isinstance(v, list) else [v]:
                out.blocks.append(Block(k, [], _json_body(item, source), source))
                out.order.append(("block", str(len(out.blocks) - 1)))
        else:
            out.attrs[k] = _literal(v) if literal and k in ("type", "description", "default") else _json_expr(v)
            out.order.append(("attr", k))
    return out


def _is_block_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(i, dict) for i in v)


@dataclass(frozen=True)
class Literal:
    value: Any


def _literal(v: Any) -> Literal:
    return Literal(v)


def _json_expr(v: Any) -> Any:
    if isinstance(v, str):
        return Template(v)
    if isinstance(v, list):
        return [_json_expr(i) for i in v]
    if isinstance(v, dict):
        return {k: _json_expr(i) for k, i in v.items()}
    return Literal(v)


# --- values ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unknown:
    """A value known only after apply (an ARN, an id)."""

    ref: str

    def __str__(self) -> str:
        return f"<{self.ref}>"


def tf_str(value: Any) -> str:
    """Terraform's string conversion inside a template."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise TfError("non-finite number")
        if isinstance(value, int):
            return str(value)
        return format(Decimal(repr(value)).normalize(), "f")  # as big.Float's Text('f', -1): no exponent
    if isinstance(value, str):
        return value
    if isinstance(value, Unknown):
        return str(value)
    if value is None:
        raise TfError("a null value cannot be interpolated")
    raise TfError(f"cannot convert {type(value).__name__} to a string")


def go_json(value: Any) -> str:
    """jsonencode: compact, object keys sorted (cty objects are), numbers as cty writes them (no exponent),
    <>& and U+2028/9 escaped as Go does."""

    def enc(v: Any) -> str:
        if isinstance(v, dict):
            return "{" + ",".join(f"{enc(str(k))}:{enc(v[k])}" for k in sorted(v)) + "}"
        if isinstance(v, list):
            return "[" + ",".join(enc(i) for i in v) + "]"
        if isinstance(v, bool) or v is None:
            return json.dumps(v)
        if isinstance(v, int | float):
            return tf_str(v)
        return json.dumps(str(v), ensure_ascii=False)  # a string, or an Unknown's placeholder

    text = enc(value)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}


def _unescape(text: str) -> str:
    """A quoted string's characters: backslash escapes and the $${ / %%{ quotes."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            n = text[i + 1]
            if n in _ESCAPES:
                out.append(_ESCAPES[n])
                i += 2
            elif n in "uU":
                width = 4 if n == "u" else 8
                out.append(chr(int(text[i + 2 : i + 2 + width], 16)))
                i += 2 + width
            else:
                raise TfError(f"invalid escape \\{n}")
        elif text.startswith("$${", i) or text.startswith("%%{", i):
            out.append(text[i + 1 : i + 3])
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def template_parts(text: str) -> Iterator[str | Tree]:
    """A template's literal text and interpolation expressions (no escapes: a file or JSON string)."""
    i, lit = 0, []
    while i < len(text):
        if text.startswith("$${", i) or text.startswith("%%{", i):
            lit.append(text[i + 1 : i + 3])
            i += 3
        elif text.startswith("%{", i):
            raise Unsupported("template directives (%{...}) are not supported by this evaluator")
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 2)
            if lit:
                yield "".join(lit)
                lit = []
            yield _interpolation(text[i + 2 : end].strip())
            i = end + 1
        else:
            lit.append(text[i])
            i += 1
    if lit:
        yield "".join(lit)


@functools.lru_cache(maxsize=4096)
def _interpolation(source: str) -> Tree:
    """One ``${...}``'s expression, parsed once: every Module of the same files reads the same templates (the
    trees are only read, never changed)."""
    attr = _trees(_trees(hcl2.parses_to_tree("x = " + source))[0])[0]
    return _children(attr)[-1]


def _closing_brace(text: str, start: int) -> int:
    depth, i, quote = 0, start, False
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    raise TfError("unclosed ${ in a template")


def _traversal(node: Tree) -> tuple[str, tuple[str, ...]] | None:
    """``a.b.c`` as ("a", ("b", "c")); None for anything that is not a plain attribute chain on a name."""
    names: list[str] = []
    while True:
        if node.data == "expr_term":
            kids = _trees(node)
            if len(kids) != 1:
                return None
            node = kids[0]
        elif node.data == "identifier":
            return _name(node), tuple(names)
        elif node.data == "get_attr_expr_term":
            base, attr = _trees(node)
            names.insert(0, _name(_trees(attr)[0]))
            node = base
        else:
            return None


def _calls(node: Any) -> bool:
    if isinstance(node, Template):
        return any(isinstance(p, Tree) and _calls(p) for p in template_parts(node.text))
    if isinstance(node, list | dict):
        return any(_calls(i) for i in (node.values() if isinstance(node, dict) else node))
    return isinstance(node, Tree) and (node.data == "function_call" or any(_calls(c) for c in _trees(node)))


def references(node: Any, bound: frozenset[str] = frozenset()) -> Iterator[tuple[str, tuple[str, ...]]]:
    """The traversals an expression refers to, as (root name, attribute names after it), leaving out the
    names its own ``for`` expressions bind: what HCL's ``Expression.Variables()`` gives Terraform."""
    if isinstance(node, Template):
        for part in template_parts(node.text):
            if isinstance(part, Tree):
                yield from references(part, bound)
        return
    if isinstance(node, list):
        for item in node:
            yield from references(item, bound)
        return
    if isinstance(node, dict):
        for item in node.values():
            yield from references(item, bound)
        return
    if not isinstance(node, Tree):
        return
    if node.data in ("expr_term", "get_attr_expr_term"):
        chain = _traversal(node)
        if chain is not None:
            if chain[0] not in bound:
                yield chain
            return
    if node.data in ("get_attr", "keyword", "identifier"):
        return  # an attribute name, or a name that is not an expression here
    if node.data == "function_call":
        kids = _trees(node)[1:]  # the first is the function's name
    elif node.data == "object_elem_key":
        (key,) = _trees(node)
        if key.data == "expr_term" and [getattr(c, "data", c) for c in _children(key)] == ["identifier"]:
            return  # a bare name is the key itself, not a reference; (name) would be one
        kids = [key]
    elif node.data in ("for_tuple_expr", "for_object_expr"):
        intro = next(c for c in _trees(node) if c.data == "for_intro")
        names = frozenset(_name(c) for c in _trees(intro) if c.data == "identifier")
        yield from references(next(c for c in _trees(intro) if c.data != "identifier"), bound)
        for c in _trees(node):
            if c is not intro:
                yield from references(c, bound | names)
        return
    else:
        kids = _trees(node)
    for c in kids:
        yield from references(c, bound)


# --- the module ----------------------------------------------------------------------------


class Scope(dict):
    """Names visible to an expression: iterator variables over the module's root names."""


class TemplateScope(Scope):
    """Inside templatefile(): only the variables passed, no var., local. or resources."""


class ResourceRef:
    """One resource instance as other expressions see it: configured attributes, else unknown."""

    def __init__(self, module: Module, address: str, block: Block, each: dict[str, Any]) -> None:
        self.module, self.address, self.block, self.each = module, address, block, each
        self._attrs: dict[str, Any] | None = None

    def attrs(self) -> dict[str, Any]:
        if self._attrs is None:
            self._attrs = self.module.evaluate_body(self.block.body, self.each, self.address)
        return self._attrs

    def get(self, name: str) -> Any:
        value = self.attrs().get(name)
        return Unknown(f"{self.address}.{name}") if value is None else value


class Module:
    """One module directory with its input values: evaluate variables, locals, resources, outputs."""

    def __init__(self, directory: Path, inputs: dict[str, Any], data: dict[str, DataStub]) -> None:
        self.dir = directory.resolve()
        self.data_attrs = data
        self.blocks = parse_directory(self.dir)
        self.variables = self._declared("variable", 1)
        self.outputs_decl = self._declared("output", 1)
        self.resources_decl = self._declared("resource", 2)
        self.data_decl = self._declared("data", 2)
        self.modules_decl = self._declared("module", 1)
        self.local_exprs: dict[str, Any] = {}
        for b in self.blocks:
            if b.type == "locals":
                for name, expr in b.body.attrs.items():
                    if name in self.local_exprs:
                        raise TfError(f"local.{name} declared twice")
                    self.local_exprs[name] = expr
        unknown = set(inputs) - set(self.variables)
        if unknown:
            raise TfError(f"no variable declared for {sorted(unknown)}")
        self.inputs = inputs
        self._vars: dict[str, Any] = {}
        self._locals: dict[str, Any] = {}
        self._resources: dict[tuple[str, str], Any] = {}
        self._data: dict[tuple[str, str], Any] = {}
        self._modules: dict[str, Module] = {}
        self._busy: set[str] = set()
        self._in_template = False
        self._check_references()
        for name in self.variables:
            self.var(name)

    def _declared(self, btype: str, nlabels: int) -> dict[Any, Block]:
        out: dict[Any, Block] = {}
        for b in self.blocks:
            if b.type == btype:
                key = b.labels[0] if nlabels == 1 else tuple(b.labels)
                if key in out:
                    raise TfError(f"{btype} {key} declared twice ({out[key].source}, {b.source})")
                out[key] = b
        return out

    # --- references, checked before anything is evaluated --------------------------------

    def _check_references(self) -> None:
        """Every reference names something declared, wherever it stands: Terraform checks this when it
        loads the configuration, so an unused branch or a try()/can() argument does not hide a typo."""
        for name, expr in self.local_exprs.items():
            self._check_refs(expr, f"local.{name}")
        for name, b in self.outputs_decl.items():
            self._check_refs(b.body.attrs.get("value"), f"output {name}")
        for name, b in self.modules_decl.items():
            for expr in b.body.attrs.values():
                self._check_refs(expr, f"module {name}")
        for (rtype, name), b in [*self.resources_decl.items(), *self.data_decl.items()]:
            where = f"data.{rtype}.{name}" if b.type == "data" else f"{rtype}.{name}"
            iterators = {"count"} if "count" in b.body.attrs else {"each"} if "for_each" in b.body.attrs else set()
            for meta in ("count", "for_each", "depends_on"):
                self._check_refs(b.body.attrs.get(meta), where)
            self._check_body_refs(b.body, where, iterators, frozenset())
        for name, b in self.variables.items():
            if "default" in b.body.attrs:
                # Decoded without an evaluation context: "Variables not allowed", "Functions may not be called here".
                default = b.body.attrs["default"]
                if next(references(default), None) is not None or _calls(default):
                    raise InvalidConfig(f"var.{name}: a default must be a literal value (no references, no calls)")
            for v in (v for v in b.body.blocks if v.type == "validation"):
                self._check_validation_refs(name, v.body.attrs.get("condition"))

    def _check_body_refs(self, body: Body, where: str, iterators: set[str], bound: frozenset[str]) -> None:
        for key, expr in body.attrs.items():
            if key not in META:
                self._check_refs(expr, where, iterators, bound)
        for block in body.blocks:
            if block.type in META:
                continue
            if block.type == "dynamic":
                (label,) = block.labels
                self._check_refs(block.body.attrs.get("for_each"), where, iterators, bound)
                it = _name(_trees(block.body.attrs["iterator"])[0]) if "iterator" in block.body.attrs else label
                for content in (b for b in block.body.blocks if b.type == "content"):
                    self._check_body_refs(content.body, where, iterators, bound | {it})
            else:
                self._check_body_refs(block.body, where, iterators, bound)

    def _check_refs(
        self, expr: Any, where: str, allowed: set[str] | None = None, bound: frozenset[str] = frozenset()
    ) -> None:
        """``allowed``: the iterator roots (count, each) valid here; None for an expression outside a resource."""
        for root, names in references(expr, bound):
            self._check_ref(root, names, where, allowed or set())

    def _check_ref(self, root: str, names: tuple[str, ...], where: str, iterators: set[str]) -> None:
        first = names[0] if names else None
        if root == "var":
            if first not in self.variables:
                raise InvalidConfig(f"{where}: var.{first} is not declared")
        elif root == "local":
            if first not in self.local_exprs:
                raise InvalidConfig(f"{where}: local.{first} is not declared")
        elif root == "data":
            if tuple(names[:2]) not in self.data_decl:
                raise InvalidConfig(f"{where}: data.{'.'.join(names[:2])} is not declared")
        elif root == "module":
            if first not in self.modules_decl:
                raise InvalidConfig(f"{where}: module.{first} is not declared")
        elif root in ("count", "each"):
            if root not in iterators:
                raise InvalidConfig(f"{where}: {root}.{first} outside a resource with {root}")
            if first not in ({"index"} if root == "count" else {"key", "value"}):
                raise InvalidConfig(f"{where}: {root}.{first} does not exist")
        elif root in ("path", "terraform", "self"):
            pass  # evaluated (or refused) where used
        elif root in {t for t, _ in self.resources_decl}:
            if (root, first) not in self.resources_decl:
                raise InvalidConfig(f"{where}: {root}.{first} is not declared")
        else:
            raise InvalidConfig(f"{where}: unknown name {root}" + (f".{first}" if first else ""))

    def _check_validation_refs(self, name: str, condition: Any) -> None:
        """Before Terraform 1.9 a validation condition may refer to its own variable only, and must refer to
        it (internal/configs/named_values.go: "Invalid reference in variable validation", "Invalid variable
        validation condition"); the module allows Terraform 1.5, so that is the rule."""
        refs = list(references(condition))
        for root, names in refs:
            if (root, names[:1]) != ("var", (name,)):
                raise InvalidConfig(
                    f"var.{name}: the condition for variable {name!r} can only refer to the variable itself, "
                    f"using var.{name} (it refers to {'.'.join((root, *names))})"
                )
        if not refs:
            raise InvalidConfig(f"var.{name}: the condition for variable {name!r} must refer to var.{name}")

    # --- names ---------------------------------------------------------------------------

    def _guard(self, key: str, fn: Callable[[], Any]) -> Any:
        if key in self._busy:
            raise TfError(f"cycle through {key}")
        self._busy.add(key)
        try:
            return fn()
        finally:
            self._busy.discard(key)

    def var(self, name: str) -> Any:
        if name not in self._vars:
            if name not in self.variables:
                raise InvalidConfig(f"var.{name} is not declared")
            self._vars[name] = self._variable(name, self.variables[name])
        return self._vars[name]

    def _variable(self, name: str, block: Block) -> Any:
        attrs = block.body.attrs
        type_ = self._type_text(attrs.get("type"))
        if name in self.inputs:
            value = convert(self.inputs[name], type_, f"var.{name}")
        elif "default" in attrs:
            value = convert(self._const(attrs["default"]), type_, f"var.{name}")
        else:
            raise TfError(f"var.{name} is required")
        self._vars[name] = value
        for v in (b for b in block.body.blocks if b.type == "validation"):
            ok = self.eval(v.body.attrs["condition"], Scope())
            if ok is not True:
                message = self.eval(v.body.attrs["error_message"], Scope())
                raise ValidationFailed(f"var.{name} = {value!r}: {message}")
        return value

    def _type_text(self, expr: Any) -> str:
        if expr is None:
            return "any"
        if isinstance(expr, Literal):
            return str(expr.value)
        return _source_text(expr)

    def _const(self, expr: Any) -> Any:
        return expr.value if isinstance(expr, Literal) else self.eval(expr, Scope())

    def local(self, name: str) -> Any:
        if name not in self._locals:
            if name not in self.local_exprs:
                raise InvalidConfig(f"local.{name} is not declared")
            self._locals[name] = self._guard(f"local.{name}", lambda: self.eval(self.local_exprs[name], Scope()))
        return self._locals[name]

    def data(self, dtype: str, name: str) -> Any:
        """A data source's attributes: its arguments and the stub's (one object, or a list of them with count)."""
        if (dtype, name) not in self.data_decl:
            raise InvalidConfig(f"data.{dtype}.{name} is not declared")
        if dtype not in self.data_attrs:
            raise TfError(f"no stub for data source {dtype}")
        key = (dtype, name)
        if key not in self._data:
            self._data[key] = self._guard(f"data.{dtype}.{name}", lambda: self._read(dtype, name))
        return self._data[key]

    def _read(self, dtype: str, name: str) -> Any:
        block = self.data_decl[(dtype, name)]
        stub = self.data_attrs[dtype]
        where = f"data.{dtype}.{name}"
        if "for_each" in block.body.attrs:
            raise Unsupported(f"{where}: for_each on a data source is not supported by this evaluator")

        def read(iterators: dict[str, Any]) -> dict[str, Any]:
            config = self.evaluate_body(block.body, iterators, where)
            return config | (stub(config) if callable(stub) else stub)

        if "count" not in block.body.attrs:
            return read({})
        n = self.eval(block.body.attrs["count"], Scope())
        if not isinstance(n, int | float) or isinstance(n, bool) or n < 0 or int(n) != n:
            raise TfError(f"{where}: count must be a whole number, got {n!r}")
        return [read({"count": {"index": i}}) for i in range(int(n))]

    def resource(self, rtype: str, name: str) -> Any:
        key = (rtype, name)
        if key not in self._resources:
            if key not in self.resources_decl:
                raise InvalidConfig(f"{rtype}.{name} is not declared")
            self._resources[key] = self._guard(f"{rtype}.{name}", lambda: self._instances(rtype, name))
        return self._resources[key]

    def _instances(self, rtype: str, name: str) -> Any:
        block = self.resources_decl[(rtype, name)]
        attrs = block.body.attrs
        base = f"{rtype}.{name}"
        if "count" in attrs and "for_each" in attrs:
            raise TfError(f"{base}: count and for_each")
        if "count" in attrs:
            n = self.eval(attrs["count"], Scope())
            if not isinstance(n, int | float) or isinstance(n, bool) or n < 0 or int(n) != n:
                raise TfError(f"{base}: count must be a whole number, got {n!r}")
            return [ResourceRef(self, f"{base}[{i}]", block, {"count": {"index": i}}) for i in range(int(n))]
        if "for_each" in attrs:
            items = self.eval(attrs["for_each"], Scope())
            if isinstance(items, SetValue):
                pairs = [(k, k) for k in items]
            elif isinstance(items, dict):
                pairs = sorted(items.items())
            else:
                raise TfError(f"{base}: for_each takes a map or a set of strings, got {type(items).__name__}")
            return {k: ResourceRef(self, f'{base}["{k}"]', block, {"each": {"key": k, "value": v}}) for k, v in pairs}
        return ResourceRef(self, base, block, {})

    def module(self, name: str) -> Module:
        if name not in self._modules:
            if name not in self.modules_decl:
                raise InvalidConfig(f"module.{name} is not declared")
            block = self.modules_decl[name]
            if "source" not in block.body.attrs:
                raise TfError(f"module {name}: no source")
            args = {k: self.eval(v, Scope()) for k, v in block.body.attrs.items() if k not in ("source", "version")}
            source = self.eval(block.body.attrs["source"], Scope())
            if not isinstance(source, str) or not source.startswith(("./", "../")):
                raise Unsupported(f"module {name}: only local sources, got {source!r}")
            self._modules[name] = Module(self.dir / source, args, self.data_attrs)
        return self._modules[name]

    # --- results ---------------------------------------------------------------------------

    def plan(self) -> dict[str, dict[str, Any]]:
        """Resource address -> evaluated configuration, for every instance this configuration creates."""
        out: dict[str, dict[str, Any]] = {}
        for rtype, name in self.resources_decl:
            inst = self.resource(rtype, name)
            refs = inst if isinstance(inst, list) else list(inst.values()) if isinstance(inst, dict) else [inst]
            for ref in refs:
                out[ref.address] = ref.attrs()
        for name in self.modules_decl:
            out |= {f"module.{name}.{k}": v for k, v in self.module(name).plan().items()}
        return out

    def outputs(self) -> dict[str, Any]:
        return {name: self.eval(b.body.attrs["value"], Scope()) for name, b in self.outputs_decl.items()}

    def evaluate_body(self, body: Body, iterators: dict[str, Any], where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        scope = Scope(iterators)
        for kind, key in body.order:
            if kind == "attr":
                if key not in META:
                    out[key] = self.eval(body.attrs[key], scope)
                continue
            block = body.blocks[int(key)]
            if block.type in META:
                continue
            if block.type == "dynamic":
                (label,) = block.labels
                if label in META:
                    raise InvalidConfig(f"{where}: a dynamic block cannot generate {label} blocks")
                if "labels" in block.body.attrs:
                    raise Unsupported(f"{where}: dynamic block labels are not implemented by this evaluator")
                items = self.eval(block.body.attrs["for_each"], scope)
                iterator = label
                if "iterator" in block.body.attrs:
                    iterator = _name(_trees(block.body.attrs["iterator"])[0])
                (content,) = [b for b in block.body.blocks if b.type == "content"]
                # dynamic blocks docs: key is the map key or list index; for a set, key is the value itself.
                if isinstance(items, SetValue):
                    pairs = [(v, v) for v in items]
                elif isinstance(items, list):
                    pairs = list(enumerate(items))
                elif isinstance(items, dict):
                    pairs = sorted(items.items())
                else:
                    raise TfError(f"{where}: dynamic {label}: for_each over {type(items).__name__}")
                for k, v in pairs:
                    inner = dict(iterators) | {iterator: {"key": k, "value": v}}
                    out.setdefault(label, []).append(self.evaluate_body(content.body, inner, where))
            else:
                out.setdefault(block.type, []).append(self.evaluate_body(block.body, iterators, where))
        return out

    # --- expressions -------------------------------------------------------------------

    def eval(self, node: Any, scope: Scope) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Template):
            return self.template(node.text, scope, keep_single=True)
        if isinstance(node, list):
            return [self.eval(i, scope) for i in node]
        if isinstance(node, dict):
            return {k: self.eval(v, scope) for k, v in node.items()}
        if isinstance(node, Token):
            raise TfError(f"unexpected token {node!r}")
        handler = getattr(self, f"_e_{node.data}", None)
        if handler is None:
            raise Unsupported(f"this evaluator does not implement {node.data}")
        return handler(node, scope)

    def template(self, text: str, scope: Scope, keep_single: bool) -> Any:
        parts = list(template_parts(text))
        if keep_single and len(parts) == 1 and isinstance(parts[0], Tree):
            return self.eval(parts[0], scope)
        return "".join(p if isinstance(p, str) else tf_str(self.eval(p, scope)) for p in parts)

    def _e_expr_term(self, node: Tree, scope: Scope) -> Any:
        (inner,) = _trees(node)
        return self.eval(inner, scope)

    def _e_int_lit(self, node: Tree, scope: Scope) -> Any:
        return int(str(node.children[0]))

    def _e_float_lit(self, node: Tree, scope: Scope) -> Any:
        return float(str(node.children[0]))

    def _e_literal_value(self, node: Tree, scope: Scope) -> Any:
        return {"true": True, "false": False, "null": None}[str(node.children[0])]

    def _e_string(self, node: Tree, scope: Scope) -> Any:
        parts: list[Any] = []
        for part in _children(node)[1:-1]:
            (child,) = part.children
            if isinstance(child, Token):
                parts.append(_unescape(str(child)))
            elif child.data == "interpolation":
                parts.append(_trees(child)[0])
            else:
                raise Unsupported(f"template directive {child.data} not supported")
        if len(parts) == 1 and isinstance(parts[0], Tree):
            return self.eval(parts[0], scope)
        return "".join(p if isinstance(p, str) else tf_str(self.eval(p, scope)) for p in parts)

    def _e_heredoc_template(self, node: Tree, scope: Scope) -> Any:
        raise Unsupported("heredocs are not supported by this evaluator")

    def _e_tuple(self, node: Tree, scope: Scope) -> Any:
        return [self.eval(e, scope) for e in _trees(node)]

    def _e_object(self, node: Tree, scope: Scope) -> Any:
        out: dict[str, Any] = {}
        for elem in _trees(node):
            key_node, value = _trees(elem)
            (k,) = _trees(key_node) or [key_node.children[0]]
            if isinstance(k, Tree) and k.data == "expr_term" and _trees(k)[0].data == "identifier":
                key = _name(_trees(k)[0])  # a bare name is the key itself
            elif isinstance(k, Tree) and k.data == "keyword":
                key = _name(k)
            else:
                key = self.eval(k, scope)
            key = _object_key(key)
            if key in out:
                raise TfError(f"duplicate object key {key}")
            out[key] = self.eval(value, scope)
        return out

    def _e_identifier(self, node: Tree, scope: Scope) -> Any:
        name = _name(node)
        if name in scope:
            return scope[name]
        if isinstance(scope, TemplateScope):
            raise TfError(f"the templatefile() vars map does not contain key {name!r}")
        if name in ROOTS or name in {t for t, _ in self.resources_decl}:
            return RootName(name)
        raise InvalidConfig(f"unknown name {name}")

    def _e_get_attr_expr_term(self, node: Tree, scope: Scope) -> Any:
        base_node, attr = _trees(node)
        return self.attr(self.eval(base_node, scope), _name(_trees(attr)[0]))

    def attr(self, base: Any, name: str) -> Any:
        if isinstance(base, RootName):
            return self._root_attr(base, name)
        if isinstance(base, RootPath):
            return self._path_attr(base, name)
        if isinstance(base, ResourceRef):
            return base.get(name)
        if isinstance(base, dict):
            if name not in base:
                raise TfError(f"object has no attribute {name!r} (has {sorted(base)})")
            return base[name]
        raise TfError(f"cannot read .{name} of {type(base).__name__}")

    def _root_attr(self, root: RootName, name: str) -> Any:
        r = root.name
        if r == "var":
            return self.var(name)
        if r == "local":
            return self.local(name)
        if r == "path":
            if name == "module":
                return str(self.dir)
            raise Unsupported(f"path.{name} is not supported")
        if r == "module":
            return self.module(name).outputs()
        if r in ("data",):
            return RootPath(("data", name))
        if r in ("each", "count"):
            raise InvalidConfig(f"{r}.{name} outside a resource with {r}")
        if r in ROOTS:
            raise Unsupported(f"{r}.{name} is not supported")
        return self.resource(r, name)

    def _path_attr(self, path: RootPath, name: str) -> Any:
        if path.parts[0] == "data":
            return self.data(path.parts[1], name)
        raise TfError(f"cannot resolve {'.'.join(path.parts)}.{name}")

    def _e_index_expr_term(self, node: Tree, scope: Scope) -> Any:
        base_node, index = _trees(node)
        base = self.eval(base_node, scope)
        key = self.eval(_trees(index)[0], scope) if index.data == "braces_index" else int(str(index.children[1]))
        return self.index(base, key)

    def index(self, base: Any, key: Any) -> Any:
        if isinstance(base, SetValue):
            raise TfError("elements of a set cannot be accessed by index (one docs: use one(), or a for expression)")
        if isinstance(base, list):
            if not isinstance(key, int | float) or isinstance(key, bool) or int(key) != key:
                raise TfError(f"list index {key!r}")
            if not 0 <= int(key) < len(base):
                raise TfError(f"index {key} out of range for {len(base)} elements")
            return base[int(key)]
        if isinstance(base, dict):
            if not isinstance(key, str):
                raise TfError(f"object key {key!r}")
            if key not in base:
                raise TfError(f"no element {key!r} (has {sorted(base)})")
            return base[key]
        raise TfError(f"cannot index {type(base).__name__}")

    def _e_full_splat_expr_term(self, node: Tree, scope: Scope) -> Any:
        base_node, splat = _trees(node)
        base = self.eval(base_node, scope)
        items = [] if base is None else base if isinstance(base, list) else [base]
        out = []
        for item in items:
            for step in _trees(splat):
                if step.data == "get_attr":
                    item = self.attr(item, _name(_trees(step)[0]))
                else:
                    item = self.index(item, self.eval(_trees(step)[0], scope))
            out.append(item)
        return out

    # Operands convert to the operation's type as hclsyntax does (convert.Convert: "5" is a number, "true" a
    # bool); a value known only after apply would make the result unknown, which this evaluator does not carry.

    def _e_conditional(self, node: Tree, scope: Scope) -> Any:
        cond, yes, no = _trees(node)
        c = _to_bool(self.eval(cond, scope), "condition")
        return self.eval(yes if c else no, scope)

    def _e_unary_op(self, node: Tree, scope: Scope) -> Any:
        op, operand = node.children
        v = self.eval(operand, scope)
        if str(op) == "!":
            return not _to_bool(v, "!")
        return -_to_number(v, "-")

    def _e_binary_op(self, node: Tree, scope: Scope) -> Any:
        left, term = _trees(node)
        op_node, right = _trees(term)
        op = str(op_node.children[0])
        a = self.eval(left, scope)
        b = self.eval(right, scope)  # Terraform 1.5 evaluates both sides of && and || too
        if op in ("&&", "||"):
            a, b = _to_bool(a, op), _to_bool(b, op)
            return (a and b) if op == "&&" else (a or b)
        if op in ("==", "!="):
            if isinstance(a, Unknown) or isinstance(b, Unknown):
                raise Unsupported(f"{op} with a value known only after apply: the result would be unknown")
            same = type(a) is type(b) and a == b if not _both_numbers(a, b) else a == b
            return same if op == "==" else not same
        a, b = _to_number(a, op), _to_number(b, op)
        if op in ("/", "%") and b == 0:
            raise Unsupported("division by zero (Terraform gives an infinity, or an error for 0/0): not modelled")
        return _ARITHMETIC[op](a, b)

    def _for(self, node: Tree, scope: Scope) -> Iterator[Scope]:
        intro = next(c for c in _trees(node) if c.data == "for_intro")
        names = [_name(c) for c in _trees(intro) if c.data == "identifier"]
        collection = self.eval(next(c for c in _trees(intro) if c.data != "identifier"), scope)
        if isinstance(collection, dict):
            pairs = sorted(collection.items())
        elif isinstance(collection, list | SetValue):
            is_set = isinstance(collection, SetValue)
            pairs = [(v, v) for v in collection] if is_set else list(enumerate(collection))
        else:
            raise TfError(f"for over {type(collection).__name__}")
        cond = next((c for c in _trees(node) if c.data == "for_cond"), None)
        for k, v in pairs:
            inner = type(scope)(scope)
            if len(names) == 2:
                inner[names[0]], inner[names[1]] = k, v
            else:
                inner[names[0]] = v
            if cond is not None:
                ok = self.eval(_trees(cond)[0], inner)
                if not isinstance(ok, bool):
                    raise TfError("for condition is not a bool")
                if not ok:
                    continue
            yield inner

    def _e_for_tuple_expr(self, node: Tree, scope: Scope) -> Any:
        body = [c for c in _trees(node) if c.data not in ("for_intro", "for_cond")]
        (value,) = body
        return [self.eval(value, s) for s in self._for(node, scope)]

    def _e_for_object_expr(self, node: Tree, scope: Scope) -> Any:
        key, value = [c for c in _trees(node) if c.data not in ("for_intro", "for_cond")]
        if any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in node.children):
            raise Unsupported("grouping (...) for expressions are not supported")
        out: dict[str, Any] = {}
        for s in self._for(node, scope):
            k = _object_key(self.eval(key, s))
            if k in out:
                raise TfError(f"duplicate key {k!r} in a for expression")
            out[k] = self.eval(value, s)
        return out

    def _e_function_call(self, node: Tree, scope: Scope) -> Any:
        parts = _children(node)
        name = _name(parts[0])
        if any(isinstance(p, Token) and p.type == "COLONS" for p in parts):
            raise Unsupported("provider functions are not supported")
        args_node = next((p for p in parts if isinstance(p, Tree) and p.data == "arguments"), None)
        arg_nodes = _trees(args_node) if args_node is not None else []
        if args_node is not None and any(isinstance(c, Token) and c.type == "ELLIPSIS" for c in args_node.children):
            raise Unsupported("argument expansion (...) is not supported")
        if name in ("try", "can"):
            return self._try(name, arg_nodes, scope)
        fn = FUNCTIONS.get(name)
        if fn is None:
            raise Unsupported(f"function {name}() is not implemented by this evaluator")
        args = [self.eval(a, scope) for a in arg_nodes]
        if name in ("file", "templatefile"):
            args = [self, *args]
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as exc:
            raise TfError(f"{name}(): wrong number of arguments ({len(arg_nodes)})") from exc
        return fn(*args)

    def _try(self, name: str, arg_nodes: list[Tree], scope: Scope) -> Any:
        if name == "can":
            (arg,) = arg_nodes
            try:
                self.eval(arg, scope)
            except (ValidationFailed, InvalidConfig, Unsupported):
                raise
            except TfError:
                return False
            return True
        for arg in arg_nodes:
            try:
                return self.eval(arg, scope)
            except (ValidationFailed, InvalidConfig, Unsupported):
                raise
            except TfError:
                continue
        raise TfError("try(): no argument could be evaluated")


# A data source's stub: its attributes, or a function of its evaluated arguments that returns them.
DataStub = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class RootName:
    name: str


@dataclass(frozen=True)
class RootPath:
    parts: tuple[str, ...]


class SetValue(list):
    """A set of strings: unique, sorted (Terraform iterates sets of strings in lexical order)."""


_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def _parse_number(text: str) -> int | float | None:
    """cty.ParseNumberVal: Go's big.ParseFloat in base 10 (no spaces, digit separators, hex, NaN)."""
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    return int(text) if re.fullmatch(r"[+-]?\d+", text, re.ASCII) else float(text)


def _to_number(value: Any, what: str) -> int | float:
    if isinstance(value, Unknown):
        raise Unsupported(f"{what} with {value}, known only after apply: the result would be unknown")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    number = _parse_number(value) if isinstance(value, str) else None
    if number is None:
        raise TfError(f"{what} needs numbers, got {value!r}")
    return number


def _to_bool(value: Any, what: str) -> bool:
    if isinstance(value, Unknown):
        raise Unsupported(f"{what} with {value}, known only after apply: the result would be unknown")
    if isinstance(value, bool):
        return value
    if value in ("true", "false", "1", "0"):
        return value in ("true", "1")
    raise TfError(f"{what} needs bools, got {value!r} (not a bool)")


def _both_numbers(a: Any, b: Any) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "%": lambda a, b: _modulo(a, b),
}


def _object_key(key: Any) -> str:
    """hclsyntax converts an object key to a string (convert.Convert(key, cty.String)); null is an error."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool | int | float) and not isinstance(key, Unknown):
        return tf_str(key)
    raise TfError(f"object key {key!r} is not a string" + (" (null)" if key is None else ""))


def _modulo(a: Any, b: Any) -> Any:
    """cty's Value.Modulo: a - b * trunc(a / b), so the result has the sign of a (Python's % floors)."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return a - b * (q if (a < 0) == (b < 0) else -q)
    return math.fmod(a, b)


def _source_text(node: Any) -> str:
    if isinstance(node, Token):
        return str(node)
    return "".join(
        _source_text(c) for c in node.children if not (isinstance(c, Tree) and c.data == "new_line_or_comment")
    )


# --- types -----------------------------------------------------------------------------------


def convert(value: Any, type_: str, what: str) -> Any:
    """A variable value converted to its declared type, as Terraform would (or refused)."""
    type_ = type_.replace(" ", "")
    if type_ == "any":
        return value
    if type_ == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return tf_str(value)
        if isinstance(value, str):
            return value
    elif type_ == "number":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and (number := _parse_number(value)) is not None:
            return number
    elif type_ == "bool":
        if isinstance(value, bool):
            return value
        if value in ("true", "false", "1", "0"):  # cty/convert's string-to-bool accepts "1" and "0" too
            return value in ("true", "1")
    elif m := re.fullmatch(r"(list|set)\((.*)\)", type_):
        if isinstance(value, list):
            items = [convert(v, m.group(2), what) for v in value]
            return SetValue(sorted(set(items))) if m.group(1) == "set" else items
    elif m := re.fullmatch(r"map\((.*)\)", type_):
        if isinstance(value, dict):
            return {k: convert(v, m.group(1), what) for k, v in value.items()}
    else:
        raise Unsupported(f"{what}: type {type_} is not supported by this evaluator")
    raise ValidationFailed(f"{what}: {value!r} is not a {type_}")


# --- functions -----------------------------------------------------------------------------


def _file(module: Module, path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise TfError(f"file {path} does not exist")
    return p.read_text(encoding="utf-8")


def _templatefile(module: Module, path: str, variables: dict[str, Any]) -> str:
    if not isinstance(variables, dict):
        raise TfError("templatefile() takes an object of variables")
    if module._in_template:
        raise TfError("templatefile(): recursive calls to templatefile are not permitted (templatefile docs)")
    # A template sees only its own variables (Terraform: "vars map does not contain key").
    module._in_template = True
    try:
        return module.template(_file(module, path), TemplateScope(variables), keep_single=False)
    finally:
        module._in_template = False


def _merge(*maps: Any) -> Any:
    out: dict[str, Any] = {}
    for m in maps:
        if m is None:
            continue
        if not isinstance(m, dict):
            raise TfError("merge() takes objects or maps")
        out |= m
    return out


def _lookup(m: Any, key: str, *default: Any) -> Any:
    if not isinstance(m, dict):
        raise TfError("lookup() takes a map")
    if key in m:
        return m[key]
    if default:
        return default[0]
    raise TfError(f"lookup(): no key {key!r}")


def _one(items: Any) -> Any:
    if not isinstance(items, list):
        raise TfError("one() takes a list")
    if len(items) > 1:
        raise TfError(f"one(): {len(items)} elements")
    return items[0] if items else None


# RE2 (Terraform's regex engine: the regex docs' table) on Python's re. RE2's ^ and $ are the start and end
# of the text (Python's $ also matches before a final newline), \d \w \s \b are ASCII (\s without \v),
# [[:name:]] is a POSIX class (Python reads it as a set of letters). What RE2 refuses (lookaround,
# backreferences, possessive repetition, repeat counts over 1000) is a TfError, as in Terraform; what the two
# engines read differently or this translation does not model is Unsupported.
_RE2_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "blank": "\\t ",
    "digit": "0-9",
    "lower": "a-z",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_RE2_SPACE = "\\t\\n\\f\\r "


def _re2_escape(e: str, in_class: bool) -> str:
    if e == "s":
        return _RE2_SPACE if in_class else f"[{_RE2_SPACE}]"
    if e == "S" and not in_class:
        return f"[^{_RE2_SPACE}]"
    if e == "z" and not in_class:
        return "\\Z"
    if e in ("dDwWafnrtv" if in_class else "AbBdDwWafnrtv"):
        return "\\" + e
    if e.isascii() and not e.isalnum():
        return "\\" + e  # punctuation stands for itself in both
    raise Unsupported(f"regex(): the escape \\{e} is not modelled by this evaluator")


@functools.lru_cache(maxsize=256)
def re2_compile(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i, n, in_class, after_repeat = 0, len(pattern), False, False
    # Go's regexp/syntax also refuses nested counted repetitions whose product passes 1000 (repeatIsValid):
    # per open group, the largest product inside it; closed, the last group's, for a {n,m} that follows it.
    products, closed = [1], 0
    while i < n:
        c, repeat, after_repeat = pattern[i], after_repeat, False
        last_closed, closed = closed, 0
        if c == "\\":
            if i + 1 >= n:
                raise TfError("regex(): trailing backslash")
            if pattern[i + 1] == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", pattern[i + 2 : i + 4]):
                out.append(pattern[i : i + 4])
                i += 4
                continue
            out.append(_re2_escape(pattern[i + 1], in_class))
            i += 2
        elif in_class:
            if pattern.startswith("[:", i):
                m = re.match(r"\[:([a-z]+):\]", pattern[i:])
                if not m or m.group(1) not in _RE2_POSIX:
                    raise Unsupported(f"regex(): the class {pattern[i : i + 12]!r} is not modelled by this evaluator")
                out.append(_RE2_POSIX[m.group(1)])
                i += len(m.group(0))
                continue
            out.append("\\[" if c == "[" else c)  # a [ in a class is literal in RE2; Python warns of nested sets
            in_class = c != "]"
            i += 1
        elif c == "[":
            out.append("[")
            in_class, i = True, i + 1
            for lead in ("^", "]"):
                if pattern.startswith(lead, i):
                    out.append("^" if lead == "^" else "\\]")
                    i += 1
        elif c == "(" and pattern.startswith("(?", i):
            named = re.match(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>", pattern[i:])
            flags = re.match(r"\(\?([A-Za-z-]*)[:)]", pattern[i:])
            if named:
                out.append(named.group(0))
                products.append(1)
                i += len(named.group(0))
            elif flags and set(flags.group(1)) <= set("imsU-"):
                if set(flags.group(1)) & set("mU"):
                    raise Unsupported(f"regex(): the flags {flags.group(0)!r} are not modelled by this evaluator")
                out.append(flags.group(0))
                if flags.group(0).endswith(":"):
                    products.append(1)
                i += len(flags.group(0))
            elif pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
                raise Unsupported("regex(): (?<name>...) is RE2 syntax only in Go 1.22 and later; use (?P<name>...)")
            else:
                raise TfError(f"regex(): RE2 does not support {pattern[i : i + 4]!r} (lookaround, atomic, comment)")
        elif c in "*+?":
            if repeat and c == "?":
                out.append("?")  # lazy
            elif repeat:
                raise TfError(f"regex(): invalid nested repetition operator {pattern[i - 1 : i + 1]!r}")
            else:
                out.append(c)
                after_repeat = True
            i += 1
        elif c == "{" and (m := re.match(r"\{(\d*)(,?)(\d*)\}", pattern[i:])):
            if m.group(1) == "":
                raise Unsupported(f"regex(): {m.group(0)} is literal text to RE2 and a repetition to Python")
            low, high = int(m.group(1)), int(m.group(3)) if m.group(3) else (-1 if m.group(2) else int(m.group(1)))
            most = low if high < 0 else high
            if low > 1000 or high > 1000 or 0 <= high < low or (most * last_closed > 1000 and most >= 2):
                raise TfError(f"regex(): invalid repeat count {m.group(0)}")
            if repeat:
                raise TfError(f"regex(): invalid nested repetition operator {m.group(0)}")
            products[-1] = max(products[-1], most * max(last_closed, 1))
            out.append(m.group(0))
            after_repeat, i = True, i + len(m.group(0))
        elif c in "()":
            if c == "(":
                products.append(1)
            elif len(products) > 1:
                closed = products.pop()
                products[-1] = max(products[-1], closed)
            out.append(c)
            i += 1
        else:
            out.append({"$": "\\Z", "{": "\\{", "}": "\\}"}.get(c, c))
            i += 1
    if in_class:
        raise TfError(f"regex(): missing closing ] in {pattern!r}")
    try:
        compiled = re.compile("".join(out), re.ASCII)
    except re.error as exc:
        raise Unsupported(f"regex(): {pattern!r} does not compile here ({exc})") from exc
    if compiled.groupindex and len(compiled.groupindex) != compiled.groups:
        # regex docs: "It's not valid to mix both named and unnamed capture groups in the same pattern."
        raise TfError(f"regex(): {pattern!r} mixes named and unnamed capture groups")
    return compiled


def _regex(pattern: str, text: str) -> Any:
    compiled = re2_compile(pattern)
    if re.search(r"\(\?[A-Za-z-]*i", pattern) and not (pattern + text).isascii():
        raise Unsupported("regex(): case folding beyond ASCII (RE2 folds all of Unicode) is not modelled")
    m = compiled.search(text)
    if m is None:
        raise TfError(f"regex(): {pattern!r} does not match {text!r}")
    if compiled.groupindex:
        return m.groupdict()
    return list(m.groups()) if compiled.groups else m.group(0)


# The verbs Terraform's format() knows (format docs); this evaluator implements %s and %d without flags.
_FORMAT_VERBS = set("vtbdoxXeEfgGsq")


def _format(spec: str, *args: Any) -> str:
    """format(): %s, %d and %%; too many or too few arguments are errors, as in cty's formatFSM."""
    if not isinstance(spec, str):
        raise TfError("format() takes a string specification")
    out, used, i = [], 0, 0
    while i < len(spec):
        if spec[i] != "%":
            out.append(spec[i])
            i += 1
            continue
        if spec.startswith("%%", i):
            out.append("%")
            i += 2
            continue
        m = re.match(r"%([-+# 0]*(?:\[\d+\])?(?:\d+|\*)?(?:\.(?:\d*|\*))?)([A-Za-z])", spec[i:])
        if m is None:
            raise TfError(f"format(): invalid format string at offset {i}")
        options, verb = m.groups()
        if verb not in _FORMAT_VERBS:
            raise TfError(f"format(): unsupported format verb %{verb}")
        if options or verb not in "sd":
            raise Unsupported(f"format(): %{options}{verb} is not implemented by this evaluator (only %s and %d)")
        if used >= len(args):
            raise TfError(f"format(): not enough arguments for %{verb} at {i}")
        value = args[used]
        used += 1
        if value is None:
            raise TfError(f"format(): a null value cannot be formatted with %{verb}")
        if verb == "s":
            out.append(tf_str(value))
        elif isinstance(value, str):
            raise Unsupported("format(): %d of a string (Terraform converts it to a number) is not implemented")
        elif isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise TfError(f"format(): unsupported value for %d: {value!r} (an integer is required)")
        else:
            out.append(str(int(value)))
        i += len(m.group(0))
    if used < len(args):
        raise TfError(f"format(): too many arguments; only {used} used by format string")
    return "".join(out)


def _graphemes(text: str) -> list[str]:
    """Terraform counts a string's characters as Unicode grapheme clusters (cty's Strlen and Substr)."""
    return regex.findall(r"\X", text)


def _length(value: Any) -> int:
    if isinstance(value, str):
        return len(_graphemes(value))
    if isinstance(value, list | dict):
        return len(value)
    raise TfError("length() of a non-collection")


def _tostring(value: Any) -> str:
    if isinstance(value, list | dict):
        raise TfError("tostring() of a collection")
    return tf_str(value)


def _concat(*lists: Any) -> list[Any]:
    out: list[Any] = []
    for item in lists:
        if not isinstance(item, list):
            raise TfError("concat() takes lists")
        out += item
    return out


def _distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for i in items:
        if i not in out:
            out.append(i)
    return out


def _toset(items: list[Any]) -> SetValue:
    if not all(isinstance(i, str) for i in items):
        raise Unsupported("this evaluator only takes toset() of strings")
    return SetValue(sorted(set(items)))


def _string_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        if not all(isinstance(a, str) for a in args):
            raise TfError(f"{fn.__name__}() takes strings")
        return fn(*args)

    return wrapped


def _replace(text: str, substring: str, replacement: str) -> str:
    """Terraform's replace() with a literal substring; its /regex/ form is refused, not guessed."""
    if len(substring) >= 2 and substring.startswith("/") and substring.endswith("/"):
        raise Unsupported("replace() with a /regular expression/ is not implemented by this evaluator")
    return text.replace(substring, replacement)


def _alltrue(items: list[Any]) -> bool:
    if not all(isinstance(i, bool) for i in items):
        raise TfError("alltrue() takes bools")
    return all(items)


def _contains(items: list[Any], value: Any) -> bool:
    return any(value == i and (type(i) is type(value) or _both_numbers(i, value)) for i in items)


def _substr(s: str, offset: Any, length: Any) -> str:
    """cty's SubstrFunc, step by step: offsets and lengths count grapheme clusters and must be whole
    numbers; a negative offset counts from the end; a negative length is the rest of the string; a zero
    length is "" except after a negative offset, where cty's loop never stops and returns the rest."""
    if not isinstance(s, str):
        raise TfError("substr() takes a string and two numbers")
    for n in (offset, length):
        if isinstance(n, str):
            raise Unsupported("substr(): a numeric string (Terraform converts it) is not implemented")
        if isinstance(n, bool) or not isinstance(n, int | float) or int(n) != n:
            raise TfError(f"substr(): {n!r} is not a whole number")
    clusters, start, count = _graphemes(s), int(offset), int(length)
    if start < 0:
        start += len(clusters)
    elif count == 0:
        return ""
    rest = clusters[start:] if start > 0 else clusters
    return "".join(rest if count <= 0 else rest[:count])


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "jsonencode": go_json,
    "jsondecode": lambda s: json.loads(s),
    "file": _file,
    "templatefile": _templatefile,
    "merge": _merge,
    "lookup": _lookup,
    "one": _one,
    "regex": _string_fn(_regex),
    "format": _format,
    "length": _length,
    "tostring": _tostring,
    "concat": _concat,
    "distinct": _distinct,
    "toset": _toset,
    "trimprefix": _string_fn(lambda s, p: s[len(p) :] if s.startswith(p) else s),
    "trimsuffix": _string_fn(lambda s, p: s[: -len(p)] if p and s.endswith(p) else s),
    "replace": _string_fn(_replace),
    "alltrue": _alltrue,
    "contains": _contains,
    "substr": _substr,
    "sha1": _string_fn(lambda s: hashlib.sha1(s.encode()).hexdigest()),
    "base64encode": _string_fn(lambda s: base64.b64encode(s.encode()).decode()),
}
