"""``python -m riverbed.demo worker NAME --url URL [--ttl N]``: a worker of the control
tour (``riverbed demo control``), started by the tour itself."""

import sys

from riverbed.demo.control import worker_main

if sys.argv[1:2] == ["worker"]:
    sys.exit(worker_main(sys.argv[2:]))
sys.exit("usage: python -m riverbed.demo worker NAME --url URL [--ttl N]")
