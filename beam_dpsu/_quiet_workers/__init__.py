"""Start-up hook for quiet Beam worker processes (see sitecustomize.py); no API."""
