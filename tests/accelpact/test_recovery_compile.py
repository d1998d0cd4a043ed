"""Recovery with torch.compile'd decoder blocks: no recompiles across 3 recoveries, bit-identical.

Backend: aot_eager (the full AOT autograd path without inductor's C++ codegen, which takes minutes
per graph on this 2-core machine). Process-group names stay stable across generations, so graphs
that reach the mesh keep resolving and dynamo's guards keep passing.
"""

from __future__ import annotations

import pytest

from accelpact.testing.compare import differences
from accelpact.testing.session import run_session

RUNNER = "experiments.workloads.fsdp_scenarios:run"

STEPS = 5


# In the default suite despite ~70 s (aot_eager compiles 2 x 4 blocks x 2 ranks; ~170 s under load):
# it is the runtime's torch.compile acceptance check.
@pytest.mark.slow  # default-suite time (issue 19: CI pytest <= 12 min); torch.compile's first compile dominates
def test_compiled_blocks_no_recompile_across_three_recoveries(tmp_path):
    scenarios = [
        {"name": "ref", "guard": False, "steps": STEPS},
        {
            "name": "faults",
            "steps": STEPS,
            "faults": [
                {"step": 1, "phase": "forward_allgather_middle", "ranks": [0]},
                {"step": 2, "phase": "backward_reduce_scatter", "ranks": [1]},
                {"step": 3, "phase": "vote", "ranks": [0, 1]},
            ],
        },
    ]
    s = run_session(tmp_path, RUNNER, scenarios, settings={"flavour": "fsdp2", "compile": "aot_eager"}, timeout_s=290)
    assert s.returncodes == [0, 0], "\n".join(s.logs)
    assert differences(s, "faults") == []
    for rank in range(2):
        res = s.result("faults", rank)
        assert len(res["events"]) == 3
        warm, end = res["compile_after_warmup"], res["compile_at_end"]
        assert warm.get("stats/unique_graphs", 0) > 0, "the blocks were not compiled at all"
        changed = {
            k: (warm.get(k, 0), v)
            for k, v in end.items()
            if warm.get(k, 0) != v and ("recompil" in k or "unique_graphs" in k or "graph_break" in k)
        }
        assert changed == {}, f"rank {rank}: recompiles / new graphs after recovery: {changed}"
