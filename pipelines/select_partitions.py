"""Entry point: differentially private set union of a user<TAB>item file (``beam-dpsu select``).

    python -m pipelines.select_partitions --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("select_partitions", sys.argv[1:]))
