"""``python -m leanrl.service``: the same as ``leanrl serve``, without loading the other commands.

Sandboxes start the service this way: it needs only what ``leanrl serve`` needs (no torch, no
transformers), whatever other commands the installed leanrl has.
"""

from __future__ import annotations

import sys

from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict, SettingsError

from leanrl.cli import _SETTINGS, normalize_argv
from leanrl.errors import LeanrlError
from leanrl.service.cli import ServeCommand


class _ServeApp(ServeCommand, BaseSettings):
    model_config = SettingsConfigDict(  # type: ignore[typeddict-item]
        **{
            **_SETTINGS,
            "cli_prog_name": "python -m leanrl.service",
            "extra": "forbid",
            "env_prefix": "LEANRL_SERVE_",
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Parse the ``serve`` flags and run the service."""
    try:
        args = normalize_argv(sys.argv[1:] if argv is None else argv)
        CliApp.run(_ServeApp, cli_args=args)
    except SettingsError as e:
        print(f"leanrl serve: error: {str(e).removeprefix('error parsing CLI: ')}", file=sys.stderr)
        return 2
    except LeanrlError as e:
        print(f"leanrl serve: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
