"""Says what went wrong from every rank's flight record file (the analyzer:
:mod:`ringcomm.observe.diagnosis`)::

    python -m ringcomm.trace /tmp/ringcomm-trace
"""
import sys

from .observe.diagnosis import main

if __name__ == "__main__":
    sys.exit(main())
