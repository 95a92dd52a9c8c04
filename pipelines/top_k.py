"""Entry point: differentially private top-k items (``beam-dpsu top-k``).

    python -m pipelines.top_k --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("top_k", sys.argv[1:]))
