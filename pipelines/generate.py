"""Entry point: write synthetic user<TAB>item data (``beam-dpsu generate``).

    python -m pipelines.generate --help
"""
import sys

from beam_dpsu.pipelines import cli

if __name__ == "__main__":
    sys.exit(cli.run_module("generate", sys.argv[1:]))
