"""hushnet operator client: steer runs from Python or a Jupyter notebook.

.. code-block:: python

    from hushnet.client import Client
    c = Client("state/")                 # a `hushnet up` state dir (or bootstrap=, ca=, cert=, key=)
    run_id = c.start_run("examples/rw_houses.toml")
    outcome = c.watch(run_id)            # live progress bar (tqdm.auto)
    rep = c.report(run_id); rep.table(); rep.plot_heatmap(); rep.plot_loss_by_distance()
    w = c.model(run_id)                  # or c.result(run_id): values + holder, step, finish record

:class:`AsyncClient` is the same API for ``await`` (inside Jupyter's running loop too).
"""

from hushnet.client.core import AsyncClient, ClientError, RunOutcome, RunRefusedError, RunResult
from hushnet.client.report import RunReport
from hushnet.client.sync import Client

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "RunOutcome",
    "RunRefusedError",
    "RunReport",
    "RunResult",
]
