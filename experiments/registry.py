"""The experiment registry: every experiment once, with what reproduce runs and what the results show.

``experiments.reproduce`` runs the entries in registry order; ``experiments.readme_results`` renders
their sections of results/README.md, and one digest line each in README.md, in ``README_ORDER``. An
entry may name a module that does not exist yet: reproduce skips it with a message. Pure data
(standard library only): listing the experiments must not import torch or the harness.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Section", "Experiment", "REGISTRY", "README_ORDER", "SECTIONS"]


@dataclass(frozen=True)
class Section:
    """How results/README.md shows one experiment's results (copied from ``results/<name>/table.md``)."""

    name: str  # results/<name>/
    title: str
    intro: str  # what the experiment runs; no measured figures here (they would go stale)
    tables: tuple[int, ...] = (0,)  # which markdown tables of table.md to copy, in order
    plot: str = ""  # a PNG in results/<name>/ to show
    paragraphs: tuple[str, ...] = ()  # "## heading" prefixes in table.md whose first paragraph to quote
    # The row of the first table that README.md's digest quotes, named by its leading cells (a name, not an
    # index, so that a row added above it does not change what the digest says); empty: the first row.
    digest_row: tuple[str, ...] = ()
    # The columns of that row the digest quotes, by header name; empty: the first four.
    digest_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Experiment:
    """One experiment: its module, the paper claim it answers, its budget and its README section."""

    name: str  # also its results/<name>/ directory
    module: str  # importable module with main(argv: list[str] | None) -> int
    # What its committed results show, with the numbers: ``check`` ("module:function" of
    # experiments.claim_checks) fails a test when the table stops supporting it.
    claim: str
    budget_min: float  # minutes of the committed full run (its provenance's runtime), 2 CPU cores
    full_args: tuple[str, ...] = ()  # main()'s arguments for the full run (the quick run gets --quick)
    title: str = ""  # README section title; empty: the experiment has no README section
    intro: str = ""
    tables: tuple[int, ...] = (0,)
    plot: str = ""
    paragraphs: tuple[str, ...] = ()
    digest_row: tuple[str, ...] = ()
    digest_columns: tuple[str, ...] = ()
    check: str = ""  # "module:function" that returns the problems of ``claim`` against results/<name>/
    paper: str = ""  # the paper's figure the experiment answers (context, not a claim of ours)

    @property
    def section(self) -> Section:
        """This experiment's section of results/README.md and its line in README.md's digest."""
        return Section(
            self.name,
            self.title,
            self.intro,
            self.tables,
            self.plot,
            self.paragraphs,
            self.digest_row,
            self.digest_columns,
        )


REGISTRY: tuple[Experiment, ...] = (
    Experiment(
        "goodput_vs_age",
        "experiments.goodput_vs_age",
        "measured whole-run gain over 5 trials with a 2% minimum effect: AccelPact (rebinding, no per-step "
        "snapshots) better than cold restart and than NVRx at every checkpoint age 0-18",
        13,
        title="Whole-run goodput vs checkpoint age",
        intro="mistral_tiny on 2 gloo ranks, one socket reset on rank 0 during a backward reduce-scatter when "
        "the newest checkpoint is 0-18 steps old; AccelPact, cold restart and NVRx checkpoint restoration, "
        "each against a fault-free reference. Paper: Mistral-7B on 16 GPUs. The verdicts give the restart "
        "cost over step time (R/s) of both setups, which decides how large any such gain can be.",
        tables=(0, 1),
        plot="goodput_vs_age.png",
        check="experiments.claim_checks:check_goodput_vs_age",
        paper="1.197x over cold restart and 1.194x over NVRx at age 5, 1.698x over restart at 18 (Mistral-7B, 16 GPUs)",
    ),
    Experiment(
        "process_loss",
        "experiments.process_loss",
        "a killed rank or a lost host heals in memory (own snapshot or the buddy's replica): no disk read, 0 steps "
        "replayed, bit-identical; measured whole-run gain over 5 trials better than cold restart (1.51-1.84) and "
        "NVRx (1.54-1.86) in all 8 cells, with per-step snapshots and pushes costing +13.1% [+11.6, +19.5] step "
        "time side by side (5 pairs)",
        28,
        title="Losing a process or a host: heal in memory vs restart from disk",
        intro="Two simulated hosts (network namespaces, one gloo rank each, mistral_tiny), rank 1 SIGKILLed (`kill`) "
        "or its whole host lost with its shared memory (`host_loss`) at checkpoint ages 5 and 18, 5 "
        "interleaved trials; AccelPact with its heal (`accelpact_heal`: the own snapshot, or the buddy's "
        "replica) against cold restart and NVRx checkpoint restoration, each against the fault-free "
        "reference; then per-step snapshots on vs off in 5 alternated pairs, for the tax every productive "
        "step pays and the shared memory each rank's snapshots take. Needs root (namespaces).",
        tables=(1, 2),
        plot="goodput.png",
        check="experiments.claim_checks:check_process_loss",
    ),
    Experiment(
        "peers",
        "experiments.peers",
        "every strategy on HSDP 2x2 at world 4, measured whole-run gain (5 trials, 2% minimum effect): AccelPact "
        "with its heal better than cold restart in all 4 cells and than NVRx in 3 (within noise after a socket "
        "reset at age 5); against torchft within noise in 3 cells and worse after a kill at age 18",
        42,
        title="Against the peers: torchft, GEMINI, NVRx, cold restart",
        intro="mistral_tiny (2 layers) on 4 gloo ranks as HSDP 2x2 for every strategy (torchft's replica groups "
        "are the replicate dimension, FSDP2 inside each), a socket reset or a SIGKILL of rank 1 at checkpoint "
        "ages 5 and 18; every strategy in each of 5 interleaved trials, each trial with its own fault-free "
        "reference (`experiment=peers`). Each strategy at its own default heartbeat and timeouts, every "
        "replacement a fresh interpreter. AccelPact runs with its heal (`accelpact_heal`: per-step snapshots "
        "and buddy pushes), which the kill cells need and the socket-reset cells pay for. Per cell: "
        "AccelPact's measured whole-run gain over the peer with its interval over trials and the verdict, "
        "the badput-based gain as a diagnostic. GEMINI runs where its extra (lm-resiliency) is installed; "
        "the table says it was not. The table also lists what the runs could not make equal and why a "
        "strategy's steps ran off the reference's pace.",
        plot="goodput_vs_age.png",
        digest_row=("torchft", "5", "kill"),
        digest_columns=("strategy", "age", "fault", "gain_ci", "verdict", "gain_bp_ci"),
        check="experiments.claim_checks:check_peers",
    ),
    Experiment(
        "peers_host_loss",
        "experiments.peers_host_loss",
        "a lost host on HSDP 2x2 at world 4, measured whole-run gain (5 trials, 2% minimum effect): AccelPact with "
        "its heal better than cold restart and NVRx at ages 5 and 18; against torchft within noise at age 5 (4 "
        "trials: one torchft run failed) and worse at age 18",
        27.5,
        title="Against the peers: a lost host",
        intro="The peers matrix's third fault, run apart because it needs hosts: mistral_tiny (2 layers) on 4 gloo "
        "ranks as HSDP 2x2 on 2 hosts, each its own network namespace (`cluster=local_hosts`, root), so each "
        "host holds one whole replica; the host of rank 1 lost (its ranks SIGKILLed, its shared memory "
        "deleted) at checkpoint ages 5 and 18; every strategy in each of 5 interleaved trials, each with its "
        "own fault-free reference. AccelPact's replacements rebuild their replica's shard group and heal "
        "from the buddies' replicas on the other host. One torchft run failed: after its lost group "
        "restarted, the restarted ranks kept exiting with `aten.mm.default got mixed torch.Tensor and "
        "DTensor`, and the run ended; the table counts it as failed and judges that cell on 4 trials.",
        plot="goodput_vs_age.png",
        digest_row=("torchft", "5"),
        digest_columns=("strategy", "age", "gain_ci", "verdict", "gain_bp_ci"),
        check="experiments.claim_checks:check_peers_host_loss",
    ),
    Experiment(
        "rebind_scaling",
        "experiments.rebind_scaling",
        "rebinding FSDP's references takes 11.3-17.0 us (median, slowest rank) at 4-16 ranks and 32 layers",
        10,
        title="Rebinding and recovery scaling",
        intro="Rebinding time (median of 1000 per cell) and end-to-end recovery after detection at world sizes "
        "2-16 and depths 2-32 layers, FSDP2 and FSDP1, on a 32-layer mistral_tiny-width decoder.",
        plot="rebind_vs_world.png",
        check="experiments.claim_checks:check_rebind_scaling",
        paper="reference-rebinding time 0.493-0.518 ms, constant from 4 to 16 ranks",
    ),
    Experiment(
        "bit_identity",
        "experiments.bit_identity",
        "state bit-identical after 10 successive faults, FSDP2 on 4 ranks and FSDP1 on 2 (+ the soak)",
        5.5,
        ("--soak",),
        title="Bit-identity after successive faults",
        intro="10 successive faults of mixed kinds and phases in one run (FSDP2 on 4 ranks, FSDP1 on 2), every "
        "rank's parameters, optimizer state and losses compared with a fault-free run; plus a long soak "
        "with resources tracked per fault (`make reproduce`: 100 faults; the committed one: 1000, made by "
        "`python -m experiments.bit_identity_soak` with its own provenance and growth slopes in table.md).",
        plot="leaks.png",
        paragraphs=("## Soak",),
        check="experiments.claim_checks:check_bit_identity",
        paper="state bit-identical after 10 successive faults",
    ),
    Experiment(
        "ckpt_overhead",
        "experiments.ckpt_overhead",
        "per-update async DCP costs +45.3% step latency here (mid 42M on 2 CPU cores)",
        3,
        title="Checkpoint overhead",
        intro="Step latency, peak host memory and storage traffic with no checkpointing, per-update async DCP, "
        "every-k async and a tuned async baseline, run side by side. The paper's 1.216B decoder does not "
        "fit this machine, so the largest size that fits runs, and each figure is extrapolated with its "
        "scaling rule (labelled EXTRAPOLATION).",
        plot="overhead_by_mode.png",
        check="experiments.claim_checks:check_ckpt_overhead",
        paper="per-update async checkpointing: +656.7% latency, 32.5 GiB host memory, 3.39 TB/hour",
    ),
    Experiment(
        "compile",
        "experiments.compile",
        "torch.compile: no new graph and no recompile across recoveries",
        1,
        title="torch.compile across recoveries",
        intro="Decoder blocks compiled with aot_eager and inductor; dynamo's counters before and after 4 "
        "recoveries, and the state against a compiled fault-free reference.",
        check="experiments.claim_checks:check_compile",
        paper="no graph breaks or recompiles across recoveries",
    ),
    Experiment(
        "mixed_faults/steps60",
        "experiments.mixed_faults",
        "over one seeded trace of Llama 3's failure mix (60 steps, 4 faults: a link down, two host losses, a "
        "hang), AccelPact's heal gives back more whole-run goodput than cold restart, NVRx, torchft and GEMINI, "
        "each at the advisor's settings, outside the minimum effect, and ends bit-identical",
        78,
        full_args=("--steps", "60", "--faults", "2", "--trials", "5", "--out", "results/mixed_faults/steps60"),
        title="A day of faults, compressed: every strategy over one seeded trace",
        intro="A seeded trace drawn from Llama 3's published failure mix, mapped to the harness's faults (the "
        "mapping and the rate scale are in the table), the same for every strategy and trial; each strategy at "
        "the protection advisor's settings for that trace; measured whole-run goodput with order-statistic "
        "intervals over interleaved trials. A 60-step run, not the full 300-step one.",
        plot="timeline.png",
        digest_row=("`cold_restart`",),
        digest_columns=("strategy", "gain of accelpact_heal [interval]", "verdict", "bit-identical to the reference"),
        check="experiments.claim_checks:check_mixed_faults",
    ),
    Experiment(
        "scale_projection",
        "experiments.scale_projection",
        "simulated ETTR at 1k-100k GPUs: at the largest size torchft's peer heal is ahead of every AccelPact "
        "row built, outside both intervals",
        1,
        title="Goodput at cluster scale (simulator)",
        intro="A failure-mix simulator (harness/scale/, no torch) calibrated on the goodput_vs_age runs (errors with intervals; the engine's replay within 5%) "
        "and, for the in-memory heal of a lost process or host, on the process_loss runs; torchft's row takes "
        "its per-failure costs from measured torchft runs and the torch 2.15 reconfigure row from "
        "results/reconfigure. Every strategy at 1k-100k GPUs with Llama 3's failure mix, each at its best "
        "checkpoint interval, beside the published ETTR anchors; two rows are designs, not built, and say so. "
        "The full table states the 100k-GPU winner and by how much.",
        tables=(3,),
        plot="ettr_vs_gpus.png",
        digest_row=("16,384", "accelpact"),
        check="experiments.claim_checks:check_scale_projection",
    ),
)

# The README tells the story in its own order: the headline gain, its cost side, then the mechanism.
README_ORDER: tuple[str, ...] = (
    "goodput_vs_age",
    "peers",
    "peers_host_loss",
    "process_loss",
    "mixed_faults/steps60",
    "ckpt_overhead",
    "rebind_scaling",
    "bit_identity",
    "compile",
    "scale_projection",
)
_BY_NAME = {e.name: e for e in REGISTRY}
SECTIONS: tuple[Section, ...] = tuple(_BY_NAME[n].section for n in README_ORDER if _BY_NAME[n].title)
