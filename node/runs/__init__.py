"""Runs: signed run specs (:mod:`.spec`), the node driver (:mod:`.driver`), the node's run service
(:mod:`.service`, wired into node processes by :mod:`.host`), accounting (:mod:`.accounting`),
the node's own policy (:mod:`.policy`), the CLI (:mod:`.cli`) and the demo (:mod:`.demo`)."""
