"""Redis for the end-to-end tests of Redis mode: the processes of
tools/redis_procs.py (shared with the benchmarks)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from redis_procs import EngineProcess, RedisServer, free_port, resp_command  # noqa: E402,F401

__all__ = ["EngineProcess", "RedisServer", "free_port", "resp_command"]
