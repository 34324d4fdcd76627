"""The command line for a newcomer: short --help, --help-all, --version, kebab- and snake_case
flags, "did you mean", short errors, and help texts that name only flags that exist."""

from __future__ import annotations

import pytest

from leanrl._cli_help import command_flags, mentioned_flags, short_help
from leanrl.cli import _COMMANDS, _load, main, parse_command
from leanrl.errors import ConfigError
from leanrl.eval.cli import EvalCommand


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("path", sorted(_COMMANDS))
def test_help_is_short_and_help_all_is_complete(
    capsys: pytest.CaptureFixture[str], path: str
) -> None:
    code, short, _ = run(capsys, *path.split(), "--help")
    assert code == 0 and short.startswith(f"usage: leanrl {path}")
    assert len(short.splitlines()) <= 70, (
        f"`leanrl {path} --help` is {len(short.splitlines())} lines"
    )
    with pytest.raises(SystemExit) as e:  # argparse's full help exits 0
        main([*path.split(), "--help-all"])
    full = capsys.readouterr().out
    assert e.value.code == 0
    cls = _load(_COMMANDS[path])
    if any(
        isinstance(f.annotation, type) and f.annotation.__name__.endswith("Config")
        for f in cls.model_fields.values()
    ):
        assert len(full.splitlines()) > len(short.splitlines())
    # every flag the short help shows is one the command takes
    for flag in mentioned_flags(short):
        name = flag.rstrip("*").rstrip(".").replace("_", "-")
        assert name in command_flags(cls) | {"env", "k"}, flag


def test_eval_help_shows_the_common_flags_and_points_at_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, text, _ = run(capsys, "eval", "--help")
    for flag in (
        "--env ID",
        "--model",
        "--samples",
        "--k",
        "--out",
        "--sampling.temperature",
        "--env.harness.prompt-format",
        "--limit",
        "--config",
    ):
        assert flag in text, flag
    assert "--help-all" in text and "--env.*" in text
    assert "--env.runtime.docker.pool.max-uses" not in text  # that one is for --help-all


@pytest.mark.parametrize("path", sorted(_COMMANDS))
def test_every_flag_a_help_text_names_exists(path: str) -> None:
    """`serve` once said "written to --port-file" with no such flag: every `--flag` that a
    command's docstring or its own options' docs mention must be one it accepts (any spelling).
    (Nested sections also document other programs' flags, such as `docker run --cpus`.)"""
    cls = _load(_COMMANDS[path])
    flags = command_flags(cls) | {"env", "k"}
    texts = [cls.__doc__ or ""] + [f.description or "" for f in cls.model_fields.values()]
    missing = set()
    for text in texts:
        for flag in mentioned_flags(text):
            kebab = flag.replace("_", "-")
            if kebab not in flags and not any(f.startswith(kebab + ".") for f in flags):
                missing.add(flag)
    assert not missing, f"`leanrl {path}` help mentions flags it does not take: {sorted(missing)}"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import leanrl

    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith(f"leanrl {leanrl.__version__} (")
    assert "warning" not in out  # this checkout is installed as itself


def test_kebab_and_snake_case_flags_mean_the_same() -> None:
    snake = parse_command(
        EvalCommand, ["--print_json", "--env.taskset.hub_id", "a/b", "--sampling.max_tokens", "9"]
    )
    kebab = parse_command(
        EvalCommand, ["--print-json", "--env.taskset.hub-id", "a/b", "--sampling.max-tokens", "9"]
    )
    assert snake == kebab
    assert kebab.print_json and kebab.env.taskset.hub_id == "a/b" and kebab.sampling.max_tokens == 9
    negated = parse_command(EvalCommand, ["--no-progress"])
    assert negated.progress is False and parse_command(EvalCommand, ["--no_progress"]) == negated


def test_unknown_flag_suggests_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "eval", "--sampels", "3")
    assert code == 2
    assert "unrecognized arguments: --sampels" in err and "did you mean --samples" in err
    assert len(err.splitlines()) <= 4
    _, _, err = run(capsys, "eval", "--env.harness.max_turn", "3")
    assert "did you mean --env.harness.max-turns" in err


def test_a_value_given_to_a_switch_says_how_to_write_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--progress", "false"], ["--progress=false"], ["--no-progress", "true"]):
        code, _, err = run(capsys, "eval", *argv)
        assert code == 2, argv
        assert "is a switch and takes no value: write --progress or --no-progress" in err, err


def test_k_below_one_says_so() -> None:
    from leanrl.eval.config import EvalConfig

    with pytest.raises(ConfigError, match=r"k of at least 1") as e:
        EvalConfig(env={"id": "countdown"}, k=[0]).check()  # type: ignore[arg-type]
    assert "Raise --samples" not in str(e.value)


def test_unknown_command_suggests_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "evl")
    assert code == 2 and "did you mean `leanrl eval`" in err
    _, _, err = run(capsys, "train", "gpro")
    assert "did you mean `leanrl train grpo`" in err


def test_missing_argument_is_a_short_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "verify")
    assert code == 2 and out == ""
    assert "required: PROOFS" in err and "leanrl verify --help" in err
    assert len(err.splitlines()) <= 3, err


def test_a_group_alone_lists_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "train")
    assert code == 2 and "train grpo" in err and "train es" in err


def test_short_help_of_a_command_without_cli_common_lists_every_top_level_option() -> None:
    from leanrl.lean.commands import DoctorCommand

    text = short_help("doctor", DoctorCommand)
    assert "--print-json" in text and "--smoke / --no-smoke" in text and "--env ID" in text
