"""A cluster on one machine: ``cv cluster`` and the tests (``local.py`` ``LocalCluster``),
the daemons as processes with their records and logs (``processes.py``), and which port
each daemon gets (``ports.py``)."""
