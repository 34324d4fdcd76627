"""The Modal image of the verification sandbox, defined in code.

It has the same contents as ``runtimes/docker/Dockerfile`` because it is made from the same
pieces: ``install-lean.sh`` (elan, the toolchain, Mathlib, the REPL) and
``requirements-service.txt`` (what ``leanrl serve`` imports), plus leanrl itself. Alternatively
Modal builds the Dockerfile (``image_source = "dockerfile"``) or pulls a pushed image
(``"registry"``). Nothing here contacts Modal: an image is a lazy description until a Sandbox
uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import leanrl.errors
from leanrl._sandbox_config import ModalConfig, image_pins
from leanrl.errors import ConfigError

if TYPE_CHECKING:
    import modal

__all__ = [
    "DOCKER_DIR",
    "ImageRecipe",
    "build_image",
    "image_recipe",
]

DOCKER_DIR = Path(__file__).resolve().parent.parent / "docker"
"""``runtimes/docker``: the Dockerfile, install script and requirements both images use."""
INSTALL_SCRIPT = DOCKER_DIR / "install-lean.sh"
REQUIREMENTS = DOCKER_DIR / "requirements-service.txt"
APT_PACKAGES = ("ca-certificates", "curl", "git", "bubblewrap")
"""System packages: fetching elan/Mathlib, and bubblewrap for ``RuntimeConfig.isolate``."""
PYTHON_VERSION = "3.11"
LEAN_HOME = "/opt/lean"
REMOTE_SRC = "/opt/leanrl-src"
SOURCE_PATHS = (
    "pyproject.toml",
    "README.md",
    "leanrl",
    "environments",
    "harnesses",
    "runtimes",
    "leanrl_verifiers",  # a name only (verifiers' plugin id), listed in pyproject's packages
)
"""What leanrl is built from in a source checkout: the same set the Dockerfile copies (not the
whole checkout, whose runs/, .venv or data would be uploaded and rebuilt on every change)."""


@dataclass(frozen=True)
class ImageRecipe:
    """The steps of the in-code image, as data (so they can be checked without Modal)."""

    python_version: str
    apt_packages: tuple[str, ...]
    local_files: tuple[tuple[Path, str], ...]
    """(file here, path in the image), copied into the image before the commands run."""
    lean_commands: tuple[str, ...]
    """Shell commands that install Lean, Mathlib and the REPL (one cached layer)."""
    requirements: Path
    source: tuple[Path, str]
    """(leanrl source here, path in the image): a source checkout or the installed package."""
    source_paths: tuple[str, ...]
    """The files and folders under ``source`` that go into the image (``.``: all of it)."""
    source_commands: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def _leanrl_source() -> tuple[Path, str, tuple[str, ...], dict[str, str], tuple[str, ...]]:
    # Installed wheel: leanrl/ holds everything (runtimes/, environments/ nested in it), so
    # copying the package and putting it on PYTHONPATH is enough. Source checkout: the built-in
    # folders live beside leanrl/, so copy the checkout and pip-install it (without deps).
    pkg = Path(leanrl.errors.__file__).resolve().parent  # the package folder
    if (pkg / "runtimes").is_dir():
        remote = f"{REMOTE_SRC}/site"
        return pkg, f"{remote}/leanrl", (), {"PYTHONPATH": remote}, (".",)
    root = pkg.parent
    if not (root / "pyproject.toml").is_file():
        raise ConfigError(
            f"cannot find leanrl's source to put in the Modal image (looked at {pkg} and {root})"
        )
    cmds = (f"pip install --no-deps --no-build-isolation {REMOTE_SRC}",)
    return root, REMOTE_SRC, cmds, {}, SOURCE_PATHS


def image_recipe(config: ModalConfig) -> ImageRecipe:
    """The in-code image for ``config`` (toolchain, Mathlib and REPL revisions)."""
    for needed in (INSTALL_SCRIPT, REQUIREMENTS):
        if not needed.is_file():
            raise ConfigError(
                f"{needed} is missing from this leanrl installation; install leanrl from a "
                "source checkout, or use modal.image_source = 'registry' with a pushed image"
            )
    src, remote, src_cmds, src_env, src_paths = _leanrl_source()
    script = "/opt/leanrl/install-lean.sh"
    return ImageRecipe(
        python_version=PYTHON_VERSION,
        apt_packages=APT_PACKAGES,
        local_files=((INSTALL_SCRIPT, script),),
        lean_commands=(
            f"LEAN_HOME={LEAN_HOME} bash {script} "
            + " ".join(image_pins(config.lean_toolchain, config.mathlib_rev, config.repl_rev)),
        ),
        requirements=REQUIREMENTS,
        source=(src, remote),
        source_paths=src_paths,
        source_commands=src_cmds,
        env={
            "PATH": "/opt/elan/bin:/usr/local/bin:/usr/bin:/bin",
            "ELAN_HOME": "/opt/elan",
            "LEANRL_LEAN_PROJECT": f"{LEAN_HOME}/project",
            # The Sandbox is the boundary to the host (see runtimes/docker/Dockerfile).
            "LEANRL_ALLOW_UNSANDBOXED": "1",
            **src_env,
        },
    )


def build_image(config: ModalConfig) -> modal.Image:
    """The ``modal.Image`` the Sandboxes run (lazy: nothing is built or sent here)."""
    import modal

    toolchain, mathlib, repl = image_pins(
        config.lean_toolchain, config.mathlib_rev, config.repl_rev
    )
    args = {"LEAN_TOOLCHAIN": toolchain, "MATHLIB_REV": mathlib, "REPL_REV": repl}
    if config.image_source == "registry":
        if not config.image_ref:
            raise ConfigError(
                "modal.image_source = 'registry' needs modal.image_ref (the pushed image's tag, "
                "built from runtimes/docker/Dockerfile)"
            )
        # The Sandbox gives its own command; the image's ENTRYPOINT must not wrap it.
        return modal.Image.from_registry(config.image_ref).entrypoint([])
    if config.image_source == "dockerfile":
        src = _leanrl_source()[0]
        if not (src / "pyproject.toml").is_file():
            raise ConfigError(
                "modal.image_source = 'dockerfile' needs leanrl as a source checkout (the "
                "Dockerfile's build context); use image_source = 'code' with an installed wheel"
            )
        return modal.Image.from_dockerfile(
            DOCKER_DIR / "Dockerfile", context_dir=src, build_args=args
        ).entrypoint([])
    r = image_recipe(config)
    image = modal.Image.debian_slim(python_version=r.python_version).apt_install(*r.apt_packages)
    for local, remote in r.local_files:
        image = image.add_local_file(local, remote, copy=True)
    # Lean and Mathlib first: they change rarely, so editing leanrl keeps this layer cached.
    image = image.run_commands(*r.lean_commands).pip_install_from_requirements(str(r.requirements))
    src, remote = r.source
    ignore = ["**/.git", "**/__pycache__", "**/.lake", "**/*.egg-info", "**/.venv", "**/build"]
    for sub in r.source_paths:
        here, there = src / sub, f"{remote}/{sub}".removesuffix("/.")
        if here.is_dir():
            image = image.add_local_dir(here, there, copy=True, ignore=ignore)
        elif here.is_file():
            image = image.add_local_file(here, there, copy=True)
    if r.source_commands:
        image = image.run_commands(*r.source_commands)
    return image.env(r.env)
