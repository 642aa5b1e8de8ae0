"""Runs: the operator's signed run spec (:mod:`node.runs.spec`) and, later, the node-side run driver."""
