"""Entry point: compare mechanisms on your data (the output is NOT private) (``beam-dpsu compare``).

    python -m pipelines.compare --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("compare", sys.argv[1:]))
