"""Every API a message or a document names can be imported: a newcomer who follows an
error message or a doc line to a dotted name finds it."""
import importlib
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
# dotted names of the package, with or without its name (docs often say dp.randomness.noise.RunKey)
NAME = re.compile(r"\b((?:beam_dpsu|dp|transforms|pipelines)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
LAYERS = ("dp", "transforms", "pipelines")


def _sources():
    for folder, _, files in os.walk(os.path.join(ROOT, "beam_dpsu")):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(folder, f)
    yield os.path.join(ROOT, "README.md")
    for f in os.listdir(os.path.join(ROOT, "docs")):
        if f.endswith(".md"):
            yield os.path.join(ROOT, "docs", f)


def _names():
    found = {}
    for path in _sources():
        text = open(path, encoding="utf-8").read()
        if path.endswith(".py"):  # only what the code says in strings and comments
            text = "\n".join(re.findall(r"(?:\"[^\"\n]*\"|'[^'\n]*'|#.*)", text))
        for m in NAME.finditer(text):
            name = m.group(1).rstrip(".")
            if text[m.end():m.end() + 3] == ".py" or text[max(0, m.start() - 1)] in "/.":
                continue  # a file path (dp/randomness/noise.py), or the tail of a longer name
            if any(part.isupper() for part in name.split(".")):
                continue  # a placeholder: python -m pipelines.NAME
            if name.startswith(LAYERS):
                name = "beam_dpsu." + name
            found.setdefault(name, os.path.relpath(path, ROOT))
    return found


def _resolve(name):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


NAMES = _names()


def test_names_were_found():
    assert "beam_dpsu.transforms.write.WriteRelease" in NAMES
    assert len(NAMES) > 50


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_named_api_imports(name):
    try:
        _resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{NAMES[name]} names {name}, which does not import: {e}")


def _public_api_table():
    text = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()
    table = text.split("## Public API", 1)[1].split("\n\n")[2]
    rows = {}
    for line in table.splitlines()[2:]:
        module, names = line.strip("|").split("|")
        rows[module.strip().strip("`")] = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", names)
    return rows


def test_the_public_api_table_holds_and_covers_the_readme():
    rows = _public_api_table()
    for module, names in rows.items():
        mod = importlib.import_module(module)
        assert names and all(hasattr(mod, n) for n in names), (module, names)
    # every name the README's examples import is in the table: a module of it
    # (from beam_dpsu.transforms import runners) or a public name of a module
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    imports = re.findall(r"^from (beam_dpsu[\w.]*) import ([\w, ]+)$", readme, re.M)
    assert imports
    for module, names in imports:
        for name in (n.strip() for n in names.split(",")):
            assert f"{module}.{name}" in rows or name in rows.get(module, ()), (module, name)
