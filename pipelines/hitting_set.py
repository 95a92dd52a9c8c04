"""Entry point: differentially private k-hitting set (``beam-dpsu hitting-set``).

    python -m pipelines.hitting_set --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("hitting_set", sys.argv[1:]))
