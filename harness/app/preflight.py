"""Check a `python -m harness ARGS` command line before Hydra creates anything.

Composes each job the command would run (command-line sweeps expanded), converts it to the typed
config and validates it against this machine. Every failure becomes a ``ConfigError`` whose text is
one line naming the override that fixes it; Hydra's own multi-line composition errors are
translated here. Runs in the parent only.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Sequence
from enum import Enum

from harness.app import capabilities
from harness.app.config import GROUPS, compose, default_option, group_options, load_catalogue, to_run_config
from harness.app.validate import Catalogue, ConfigError, validate
from harness.machine import probe
from harness.parent.memory_plan import MemoryPlan
from harness.schema import Device

# Command-line switches after which there is nothing to run (help, printing the config, ...).
_NO_RUN_FLAGS = ("help", "hydra_help", "cfg", "info", "shell_completion", "version")
MAX_SWEEP_JOBS_CHECKED = 64


def job_overrides(argv: Sequence[str]) -> tuple[list[list[str]], bool] | None:
    """The override list of every job ``argv`` would run and whether it is a multirun; None if it runs none."""
    from hydra._internal.utils import get_args_parser

    args, _unknown = get_args_parser().parse_known_args(list(argv))
    if any(getattr(args, flag, None) for flag in _NO_RUN_FLAGS):
        return None
    overrides = [o for o in args.overrides if not _key(o).startswith(("hydra.", "hydra/"))]
    swept = _config_sweep(overrides)
    if not args.multirun and swept is None:
        return [overrides], False
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        # An experiment's own sweep (hydra.sweeper.params) first; the command line wins key by key,
        # as in Hydra's basic sweeper.
        parsed = OverridesParser.create().parse_overrides([*(swept or []), *overrides])
    except Exception as exc:
        raise ConfigError(_unparsable(exc, [*(swept or []), *overrides]) or _first_line(exc)) from None
    by_key: dict[str, list[str]] = {}
    for ov in parsed:
        key = ov.get_key_element()
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        by_key[key] = [f"{key}={v}" for v in values]
    axes = list(by_key.values())
    jobs = [list(combo) for combo in itertools.islice(itertools.product(*axes), MAX_SWEEP_JOBS_CHECKED)]
    return jobs, True


def _config_sweep(overrides: Sequence[str]) -> list[str] | None:
    """The sweep an experiment config declares (``hydra.mode: MULTIRUN`` + ``hydra.sweeper.params``)
    as overrides, or None when the composed config is a single run. Composition errors are left to
    the per-job check, which explains them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        cfg = compose([o.input_line for o in parsed if not o.is_sweep_override() and o.input_line], with_hydra=True)
    except Exception:
        return None
    if str(cfg.hydra.get("mode")) != "RunMode.MULTIRUN":
        return None
    return [f"{k}={v}" for k, v in (cfg.hydra.sweeper.get("params") or {}).items()]


def check(argv: Sequence[str]) -> list[MemoryPlan]:
    """Memory plans of every job of ``argv``; ConfigError (one line) on the first bad one."""
    jobs = job_overrides(argv)
    if jobs is None:
        return []
    catalogue = load_catalogue()
    return [check_overrides(overrides, catalogue) for overrides in jobs[0]]


def check_overrides(overrides: Sequence[str], catalogue: Catalogue | None = None) -> MemoryPlan:
    """Compose + type-check + validate one job's overrides."""
    try:
        cfg = compose(overrides)
        run = to_run_config(cfg)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(explain_compose_error(exc, overrides)) from None
    machine = probe(with_gpus=run.cluster.device == Device.cuda)
    memory = validate(run, machine, catalogue or load_catalogue(), overrides)
    capabilities.check_runnable(run)
    return memory


def explain_compose_error(exc: BaseException, overrides: Sequence[str]) -> str:
    """One line for a Hydra/OmegaConf composition error, naming the override that fixes it."""
    text = str(exc)
    missing = re.search(r"Could not find '([^'/]+)/([^']*)'", text)
    if missing:
        group, value = missing.groups()
        options = group_options(group)
        example = default_option(group) or (options[0] if options else "...")
        return f"unknown {group}={value}; available {group} options: {', '.join(options)} (e.g. `{group}={example}`)"
    unparsable = _unparsable(exc, overrides)
    if unparsable:
        return unparsable
    if "interpolation" in text or "Interpolation" in type(exc).__name__:
        given = next((o for o in overrides if "${" in o), None)
        return (
            f"cannot resolve {('`' + given + '`') if given else 'an interpolation'}: {_first_line(exc)}; "
            "give a literal value instead (e.g. `cluster.world_size=2`)"
        )
    no_match = re.search(r"Could not override '([^']+)'\. No match in the defaults list", text)
    if no_match:
        return f"unknown config group '{no_match.group(1)}'; the groups are {', '.join(GROUPS)}"
    cause = exc.__cause__ or exc.__context__
    full_key = getattr(cause, "full_key", None)
    if cause is not None and full_key:
        detail = _first_line(cause)
        given = next((o for o in overrides if _key(o) == full_key.split("[")[0]), full_key)
        if "not in" in detail or type(cause).__name__ == "ConfigAttributeError":
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            wanted = next((o for o in overrides if _key(o).startswith(full_key)), full_key + "=...")
            own = (
                "; each strategy owns its settings: for one strategy of a sweep of several, "
                f"`++per_strategy.<strategy>.{wanted.lstrip('+').split('.', 1)[1]}`"
                if full_key.startswith("strategy.")
                else ""
            )
            return f"unknown key {full_key} in `{given}`; {_known_keys(parent, overrides)}{own}"
        example = _default_value(full_key.split("[")[0], overrides)  # type: ignore[assignment]
        hint = (
            f"; e.g. `{full_key.split('[')[0]}={example}`"
            if example is not None
            else "; give a value of the field's type (see `python -m harness --cfg job`)"
        )
        return f"bad value in `{given}`: {detail}{hint}"
    line = _first_line(exc).replace("To append to your config use", "to add a new key use")
    # Anything else Hydra raises: still one line, and still a way forward.
    return (
        line if "`" in line or " use " in line else f"{line}; check the overrides against `python -m harness --cfg job`"
    )


def _unparsable(exc: BaseException, overrides: Sequence[str]) -> str | None:
    """One line for an override Hydra's grammar rejects (a stray bracket, quote, or a bare key)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in overrides:
        try:
            OverridesParser.create().parse_overrides([o])
        except Exception as err:  # noqa: BLE001 - any grammar error, reported as one line
            detail = _first_line(err).replace("\n", " ")
            if "=" not in o:
                return (
                    f"cannot parse override `{o}`: give it a value as key=value (e.g. `{_key(o) or 'train.steps'}=...`) "
                    "or remove it with ~key"
                )
            return (
                f"cannot parse override `{o}` ({detail}); quote a value with brackets, quotes, spaces or "
                f"other special characters, e.g. `{_key(o) or 'key'}='...'`, or use a plain value"
            )
    return None


def _known_keys(parent: str, overrides: Sequence[str]) -> str:
    others = [o for o in overrides if not _key(o).startswith(parent + ".")] if parent else []
    try:
        node = compose(others)
        for part in parent.split(".") if parent else []:
            node = node[part]
        return f"valid keys{' of ' + parent if parent else ''}: {', '.join(k for k in node.keys())}"  # type: ignore[misc]
    except Exception:
        return "check the spelling against conf/"


def _default_value(key: str, overrides: Sequence[str]) -> object | None:
    others = [o for o in overrides if _key(o) != key]
    try:
        node = compose(others)
        for part in key.split("."):
            node = node[part]
        # An enum field: the value a user types (`template`), not the member's repr (`ReplacementStart.template`).
        return node.value if isinstance(node, Enum) else node
    except Exception:
        return None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


VALIDATE_ONLY_FLAG = "--validate-only"


def validate_only(argv: Sequence[str], out=None, err=None) -> int:
    """``python -m harness --validate-only ARGS``: check every job ``ARGS`` would run, train nothing.

    Prints one ``ok:`` line (0) or one ``error:`` line naming the fix (2, like a rejected run).
    Nothing is created: no Hydra run directory, no process. The same function the CLI calls, so
    tests can fuzz it in-process.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    args = [a for a in argv if a != VALIDATE_ONLY_FLAG]
    try:
        if "experiment=project_scale" in args:  # the cluster-scale simulator has its own keys
            from harness.fleet.config import ScaleConfigError
            from harness.scale.entry import parse  # lazy: PyYAML, numpy

            try:
                parse(args)
            except ScaleConfigError as exc:
                raise ConfigError(_first_line(exc)) from None
            print("ok: experiment=project_scale arguments are valid", file=out)
            return 0
        plans = check(args)
    except ConfigError as exc:
        print(f"error: {_one_line(str(exc))}", file=err)
        return 2
    print(f"ok: {max(1, len(plans))} job(s) valid on this machine", file=out)
    return 0


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
