"""The README's Python examples run as written."""
import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_examples_run_and_release_the_common_words():
    # "the" and "of" have weight 500/√3 ≈ 289 against T ≈ 37, σ ≈ 5.6 (never missed);
    # a rare word (weight 1/√3) is released with probability 3.8e-11, so the
    # false-failure probability of the last assertion is 500 × 3.8e-11 < 2e-8.
    blocks = python_blocks()
    assert len(blocks) >= 2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = {}
        for block in blocks:
            exec(compile(block, str(README), "exec"), namespace)
    printed = out.getvalue().split()
    assert "the" in printed and "of" in printed
    assert not any(w.startswith("rare") for w in printed)
