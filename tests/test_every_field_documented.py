"""Every field of every config model has a docstring (it becomes the --help text)."""

from __future__ import annotations

import importlib
import pkgutil

import pydantic
import pytest

import leanrl


def _config_models() -> set[type[pydantic.BaseModel]]:
    found: set[type[pydantic.BaseModel]] = set()
    for mod in pkgutil.walk_packages(leanrl.__path__, "leanrl."):
        try:
            m = importlib.import_module(mod.name)
        except ImportError:  # optional extras (vllm) are allowed to be missing
            continue
        for obj in vars(m).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, pydantic.BaseModel)
                and obj.__module__ == m.__name__
                and (
                    obj.__name__.endswith(("Config", "Command", "Policy"))
                    or obj.__name__ == "ColumnMap"
                )
            ):
                found.add(obj)
    return found


MODELS = sorted(_config_models(), key=lambda c: f"{c.__module__}.{c.__name__}")


def test_found_the_core_models() -> None:
    names = {m.__name__ for m in MODELS}
    assert {
        "TasksetConfig",
        "HarnessConfig",
        "RuntimeConfig",
        "EnvironmentConfig",
        "PolicyConfig",
        "SamplingConfig",
        "VerificationPolicy",
        "TrainConfig",
    } <= names


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_has_a_docstring(model: type[pydantic.BaseModel]) -> None:
    def ours(name: str) -> bool:  # declared by leanrl (a verifiers base's fields are its own)
        owner = next(c for c in model.__mro__ if name in getattr(c, "__annotations__", {}))
        return owner.__module__.startswith("leanrl")

    undocumented = [
        name
        for name, f in model.model_fields.items()
        if ours(name) and not (f.description or "").strip()
    ]
    assert not undocumented, f"{model.__name__}: fields without a docstring: {undocumented}"
