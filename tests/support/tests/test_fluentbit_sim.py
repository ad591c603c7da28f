"""tests/support/fluentbit_sim.py, the Fluent Bit simulator, on small configurations written here.

tests/deploy/test_fluentbit.py and tests/deploy/test_stack.py trust this simulator to say what Fluent Bit does with
fluentbit/triton.conf. These tests pin the simulator itself, independent of that file: the classic config
format and its checks, tag matching, the filters (rewrite_tag, modify, parser, multiline), the record
accessor templates and the cloudwatch_logs output's group, stream and message, on configurations of a few
lines each. Where Fluent Bit refuses a configuration, or where 1.9.10 (aws-for-fluent-bit 2.x) and 4.1
(3.x) would read it differently, the simulator must refuse it too (ConfigError), never pick one reading.

The reference is Fluent Bit's own C source at the tags v1.9.10 and v4.1.0 (github.com/fluent/fluent-bit;
each test names the file and function it follows) and its documentation, and docs/logs.md for what the
project saw real Fluent Bit do.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.fluentbit_sim import (
    ConfigError,
    Event,
    FireLensTask,
    OnigmoError,
    Pipeline,
    Record,
    TemplateMissing,
    check_template,
    compile_onigmo,
    parse_classic,
    substitute_env,
    translate,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
T0 = 1_700_000_000.0


def section(kind: str, **entries: str | list[str]) -> str:
    lines = [f"[{kind}]"]
    for key, val in entries.items():
        for v in val if isinstance(val, list) else [val]:
            lines.append(f"    {key} {v}")
    return "\n".join(lines) + "\n"


def output(match: str, group: str = "/g", **entries: str) -> str:
    """A cloudwatch_logs output; log_stream_prefix "s-" unless a stream name or prefix is given."""
    if "log_stream_name" not in entries and "log_stream_prefix" not in entries:
        entries["log_stream_prefix"] = "s-"
    return section("OUTPUT", Name="cloudwatch_logs", Match=match, region="us-east-1", log_group_name=group, **entries)


def pipeline(tmp_path: Path, conf: str, parsers: str = "", env: dict[str, str] | None = None) -> Pipeline:
    if parsers:
        (tmp_path / "parsers.conf").write_text(parsers)
        conf = section("SERVICE", Parsers_File="parsers.conf") + conf
    (tmp_path / "fb.conf").write_text(conf)
    return Pipeline(tmp_path / "fb.conf", env or {}, now=NOW)


def run(p: Pipeline, *records: tuple[str, dict]) -> list[Event]:
    return p.run([Record(tag, T0 + i, dict(body)) for i, (tag, body) in enumerate(records)])


def groups(events: list[Event]) -> list[str]:
    return [e.group for e in events]


# --- the classic format ----------------------------------------------------------------------------


def test_classic_format_sections_entries_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "x.conf"
    path.write_text("# comment\n\n[FILTER]\n    Name  modify\n\tMatch a.*  \n    # indented comment\n    Set k v w\n")
    (s,) = parse_classic(path)
    assert s.kind == "FILTER" and s.entries == [("Name", "modify"), ("Match", "a.*"), ("Set", "k v w")]
    assert s.get("match") == "a.*" and s.name == "modify"  # keys are case-insensitive, values are not


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[FILTERS]\n    Name modify\n", r"unknown section \[FILTERS\]"),
        ("    Name modify\n", "entry outside a section"),
        ("[FILTER]\nName modify\n", "must be indented"),
        ("[FILTER]\n    Name\n", "key without value"),
        ("@INCLUDE other.conf\n", "directive @INCLUDE"),
    ],
)
def test_classic_format_refusals(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "x.conf"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        parse_classic(path)


def test_environment_substitution() -> None:
    assert substitute_env("${A}/x/${A}", {"A": "/p"}) == "/p/x//p"
    assert substitute_env("emf-${HOSTNAME}", {}) == "emf-ip-10-0-1-23.ec2.internal"  # Docker sets HOSTNAME
    with pytest.raises(ConfigError, match="B is not set"):
        substitute_env("${B}", {"A": "x"})


# --- Onigmo regexes ---------------------------------------------------------------------------------


def test_onigmo_ruby_semantics() -> None:
    # Ruby syntax (ONIG_SYNTAX_RUBY): ^ and $ are line anchors, . stops at newlines, \z is the end and \Z the
    # end before a final newline, \d \w \s are ASCII, (?<name>) groups.
    assert compile_onigmo("^b$").search("a\nb\nc")
    assert not compile_onigmo("a.b").search("a\nb")
    assert compile_onigmo(r"\Aa\z").search("a") and not compile_onigmo(r"a\z").search("a\n")
    assert compile_onigmo(r"a\Z").search("a\n")
    assert not compile_onigmo(r"^\d$").search("\u0661")
    assert compile_onigmo(r"(?<lvl>[IWEF])\d").search("E1").group("lvl") == "E"
    assert compile_onigmo("/a.b/").search("axb")  # a pattern written /.../ loses its slashes


@pytest.mark.parametrize(
    "pattern",
    [r"(?P<x>a)", r"\h", r"(?i)a", r"[[:alpha:]]", r"[a-z&&[^b]]", r"a{2}+", r"\p{L}", r"(?#c)", "[a", "a\\"],
)
def test_onigmo_constructs_read_differently_are_refused(pattern: str) -> None:
    with pytest.raises(OnigmoError):
        compile_onigmo(pattern)


# --- record accessor templates -------------------------------------------------------------------


def test_templates_translate_tag_parts_groups_and_keys() -> None:
    # flb_record_accessor.c ra_translate_tag_part: $TAG[n] is the n-th dot-separated part, "" past the end.
    tag = "triton.m2.task-1.ns.ranker"
    assert translate("$TAG", tag) == tag
    assert translate("/m/$TAG[3].$TAG[4]", tag) == "/m/ns.ranker"
    assert translate("$TAG[0],$TAG[9].x", tag) == "triton,.x"
    assert translate("new.$1.$0", "t", {}, ("whole", "one")) == "new.one.whole"
    assert translate("$2", "t", {}, ("whole", "one")) == ""  # a group that does not exist
    assert translate("/g/$model", "t", {"model": "add"}) == "/g/add"
    with pytest.raises(TemplateMissing):
        translate("/g/$model", "t", {})


@pytest.mark.parametrize(
    ("template", "match"),
    [("/g/$model-errors", "stray characters"), ("/g/$TAG[1]-x", "followed by"), ("$key/x", "stray characters")],
)
def test_templates_refuse_what_the_record_accessor_reads_otherwise(template: str, match: str) -> None:
    # ra_parse_buffer ends a $key at ".", " ", "," or a quote: "$model-errors" would look up "model-errors".
    with pytest.raises(ConfigError, match=match):
        check_template(template)


# --- configuration checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        (section("FILTER", Name="lua", Match="*", script="x.lua", call="f"), "plugin not modelled"),
        (section("FILTER", Name="record_modifier", Match="*", Record="k v"), "plugin not modelled"),
        (section("INPUT", Name="forward", Port="24224"), "FireLens already declares the forward input"),
        (section("FILTER", Name="modify", Match="*", Bogus="1"), "unknown keys"),
        (section("FILTER", Name="modify", Set="a b"), "no Match"),
        (section("FILTER", Name="rewrite_tag", Match="*"), "missing"),
        (section("FILTER", Name="parser", Match="*", Key_Name="log", Parser="nope"), "parser nope is not defined"),
        (section("OUTPUT", Name="cloudwatch_logs", Match="*", log_group_name="/g"), "missing"),  # region
        (output("*", log_retention_days="42"), "not a CloudWatch value"),
        (output("*", group="/g with space"), "log_group_name"),
        (output("*", log_group_template="/g/$model-x"), "stray characters"),
        (
            section("FILTER", Name="rewrite_tag", Match="a", Rule="$log .* b false")
            + section(
                "FILTER", Name="multiline", Match="*", **{"multiline.key_content": "log"}, mode="partial_message"
            ),
            "first multiline filter must be the first filter",
        ),
        (section("FILTER", Name="rewrite_tag", Match="a", Rule="$log .* b maybe"), "keep flag"),
        (section("FILTER", Name="rewrite_tag", Match="a", Rule="$log .*"), "4 fields"),
        (section("FILTER", Name="rewrite_tag", Match="a", Rule="$a['b'] .* c false"), "not a plain"),
    ],
)
def test_configurations_fluent_bit_would_refuse_or_misread(tmp_path: Path, conf: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        pipeline(tmp_path, conf)


# --- tag matching -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "tag", "matches"),
    [
        ("app.*", "app.x", True),
        ("app.*", "app.x.y", True),  # * crosses dots
        ("app.*", "app", False),
        ("*.log", "a.b.log", True),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "aXbY", False),
        ("exact", "exact", True),
        ("exact", "exact2", False),
        ("*", "anything", True),
        ("App.*", "app.x", False),  # case-sensitive
    ],
)
def test_match_wildcards(tmp_path: Path, pattern: str, tag: str, matches: bool) -> None:
    p = pipeline(tmp_path, output(pattern))
    assert len(run(p, (tag, {"log": "x"}))) == int(matches)


def test_a_record_no_output_matches_is_dropped_and_one_matching_two_outputs_goes_to_both(tmp_path: Path) -> None:
    # Routes are fixed per chunk by its tag (flb_routes_mask_set_by_tag); a chunk with no route is discarded.
    p = pipeline(tmp_path, output("a.*", "/one") + output("a.b", "/two"))
    assert groups(run(p, ("a.b", {"log": "x"}))) == ["/one", "/two"]
    assert run(p, ("z.b", {"log": "x"})) == []


# --- rewrite_tag ----------------------------------------------------------------------------------


def test_rewrite_tag_keep_false_moves_the_record(tmp_path: Path) -> None:
    # filter_rewrite_tag: the first rule whose regex matches the key's string value wins; the record is
    # re-emitted with the new tag (through the filters from the start) and, with KEEP false, dropped.
    conf = (
        section("FILTER", Name="rewrite_tag", Match="in", Rule=["$lvl ^E errors.$TAG false", "$lvl .* all.$TAG false"])
        + output("in", "/in")
        + output("errors.*", "/errors")
        + output("all.*", "/all")
    )
    p = pipeline(tmp_path, conf)
    events = run(p, ("in", {"lvl": "ERROR"}), ("in", {"lvl": "INFO"}), ("in", {"lvl": 3}), ("in", {"x": "E"}))
    assert sorted(((e.group, e.tag, e.record.get("lvl")) for e in events), key=str) == [
        ("/all", "all.in", "INFO"),
        ("/errors", "errors.in", "ERROR"),
        ("/in", "in", 3),  # a value that is not a string matches no rule
        ("/in", "in", None),  # a missing key matches no rule
    ]


def test_rewrite_tag_keep_true_copies_and_the_original_goes_on(tmp_path: Path) -> None:
    conf = (
        section("FILTER", Name="rewrite_tag", Match="in", Rule="$msg (\\w+)-(\\w+) copy.$2.$1 true")
        + section("FILTER", Name="modify", Match="in", Set="seen yes")
        + output("*", "/all")
    )
    events = run(pipeline(tmp_path, conf), ("in", {"msg": "ab-cd"}))
    by_tag = {e.tag: e.record for e in events}
    assert by_tag == {"copy.cd.ab": {"msg": "ab-cd"}, "in": {"msg": "ab-cd", "seen": "yes"}}


def test_re_emitted_records_run_every_filter_again_and_cycles_are_caught(tmp_path: Path) -> None:
    conf = (
        section("FILTER", Name="modify", Match="new.*", Add="stamp 1")
        + section("FILTER", Name="rewrite_tag", Match="old", Rule="$log .* new.$TAG false")
        + output("*", "/g")
    )
    (e,) = run(pipeline(tmp_path, conf), ("old", {"log": "x"}))
    assert e.tag == "new.old" and e.record == {"log": "x", "stamp": "1"}  # a filter before it ran on the copy
    loop = section("FILTER", Name="rewrite_tag", Match="a*", Rule="$log .* a$TAG false") + output("*")
    with pytest.raises(ConfigError, match="cycle"):
        run(pipeline(tmp_path, loop), ("a", {"log": "x"}))


# --- modify -----------------------------------------------------------------------------------------


def test_modify_rules_and_conditions(tmp_path: Path) -> None:
    # filter_modify: Set overwrites or adds, Add only adds, Remove, Rename keeps the position and does
    # nothing when the new name exists; rules apply in order; all Conditions must hold; key names and
    # compared values are case-sensitive; a non-string value never equals a string.
    conf = section(
        "FILTER",
        Name="modify",
        Match="*",
        Condition=["Key_Value_Equals level I", "Key_Exists source", "Key_Does_Not_Exist skip"],
        Set=["level INFO", "new a b"],
        Add=["source other", "added yes"],
        Rename=["source stream", "x y"],
        Remove="drop",
    ) + output("*")
    p = pipeline(tmp_path, conf)
    (e,) = run(p, ("t", {"level": "I", "source": "stderr", "drop": 1, "x": 1, "y": 2}))
    assert list(e.record.items()) == [
        ("level", "INFO"),
        ("stream", "stderr"),
        ("x", 1),
        ("y", 2),
        ("new", "a b"),
        ("added", "yes"),
    ]
    for body in ({"level": "i", "source": "s"}, {"level": "I"}, {"level": "I", "source": "s", "skip": 1}):
        (e,) = run(p, ("t", body))
        assert e.record == body  # a condition failed: nothing changed
    (e,) = run(p, ("t", {"level": 1, "source": "s"}))
    assert e.record == {"level": 1, "source": "s"}


def test_modify_conditions_not_modelled_are_refused(tmp_path: Path) -> None:
    conf = section("FILTER", Name="modify", Match="*", Condition="A_Key_Matches ^x", Set="a b") + output("*")
    with pytest.raises(ConfigError, match="not modelled"):
        run(pipeline(tmp_path, conf), ("t", {"x": 1}))


# --- parser -----------------------------------------------------------------------------------------

PARSERS = (
    section(
        "PARSER",
        Name="line",
        Format="regex",
        Regex=r"^(?<level>[IWE]) (?<time>\d{2}/\d{2} \d{2}:\d{2}:\d{2}) (?<msg>.*)$",
        Time_Key="time",
        Time_Format="%m/%d %H:%M:%S",
    )
    + section("PARSER", Name="kv", Format="regex", Regex=r"^(?<k>\w+)=(?<v>\w+)$")
    + section(
        "PARSER",
        Name="quoted",
        Format="regex",
        Regex=r'^"(?<msg>(?:[^"\\]|\\.)*)"$',
        Decode_Field_As="escaped msg",
    )
)


def parser_filter(key: str = "log", parsers: tuple[str, ...] = ("line", "kv"), **opts: str) -> str:
    return section("FILTER", Name="parser", Match="*", Key_Name=key, Parser=list(parsers), **opts)


def test_parser_first_match_wins_time_and_reserve_data(tmp_path: Path) -> None:
    p = pipeline(tmp_path, parser_filter(Reserve_Data="On") + output("*"), PARSERS)
    (e1, e2, e3, e4) = run(
        p,
        ("t", {"log": "E 11/29 08:00:01 boom", "stream": "stderr"}),
        ("t", {"log": "a=b", "stream": "stdout"}),
        ("t", {"log": "no parser matches", "stream": "stdout"}),
        ("t", {"log": 5}),
    )
    # Time_Key becomes the record's time (a format without a year takes the current one) and leaves the record.
    assert e1.record == {"level": "E", "msg": "boom", "stream": "stderr"}
    assert e1.time == datetime(2026, 11, 29, 8, 0, 1, tzinfo=UTC).timestamp()
    assert e2.record == {"k": "a", "v": "b", "stream": "stdout"} and e2.time == T0 + 1
    assert e3.record == {"log": "no parser matches", "stream": "stdout"}  # untouched
    assert e4.record == {"log": 5}  # a value that is not a string is not parsed


def test_parser_without_reserve_data_keeps_only_the_parsed_keys(tmp_path: Path) -> None:
    p = pipeline(tmp_path, parser_filter() + output("*"), PARSERS)
    (e,) = run(p, ("t", {"log": "a=b", "stream": "stdout"}))
    assert e.record == {"k": "a", "v": "b"}


def test_parser_preserve_key_with_reserve_data(tmp_path: Path) -> None:
    p = pipeline(tmp_path, parser_filter(Reserve_Data="On", Preserve_Key="On") + output("*"), PARSERS)
    (e,) = run(p, ("t", {"log": "a=b", "stream": "stdout"}))
    assert e.record == {"k": "a", "v": "b", "log": "a=b", "stream": "stdout"}


def test_parser_time_keep_and_escaped_decoder(tmp_path: Path) -> None:
    parsers = PARSERS.replace("Time_Format", "Time_Keep On\n    Time_Format")
    p = pipeline(tmp_path, parser_filter(parsers=("line", "quoted")) + output("*"), parsers)
    (e1, e2) = run(p, ("t", {"log": "I 01/02 03:04:05 x"}), ("t", {"log": '"a\\"b\\nc\\\\d\\t"'}))
    assert e1.record == {"level": "I", "time": "01/02 03:04:05", "msg": "x"}
    # flb_unescape.c flb_unescape_string (Decode_Field_As escaped): \" \n \\ \t decoded.
    assert e2.record == {"msg": 'a"b\nc\\d\t'}


def test_parser_file_refusals(tmp_path: Path) -> None:
    bad = {
        "Time_Key names no capture": PARSERS.replace("Time_Key time", "Time_Key when"),
        "only Format regex": PARSERS.replace("Format regex", "Format json", 1),
        "duplicate parser": PARSERS + section("PARSER", Name="kv", Format="regex", Regex="x"),
        "unknown keys": PARSERS + section("PARSER", Name="z", Format="regex", Regex="x", Bogus="1"),
        "unknown decoder": PARSERS.replace("escaped msg", "base64 msg"),
    }
    for complaint, parsers in bad.items():
        match = {"Time_Key names no capture": "is not a capture"}.get(complaint, complaint)
        with pytest.raises(ConfigError, match=match):
            pipeline(tmp_path, parser_filter() + output("*"), parsers)


# --- multiline --------------------------------------------------------------------------------------


def test_multiline_partial_message_rejoins_docker_splits(tmp_path: Path) -> None:
    conf = section(
        "FILTER", Name="multiline", Match="*", **{"multiline.key_content": "log"}, mode="partial_message"
    ) + output("*")
    task = FireLensTask("app", partial_limit=4)
    events = pipeline(tmp_path, conf).run(task.records(["abcdefghij", "xy"]))
    assert [e.record["log"] for e in events] == ["abcdefghij", "xy"]
    assert not any(k.startswith("partial_") for e in events for k in e.record)


def test_multiline_parser_joins_continuation_lines(tmp_path: Path) -> None:
    parsers = (
        "[MULTILINE_PARSER]\n    Name  ml\n    Type  regex\n    Flush_Timeout 1000\n"
        '    Rule  "start_state"  "/^\\d+ /"  "cont"\n    Rule  "cont"  "/^\\s+/"  "cont"\n'
    )
    conf = section("FILTER", Name="multiline", Match="*", **{"multiline.key_content": "log", "multiline.parser": "ml"})
    p = pipeline(tmp_path, conf + output("*"), parsers)
    lines = ["1 first", "  more", "  more", "2 second", "loose", "3 third"]
    events = run(p, *[("t", {"log": line}) for line in lines])
    assert [e.record["log"] for e in events] == ["1 first\n  more\n  more", "2 second", "loose", "3 third"]


# --- cloudwatch_logs ------------------------------------------------------------------------------------


def test_cloudwatch_group_and_stream_templates(tmp_path: Path) -> None:
    # out_cloudwatch_logs get_log_stream: a template takes priority; the stream prefix is not added to a
    # template; a template whose record key is missing falls back to log_group_name / prefix + tag.
    conf = output(
        "m.*",
        "/fallback",
        log_group_template="/models/$TAG[1].$model",
        log_stream_template="$TAG[2]",
        log_stream_prefix="p-",
    )
    p = pipeline(tmp_path, conf)
    e1, e2 = run(p, ("m.a.task1", {"model": "x"}), ("m.a.task1", {"other": 1}))
    assert (e1.group, e1.stream) == ("/models/a.x", "task1")
    assert (e2.group, e2.stream) == ("/fallback", "task1")
    (e3,) = run(pipeline(tmp_path, output("*", "/g", log_stream_name="fixed")), ("t", {"log": "x"}))
    assert e3.stream == "fixed"
    (e4,) = run(pipeline(tmp_path, output("*", "/g")), ("a.b", {"log": "x"}))
    assert e4.stream == "s-a.b"


def test_cloudwatch_message_is_the_record_as_json_or_the_log_key_raw(tmp_path: Path) -> None:
    p = pipeline(tmp_path, output("json", "/j") + output("raw", "/r", log_key="log", log_format="json/emf"))
    (e1,) = run(p, ("json", {"log": "x", "n": 1}))
    assert json.loads(e1.message) == {"log": "x", "n": 1}
    (e2,) = run(p, ("raw", {"log": '{"_aws": {}}', "n": 1}))
    assert e2.message == '{"_aws": {}}'
    assert run(p, ("raw", {"n": 1})) == []  # no log_key in the record: "Could not find log_key", not sent


# --- details of the C sources a simulator easily gets wrong: matching, parsers, refusals --------------


@pytest.mark.parametrize(
    ("pattern", "tag", "matches"),
    [
        # flb_router.c router_match (1.9.10 and 4.1): only * is a wildcard; ? and [ are plain characters.
        ("a?c", "abc", False),
        ("a?c", "a?c", True),
        ("a[bc]", "ab", False),
        ("a[bc]", "a[bc]", True),
    ],
)
def test_match_has_no_other_wildcard_than_star(tmp_path: Path, pattern: str, tag: str, matches: bool) -> None:
    p = pipeline(tmp_path, output(pattern))
    assert len(run(p, (tag, {"log": "x"}))) == int(matches)


@pytest.mark.parametrize(
    ("regex_", "match", "tag", "matches"),
    [
        # router_match: onig_match at the start of the tag (not a search), and only a match of at least one
        # character counts; when the regex fails, Match is tried too.
        ("firelens-", None, "app-firelens-1", False),
        ("app-", None, "app-firelens-1", True),
        ("^(app|web)-firelens-", None, "web-firelens-1", True),
        ("x*", None, "abc", False),
        ("^a", "b.*", "b.x", True),
        ("^a", "b.*", "c.x", False),
    ],
)
def test_match_regex_is_anchored_at_the_start_and_falls_back_to_match(
    tmp_path: Path, regex_: str, match: str | None, tag: str, matches: bool
) -> None:
    conf = output("unused").replace("Match unused", f"Match_Regex {regex_}" + (f"\n    Match {match}" if match else ""))
    assert len(run(pipeline(tmp_path, conf), (tag, {"log": "x"}))) == int(matches)


def test_regex_options_after_slashes_are_refused(tmp_path: Path) -> None:
    # flb_regex.c str_to_regex: 4.1 reads /pat/imx options (check_option); 1.9.10 only strips /.../ and takes
    # "/a.b/m" as the literal pattern. An "o" alone is no option on 4.1 either: literal on both.
    for pattern in ("/a.b/m", "/ab/i", "/a b/x", "/ab/mo"):
        with pytest.raises(OnigmoError, match=r"not on 1\.9\.10"):
            compile_onigmo(pattern)
    assert compile_onigmo("/ab/o").search("x/ab/o") and not compile_onigmo("/ab/o").search("ab")


def test_cloudwatch_needs_exactly_one_of_stream_name_and_prefix(tmp_path: Path) -> None:
    # cloudwatch_logs.c cb_cloudwatch_init: "Either 'log_stream_name' or 'log_stream_prefix' is required",
    # for neither and for both, even with a log_stream_template.
    neither = output("*", log_stream_template="$TAG").replace("    log_stream_prefix s-\n", "")
    both = output("*", log_stream_name="n", log_stream_prefix="p-")
    for conf in (neither, both):
        with pytest.raises(ConfigError, match="Either 'log_stream_name' or 'log_stream_prefix'"):
            pipeline(tmp_path, conf)


def test_a_failed_stream_template_falls_back_to_the_stream_name(tmp_path: Path) -> None:
    # cloudwatch_api.c get_log_stream: template, else log_stream_name, else log_stream_prefix + tag.
    p = pipeline(tmp_path, output("*", log_stream_template="$key", log_stream_name="fixed"))
    e1, e2 = run(p, ("t", {"key": "from-record"}), ("t", {"other": 1}))
    assert (e1.stream, e2.stream) == ("from-record", "fixed")


def test_parser_skips_empty_captures_unless_told_not_to(tmp_path: Path) -> None:
    # flb_parser.c: Skip_Empty_Values defaults to on; cb_results skips a capture of length 0 (an unset
    # optional group too); with it off, both are empty strings.
    parsers = section("PARSER", Name="p", Format="regex", Regex=r"^(?<a>\w*):(?<b>x)?(?<c>.*)$")
    p = pipeline(tmp_path, parser_filter(parsers=("p",)) + output("*"), parsers)
    (e,) = run(p, ("t", {"log": ":"}))
    assert e.record == {}
    parsers = parsers.replace("Format regex", "Format regex\n    Skip_Empty_Values Off")
    (e,) = run(pipeline(tmp_path, parser_filter(parsers=("p",)) + output("*"), parsers), ("t", {"log": ":z"}))
    assert e.record == {"a": "", "b": "", "c": "z"}


def test_parser_time_key_defaults_to_time_and_a_bad_time_is_dropped(tmp_path: Path) -> None:
    # flb_parser_regex.c cb_results: with a Time_Format and no Time_Key the key is "time"; a value that does
    # not fit the format is logged ("invalid time format") and skipped: not in the record, time unchanged.
    parsers = section("PARSER", Name="p", Format="regex", Regex=r"^(?<time>\S+) (?<msg>.*)$", Time_Format="%H:%M:%S")
    p = pipeline(tmp_path, parser_filter(parsers=("p",)) + output("*"), parsers)
    e1, e2 = run(p, ("t", {"log": "08:09:10 a"}), ("t", {"log": "late b"}))
    # no year in the format: the current one (2026); no date: January 1st, as strptime
    assert e1.record == {"msg": "a"} and e1.time == datetime(2026, 1, 1, 8, 9, 10, tzinfo=UTC).timestamp()
    assert e2.record == {"msg": "b"} and e2.time == T0 + 1


def test_parser_time_zone_from_the_value(tmp_path: Path) -> None:
    parsers = section(
        "PARSER",
        Name="p",
        Format="regex",
        Regex=r"^(?<t>\S+) (?<msg>.*)$",
        Time_Key="t",
        Time_Format="%Y-%m-%dT%H:%M:%S%z",
    )
    p = pipeline(tmp_path, parser_filter(parsers=("p",)) + output("*"), parsers)
    (e,) = run(p, ("t", {"log": "2026-01-02T03:04:05+0200 x"}))
    assert e.time == datetime(2026, 1, 2, 1, 4, 5, tzinfo=UTC).timestamp()


def test_parser_output_puts_parsed_keys_first_and_refuses_duplicates(tmp_path: Path) -> None:
    # filter_parser.c + flb_pack.c flb_msgpack_expand_map: the parsed map, then the kept keys of the record.
    # A key in both would be in the record twice (msgpack maps allow it; a dict cannot show it).
    p = pipeline(tmp_path, parser_filter(parsers=("kv",), Reserve_Data="On") + output("*"), PARSERS)
    (e,) = run(p, ("t", {"stream": "stdout", "log": "a=b", "z": 1}))
    assert list(e.record) == ["k", "v", "stream", "z"]
    assert list(json.loads(e.message)) == ["k", "v", "stream", "z"]
    with pytest.raises(ConfigError, match=r"parsed \['k'\] also in the record"):
        run(p, ("t", {"k": "old", "log": "a=b"}))


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"Preserve_Key": "On"}, "Preserve_Key without Reserve_Data differs"),  # 1.9.10 drops it, 4.1 keeps it
        ({"Key_Name": "$log"}, "4.1 only"),
        ({"Unescape_Key": "On"}, "not modelled"),
    ],
)
def test_parser_filter_options_read_differently_or_not_modelled(tmp_path: Path, opts: dict, match: str) -> None:
    key = opts.pop("Key_Name", "log")
    with pytest.raises(ConfigError, match=match):
        pipeline(tmp_path, parser_filter(key, **opts) + output("*"), PARSERS)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("Decode_Field_As json msg", "decoder json not modelled"),
        ("Decode_Field_As escaped_utf8 msg", "decoder escaped_utf8 not modelled"),
        ("Decode_Field escaped msg", "not modelled"),
        ("Types k:integer", "not modelled"),
        ("Time_Offset +0200", "not modelled"),
    ],
)
def test_parser_options_not_modelled_are_refused(tmp_path: Path, extra: str, match: str) -> None:
    parsers = PARSERS.replace("Name kv", f"Name kv\n    {extra}")
    with pytest.raises(ConfigError, match=match):
        pipeline(tmp_path, parser_filter() + output("*"), parsers)


def test_escaped_decoder_drops_the_backslash_of_other_escapes(tmp_path: Path) -> None:
    # flb_unescape.c flb_unescape_string (Decode_Field_As escaped, unchanged from 1.9.10 to 4.1): only
    # \n \a \b \t \v \f \r \\ are decoded; before any other character the backslash goes: \" is ", \/ is /,
    # \u00e9 is "u00e9" (escaped_utf8 would decode it), \q is q.
    p = pipeline(tmp_path, parser_filter(parsers=("quoted",)) + output("*"), PARSERS)
    (e,) = run(p, ("t", {"log": '"\\"\\/\\u00e9\\q\\a"'}))
    assert e.record == {"msg": '"/u00e9q\a'}
    with pytest.raises(ConfigError, match="lone backslash"):
        run(pipeline(tmp_path, parser_filter(parsers=("loose",)) + output("*"), PARSERS_LOOSE), ("t", {"log": "x\\"}))


PARSERS_LOOSE = section("PARSER", Name="loose", Format="regex", Regex=r"^(?<msg>.*)$", Decode_Field_As="escaped msg")


@pytest.mark.parametrize("op", ["Hard_Rename a b", "Copy a b", "Hard_Copy a b", "Remove_Wildcard a", "Remove_Regex ^a"])
def test_modify_operations_not_modelled_are_refused_when_loaded(tmp_path: Path, op: str) -> None:
    key, _, val = op.partition(" ")
    with pytest.raises(ConfigError, match="not modelled"):
        pipeline(tmp_path, section("FILTER", Name="modify", Match="*", **{key: val}) + output("*"))


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"buffer": "off", "multiline.parser": "ml"}, "buffer off"),
        ({"multiline.parser": "ml, ml2"}, "exactly one multiline.parser"),
        ({}, "exactly one multiline.parser"),  # ml.c: parser mode with no parser is an error
    ],
)
def test_multiline_options_not_modelled_are_refused(tmp_path: Path, opts: dict, match: str) -> None:
    parsers = (
        '[MULTILINE_PARSER]\n    Name  ml\n    Type  regex\n    Rule  "start_state"  "/^a/"  "start_state"\n'
        '[MULTILINE_PARSER]\n    Name  ml2\n    Type  regex\n    Rule  "start_state"  "/^b/"  "start_state"\n'
    )
    conf = section("FILTER", Name="multiline", Match="*", **{"multiline.key_content": "log"}, **opts)
    with pytest.raises(ConfigError, match=match):
        pipeline(tmp_path, conf + output("*"), parsers)
