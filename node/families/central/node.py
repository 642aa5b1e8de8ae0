"""Central DP-SGD, node side: the ``run.gradient`` operator command that carries one gradient
request of the operator's aggregator to this node's :class:`~hushnet.families.central.machines.CentralClient`.

Requests travel over the operator's authenticated control channel (the ``Control`` RPC, served only
to callers whose mutual-TLS certificate is an operator certificate of the node's own network CA); the
client machine additionally refuses a request that does not come from the aggregator vertex or replays
an earlier step with other contents; the very request it answered last, asked again (the operator's call
failed in transport, perhaps after the answer left), gets the same reply and no second charge.  The
ledger is charged before the gradient leaves.
"""

from __future__ import annotations

import base64
import json

from hushnet.engine.actions import Fault, Finish, Send
from hushnet.engine.events import MessageArrived
from hushnet.engine.execute import execute
from hushnet.families.central.params import PROTOCOL
from hushnet.runs.driver import NodeEffects, RunDriver, RunRefused


class _GradientEffects(NodeEffects):
    """The node's effects, except that the reply to the aggregator is returned to the operator's call
    (not queued to a peer), a fault stops the batch, and a Finish is refused (a client never finishes)."""

    def __init__(self, driver: RunDriver, aggregator: int) -> None:
        super().__init__(driver)
        self.aggregator = aggregator
        self.reply: bytes | None = None

    def send(self, act: Send) -> None:
        if act.dst == self.aggregator:
            self.reply = act.payload
            self.driver.messages_out += 1
        else:
            super().send(act)

    def fault(self, act: Fault) -> bool:
        super().fault(act)
        return False

    def finish(self, act: Finish) -> None:
        raise RunRefused("protocol-error", "central client emitted Finish")


async def c_gradient(service, payload: bytes) -> bytes:
    """``run.gradient``: the operator's aggregator asks this node for its clipped gradient at one step.

    ``{"run_id", "request_b64"}`` → ``{"reply_b64"}``.  The ledger is charged first; a refused charge
    (budget exhausted) stops the run here and no gradient leaves.
    """
    run, args = service._run(payload)
    if run.spec.protocol != PROTOCOL:
        raise RunRefused(
            "wrong-protocol", f"run {run.run_id} is {run.spec.protocol}, not {PROTOCOL}"
        )
    if run.state in ("finished", "closed", "stopped", "cancelled"):
        raise RunRefused("run-over", f"run {run.run_id} is {run.state} at {run.node_id}")
    try:
        request = base64.b64decode(str(args.get("request_b64", "")), validate=True)
    except ValueError as exc:
        raise RunRefused("malformed", f"request is not base64: {exc}") from None
    if not run.begun:  # not started, or started and its first round still queued: start it now
        run.start()
    run.messages_in += 1
    fx = _GradientEffects(run, aggregator=len(run.ids))
    if not execute(run.machine.handle(MessageArrived(fx.aggregator, request)), fx):
        if fx.faults:
            err = fx.faults[0].error
            raise RunRefused(getattr(err, "code", "protocol-error"), str(err))
        raise RunRefused(
            "budget", f"{run.node_id}: {run.reason}"
        )  # the charge was refused: no gradient left
    reply = fx.reply
    if reply is None:
        raise RunRefused("protocol-error", "the central client produced no gradient reply")
    run.note_progress(int(run.machine.last_step))
    return json.dumps({"node": run.node_id, "reply_b64": base64.b64encode(reply).decode()}).encode()
