"""The hushnet bootstrap: certificate authority, membership directory and topology.

It admits nodes (join token → signed certificate naming the node id), keeps a leased
membership list with each node's address, certificate fingerprint and X25519 public key, and
publishes the communication graph with its Metropolis–Hastings weights. It is never in the
data path. See :mod:`hushnet.bootstrap.service`.
"""
