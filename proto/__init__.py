"""hushnet's wire contract: versioned ``.proto`` files and the Python code generated from them.

The generated modules are committed (``proto/hushnet/v1/*_pb2*.py``) so a clone imports them
without running ``protoc``; ``tests/network/test_proto_fresh.py`` regenerates them into a
temporary directory and fails when the committed copies are stale. Regenerate with
``python -m proto.codegen``.
"""
