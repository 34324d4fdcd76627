"""The options of a run over several environments at once: ``envs``, a weighted list.

Its own small module (no torch, no environment loaded): the GRPO and distillation configs hold
one, and configs are imported at CLI start-up. The environments themselves are put together by
:mod:`leanrl.train.multienv`.

On the command line ``--env countdown --env minif2f`` (the flag given more than once) makes a
mixed run with equal weights, and ``--env countdown=3`` gives a weight; in a TOML file a table per
environment::

    [envs.countdown]
    weight = 3
    taskset = { split = "train" }
    eval = { taskset = { split = "test", limit = 50 } }

    [envs.minif2f]
    taskset = { path = "data/minif2f.jsonl", split = "valid" }
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from leanrl.environment import EnvironmentConfig

__all__ = ["MixedEnvConfig", "check_mixed", "mixed_held_out", "parse_envs", "with_held_out"]


class MixedEnvConfig(EnvironmentConfig):
    """One environment of a mixed run: the environment, its share of each step's tasks, and
    its held-out set."""

    name: str = ""
    """The environment's name in the run (metrics ``env/NAME/...``, ``distill.experts``);
    default: its ``id``."""
    weight: float = Field(default=1.0, gt=0.0)
    """Its share of each step's tasks: each task of a step is drawn from environment e with
    probability ``weight_e / Σ weight`` (seeded per step, so a resumed run draws the same)."""
    eval: EnvironmentConfig | None = None
    """Its held-out set for the in-run evaluation (``eval.every``). What it does not name comes
    from this environment (``eval = { taskset = { split = "test" } }``). Unset: the run's
    ``eval.env`` given without an ``id`` is applied to every environment."""

    @model_validator(mode="after")
    def _defaults(self) -> MixedEnvConfig:
        if not self.name:
            self.name = self.id
        if self.eval is not None:
            self.eval = with_held_out(self, self.eval)
        return self


def with_held_out(env: EnvironmentConfig, held: EnvironmentConfig) -> EnvironmentConfig:
    """``held`` with what it does not set taken from ``env`` (its id, taskset source, harness
    and runtime): ``taskset = { split = "test" }`` alone means this environment's test split."""
    if "id" in held.model_fields_set:
        return held
    ts = held.taskset
    src = {k: getattr(env.taskset, k) for k in ("path", "hub_id", "revision", "columns")}
    ts = ts.model_copy(update={k: v for k, v in src.items() if k not in ts.model_fields_set})
    upd: dict[str, Any] = {"id": env.id, "taskset": ts}
    for part in ("harness", "runtime"):
        if part not in held.model_fields_set:
            upd[part] = getattr(env, part)
    new = held.model_copy(update=upd)
    new.model_fields_set.update(upd)
    return new


def _spec(text: str) -> dict[str, Any]:
    """``ID`` or ``ID=WEIGHT`` (the command-line spelling) as a table."""
    env, sep, weight = text.partition("=")
    env = env.strip()
    if not env:
        raise ValueError(f"envs entry {text!r}: expected ID or ID=WEIGHT, e.g. countdown=2")
    out: dict[str, Any] = {"id": env}
    if sep:
        try:
            out["weight"] = float(weight)
        except ValueError:
            raise ValueError(
                f"envs entry {text!r}: the weight after '=' must be a number, e.g. countdown=2"
            ) from None
    return out


def _plain(v: Any) -> Any:
    """A config given in Python as the fields it sets (so the defaulting above sees them)."""
    if isinstance(v, BaseModel):
        return v.model_dump(exclude_unset=True)
    return v


def parse_envs(v: Any) -> Any:
    """``envs`` as given (a TOML table by name, a list of tables, ``ID``/``ID=WEIGHT`` strings,
    or a comma-separated string) as a list of tables, each with its ``name``."""
    if v is None:
        return []
    if isinstance(v, str):
        v = [x for x in v.split(",") if x.strip()]
    if isinstance(v, dict):
        out = []
        for name, body in v.items():
            body = _plain(body)
            if isinstance(body, (int, float)) and not isinstance(body, bool):
                body = {"weight": body}
            if not isinstance(body, dict):
                raise ValueError(f"envs.{name} must be a table (weight, taskset, ...)")
            out.append({"id": name, **body, "name": body.get("name") or name})
        return out
    if isinstance(v, (list, tuple)):
        return [_spec(x) if isinstance(x, str) else _plain(x) for x in v]
    return v


def check_mixed(envs: list[MixedEnvConfig]) -> None:
    """Refuse a mixed run that names an environment twice (``ValueError``, for validators)."""
    seen: set[str] = set()
    for e in envs:
        if e.name in seen:
            raise ValueError(
                f"envs names {e.name!r} twice: give each a name of its own (a TOML table per "
                "name, with id = ... where two share an environment)"
            )
        seen.add(e.name)
    if len(envs) == 1:
        raise ValueError(
            f"envs has one environment ({envs[0].name}): use --env {envs[0].id} for a run on "
            "one environment, or name two or more"
        )


def mixed_held_out(data: Any) -> Any:
    """Raw config input with ``envs`` parsed (:func:`parse_envs`) and, when ``eval.env`` is
    given without an ``id``, that held-out template copied to every environment of ``envs``
    that has no ``eval`` of its own (each then defaults from its environment)."""
    if not isinstance(data, dict) or not data.get("envs"):
        return data
    data = dict(data)
    envs = parse_envs(data["envs"])
    ev = data.get("eval")
    if hasattr(ev, "model_dump"):
        ev = ev.model_dump(exclude_unset=True)
    held: Any = ev.get("env") if isinstance(ev, dict) else None
    if held is not None and hasattr(held, "model_dump"):
        held = held.model_dump(exclude_unset=True)
    if isinstance(held, dict) and "id" not in held and isinstance(envs, list):
        envs = [dict(e, eval=held) if isinstance(e, dict) and "eval" not in e else e for e in envs]
    if isinstance(ev, dict) and ev.get("every") and not held and isinstance(envs, list):
        first = next((e for e in envs if isinstance(e, dict) and e.get("eval") is not None), None)
        if first is not None:  # a placeholder: the after-validator sets the first held-out set
            ev = dict(ev, env={"id": first["id"]})
    data["envs"] = envs
    if ev is not None:
        data["eval"] = ev
    return data
