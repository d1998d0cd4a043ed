"""The out-of-band control channel and what it is built from.

- channel.py: :class:`ControlChannel` (deadlines, reconnects, the job-token check, the report gather);
- server.py: hosting the control store, and a job's fresh token;
- store_client.py: a TCPStore client call on a worker thread, stopped at the caller's deadline;
- data_plane_store.py: the never-used store prefix each data-plane generation is built on;
- launch_env.py: where the channel's settings come from (the harness, torchrun);
- notice_auth.py: signing and checking death notices with the job token;
- store_loss.py: naming the loss of the control store's host.
"""

from accelpact.control.channel import ControlChannel, ControlConfig
from accelpact.control.server import new_job_token, start_control_server

__all__ = ["ControlChannel", "ControlConfig", "new_job_token", "start_control_server"]
