"""In-process driver: an in-memory transport and a virtual clock for thousands of machines."""

from hushnet.sim.simulator import SimResult, Simulator

__all__ = ["SimResult", "Simulator"]
