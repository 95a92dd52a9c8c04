"""The script of ``beam_dpsu.warm_workers`` (``warm_worker.py``, run by path); no API."""
