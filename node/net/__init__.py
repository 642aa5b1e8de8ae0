"""The hushnet peer network: mutual-TLS transport between graph neighbours.

Modules: :mod:`.pki` (keys, certificates, credentials), :mod:`.handlers` (protocol handler
and operator-command registries), :mod:`.store` (the node's SQLite state), :mod:`.node`
(the :class:`~hushnet.net.node.Node`), :mod:`.operator` (operator client for status/control),
:mod:`.cluster` (a local cluster of processes on 127.0.0.x), :mod:`.logs` (structured logs).
"""

VERSION = "0.1.0"
