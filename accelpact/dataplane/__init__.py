"""The data plane: the guard's process groups, their generations, and every place that caches them.

- plane.py: :class:`DataPlane`, the seam recovery and the heal use (abort, rebuild, prove, rescan);
- registry.py: its implementations by name; rebind.py: today's (new groups under the old names, rebind);
- generations.py: building a group's next generation under its old name on a never-used store prefix;
- bindings.py, references.py: every place FSDP caches a group, the rebind, the completeness check;
- interruptible.py: waiting for the guard's own collectives in a way that can be given up;
- reset.py: FSDP2 / FSDP1 back to a clean between-steps state after a failed step;
- tracebacks.py, heap.py: retiring an old generation (frames that hold it, the heap it leaves);
- process_group.py: ``accelpact.init_process_group``, the default group with the backend configured.
"""
