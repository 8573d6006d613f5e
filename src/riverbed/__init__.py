"""riverbed: resilient, stateful stream aggregation and recurring data jobs on Spark.

The packages (see docs/architecture.md):

* :mod:`riverbed.control` — leases, transactions, watches, locks, elections, membership
  on SQLite (embedded), etcd (clusters) or memory (tests);
* :mod:`riverbed.spark`   — the one place that builds SparkSessions;
* :mod:`riverbed.config`  — where things live (``RIVERBED_HOME``, URLs);
* :mod:`riverbed.errors`  — the exception hierarchy.
"""

from __future__ import annotations

from riverbed.config import Config, SparkConfig, load_config
from riverbed.errors import ConfigError, RiverbedError

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "RiverbedError", "SparkConfig", "__version__", "load_config"]
