"""The REPL wire models against real REPL transcripts (the fixtures; every transcript in the
full benchmark data too when it is there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leanrl.lean.protocol import (
    CommandRequest,
    CommandResponse,
    PickleEnvRequest,
    ProtocolError,
    ReplError,
    TacticRequest,
    TacticResponse,
    UnpickleEnvRequest,
    encode_request,
    parse_response,
    read_request_block,
    split_blocks,
)


def _pairs(*roots: Path) -> list[tuple[Path, Path]]:
    pairs = []
    for inp in sorted(p for root in roots for p in (root / "repl-transcripts").rglob("*.in")):
        out = inp.with_name(inp.name[: -len(".in")] + ".expected.out")
        if out.is_file():
            pairs.append((inp, out))
    return pairs


def _requests(inp: Path) -> list[dict]:
    # The REPL skips blocks starting with `#` or `--` (comments); so do we.
    blocks = split_blocks(inp.read_text(encoding="utf-8"))
    return [read_request_block(b) for b in blocks if not b.startswith(("#", "--"))]


def test_every_transcript_parses_and_matches_its_requests(data_roots: list[Path]) -> None:
    pairs = _pairs(*data_roots)
    assert len(pairs) >= 10, "expected the fixtures' transcripts (and the full set if present)"
    n_answers = 0
    for inp, out in pairs:
        reqs = _requests(inp)
        answers = [parse_response(json.loads(b)) for b in split_blocks(out.read_text("utf-8"))]
        assert len(answers) == len(reqs), (
            f"{inp.name}: {len(reqs)} requests, {len(answers)} answers"
        )
        for req, ans in zip(reqs, answers, strict=True):
            n_answers += 1
            if isinstance(ans, ReplError):
                assert ans.message, inp.name
            elif "tactic" in req or "proofState" in req or "unpickleProofStateFrom" in req:
                assert isinstance(ans, TacticResponse), f"{inp.name}: {req}"
            else:
                assert isinstance(ans, CommandResponse), f"{inp.name}: {req}"
                for m in ans.messages:
                    assert m.severity in {"error", "warning", "info"}
                    assert m.pos is not None and m.pos.line >= 0
                for s in ans.sorries:
                    assert s.goal.startswith(("⊢", "case")) or "⊢" in s.goal or s.goal == ""
    assert n_answers >= 25 + (150 if len(data_roots) > 1 else 0)  # fixtures alone: 28


def test_readme_transcript_details(bench_data: Path) -> None:
    out = (bench_data / "repl-transcripts" / "readme.expected.out").read_text("utf-8")
    first, second, third = (parse_response(json.loads(b)) for b in split_blocks(out))
    assert isinstance(first, CommandResponse) and first.env == 0
    (s,) = first.sorries
    assert s.proof_state == 0 and s.goal == "x : Unit\n⊢ Nat"
    assert s.pos is not None and (s.pos.line, s.pos.column) == (1, 29)
    assert s.end_pos is not None and s.end_pos.column == 34
    (m,) = first.messages
    assert m.severity == "warning" and m.data == "declaration uses `sorry`"
    assert isinstance(second, TacticResponse)
    assert second.proof_status == "Incomplete: open goals remain"
    assert second.goals == ("x : Unit\n⊢ Int",)
    assert isinstance(third, TacticResponse) and third.proof_status == "Completed"
    assert third.goals == () and third.proof_state == 2


def test_error_answers(bench_data: Path) -> None:
    root = bench_data / "repl-transcripts"
    unk = parse_response(json.loads((root / "unknown_environment.expected.out").read_text("utf-8")))
    assert isinstance(unk, ReplError) and unk.message == "Unknown environment."
    blocks = split_blocks((root / "unknown_tactic.expected.out").read_text("utf-8"))
    err = parse_response(json.loads(blocks[1]))
    assert isinstance(err, ReplError) and err.message.startswith("Lean error:")


def test_kernel_error_is_an_error_message(bench_data: Path) -> None:
    out = (bench_data / "repl-transcripts" / "app_type_mismatch2.expected.out").read_text("utf-8")
    first = parse_response(json.loads(split_blocks(out)[0]))
    assert isinstance(first, CommandResponse)
    assert first.errors and first.errors[0].data.startswith("(kernel)")


def test_requests_round_trip_through_the_models(data_roots: list[Path]) -> None:
    seen = set()
    for inp, _ in _pairs(*data_roots):
        for req in _requests(inp):
            model: object
            if "tactic" in req:
                model = TacticRequest.model_validate(req)
            elif "pickleTo" in req and "env" in req:
                model = PickleEnvRequest.model_validate(req)
            elif "unpickleEnvFrom" in req:
                model = UnpickleEnvRequest.model_validate(req)
            elif "cmd" in req and "infotree" not in req:
                model = CommandRequest.model_validate(req)
            else:
                continue
            seen.add(type(model).__name__)
            wire = encode_request(model)  # type: ignore[arg-type]
            assert wire.endswith(b"\n\n") and wire.count(b"\n") == 2, "one line, then a blank"
            again = json.loads(wire)
            assert again == {k: v for k, v in req.items() if v is not None}
    assert seen == {"TacticRequest", "PickleEnvRequest", "UnpickleEnvRequest", "CommandRequest"}


def test_multiline_command_is_sent_on_one_line() -> None:
    wire = encode_request(CommandRequest(cmd="theorem x : True := by\n\n  trivial", env=3))
    assert wire.count(b"\n") == 2
    assert json.loads(wire) == {"cmd": "theorem x : True := by\n\n  trivial", "env": 3}


@pytest.mark.parametrize("bad", [[1, 2], {"foo": 1}, {"env": "x"}, {"proofState": 1, "goals": 3}])
def test_unrecognised_answers_raise_protocol_error(bad: object) -> None:
    with pytest.raises(ProtocolError):
        parse_response(bad)


def test_unknown_fields_are_ignored() -> None:
    ans = parse_response({"env": 4, "messages": [], "newField": {"x": 1}})
    assert isinstance(ans, CommandResponse) and ans.env == 4


def test_unencodable_text_is_replaced_not_fatal() -> None:
    wire = encode_request(CommandRequest(cmd="theorem x : True := by\n  trivial -- \ud800"))
    assert json.loads(wire)["cmd"].endswith("-- ?")
