"""Hydra side of the configuration: schema registration, composition, DictConfig -> RunConfig.

Parent process only (it imports Hydra). The dataclasses themselves live in ``harness.schema`` so
rank processes can rebuild the config without Hydra.

Every group YAML starts with ``defaults: [schema, _self_]``: it extends the group's dataclass schema,
so an unknown key or a wrongly typed value fails at composition, naming the key. A strategy's YAML extends
its own ``<name>_schema`` instead: the config class its spec names (``StrategySpec.config``), so
``strategy=torchft`` has torchft's settings and no other strategy has them. ``per_strategy.NAME`` carries a
sweep's settings for one strategy only (:func:`to_run_config` applies it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from harness import strategies
from harness.app.validate import Catalogue
from harness.faults import registry as faults
from harness.schema import (
    CheckpointConfig,
    ClusterConfig,
    ConfigError,
    FaultConfig,
    ModelConfig,
    RunConfig,
    StrategyConfig,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "config"
GROUPS = ("model", "strategy", "fault", "checkpoint", "cluster", "experiment")

_GROUP_SCHEMAS = {
    "model": ModelConfig,
    "strategy": StrategyConfig,
    "fault": FaultConfig,
    "checkpoint": CheckpointConfig,
    "cluster": ClusterConfig,
}


def register_schemas() -> None:
    """Put the dataclass schemas in Hydra's ConfigStore (idempotent), and an option for every registered
    strategy and fault kind that has no YAML file in conf/ (those of plugins, ``harness.plugins``)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for group, schema in _GROUP_SCHEMAS.items():
        cs.store(group=group, name="schema", node=schema)
    for spec in strategies.specs():
        cs.store(group="strategy", name=f"{spec.name}_schema", node=spec.config)
        if not (CONF_DIR / "strategy" / f"{spec.name}.yaml").exists():
            cs.store(group="strategy", name=spec.name, node=spec.config(name=spec.name))
    for kind in faults.kinds():
        if not (CONF_DIR / "fault" / f"{kind}.yaml").exists():
            cs.store(group="fault", name=kind, node=FaultConfig(kind=kind))


def to_run_config(cfg: DictConfig) -> RunConfig:
    """The typed config of a composed DictConfig. Pure: no Hydra runtime state needed.

    The ``hydra`` node (present when composed with ``return_hydra_config=True``) is ignored.
    """
    if "hydra" in cfg:  # leave Hydra's own node out before resolving: it has mandatory fields of its own
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # type: ignore[misc]
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(container, dict)
    strategy = container.get("strategy") or {}
    per_strategy = container.get("per_strategy") or {}
    container["strategy"] = _strategy_node(strategy, per_strategy)
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), container)
    run = OmegaConf.to_object(merged)
    assert isinstance(run, RunConfig)
    return run


def _strategy_node(strategy: dict, per_strategy: dict) -> DictConfig:
    """The strategy's node typed by its own config class, with ``per_strategy[name]`` merged over it. Every
    ``per_strategy`` entry is checked against its strategy's class, so a misspelled key fails in any run."""
    for name, values in per_strategy.items():
        if name not in strategies.names():
            raise ConfigError(
                f"per_strategy.{name}: no strategy is registered under that name; the registered ones: "
                f"{', '.join(strategies.names())}"
            )
        _typed(name, values, f"per_strategy.{name}")
    name = str(strategy.get("name", StrategyConfig.name))
    node = _typed(name, strategy, "strategy")
    if name in per_strategy:
        node = _as_dict(OmegaConf.merge(node, per_strategy[name]))
    return node


def _typed(name: str, values: object, where: str) -> DictConfig:
    """``values`` merged into strategy ``name``'s config class; ConfigError naming the key it does not have."""
    cls = strategies.config_class(name)
    try:
        return _as_dict(OmegaConf.merge(OmegaConf.structured(cls(name=name)), values))
    except (ConfigKeyError, ValidationError) as exc:
        keys = ", ".join(f.name for f in dataclasses.fields(cls) if f.name != "name")
        hint = (
            "; a setting of one strategy in a sweep of several goes under `per_strategy.<strategy>`, e.g. "
            f"`++per_strategy.{name}.<key>=<value>`"
            if where == "strategy"
            else ""
        )
        raise ConfigError(f"{where}: {str(exc).splitlines()[0]} (strategy={name}'s settings: {keys}){hint}") from None


def _as_dict(node: object) -> DictConfig:
    assert isinstance(node, DictConfig)  # merging into a structured config keeps it a mapping
    return node


def group_options(group: str) -> list[str]:
    """Names of the options of a config group: its YAML files, plus registered plugin strategies and
    fault kinds (the `schema` nodes are not options)."""
    names = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    if group == "strategy":
        names |= set(strategies.names())
    elif group == "fault":
        names |= set(faults.kinds())
    return sorted(names)


def default_option(group: str) -> str | None:
    """The option conf/config.yaml's defaults list picks for ``group`` (None if it picks none)."""
    for entry in OmegaConf.load(CONF_DIR / f"{CONFIG_NAME}.yaml").get("defaults", []):  # type: ignore[arg-type]
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


def load_group(group: str) -> dict[str, object]:
    """Every shipped option of a schema'd group, typed, by name (``defaults`` lists ignored).

    Shipped means a YAML in conf/: a plugin's registered fault kind or strategy has none (it is
    configured by overrides), so it is not loaded here."""
    out: dict[str, object] = {}
    for name in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
        schema = strategies.config_class(name) if group == "strategy" else _GROUP_SCHEMAS[group]
        raw = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
        raw.pop("defaults", None)  # type: ignore[call-arg, arg-type]  # a DictConfig
        merged = OmegaConf.merge(OmegaConf.structured(schema), raw)
        out[name] = OmegaConf.to_object(merged)
    return out


def load_catalogue() -> Catalogue:
    """The models and clusters validation may suggest instead of ones that cannot run here."""
    return Catalogue(models=load_group("model"), clusters=load_group("cluster"))  # type: ignore[arg-type]


def compose(overrides: Sequence[str] = (), with_hydra: bool = False) -> DictConfig:
    """Compose conf/ like `python -m harness OVERRIDES` would, without running anything
    (``with_hydra``: keep the ``hydra`` node, e.g. to read an experiment's sweep)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=with_hydra)
