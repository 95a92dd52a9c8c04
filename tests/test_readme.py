"""The README's Python examples run as written."""
import contextlib
import importlib.util
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
HAS_PIPELINE_DP = importlib.util.find_spec("pipeline_dp") is not None


GUIDE = README.parent / "docs" / "guide.md"


def python_blocks(path=README):
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def needs_pipeline_dp(block: str) -> bool:
    return re.search(r"^\s*import pipeline_dp\b", block, re.M) is not None


def test_readme_examples_run_and_release_the_common_words(tmp_path, monkeypatch):
    # "the" and "of" have weight 500/√3 ≈ 289 against T ≈ 37, σ ≈ 5.6 (never missed);
    # a rare word (weight 1/√3) is released with probability 3.8e-11, so the
    # false-failure probability of the last assertion is 500 × 3.8e-11 < 2e-8.
    # The "Select, then aggregate" block (run only where pipeline-dp is installed,
    # which the test extra does) selects keys with Weighted Gaussian at ε = 1,
    # δ = 1e-9, Δ0 = 3: T ≈ 35.8, σ ≈ 5.61, so "apples" and "pears" (weight
    # 300/√3 ≈ 173) are never missed and each of the 300 rare keys (weight 1/√3) is
    # released with probability Φ̄(6.28) ≈ 1.7e-10: false-failure probability
    # below 5e-8 + 2e-8 < 1e-7 for the whole test. The second block (SelectPartitions,
    # ε = 1, δ = 1e-9, Δ0 = 20: the first block's T and σ) releases a rare word with
    # probability 3.8e-11: 500 × 3.8e-11 < 2e-8 more. The examples write their files in
    # a scratch directory. Each block runs alone, in a namespace of its own.
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 2
    run = [b for b in blocks if HAS_PIPELINE_DP or not needs_pipeline_dp(b)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in run:
            namespace = {}
            exec(compile(block, str(README), "exec"), namespace)
            if needs_pipeline_dp(block):
                pipeline_dp_namespace = namespace
    text = out.getvalue()
    printed = text.split()
    assert "the" in printed and "of" in printed
    assert not any(w.startswith("rare") for w in printed)
    assert "rare" not in text
    if HAS_PIPELINE_DP:
        # The aggregation printed both selected keys; the stated total is the
        # sum of the shares the accountant handed out (basic composition).
        assert "('apples', MetricsTuple(" in text and "('pears', MetricsTuple(" in text
        accountant = pipeline_dp_namespace["accountant"]
        select = pipeline_dp_namespace["select"]
        shares = [(s.eps * s.count, s.delta * s.count) for s in accountant.mechanism_specs]
        assert len(shares) == 3                      # selection, count, sum
        total = (sum(e for e, _ in shares), sum(d for _, d in shares))
        assert total == pytest.approx((2.0, 1e-9), rel=1e-12)
        assert str((2.0, 1e-09)) in text
        g = select.guarantee
        assert (g.epsilon, g.delta) == pytest.approx((1.0, 1e-9), rel=1e-12)


def test_readme_pipeline_dp_block_is_skipped_only_without_pipeline_dp():
    blocks = [b for b in python_blocks() if needs_pipeline_dp(b)]
    assert len(blocks) == 1
    if not HAS_PIPELINE_DP:
        pytest.skip("pipeline-dp is not installed: the README's PipelineDP block was not run")


@pytest.mark.parametrize("path,index", [(README, i) for i in range(len(python_blocks()))] +
                         [(GUIDE, i) for i in range(len(python_blocks(GUIDE)))])
def test_each_example_runs_alone_prints_nothing_from_beam_and_leaves_no_temporary_files(
        tmp_path, path, index):
    # Run as a user runs one: a fresh interpreter, a temporary directory of its own.
    import os
    import subprocess
    import sys
    block = python_blocks(path)[index]
    if needs_pipeline_dp(block) and not HAS_PIPELINE_DP:
        pytest.skip("pipeline-dp is not installed")
    script = tmp_path / "example.py"
    script.write_text(block)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=str(tmp_path), env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    assert os.listdir(temp) == []
    assert proc.stdout.strip()


def test_readme_stays_short():
    # the README is the page a newcomer reads first: what to do, then links
    assert len(README.read_bytes()) <= 8704  # 8.5 KiB


@pytest.mark.slow
@pytest.mark.subprocess
def test_readme_examples_run_in_a_fresh_venv_with_the_extras_it_names(tmp_path):
    # A newcomer's steps: a new virtual environment, `pip install .` (and the extra the
    # PipelineDP block names), then each example alone. Packages come from the
    # machine's pip cache or PyPI, as the README's own commands get them.
    import os
    import subprocess
    import sys
    root = README.parent
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    blocks = python_blocks()
    for extra in ("", "[pipelinedp]"):
        done = subprocess.run(pip + [f"{root}{extra}"], capture_output=True, text=True,
                              timeout=1200, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr[-2000:]
        for index, block in enumerate(blocks):
            if needs_pipeline_dp(block) != bool(extra):
                continue
            script = tmp_path / f"example{index}.py"
            script.write_text(block)
            proc = subprocess.run([str(venv / "bin" / "python"), str(script)],
                                  capture_output=True, text=True, cwd=str(tmp_path),
                                  timeout=600, env={k: v for k, v in os.environ.items()
                                                    if k != "PYTHONPATH"})
            assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
            assert proc.stdout.strip()


def test_ci_runs_the_readmes_test_command():
    # The README's second command is what CI runs: the same install, the same engines (CI
    # sets them up in two processes at once) and the same pytest invocation.
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)\n```", README.read_text(encoding="utf-8"), re.S)
    test_command = next(c for c in commands if "pytest" in c)
    steps = [s.strip() for s in test_command.split("&&")]
    pytest_step = steps[-1]
    installs = [s for s in steps[1:-1] if "setup-engines" not in s]
    assert installs and all(s in ci for s in installs)
    assert pytest_step.endswith(" tests")  # CI adds --durations=15 before the folder
    assert pytest_step[:-len(" tests")] + " --durations=15 tests" in ci
    engines = [s for s in steps if "setup-engines" in s]
    assert engines == [".venv/bin/beam-dpsu setup-engines"]  # every engine
    named = {e for found in re.findall(r"setup-engines ([a-z ]+)", ci) for e in found.split()}
    from beam_dpsu.pipelines.setup_engines import ENGINES
    assert named == set(ENGINES)
