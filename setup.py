"""Packaging for beam_dpsu: differentially private set union on Apache Beam."""
from setuptools import find_packages, setup

setup(
    name="beam-dpsu",
    version="0.1.0",
    description=(
        "Composable Apache Beam PTransforms for differentially private set union "
        "(partition selection)."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Only beam_dpsu: the checkout's top-level ``pipelines/`` entry points are not installed.
    packages=find_packages(include=["beam_dpsu", "beam_dpsu.*"]),
    entry_points={
        "console_scripts": ["beam-dpsu=beam_dpsu.pipelines.cli:console"],
        # the true size of Beam's elements for Dask's memory management
        "dask.sizeof": ["beam_dpsu=beam_dpsu.transforms._dask_sizeof:register_beam_sizes"],
    },
    install_requires=[
        "apache-beam>=2.60",
        "numpy>=1.24",
        "scipy>=1.10",
        # Imported directly by the columnar path (dp.data.columnar: Arrow string arrays,
        # dictionary encoding, IPC between stages); apache-beam already depends on it.
        "pyarrow>=14",
        # dp.data.columnar compresses the messages between stages with it, keeping one
        # compressor per thread (Arrow's IPC compression makes a context per buffer);
        # apache-beam already depends on it.
        "zstandard>=0.18",
    ],
    extras_require={
        # pipeline-dp and dp-accounting install beside apache-beam 2.77 / numpy 2 without
        # changing either; the suite runs the PipelineDP example and checks the zCDP
        # conversion against dp-accounting's RDP conversion. dask[distributed]: the suite
        # runs every pipeline on a two-worker Dask cluster. import-linter: the suite checks
        # the layer contract of setup.cfg (pipelines -> transforms -> dp, no Beam in dp)
        # with it rather than with an import walker of our own. mpmath: the calibration
        # tests check thresholds and noise scales against 90-digit computations. pytest
        # below 9.2: its node ids break pytest-xdist 3.8's --dist loadgroup, which then
        # groups nothing (pytest-dev/pytest-xdist#1386; tests/conftest.py fails a test so
        # split).
        "test": ["pytest>=7,<9.2", "import-linter>=2.17", "matplotlib>=3.5", "numba>=0.59", "isal>=1.6",
                 "pipeline-dp>=0.3.1,<0.4", "dp-accounting>=0.4", "dask[distributed]>=2024.1",
                 "mpmath>=1.2", "wheel", "pytest-xdist>=3.5"],
        "dask": ["dask[distributed]>=2024.1"],
        "plots": ["matplotlib>=3.5"],
        # numba: the columnar path's compiled kernels (dp.randomness.compiled); isal: python-isal's
        # gzip reader (dp.data.lines.gzip_reader), the same bytes for about 3.5x less CPU.
        "fast": ["numba>=0.59", "isal>=1.6"],
        # beam_dpsu.transforms.pipelinedp relies on NaiveBudgetAccountant's lazy MechanismSpec
        # (eps/delta filled by compute_budgets()); the upper bound guards that contract.
        "pipelinedp": ["pipeline-dp>=0.3.1,<0.4"],
    },
    license="Apache-2.0",
)
