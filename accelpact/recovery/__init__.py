"""Recovery: the rounds after a communication fault, the commit rule, and the heal of a lost rank.

- rounds.py: :func:`recover`, the rounds (agree, rebuild, prove) run on the guard's data plane;
- context.py: what recovery and the heal get instead of the guard (:class:`StepState` and friends);
- consensus.py: the commit rule, pure logic;
- region_rule.py: the commit rule of a guarded region (``Guard.run`` / ``Guard.finish``), pure logic;
- heal.py, heal_plan.py, heal_wait.py: healing a lost rank in memory (survivors' and replacement's side);
- heal_groups.py: the plan's groups, every survivor's merged (a replacement under HSDP needs groups one survivor lacks);
- rejoin.py, rejoin_mesh.py: a replacement process joining the survivors' next generation, and its DeviceMesh.
"""
