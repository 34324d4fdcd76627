"""Parsing Lean's messages: REPL answers, `lean --json` lines and plain `file:line:col:` output."""

from __future__ import annotations

import json
from pathlib import Path

from leanrl.lean.messages import (
    cut_tagged,
    from_repl,
    normalize_severity,
    parse_json_output,
    parse_plain_output,
    shift,
)
from leanrl.lean.protocol import CommandResponse, parse_response, split_blocks
from leanrl.verdict import Message, Position

# Shaped like Lean 4's SerialMessage JSON (`lean --json`): one object per line, severity spelled
# "information"/"warning"/"error", optional caption, newer versions add keepFullRange/isSilent.
JSON_OUT = "\n".join(
    [
        json.dumps(
            {
                "severity": "error",
                "pos": {"line": 5, "column": 2},
                "endPos": {"line": 5, "column": 9},
                "keepFullRange": False,
                "fileName": "Attempt.lean",
                "data": "unknown identifier 'foo'",
                "caption": "",
            }
        ),
        json.dumps(
            {
                "severity": "warning",
                "pos": {"line": 4, "column": 8},
                "endPos": None,
                "fileName": "Attempt.lean",
                "data": "declaration uses 'sorry'",
                "caption": "",
                "isSilent": False,
            }
        ),
        "not json at all",
        json.dumps(
            {
                "severity": "information",
                "pos": {"line": 9, "column": 0},
                "fileName": "Attempt.lean",
                "data": "LEANRL-CHECK {}",
            }
        ),
    ]
)

PLAIN_OUT = """Attempt.lean:5:2: error: type mismatch
  h
has type
  a = b : Prop
but is expected to have type
  b = a : Prop
Attempt.lean:4:8: warning: declaration uses 'sorry'
Attempt.lean:9:0: info: 42
Attempt.lean:10:0: "old style info without severity"
"""


def test_json_output() -> None:
    msgs = parse_json_output(JSON_OUT)
    assert [m.severity for m in msgs] == ["error", "warning", "info"]
    assert msgs[0].pos == Position(line=5, column=2)
    assert msgs[0].end_pos == Position(line=5, column=9)
    assert msgs[1].end_pos is None
    assert msgs[2].data == "LEANRL-CHECK {}"


def test_plain_output_with_continuation_lines() -> None:
    msgs = parse_plain_output(PLAIN_OUT, "Attempt.lean")
    assert [m.severity for m in msgs] == ["error", "warning", "info", "info"]
    assert msgs[0].data.startswith("type mismatch\n  h\nhas type")
    assert msgs[0].data.endswith("b = a : Prop")
    assert msgs[0].pos == Position(line=5, column=2)
    assert msgs[1].data == "declaration uses 'sorry'"
    assert msgs[2].data == "42"
    assert msgs[3].data == '"old style info without severity"'


def test_plain_output_end_positions_and_other_files() -> None:
    out = (
        "/tmp/x/Attempt.lean:3:4-3:9: error: oops\n"
        "  see /usr/lib/Other.lean:1:1: error: not a new message\n"
    )
    (m,) = parse_plain_output(out, "Attempt.lean")
    assert m.pos == Position(line=3, column=4) and m.end_pos == Position(line=3, column=9)
    assert "not a new message" in m.data


def test_plain_output_text_before_any_message_is_an_error() -> None:
    (m,) = parse_plain_output("uncaught exception: out of memory\n", "Attempt.lean")
    assert m.severity == "error" and m.pos is None and "out of memory" in m.data


def test_backtick_and_quote_sorry_wordings_parse_the_same(bench_data: Path) -> None:
    # v4.9 writes 'sorry', current Lean writes `sorry`; parsing keeps the text verbatim and the
    # policy never looks at it (it uses the structured sorries list and the sorryAx axiom).
    out = (bench_data / "repl-transcripts" / "readme.expected.out").read_text("utf-8")
    ans = parse_response(json.loads(split_blocks(out)[0]))
    assert isinstance(ans, CommandResponse)
    (m,) = from_repl(ans.messages)
    assert m.data == "declaration uses `sorry`" and m.severity == "warning"
    old = parse_plain_output("A.lean:1:8: warning: declaration uses 'sorry'\n", "A.lean")
    assert old[0].severity == m.severity


def test_shift_and_repl_offsets(bench_data: Path) -> None:
    out = (bench_data / "repl-transcripts" / "have_by_sorry.expected.out").read_text("utf-8")
    ans = parse_response(json.loads(split_blocks(out)[0]))
    assert isinstance(ans, CommandResponse)
    (m,) = from_repl(ans.messages, line_offset=0)
    assert m.pos == Position(line=1, column=33) and m.end_pos == Position(line=2, column=28)
    shifted = shift([Message(severity="error", data="x", pos=Position(line=7, column=1))], 3)
    assert shifted[0].pos == Position(line=4, column=1)
    # line 0 (tactic-mode messages without position) stays 0
    zero = shift([Message(severity="error", data="x", pos=Position(line=0, column=0))], 3)
    assert zero[0].pos == Position(line=0, column=0)


def test_normalize_severity() -> None:
    assert normalize_severity("information") == "info"
    assert normalize_severity("ERROR") == "error"


def test_cut_tagged_finds_reports_glued_anywhere() -> None:
    out = (
        'C.lean:3:8: warning: declaration uses \'sorry\'LEANRL-CHECK {"nonce":"ab","s":"}"}'
        "\nLEANRL-CHECK {broken\nC.lean:4:0: error: boom\n"
    )
    found, rest = cut_tagged(out, "LEANRL-CHECK ")
    assert found == ['LEANRL-CHECK {"nonce":"ab","s":"}"}', "LEANRL-CHECK {broken"]
    msgs = parse_plain_output(rest, "C.lean")
    assert [(m.severity, m.data) for m in msgs] == [
        ("warning", "declaration uses 'sorry'"),
        ("error", "boom"),
    ]
