"""The demos, above every engine package (``riverbed demo WHICH``).

- :mod:`riverbed.demo.stream`: the main job (``make demo``) — a stream aggregation
  through a SIGKILL, against pandas;
- :mod:`riverbed.demo.jobs`: the jobs pipeline through a worker's and an orchestrator's
  crash;
- :mod:`riverbed.demo.timerange`: a time-range job resumed after a SIGKILL, against one
  pass;
- :mod:`riverbed.demo.control`: the control plane's election and fencing with real
  processes;
- :mod:`riverbed.demo.cluster`: the stream and the jobs on the test bed's hosts through
  a lost host and a partition.
"""
