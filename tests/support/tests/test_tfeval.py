"""tests/support/tfeval.py, the Terraform evaluator, on small modules written here.

tests/deploy/test_terraform.py trusts this evaluator to say what ``terraform plan`` would configure for
deploy/terraform/. These tests pin the evaluator itself, independent of that module: each feature it
implements computes what Terraform computes, and each thing Terraform refuses (or that the evaluator does
not implement) is a :class:`TfError`, never a silent guess. A regression here shows as a failing test
named after the feature, not as a diff between the module and the CloudFormation stack.

The reference is Terraform's documentation (developer.hashicorp.com/terraform/language, the same pages as
website/docs/language/ in hashicorp/terraform), and where it is silent, the code Terraform runs:
zclconf/go-cty's function library and conversions, hashicorp/hcl's expression evaluator, and
hashicorp/terraform's own functions and configuration checks. Each test names what it checked. The module
targets ``required_version >= 1.5.0``, so where Terraform changed behaviour since then, the 1.5 rule (the
stricter one) is the one asserted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.tfeval import Module, TfError, Unknown, ValidationFailed


def module(tmp_path: Path, text: str, inputs: dict[str, Any] | None = None, data: dict | None = None) -> Module:
    (tmp_path / "main.tf").write_text(text)
    return Module(tmp_path, inputs or {}, data or {})


def value(tmp_path: Path, expr: str, decl: str = "", inputs: dict[str, Any] | None = None) -> Any:
    """The value of one expression, as an output of a module holding ``decl``."""
    return module(tmp_path, f'{decl}\noutput "x" {{\n  value = {expr}\n}}\n', inputs).outputs()["x"]


def hcl(text: str) -> str:
    """``text`` as an HCL quoted string (whose escapes are only \\n \\r \\t \\" \\\\ \\uNNNN \\UNNNNNNNN, $${, %%{)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out).replace("${", "$${").replace("%{", "%%{") + '"'


def refused(tmp_path: Path, expr: str, match: str, decl: str = "", inputs: dict[str, Any] | None = None) -> None:
    with pytest.raises(TfError, match=match):
        value(tmp_path, expr, decl, inputs)


# --- declarations and parsing ------------------------------------------------------------------


def test_inputs_must_be_declared_and_required_variables_given(tmp_path: Path) -> None:
    # Terraform: "Value for undeclared variable" (-var) and "No value for required variable".
    decl = 'variable "a" {\n  type = string\n}\n'
    with pytest.raises(TfError, match="no variable declared"):
        module(tmp_path, decl, {"a": "x", "b": "y"})
    with pytest.raises(TfError, match=r"var\.a is required"):
        module(tmp_path, decl)
    refused(tmp_path, "var.nope", r"var\.nope is not declared", decl, {"a": "x"})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('variable "a" {}\nvariable "a" {}\n', "variable a declared twice"),
        ("locals {\n  a = 1\n}\nlocals {\n  a = 2\n}\n", r"local\.a declared twice"),
        ('resource "t" "r" {}\nresource "t" "r" {}\n', r"resource \('t', 'r'\) declared twice"),
        ('output "o" {\n  value = 1\n  value = 2\n}\n', "attribute value set twice"),
    ],
)
def test_duplicate_declarations_are_refused(tmp_path: Path, text: str, match: str) -> None:
    # Terraform: "Duplicate variable declaration", "Duplicate local value definition",
    # "Duplicate resource ... configuration", HCL "Attribute redefined" (hclsyntax/parser.go).
    with pytest.raises(TfError, match=match):
        module(tmp_path, text)


def test_locals_unknown_names_and_cycles(tmp_path: Path) -> None:
    assert value(tmp_path, "local.b", "locals {\n  a = 2\n  b = local.a * 3\n}\n") == 6
    refused(tmp_path, "local.c", r"local\.c is not declared", "locals {\n  a = 1\n}\n")
    refused(tmp_path, "nothing", "unknown name nothing")
    refused(tmp_path, "local.a", "cycle through local", "locals {\n  a = local.b\n  b = local.a\n}\n")


def test_json_syntax_files(tmp_path: Path) -> None:
    # Terraform's JSON syntax: strings are templates ("${...}" alone keeps the value's type), "//" is a
    # comment, a variable's default is a literal value.
    (tmp_path / "main.tf.json").write_text(
        json.dumps(
            {
                "//": "a comment",
                "variable": {"n": {"type": "number", "default": 2}},
                "locals": {"twice": "${var.n * 2}", "text": "n=${var.n}", "literal": "$${var.n}"},
                "output": {"o": {"value": ["${local.twice}", "${local.text}", "${local.literal}"]}},
            }
        )
    )
    assert Module(tmp_path, {}, {}).outputs()["o"] == [4, "n=2", "${var.n}"]
    (tmp_path / "main.tf.json").write_text(json.dumps({"terraform": {"required_version": ">= 1.5.0"}}))
    with pytest.raises(TfError, match="does not read JSON 'terraform' blocks"):
        Module(tmp_path, {}, {})


# --- variables ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "given", "expected"),
    [
        ("string", 5, "5"),
        ("string", 1.5, "1.5"),
        ("string", True, "true"),
        ("number", "42", 42),
        ("number", "-1.25", -1.25),
        ("bool", "false", False),
        ("list(string)", [1, "a"], ["1", "a"]),
        ("set(string)", ["b", "a", "b"], ["a", "b"]),
        ("map(number)", {"x": "1"}, {"x": 1}),
        ("any", {"k": [1]}, {"k": [1]}),
    ],
)
def test_variable_values_convert_to_the_declared_type(tmp_path: Path, type_: str, given: Any, expected: Any) -> None:
    # cty/convert: number and bool to string, numeric strings to number, "true"/"false" to bool, element-wise
    # for collections; a set of strings comes out unique and lexically sorted.
    m = module(tmp_path, f'variable "v" {{\n  type = {type_}\n}}\n', {"v": given})
    assert m.var("v") == expected


@pytest.mark.parametrize(
    ("type_", "given"),
    [("number", "ten"), ("number", True), ("bool", "yes"), ("bool", 1), ("string", [1]), ("list(string)", "a")],
)
def test_variable_values_that_do_not_convert_are_refused(tmp_path: Path, type_: str, given: Any) -> None:
    with pytest.raises(ValidationFailed, match="is not a"):
        module(tmp_path, f'variable "v" {{\n  type = {type_}\n}}\n', {"v": given})


def test_variable_types_the_evaluator_does_not_model_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TfError, match=r"type object\(\{a=string\}\) is not supported"):
        module(tmp_path, 'variable "v" {\n  type = object({ a = string })\n}\n', {"v": {"a": "x"}})


def test_variable_defaults_and_validation(tmp_path: Path) -> None:
    decl = (
        'variable "size" {\n  type    = number\n  default = 4\n'
        "  validation {\n    condition     = var.size >= 1 && var.size <= 8\n"
        '    error_message = "Size must be 1 to 8."\n  }\n}\n'
    )
    assert module(tmp_path, decl).var("size") == 4
    assert module(tmp_path, decl, {"size": "8"}).var("size") == 8
    with pytest.raises(ValidationFailed, match="Size must be 1 to 8"):
        module(tmp_path, decl, {"size": 9})
    with pytest.raises(ValidationFailed, match="Size must be 1 to 8"):  # the default is validated too
        module(tmp_path, decl.replace("default = 4", "default = 0"))


def test_validation_with_can_regex_accepts_and_refuses(tmp_path: Path) -> None:
    decl = (
        'variable "name" {\n  type = string\n  validation {\n'
        '    condition     = can(regex("^[a-z][a-z0-9-]{0,9}$", var.name))\n'
        '    error_message = "Bad name."\n  }\n}\n'
    )
    assert module(tmp_path, decl, {"name": "gpu-1"}).var("name") == "gpu-1"
    for bad in ("", "Gpu", "1gpu", "a" * 11, "a b"):
        with pytest.raises(ValidationFailed, match="Bad name"):
            module(tmp_path, decl, {"name": bad})


# --- expressions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),  # numbers are not integers: Terraform's / is exact division
        ("7 % 3", 1),
        ("-(2 - 5)", 3),
        ("2 < 3 && !(3 <= 2)", True),
        ('"a" == "a"', True),
        ('"1" == 1', False),  # equality never converts: a string is not a number
        ("1 == 1.0", True),
        ("[1, 2] == [1, 2]", True),
        ("{a = 1} != {a = 2}", True),
        ("true ? 1 : 2", 1),
        ("null == null", True),
    ],
)
def test_operators(tmp_path: Path, expr: str, expected: Any) -> None:
    assert value(tmp_path, expr) == expected


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ('"a" < "b"', "needs numbers"),  # comparison operators take numbers only
        ("1 + true", "needs numbers"),
        ("1 && true", "needs bools"),
        ('!"x"', "needs bools"),
        ("1 ? 2 : 3", "not a bool"),
        ("1 / 0", "division by zero"),
    ],
)
def test_operator_type_errors_are_refused(tmp_path: Path, expr: str, match: str) -> None:
    refused(tmp_path, expr, match)


def test_conditional_evaluates_only_the_chosen_branch_and_logic_evaluates_both(tmp_path: Path) -> None:
    # hcl hclsyntax ConditionalExpr.Value: the other branch's errors are dropped. && and || evaluate both
    # operands and report either's error: short-circuiting arrived with HCL v2.24 (commit 4192658, Dec 2024),
    # long after Terraform 1.5, the oldest release the module allows.
    decl = 'locals {\n  foo = { bar = "baz" }\n}\n'
    assert value(tmp_path, "true ? 1 : local.foo.boop", decl) == 1
    refused(tmp_path, "false && local.foo.boop", "no attribute 'boop'", decl)
    refused(tmp_path, "true || local.foo.boop", "no attribute 'boop'", decl)


def test_strings_escapes_and_templates(tmp_path: Path) -> None:
    # Terraform docs, "Strings and Templates": \n \t \" \\ \uNNNN \UNNNNNNNN escapes; $${ and %%{ are literal
    # ${ and %{; a template of a single interpolation keeps its value's type; numbers and bools interpolate
    # as their string forms.
    assert value(tmp_path, r'"a\tb\n\"q\" \\ \u00e9\U0001F600"') == 'a\tb\n"q" \\ é\U0001f600'
    assert value(tmp_path, '"$${var.x} %%{if}"') == "${var.x} %{if}"
    assert value(tmp_path, '"${1 + 1}"') == 2
    assert value(tmp_path, '"n=${1 + 1} ${true} ${1.5}"') == "n=2 true 1.5"
    refused(tmp_path, r'"\q"', r"invalid escape \\q")
    refused(tmp_path, '"x${null}"', "null value cannot be interpolated")
    refused(tmp_path, '"x${[1]}"', "cannot convert list to a string")


def test_template_directives_and_heredocs_are_not_implemented(tmp_path: Path) -> None:
    refused(tmp_path, '"%{ if true }yes%{ endif }"', "template directive")
    refused(tmp_path, "<<EOT\nhello\nEOT\n", "heredocs are not supported")


def test_collections_index_and_attribute_access(tmp_path: Path) -> None:
    decl = 'locals {\n  l = ["a", "b"]\n  m = { k = "v", "with space" = 1 }\n}\n'
    assert value(tmp_path, '[local.l[1], local.l[1.0], local.m.k, local.m["with space"]]', decl) == ["b", "b", "v", 1]
    refused(tmp_path, "local.l[2]", "index 2 out of range", decl)
    refused(tmp_path, "local.l[-1]", "out of range", decl)
    refused(tmp_path, "local.l[0.5]", "list index", decl)
    refused(tmp_path, "local.m.nope", "no attribute 'nope'", decl)
    refused(tmp_path, 'local.m["nope"]', "no element 'nope'", decl)
    refused(tmp_path, "local.l.x", r"cannot read \.x of list", decl)


def test_object_keys(tmp_path: Path) -> None:
    # A bare name is the key itself; parentheses make the key an expression.
    decl = 'locals {\n  k = "dyn"\n}\n'
    assert value(tmp_path, '{ k = 1, (local.k) = 2, "q" = 3 }', decl) == {"k": 1, "dyn": 2, "q": 3}


def test_splat(tmp_path: Path) -> None:
    # Terraform docs, "Splat Expressions": [*] over a list maps; over a non-list value it makes a one-element
    # list; over null an empty list.
    decl = "locals {\n  l = [{ n = 1 }, { n = 2 }]\n  one = { n = 3 }\n  none = null\n}\n"
    assert value(tmp_path, "[local.l[*].n, local.one[*].n, local.none[*]]", decl) == [[1, 2], [3], []]


def test_for_expressions(tmp_path: Path) -> None:
    # Terraform docs, "for Expressions": maps iterate in lexical key order, sets of strings in lexical value
    # order; two symbols give key/index and value; "if" filters.
    decl = 'locals {\n  m = { b = 2, a = 1, c = 3 }\n  l = ["x", "y"]\n}\n'
    assert value(tmp_path, "[for k, v in local.m : k if v > 1]", decl) == ["b", "c"]
    assert value(tmp_path, "[for v in local.m : v]", decl) == [1, 2, 3]
    assert value(tmp_path, '[for i, v in local.l : "${i}=${v}"]', decl) == ["0=x", "1=y"]
    assert value(tmp_path, '[for s in toset(["b", "a", "b"]) : s]', decl) == ["a", "b"]
    assert value(tmp_path, '{for k, v in local.m : "${k}!" => v if k != "c"}', decl) == {"a!": 1, "b!": 2}
    refused(tmp_path, "[for v in 5 : v]", "for over int", decl)
    refused(tmp_path, '{for v in local.l : "same" => v}', "duplicate key 'same'", decl)  # "Duplicate object key"
    refused(tmp_path, '{for v in local.l : "same" => v...}', "grouping", decl)
    refused(tmp_path, "[for v in local.l : v if 1]", "not a bool", decl)


# --- functions ----------------------------------------------------------------------------------

FOO = 'locals {\n  foo = { bar = "baz" }\n}\n'


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # substr (docs examples): offsets count characters; a negative offset counts from the end; length -1
        # is the rest; a length past the end stops at the end.
        ('substr("hello world", 1, 4)', "ello"),
        ('substr("hello world", -5, -1)', "world"),
        ('substr("hello world", 6, 10)', "world"),
        ('substr("\U0001f914\U0001f937", 0, 1)', "\U0001f914"),
        ('substr("abc", 5, 1)', ""),
        ('substr("abc", -10, 2)', "ab"),
        # lookup (docs examples): the default when the key is absent.
        ('lookup({a = "ay", b = "bee"}, "a", "what?")', "ay"),
        ('lookup({a = "ay", b = "bee"}, "c", "what?")', "what?"),
        ('lookup({a = "ay"}, "a")', "ay"),
        # one (docs examples): null for an empty list, the element of a one-element list or set.
        ("one([])", None),
        ('one(["hello"])', "hello"),
        ('one(toset(["hello"]))', "hello"),
        # merge (docs examples): later arguments win; null arguments are skipped (cty MergeFunc).
        ('merge({a = "b", c = "d"}, {e = "f", c = "z"})', {"a": "b", "c": "z", "e": "f"}),
        ('merge({a = "b"}, {a = [1, 2], c = "z"}, {d = 3})', {"a": [1, 2], "c": "z", "d": 3}),
        ("merge({a = 1}, null)", {"a": 1}),
        # jsonencode (docs): minified; <, >, &, U+2028, U+2029 become \u003c \u003e \u0026 \u2028 \u2029;
        # object keys in lexical order (cty objects have no declaration order).
        ('jsonencode({"hello" = "world"})', '{"hello":"world"}'),
        (r'jsonencode("<a href=\"x\">&</a>")', r'"\u003ca href=\"x\"\u003e\u0026\u003c/a\u003e"'),
        (r'jsonencode("\u2028\u2029é")', r'"\u2028\u2029é"'),
        ('jsonencode({b = 1, a = [true, null, 1.5, "x"]})', '{"a":[true,null,1.5,"x"],"b":1}'),
        ('jsondecode("{\\"a\\": [1, \\"x\\"]}")', {"a": [1, "x"]}),
        # format (docs examples) with %s and %d; %% is a literal percent sign.
        ('format("Hello, %s!", "Ander")', "Hello, Ander!"),
        ('format("There are %d lights", 4)', "There are 4 lights"),
        ('format("100%% %s", true)', "100% true"),
        # regex (docs examples): whole match, a list for unnamed groups, an object for named groups.
        ('regex("[a-z]+", "53453453.345345aaabbbccc23454")', "aaabbbccc"),
        ('regex("(\\\\d\\\\d\\\\d\\\\d)-(\\\\d\\\\d)-(\\\\d\\\\d)", "2019-02-01")', ["2019", "02", "01"]),
        (
            'regex("^(?:(?P<scheme>[^:/?#]+):)?(?://(?P<authority>[^/?#]*))?", "https://terraform.io/docs/")',
            {"scheme": "https", "authority": "terraform.io"},
        ),
        # replace with a plain substring: every occurrence.
        ('replace("1 + 2 + 3", "+", "-")', "1 - 2 - 3"),
        ('replace("a/b", "/", "")', "ab"),  # a lone "/" is not the /regex/ form
        ('trimprefix("helloworld", "hello")', "world"),
        ('trimprefix("helloworld", "cat")', "helloworld"),
        ('trimsuffix("helloworld", "world")', "hello"),
        ('trimsuffix("hello", "")', "hello"),
        ('length("hello")', 5),
        ("length([1, 2])", 2),
        ("length({a = 1})", 1),
        ("tostring(1.5)", "1.5"),
        ("tostring(true)", "true"),
        ('concat(["a"], [], ["b", "c"])', ["a", "b", "c"]),
        ('distinct(["a", "b", "a", "c", "b"])', ["a", "b", "c"]),  # first occurrences, in order
        ('toset(["c", "a", "c"])', ["a", "c"]),
        ("alltrue([])", True),
        ("alltrue([true, false])", False),
        ('contains(["a", "b"], "b")', True),
        ('contains(["1"], 1)', False),
        ('sha1("hello")', "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"),
        ('base64encode("Hello World")', "SGVsbG8gV29ybGQ="),
        # try (docs examples): the first argument that evaluates without a dynamic error.
        ('try(local.foo.bar, "fallback")', "baz"),
        ('try(local.foo.boop, "fallback")', "fallback"),
        ('can(regex("^a", "abc"))', True),
        ('can(regex("^b", "abc"))', False),
    ],
)
def test_functions(tmp_path: Path, expr: str, expected: Any) -> None:
    assert value(tmp_path, expr, FOO) == expected


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        ('one(["hello", "goodbye"])', r"one\(\): 2 elements"),  # docs: an error for two or more elements
        ('lookup({a = 1}, "b")', "no key 'b'"),  # no default: an error (lookup failed to find key)
        ('merge({a = 1}, ["b"])', "maps"),
        ('regex("[a-z]+", "53453453.34534523454")', "does not match"),  # docs: an error when nothing matches
        ('replace("a1", "/[0-9]/", "")', "regular expression"),  # the /regex/ form: not implemented here
        ('cidrsubnet("10.0.0.0/16", 8, 1)', r"function cidrsubnet\(\) is not implemented"),
        ('provider::aws::arn_parse("x")', "provider functions"),
        ("tostring([1])", "collection"),
        ("length(5)", "non-collection"),
        ('concat(["a"], "b")', "lists"),
        ("toset([1, 2])", "toset"),
        ("alltrue([1])", "bools"),
        ("try(local.foo.boop, local.foo.beep)", "no argument could be evaluated"),
        ("substr(1, 0, 1)", "takes a string"),
        ("sha1(1)", "takes strings"),
        ('format("%x", 255)', r"%x"),
    ],
)
def test_function_errors_are_refused(tmp_path: Path, expr: str, match: str) -> None:
    refused(tmp_path, expr, match, FOO)


def test_file_and_templatefile(tmp_path: Path) -> None:
    # templatefile docs: the template sees only the given variables and may call functions; the
    # "Generating JSON" example renders with jsonencode and a for expression. file() reads literally.
    (tmp_path / "t.tftpl").write_text('${jsonencode({"backends": [for addr in ip_addrs : "${addr}:${port}"]})}')
    (tmp_path / "plain.txt").write_text("${not interpolated}\n")
    decl = 'locals {\n  secret = "s"\n}\n'
    call = 'templatefile("${path.module}/t.tftpl", { port = 8080, ip_addrs = ["10.0.0.1", "10.0.0.2"] })'
    assert value(tmp_path, call, decl) == '{"backends":["10.0.0.1:8080","10.0.0.2:8080"]}'
    assert value(tmp_path, 'file("${path.module}/plain.txt")', decl) == "${not interpolated}\n"
    (tmp_path / "t.tftpl").write_text("${local.secret}")
    refused(tmp_path, 'templatefile("${path.module}/t.tftpl", {})', "vars map does not contain key 'local'", decl)
    (tmp_path / "t.tftpl").write_text("%{ for a in ip_addrs }${a}%{ endfor }")
    refused(tmp_path, call, r"template directives \(%\{...\}\) are not supported", decl)
    refused(tmp_path, 'file("${path.module}/absent.txt")', "does not exist", decl)
    refused(tmp_path, 'templatefile("${path.module}/plain.txt", ["x"])', "object of variables", decl)


# --- resources, data sources, modules ----------------------------------------------------------


def test_resources_count_for_each_and_unknown_attributes(tmp_path: Path) -> None:
    m = module(
        tmp_path,
        'variable "n" {\n  type = number\n}\n'
        'resource "aws_sqs_queue" "q" {\n  count = var.n\n  name  = "q-${count.index}"\n}\n'
        'resource "aws_s3_bucket" "b" {\n  for_each = { x = "one", y = "two" }\n'
        '  bucket = "${each.key}-${each.value}"\n}\n'
        'resource "aws_sns_topic" "t" {\n  for_each = toset(["b", "a"])\n  name = each.value\n}\n'
        'resource "aws_iam_role" "r" {\n  name = aws_sqs_queue.q[1].name\n'
        '  policy = "${aws_s3_bucket.b["x"].arn}/*"\n}\n'
        'output "names" {\n  value = aws_sqs_queue.q[*].name\n}\n'
        'output "arns" {\n  value = [for k, b in aws_s3_bucket.b : b.arn]\n}\n'
        'output "topic" {\n  value = aws_sns_topic.t["a"].name\n}\n',
        {"n": 2},
    )
    plan = m.plan()
    assert sorted(plan) == [
        "aws_iam_role.r",
        'aws_s3_bucket.b["x"]',
        'aws_s3_bucket.b["y"]',
        'aws_sns_topic.t["a"]',
        'aws_sns_topic.t["b"]',
        "aws_sqs_queue.q[0]",
        "aws_sqs_queue.q[1]",
    ]
    assert plan['aws_s3_bucket.b["y"]'] == {"bucket": "y-two"}
    # A configured attribute is its value; anything else is known only after apply.
    assert plan["aws_iam_role.r"] == {"name": "q-1", "policy": '<aws_s3_bucket.b["x"].arn>/*'}
    outputs = m.outputs()
    assert outputs["names"] == ["q-0", "q-1"]
    assert outputs["arns"] == [Unknown('aws_s3_bucket.b["x"].arn'), Unknown('aws_s3_bucket.b["y"].arn')]
    assert outputs["topic"] == "a"
    assert module(tmp_path, (tmp_path / "main.tf").read_text(), {"n": 0}).outputs()["names"] == []


@pytest.mark.parametrize(
    ("resource", "match"),
    [
        ("count = 1\n  for_each = toset([])", "count and for_each"),  # "Invalid combination of count and for_each"
        ("count = -1", "count must be a whole number"),
        ("count = 1.5", "count must be a whole number"),
        ("count = true", "count must be a whole number"),
        ('for_each = ["a"]', "for_each takes a map or a set of strings"),  # a list (tuple) is refused
        ("name = count.index", r"count\.index outside a resource with count"),
        ("name = each.key", r"each\.key outside a resource with each"),
        ("name = aws_nope.x.id", r"unknown name aws_nope"),
        ("name = self.id", r"self\.id is not supported"),
    ],
)
def test_resource_meta_arguments_terraform_refuses(tmp_path: Path, resource: str, match: str) -> None:
    with pytest.raises(TfError, match=match):
        module(tmp_path, f'resource "aws_sqs_queue" "q" {{\n  {resource}\n}}\n').plan()


def test_resource_references_that_do_not_exist_are_refused(tmp_path: Path) -> None:
    decl = 'resource "aws_sqs_queue" "q" {\n  count = 1\n}\nresource "aws_sns_topic" "t" {}\n'
    refused(tmp_path, "aws_sqs_queue.nope.arn", r"aws_sqs_queue\.nope is not declared", decl)
    refused(tmp_path, "aws_sqs_queue.q.arn", r"cannot read \.arn of list", decl)  # "Missing resource instance key"
    refused(tmp_path, "aws_sqs_queue.q[1].arn", "out of range", decl)
    refused(tmp_path, "aws_sns_topic.t[0].arn", "cannot index", decl)  # not a counted resource


def test_nested_and_dynamic_blocks(tmp_path: Path) -> None:
    # Terraform docs, "dynamic Blocks": the iterator (the label, or "iterator") has key (list index or map
    # key) and value; map elements come in key order; lifecycle and other meta blocks are not configuration.
    m = module(
        tmp_path,
        'resource "aws_security_group" "g" {\n'
        '  name = "g"\n'
        "  lifecycle {\n    create_before_destroy = true\n  }\n"
        "  ingress {\n    from_port = 1\n  }\n"
        '  dynamic "ingress" {\n    for_each = [10, 20]\n'
        '    content {\n      from_port = ingress.value\n      note = "i${ingress.key}"\n    }\n  }\n'
        '  dynamic "egress" {\n    for_each = { b = 2, a = 1 }\n    iterator = rule\n'
        "    content {\n      to_port = rule.value\n      note = rule.key\n    }\n  }\n"
        "}\n",
    )
    assert m.plan()["aws_security_group.g"] == {
        "name": "g",
        "ingress": [{"from_port": 1}, {"from_port": 10, "note": "i0"}, {"from_port": 20, "note": "i1"}],
        "egress": [{"to_port": 1, "note": "a"}, {"to_port": 2, "note": "b"}],
    }


def test_data_sources(tmp_path: Path) -> None:
    decl = 'data "aws_caller_identity" "me" {}\ndata "aws_region" "r" {\n  name = "x"\n}\n'
    stubs = {"aws_caller_identity": {"account_id": "123456789012"}, "aws_region": lambda args: {"id": args["name"]}}
    m = module(
        tmp_path,
        decl + 'output "x" {\n  value = [data.aws_caller_identity.me.account_id, data.aws_region.r.id]\n}\n',
        data=stubs,
    )
    assert m.outputs()["x"] == ["123456789012", "x"]
    with pytest.raises(TfError, match=r"data\.aws_region\.nope is not declared"):
        module(tmp_path, decl + 'output "x" {\n  value = data.aws_region.nope.id\n}\n', data=stubs).outputs()
    with pytest.raises(TfError, match="no stub for data source aws_region"):
        module(tmp_path, decl + 'output "x" {\n  value = data.aws_region.r.id\n}\n', data={}).outputs()


def test_module_calls(tmp_path: Path) -> None:
    child = tmp_path / "child"
    child.mkdir()
    (child / "main.tf").write_text(
        'variable "prefix" {\n  type = string\n}\n'
        'resource "aws_sqs_queue" "q" {\n  name = "${var.prefix}-q"\n}\n'
        'output "queue" {\n  value = aws_sqs_queue.q.name\n}\n'
        'output "arn" {\n  value = aws_sqs_queue.q.arn\n}\n'
    )
    root = tmp_path / "root"
    root.mkdir()
    (root / "main.tf").write_text(
        'module "c" {\n  source = "../child"\n  prefix = "p"\n}\n'
        'output "q" {\n  value = [module.c.queue, module.c.arn]\n}\n'
    )
    m = Module(root, {}, {})
    assert m.plan() == {"module.c.aws_sqs_queue.q": {"name": "p-q"}}
    # An unknown inside a module is named by its address inside the module.
    assert m.outputs()["q"] == ["p-q", Unknown("aws_sqs_queue.q.arn")]
    (root / "main.tf").write_text('module "c" {\n  source = "../child"\n  prefix = "p"\n  colour = "x"\n}\n')
    with pytest.raises(TfError, match="no variable declared"):
        Module(root, {}, {}).plan()
    (root / "main.tf").write_text('module "c" {\n  source = "hashicorp/x/aws"\n}\n')
    with pytest.raises(TfError, match="only local sources"):
        Module(root, {}, {}).plan()
    (root / "main.tf").write_text('module "c" {\n  source = "../child"\n}\n')
    with pytest.raises(TfError, match=r"var\.prefix is required"):
        Module(root, {}, {}).plan()


# --- references are checked before evaluation; try() and can() catch only dynamic errors ----------


@pytest.mark.parametrize(
    "expr",
    [
        'try(local.nonexist, "fallback")',  # the try docs' own example: "Reference to undeclared local value"
        "can(var.nope)",
        "can(aws_sqs_queue.nope.arn)",
        "can(data.aws_region.nope.id)",
        "can(module.nope.x)",
        "true ? 1 : local.nonexist",  # an unused branch is still checked
        "[for x in [] : local.nonexist]",  # so is a loop that never runs
    ],
)
def test_references_to_undeclared_objects_are_errors_that_try_and_can_do_not_catch(tmp_path: Path, expr: str) -> None:
    # try docs: "will not catch errors relating to ... a reference to a top-level object that has not been
    # declared"; Terraform resolves references when it loads the configuration, before evaluating anything.
    decl = 'resource "aws_sqs_queue" "q" {}\ndata "aws_region" "r" {}\n'
    with pytest.raises(TfError, match="not declared"):
        value(tmp_path, expr, decl)


def test_things_the_evaluator_does_not_implement_are_not_caught_by_try_or_can(tmp_path: Path) -> None:
    # Otherwise can(cidrsubnet(...)) would read as false and try() would quietly take its fallback.
    refused(tmp_path, 'can(cidrsubnet("10.0.0.0/16", 8, 1))', r"cidrsubnet\(\) is not implemented")
    refused(tmp_path, 'try(cidrsubnet("10.0.0.0/16", 8, 1), "x")', r"cidrsubnet\(\) is not implemented")
    refused(tmp_path, 'can(replace("a1", "/[0-9]/", ""))', "regular expression")
    refused(tmp_path, 'can("%{ if true }x%{ endif }")', "template directive")
    assert value(tmp_path, 'can(regex("^b", "abc"))') is False  # a function's own error is still caught


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ('resource "aws_sqs_queue" "q" {\n  name = count.index\n}\n', r"count\.index outside a resource with count"),
        ('resource "aws_sqs_queue" "q" {\n  count = 1\n  name = each.key\n}\n', r"each\.key outside"),
        ('resource "aws_sqs_queue" "q" {\n  count = 1\n  name = count.nope\n}\n', r"count\.nope does not exist"),
        ('resource "aws_sqs_queue" "q" {\n  count = count.index\n}\n', r"count\.index outside"),
        ('resource "aws_sqs_queue" "q" {\n  name = aws_sns_topic.t.arn\n}\n', "unknown name aws_sns_topic"),
        ("locals {\n  a = { (local.k) = 1 }\n}\n", r"local\.k is not declared"),
        ('locals {\n  x = 1\n}\nvariable "v" {\n  default = local.x\n}\n', "a default must be a literal value"),
        ('variable "v" {\n  default = upper("x")\n}\n', "a default must be a literal value"),
        (
            'resource "aws_security_group" "g" {\n  dynamic "ingress" {\n    for_each = [1]\n'
            "    content {\n      from_port = egress.value\n    }\n  }\n}\n",
            "unknown name egress",
        ),
    ],
)
def test_references_are_checked_in_every_declaration_even_unevaluated(tmp_path: Path, where: str, match: str) -> None:
    with pytest.raises(TfError, match=match):
        module(tmp_path, where)


def test_validation_conditions_refer_to_their_own_variable_only(tmp_path: Path) -> None:
    # Terraform before 1.9 (internal/configs/named_values.go): "Invalid reference in variable validation: The
    # condition for variable "x" can only refer to the variable itself, using var.x", and "Invalid variable
    # validation condition: ... must refer to var.x in order to test incoming values". The module allows 1.5.
    def decl(condition: str) -> str:
        return (
            'variable "min" {\n  type = number\n  default = 1\n}\n'
            "locals {\n  max = 9\n}\n"
            f'variable "n" {{\n  type = number\n  default = 5\n  validation {{\n    condition = {condition}\n'
            '    error_message = "Out of range."\n  }\n}\n'
        )

    assert module(tmp_path, decl("alltrue([for x in [var.n] : x > 0])")).var("n") == 5
    with pytest.raises(TfError, match="can only refer to the variable itself"):
        module(tmp_path, decl("var.n >= var.min"))
    with pytest.raises(TfError, match="can only refer to the variable itself"):
        module(tmp_path, decl("var.n <= local.max"))
    with pytest.raises(TfError, match=r"must refer to var\.n"):
        module(tmp_path, decl("true"))


# --- regex() speaks RE2 -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        # regex docs, zero-width operators: "$  At the end of the given string" (RE2 without the m flag):
        # unlike Python's $, not before a final newline. So can(regex("^[a-z]+$", "abc\n")) is false.
        ("^[a-z]+$", "abc", "abc"),
        ("^[a-z]+$", "abc\n", None),
        ("^[a-z]+\\z", "abc\n", None),
        ("^a", "b\na", None),  # ^ is the start of the text, not of a line
        # \d \s \w are ASCII; \s is space, tab, newline, carriage return, form feed (no vertical tab).
        ("^\\d+$", "\u0661\u0662", None),  # ARABIC-INDIC digits are \d to Python's str patterns
        ("^\\w+$", "é", None),
        ("^\\s$", "\v", None),
        ("^\\s$", "\f", "\f"),
        ("^[\\s]$", "\v", None),
        # POSIX classes from the docs' table.
        ("^[[:alpha:]]+$", "abcXYZ", "abcXYZ"),
        ("^[[:alpha:]]+$", "al:", None),  # Python alone would read [[:alpha:] as a set holding ':'
        ("^[[:xdigit:][:space:]]+$", "0f F\t", "0f F\t"),
        ("^[[:space:]]$", "\v", "\v"),  # [[:space:]] does include \v
        # Repetition, lazy forms, literal braces.
        ("a{2,3}?", "aaaa", "aa"),
        ("^(?:a{100}){10}$", "a" * 1000, "a" * 1000),  # a product of exactly 1000 is allowed
        ("^x{1}$", "x", "x"),
        ("a{", "a{", "a{"),
        ("(?i)^abc$", "ABC", "ABC"),
        ("(?s)a.b", "a\nb", "a\nb"),
        ("a.b", "a\nb", None),
    ],
)
def test_regex_follows_re2(tmp_path: Path, pattern: str, text: str, expected: str | None) -> None:
    call = f"regex({hcl(pattern)}, {hcl(text)})"
    if expected is None:
        assert value(tmp_path, f"can({call})") is False
    else:
        assert value(tmp_path, call) == expected


@pytest.mark.parametrize(
    ("pattern", "match"),
    [
        # "It's not valid to mix both named and unnamed capture groups in the same pattern." (regex docs)
        ("(?P<a>x)(y)", "mixes named and unnamed"),
        # RE2 has no lookaround, atomic groups or backreferences ("it does not support backreferences").
        ("a(?=b)", "RE2 does not support"),
        ("a(?!b)", "RE2 does not support"),
        ("(?<=a)b", "RE2 does not support"),
        ("(?>a)", "RE2 does not support"),
        ("a++", "invalid nested repetition"),
        ("a{2}+", "invalid nested repetition"),
        # Go's regexp/syntax: counts over 1000, min over max, and nested counts whose product passes 1000.
        ("a{1001}", "invalid repeat count"),
        ("^[a-z]{1,2048}$", "invalid repeat count"),
        ("a{3,2}", "invalid repeat count"),
        ("(a{100}){11}", "invalid repeat count"),
        ("((ab){10}c){101}", "invalid repeat count"),
        ("(a)*{2}", "invalid nested repetition"),
        ("[a", "missing closing"),
    ],
)
def test_regex_refuses_what_re2_refuses(tmp_path: Path, pattern: str, match: str) -> None:
    refused(tmp_path, f'regex({hcl(pattern)}, "ab")', match)
    assert value(tmp_path, f'can(regex({hcl(pattern)}, "ab"))') is False  # an error in Terraform too


@pytest.mark.parametrize(
    "pattern",
    ["(?i)é", "(a)\\1", "\\pL", "\\Qa.b\\E", "(?m)^a$", "(?U)a+", "(?<n>a)", "a{,2}", "[[:punct:]]", "\\x{41}", "\\Z"],
)
def test_regex_constructs_not_modelled_are_unsupported_even_in_can(tmp_path: Path, pattern: str) -> None:
    # Valid RE2 (or refused by RE2 for reasons this evaluator does not reproduce): never a quiet false.
    refused(tmp_path, f'can(regex({hcl(pattern)}, "a"))', "regex")


# --- functions and operators at the edges Terraform defines ----------------------------------------


@pytest.mark.parametrize(
    ("expr", "match"),
    [
        # cty's formatFSM (function/stdlib/format_fsm.rl, since cty 1.0): unused arguments are an error,
        # "too many arguments; only N used by format string"; missing ones too; %d needs an integer
        # (formatAppendInteger: "an integer is required"); null only formats with %v.
        ('format("%s", "a", "b")', "too many arguments; only 1 used"),
        ('format("x", "a")', "too many arguments; only 0 used"),
        ('format("%s %s", "a")', "not enough arguments"),
        ('format("%d", 1.5)', "an integer is required"),
        ('format("%d", true)', "an integer is required"),
        ('format("%s", null)', "null value cannot be formatted"),
        ('format("%y", 1)', "unsupported format verb"),
        ('format("50%", 1)', "invalid format string"),
        # Flags, width, precision and other verbs are Terraform's, not this evaluator's: never copied through.
        ('format("%5s", "x")', r"%5s is not implemented"),
        ('format("%-3d|", 7)', r"%-3d is not implemented"),
        ('format("%[1]s", "x")', r"%\[1\]s is not implemented"),
        ('format("%v", 1)', r"%v is not implemented"),
        ('format("%d", "5")', "not implemented"),
    ],
)
def test_format_refuses_what_terraform_refuses_and_what_it_does_not_implement(
    tmp_path: Path, expr: str, match: str
) -> None:
    refused(tmp_path, expr, match)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # cty Value.Modulo: a - b * trunc(a / b), the sign of the dividend (Python's % floors instead).
        ("-7 % 3", -1),
        ("7 % -3", 1),
        ("-7 % -3", -1),
        ("7.5 % 2", 1.5),
        ("-7.5 % 2", -1.5),
    ],
)
def test_modulo_truncates_like_cty(tmp_path: Path, expr: str, expected: float) -> None:
    assert value(tmp_path, expr) == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # length and substr count grapheme clusters (cty Strlen: "Unicode characters (technically: grapheme
        # clusters)"): a letter with a combining accent, a flag, a thumbs-up with a skin tone are one each.
        ('length("e\\u0301")', 1),
        ('length("\\U0001F1EB\\U0001F1F7!")', 2),
        ('length("\\U0001F44D\\U0001F3FD")', 1),
        ('substr("e\\u0301xy", 1, 1)', "x"),
        ('substr("ab\\U0001F44D\\U0001F3FD", -1, -1)', "\U0001f44d\U0001f3fd"),
        # cty SubstrFunc: a zero length is "" ... except after a negative offset, where its loop runs on
        # and returns the rest of the string; any negative length is the rest.
        ('substr("hello", 1, 0)', ""),
        ('substr("hello", -3, 0)', "llo"),
        ('substr("hello", 1, -2)', "ello"),
        ('substr("hello", 5, 1)', ""),
    ],
)
def test_length_and_substr_count_grapheme_clusters(tmp_path: Path, expr: str, expected: Any) -> None:
    assert value(tmp_path, expr) == expected


def test_substr_offsets_must_be_whole_numbers(tmp_path: Path) -> None:
    # gocty.FromCtyValue into an int: a fractional number is an error, not truncated.
    refused(tmp_path, 'substr("hello", 1.5, 1)', "not a whole number")
    refused(tmp_path, 'substr("hello", 0, 0.5)', "not a whole number")


def test_sets_cannot_be_indexed(tmp_path: Path) -> None:
    # one() docs: "Set values don't support indexing, so it's not valid to write var.set[0]".
    decl = 'variable "s" {\n  type    = set(string)\n  default = ["a"]\n}\n'
    refused(tmp_path, "var.s[0]", "cannot be accessed by index", decl)
    refused(tmp_path, 'toset(["a"])[0]', "cannot be accessed by index", decl)
    assert value(tmp_path, "one(var.s)", decl) == "a"


def test_dynamic_blocks_over_a_set_use_the_value_as_key(tmp_path: Path) -> None:
    # dynamic blocks docs: "If the for_each expression produces a set value then key is identical to value".
    m = module(
        tmp_path,
        'resource "aws_security_group" "g" {\n  dynamic "ingress" {\n    for_each = toset(["b", "a"])\n'
        "    content {\n      k = ingress.key\n      v = ingress.value\n    }\n  }\n}\n",
    )
    assert m.plan()["aws_security_group.g"] == {"ingress": [{"k": "a", "v": "a"}, {"k": "b", "v": "b"}]}


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ('dynamic "ingress" {\n    for_each = 5\n    content {}\n  }', "for_each over int"),
        ('dynamic "lifecycle" {\n    for_each = [1]\n    content {}\n  }', "cannot generate lifecycle"),
        (
            'dynamic "ingress" {\n    for_each = [1]\n    labels = ["x"]\n    content {}\n  }',
            "labels are not implemented",
        ),
    ],
)
def test_dynamic_blocks_refused(tmp_path: Path, block: str, match: str) -> None:
    # "It is not possible to generate meta-argument blocks such as lifecycle and provisioner" (dynamic docs).
    with pytest.raises(TfError, match=match):
        module(tmp_path, f'resource "aws_security_group" "g" {{\n  {block}\n}}\n').plan()


def test_templatefile_cannot_call_itself(tmp_path: Path) -> None:
    # templatefile docs: "recursive calls to templatefile are not permitted".
    (tmp_path / "a.tftpl").write_text('${templatefile("${dir}/b.tftpl", {})}')
    (tmp_path / "b.tftpl").write_text("b")
    refused(tmp_path, f'templatefile("{tmp_path}/a.tftpl", {{ dir = "{tmp_path}" }})', "recursive calls")


@pytest.mark.parametrize("given", ["1_000", " 1", "1 ", "nan", "inf", "0x10", "\u0661", "1e", ""])
def test_number_variables_parse_strings_as_cty_does(tmp_path: Path, given: str) -> None:
    # cty.ParseNumberVal: Go's big.ParseFloat in base 10: no spaces, digit separators, hex, NaN; ASCII digits.
    with pytest.raises(ValidationFailed, match="is not a number"):
        module(tmp_path, 'variable "v" {\n  type = number\n}\n', {"v": given})


@pytest.mark.parametrize(("given", "expected"), [("+1", 1), ("1e3", 1000), (".5", 0.5), ("-0", 0)])
def test_number_variables_accept_what_cty_parses(tmp_path: Path, given: str, expected: float) -> None:
    assert module(tmp_path, 'variable "v" {\n  type = number\n}\n', {"v": given}).var("v") == expected


def test_bool_variables_take_1_and_0_as_strings(tmp_path: Path) -> None:
    # cty/convert conversion_primitive.go: "true" and "1" are true, "false" and "0" false; "True" is refused.
    decl = 'variable "v" {\n  type = bool\n}\n'
    assert [module(tmp_path, decl, {"v": g}).var("v") for g in ("1", "0", "true")] == [True, False, True]
    with pytest.raises(ValidationFailed):
        module(tmp_path, decl, {"v": "True"})


def test_object_keys_convert_to_strings(tmp_path: Path) -> None:
    # hclsyntax ObjectConsExpr and ForExpr convert each key with convert.Convert(key, cty.String).
    assert value(tmp_path, "{for i, v in [10, 20] : i => v}") == {"0": 10, "1": 20}
    assert value(tmp_path, "{ (1.5) = 1, (true) = 2 }") == {"1.5": 1, "true": 2}
    refused(tmp_path, "{ (null) = 1 }", "not a string")


@pytest.mark.parametrize("expr", ['substr("abc", 1)', "lookup({a = 1})", 'sha1("a", "b")', "one()", "jsonencode()"])
def test_function_arity_is_checked(tmp_path: Path, expr: str) -> None:
    refused(tmp_path, expr, "wrong number of arguments")


def test_operands_convert_as_hcl_converts_them(tmp_path: Path) -> None:
    # hclsyntax BinaryOpExpr/UnaryOpExpr/ConditionalExpr convert each operand to the operation's type first
    # (convert.Convert): numeric strings are numbers, "true"/"false" bools; anything else is an error.
    assert value(tmp_path, '["1" + 2, "2.5" * 2, -"3", "10" > 9]') == [3, 5.0, -3, True]
    assert value(tmp_path, '["true" && true, !"false", "true" ? 1 : 2]') == [True, True, 1]
    refused(tmp_path, '"a" + 1', "needs numbers")
    refused(tmp_path, '"yes" ? 1 : 2', "needs bools")
    refused(tmp_path, "null + 1", "needs numbers")


def test_operations_on_values_known_only_after_apply_are_not_guessed(tmp_path: Path) -> None:
    # Terraform's result would be unknown ("known after apply"); this evaluator carries no unknown results,
    # so it refuses rather than compare a placeholder (an == that read false, a count that read 1).
    decl = 'resource "aws_sqs_queue" "q" {}\n'
    for expr in ('aws_sqs_queue.q.arn == ""', "aws_sqs_queue.q.arn != null", "aws_sqs_queue.q.delay + 1"):
        refused(tmp_path, expr, "known only after apply", decl)
    refused(tmp_path, "aws_sqs_queue.q.fifo ? 1 : 0", "known only after apply", decl)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # cty writes numbers with big.Float's Text('f', -1): no exponent, in strings and in jsonencode.
        ('"n=${0.0000001}"', "n=0.0000001"),
        ('"n=${1e22}"', "n=10000000000000000000000"),
        ('"n=${2.50}"', "n=2.5"),
        ("jsonencode([0.0000001, 2.0, -0.25])", "[0.0000001,2,-0.25]"),
        ("tostring(1e-3)", "0.001"),
    ],
)
def test_numbers_are_written_without_exponents(tmp_path: Path, expr: str, expected: str) -> None:
    assert value(tmp_path, expr) == expected
