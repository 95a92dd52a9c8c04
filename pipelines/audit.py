"""Entry point: the empirical privacy auditor (``beam-dpsu audit``).

    python -m pipelines.audit --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("audit", sys.argv[1:]))
