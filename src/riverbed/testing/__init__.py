"""Helpers for riverbed's own tests and benchmarks: real servers on loopback ports.

Not imported by library code. Each server object starts a real process on free
loopback ports in a private temporary directory and always stops it (context
managers; pytest fixtures in ``tests/conftest.py`` wrap them).
"""

from riverbed.testing.icebergrest import IcebergRestServer
from riverbed.testing.kafkaserver import KafkaCluster, KafkaServer
from riverbed.testing.logserver import log_server_process
from riverbed.testing.s3 import CephS3Server
from riverbed.testing.servers import (
    EtcdCluster,
    EtcdServer,
    MariaDBServer,
    PostgresServer,
    free_port,
)

__all__ = [
    "CephS3Server",
    "EtcdCluster",
    "EtcdServer",
    "IcebergRestServer",
    "KafkaCluster",
    "KafkaServer",
    "MariaDBServer",
    "PostgresServer",
    "free_port",
    "log_server_process",
]
