"""One run, parent side: run directory, resolved config, control store, ranks, faults, relaunches, row.

``run_one`` always leaves a results row (status ok or failed) and returns it. The strategy's spec
(``harness.strategies``) says what the parent sets up for it and when it relaunches the ranks; the
fault's spec (``harness.faults``) says whether the ranks run in network namespaces and what the parent
does when a rank asks for the fault.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.contract import write_spec
from harness.parent.launcher import LOG_DIR, Launcher, LaunchPlan, Outcome
from harness.parent.memory_plan import MemoryPlan
from harness.parent.progress import Progress
from harness.report import results
from harness.schema import RunConfig, to_dict


def new_run_id(run_dir: Path) -> str:
    return f"{run_dir.name}-{secrets.token_hex(3)}"


def write_resolved_config(run_dir: Path, run: RunConfig) -> Path:
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(run))))
    return path


@dataclass
class _Teardown:
    """What the parent learns while it tears a run down, for the row (the ExitStack's callbacks fill it)."""

    notes: list[str] = field(default_factory=list)  # appended to the outcome's reason
    driver: Any = None  # the fault driver: its errors go into the row
    setup: Any = None  # the strategy's parent-side set-up (closed last)
    launcher: Any = None  # the run's Launcher, once started


def run_one(
    run: RunConfig,
    run_dir: Path,
    memory_plan: MemoryPlan | None = None,
    overrides: Sequence[str] = (),
    reference_dir: Path | None = None,
    show_plan: bool = True,
) -> dict[str, Any]:
    """The parent side of one run. Always writes the results row (status ok or failed) and returns it.
    ``show_plan``: print the memory plan (a sweep prints it for its first job only: they share it).

    Parent-side faults are driven by ``harness.faults.driver``; namespace faults run the ranks inside a
    ``NetnsTopology`` (torn down whatever happens). The strategy's spec sets up what its ranks need
    from the parent and decides after a failure whether every rank is relaunched.
    ``reference_dir``: a fault-free run of the same sweep; the row then says whether this run's final
    state is bit-identical to it."""
    from harness.events import EventLog
    from harness.parent import load_guard

    started = time.time()
    run = _resolve_cluster(run)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(run_dir)
    write_resolved_config(run_dir, run)
    spec = write_spec(run_dir, run)
    if memory_plan is not None and show_plan:
        print(memory_plan.table(), flush=True)
    print(
        f"run {run_id}: {run.name}, model={run.model.name}, {run.cluster.world_size} x {run.cluster.backend}"
        f" ranks, strategy={run.strategy.name}, fault={run.fault.kind}\n  run dir: {run_dir}",
        flush=True,
    )
    outcome = Outcome("failed", "harness error before the ranks started")
    relaunches: list[str] = []
    torn = _Teardown()
    load = load_guard.for_run(run).start()  # the host's load before and during the run, into its row
    try:
        # Torn down in reverse order of set-up, whatever happens: progress, fault driver, ranks, a child
        # store, namespaces (or the one-host snapshot root), the parent's events, the strategy's set-up.
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: torn.setup is not None and hasattr(torn.setup, "close") and torn.setup.close())
            parent_events = stack.enter_context(EventLog(run_dir, -1))
            launcher, store_host = _start(run, run_dir, spec, parent_events, stack, torn)
            torn.launcher = launcher
            progress = Progress(run.train.steps, run.cluster.world_size, run.train.log_every, enabled=run.progress)
            stack.callback(progress.close)
            outcome = _follow(run, launcher, progress, parent_events, store_host, relaunches)
    except BaseException as exc:
        outcome = Outcome("failed", f"harness error: {type(exc).__name__}: {exc}")
        raise
    finally:
        outcome.reason += "".join(torn.notes)
        extra = {
            "relaunches": len(relaunches),
            "relaunch_reasons": "; ".join(relaunches),
            "first_launch": getattr(torn.launcher, "first_launch", ""),
            "fault_errors": "; ".join(torn.driver.errors) if torn.driver is not None else "",
            **load.stop(),
        }
        if torn.setup is not None and hasattr(torn.setup, "row_columns"):  # a strategy's own columns (torchft's quorum)
            try:
                extra.update(torn.setup.row_columns())
            except Exception as exc:  # noqa: BLE001 - its columns must never cost the row
                print(
                    f"warning: {run.strategy.name}'s row columns failed: {type(exc).__name__}: {exc}", file=sys.stderr
                )
        row = _finish(run, run_dir, run_id, outcome, started, memory_plan, overrides, extra, reference_dir)
    return row


def _start(
    run: RunConfig, run_dir: Path, spec: Path, parent_events: Any, stack: contextlib.ExitStack, torn: _Teardown
) -> tuple[Launcher, Any]:
    """Where the ranks run, the Launcher configured by one LaunchPlan, the strategy's parent set-up and the
    fault driver; each registered on ``stack`` for teardown. Returns (launcher, the child store host or None)."""
    from harness import strategies
    from harness.events import Replacement
    from harness.faults import planned as planned_faults
    from harness.faults.driver import FaultDriver
    from harness.faults.netns_host import TAG_ENV
    from harness.faults.placement import StoreHome, placement
    from harness.faults.snapshot_roots import remove_job_roots, single_host_snapshot_env
    from harness.parent import template as replacement_template

    strategy = strategies.get(run.strategy.name)
    plan = LaunchPlan(settle_s=strategy.settle_s(run))
    store_host: Any = None  # a control store in a child process, for a fault that kills it
    topology: Any = None
    where = placement(run)  # the same decision validation checked the fault's needs against
    if where.namespaces:
        topology = _start_topology(run)
        stack.callback(_teardown_topology, topology, torn)
        plan.control, plan.rank_env, plan.wrap = topology.control_addr, topology.rank_env, topology.wrap_command
        plan.netns_of, plan.store_set = topology.layout.rank_ns, topology.store_set
        plan.store_netns = topology.layout.bridge_ns  # with the control store: every host reaches it
    elif where.store == StoreHome.child:
        from harness.faults.store_host import ChildStore

        store_host = ChildStore(run.cluster.master_addr)
        stack.callback(store_host.close)
        plan.control, plan.store_set = store_host.addr, store_host.set
    else:
        # Names the snapshot root of a run without namespaces (one host); removed once no rank writes.
        stack.callback(remove_job_roots, single_host_snapshot_env(plan.extra_env, TAG_ENV))
    if strategy.replace_dead is not None:
        policy = strategy.replace_dead
        plan.replace_dead = lambda rank, code, codes: policy(run, rank, code, codes)
        plan.max_replacements = run.strategy.max_restarts
        plan.on_replace = lambda record: parent_events.emit(Replacement, **record)
        plan.hot_spares = run.strategy.hot_spares
        plan.template_wanted = replacement_template.wanted(run)
    launcher = Launcher(run, run_dir, spec, plan)
    stack.callback(launcher.close)
    if plan.control is None:
        launcher.start_control_store()
    if strategy.parent_setup is not None:
        torn.setup = strategies.resolve(strategy.parent_setup)(run, launcher)
    if planned_faults.injects(run):
        torn.driver = FaultDriver(run, run_dir, launcher, parent_events, topology, store_host=store_host)
        stack.callback(torn.driver.close)
        launcher.tick_hooks.append(torn.driver.tick)
    return launcher, store_host


def _follow(
    run: RunConfig, launcher: Launcher, progress: Progress, parent_events: Any, store_host: Any, relaunches: list[str]
) -> Outcome:
    """Start the ranks, follow them, and relaunch them while the strategy's policy says so."""
    from harness import strategies
    from harness.events import Relaunch

    launcher.start_ranks(incarnation=0)
    outcome = launcher.wait(progress)
    while True:
        why = strategies.relaunch_reason(
            run.strategy.name,
            outcome.exit_codes,
            len(relaunches),
            run.strategy.max_restarts,
            outcome.interrupted,
            outcome.failed_rank,
        )
        if why is None:
            return outcome
        relaunches.append(why)
        parent_events.emit(
            Relaunch,
            reason=why,
            incarnation=launcher.incarnation + 1,
            exit_codes={str(k): v for k, v in outcome.exit_codes.items()},
        )
        print(f"  {why}; relaunching every rank (incarnation {launcher.incarnation + 1})", flush=True)
        launcher.kill_all()
        if store_host is not None:  # a killed store host comes back (a new port) for the relaunch
            launcher.control = store_host.ensure_running()
        launcher.start_ranks(incarnation=launcher.incarnation + 1)
        outcome = launcher.wait(progress)


def _teardown_topology(topology: Any, torn: _Teardown) -> None:
    left = topology.teardown()
    if left:
        torn.notes.append(f" (namespace teardown left: {left})")


def _resolve_cluster(run: RunConfig) -> RunConfig:
    """Under cluster.launch=srun, the cluster as the Slurm allocation describes it (master_addr=auto -> its
    first node); every other cluster unchanged."""
    import dataclasses

    from harness.schema import RankLaunch

    if run.cluster.launch != RankLaunch.srun:
        return run
    from harness.slurm_env import resolve_cluster

    return dataclasses.replace(run, cluster=resolve_cluster(run.cluster))


def _start_topology(run: RunConfig) -> Any:
    """Network namespaces for the link faults and for ``cluster.hosts`` > 0 (the multi-host topology,
    built for its fault-free runs too, so a reference runs on the same networks)."""
    from harness.faults.netns import NetnsTopology

    topology = NetnsTopology(world_size=run.cluster.world_size, hosts=run.cluster.hosts or None)
    topology.up()
    return topology


def _finish(
    run: RunConfig,
    run_dir: Path,
    run_id: str,
    outcome: Outcome,
    started: float,
    memory_plan: MemoryPlan | None,
    overrides: Sequence[str],
    extra: dict[str, Any] | None = None,
    reference_dir: Path | None = None,
) -> dict[str, Any]:
    from harness.events import load_events

    # Read once: the row, the goodput report (saved as goodput.json) and the plot all use these.
    events = load_events(run_dir)
    columns: dict[str, Any] = {"failed_rank": outcome.failed_rank, **(extra or {})}
    try:
        columns.update(results.goodput_columns(run, run_dir, extra or {}, reference_dir, events=events))
    except Exception as exc:  # accounting must never cost the row
        print(f"warning: goodput accounting failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    row = results.build_row(
        run,
        run_dir,
        run_id=run_id,
        status=outcome.status,
        reason=outcome.reason,
        wall_s=time.time() - started,
        n_params=memory_plan.n_params if memory_plan else None,
        started_at=started,
        overrides=overrides,
        extra=columns,
        events=events,
    )
    summary = {
        "exit_codes": outcome.exit_codes,
        "log_tail": outcome.log_tail,
        "memory_plan": memory_plan.table() if memory_plan else None,
    }
    results.write_row(run_dir, row, summary)
    index = Path(run.index_path)
    results.append_to_index(index, row)
    try:
        from harness.report import plots_run as plots

        plots.plot_run(run_dir, title=f"{run.name}: {run.model.name}, {run.cluster.world_size} ranks", events=events)
    except Exception as exc:  # a plot must never cost the row
        print(f"warning: plot failed: {exc}", file=sys.stderr)
    if outcome.status == "ok":
        tps = row.get("tokens_per_s")
        print(
            f"done: {row['steps_done']} steps in {row['wall_s']:.1f} s (train {row['train_s'] or 0:.1f} s), "
            f"{tps or 0:,.0f} tokens/s, final loss {row['final_loss']}, state {str(row['state_hash'])[:16]}, "
            f"ranks agree: {row['ranks_agree']}\n  row: {run_dir / results.ROW_FILE}  index: {index}",
            flush=True,
        )
        if row.get("goodput") is not None and row.get("faults"):
            print(
                f"  goodput {row['goodput']:,.0f} tokens/s, {row.get('faults')} fault(s), "
                f"{row.get('relaunches', 0)} relaunch(es), {row.get('replayed_steps')} replayed step(s), "
                f"fallback: {row.get('fallback_reason') or 'no'}, bit-identical: {row.get('bit_identical')}",
                flush=True,
            )
    else:
        print(f"run failed: {outcome.reason}", file=sys.stderr, flush=True)
        if outcome.log_tail:
            print(
                f"last lines of rank {outcome.failed_rank}'s log ({launcher_log(run_dir, outcome.failed_rank)}):",
                file=sys.stderr,
            )
            for line in outcome.log_tail:
                print(f"  | {line}", file=sys.stderr)
    return row


def launcher_log(run_dir: Path, rank: int | None) -> Path:
    return Path(run_dir) / LOG_DIR / f"rank{rank}.log"
