"""What users see of ringcomm: profiler ranges and the log, flight record files and their
analyzer (``python -m ringcomm.trace``), and the traffic counts of ``Communicator.stats``."""
