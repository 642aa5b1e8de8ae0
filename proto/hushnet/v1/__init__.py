"""Version 1 of the hushnet wire contract (``package hushnet.v1``).

``envelope_pb2`` holds the opaque protocol envelope, ``bootstrap_pb2``/``bootstrap_pb2_grpc``
the admission service, ``peer_pb2``/``peer_pb2_grpc`` the node-to-node service.
"""
