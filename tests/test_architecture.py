"""The shape of the package: three layers, Beam's public API only, one path per name."""
import ast
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "beam_dpsu"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def test_the_core_imports_without_beam():
    core = [name for name, _ in _modules() if name.startswith("beam_dpsu.dp")]
    code = ("import importlib, sys\n"
            f"for name in {core!r}:\n"
            "    importlib.import_module(name)\n"
            "print('apache_beam' in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith('apache_beam'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False"), out.stdout


@pytest.mark.subprocess
def test_the_import_contract_holds():
    lint = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([lint, "--config", str(ROOT / "setup.cfg")], capture_output=True,
                         text=True, cwd=str(ROOT), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


#: What a library must not do to a user's interpreter or to Beam (the multi-process
#: DirectRunner is a testing tool; nothing here patches a process, Beam or CPython).
FORBIDDEN = [
    (r"\bos\._exit\b", "os._exit"),
    (r"\batexit\._run_exitfuncs\b", "atexit._run_exitfuncs"),
    (r"\bthreading\._shutdown\b", "threading._shutdown"),
    (r"\bsdk_worker_main\b", "Beam's sdk_worker_main"),
    (r"\bsitecustomize\b", "sitecustomize"),
    (r"sys\.modules\[[^\]]*\]\s*=", "sys.modules[...] ="),
]


def _sources():
    for path in sorted(list(PACKAGE.rglob("*.py")) + list((ROOT / "pipelines").rglob("*.py"))):
        yield path, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("pattern,what", FORBIDDEN, ids=[w for _, w in FORBIDDEN])
def test_no_process_or_interpreter_tricks(pattern, what):
    hits = [f"{p.relative_to(ROOT)}:{i}" for p, text in _sources()
            for i, line in enumerate(text.splitlines(), 1) if re.search(pattern, line)]
    assert not hits, f"{what} in {hits}"


def test_no_module_level_getattr():
    hits = [str(p.relative_to(ROOT)) for p, text in _sources()
            if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                   for n in ast.parse(text).body)]
    assert not hits


def test_every_public_module_declares_its_api():
    missing = []
    for name, path in _modules():
        if any(part.startswith("_") for part in name.split(".")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        declared = None
        for node in tree.body:
            if (isinstance(node, (ast.Assign, ast.AnnAssign))
                    and any(getattr(t, "id", None) == "__all__"
                            for t in (node.targets if isinstance(node, ast.Assign)
                                      else [node.target]))):
                declared = ast.literal_eval(node.value)
        if declared is None:
            if path.name != "__init__.py":
                missing.append(name)
            continue
        module = __import__(name, fromlist=["_"])
        undefined = [n for n in declared if not hasattr(module, n)]
        assert not undefined, f"{name}.__all__ names {undefined}, which it does not define"
    assert not missing, f"modules without __all__: {missing}"


def test_one_home_per_public_name():
    # A public name is defined in one module and re-exported by its package's
    # __init__ at most: no module re-exports another module's names in its __all__.
    homes = {}
    for name, path in _modules():
        if path.name == "__init__.py":
            continue
        module = __import__(name, fromlist=["_"])
        for public in getattr(module, "__all__", []):
            obj = getattr(module, public)
            if isinstance(obj, (type, types.FunctionType)):
                assert obj.__module__ == name, (
                    f"{name}.__all__ re-exports {public} from {obj.__module__}")
                homes.setdefault(public, []).append(name)
    library = ("beam_dpsu.dp", "beam_dpsu.transforms")  # commands each have their own main
    twice = {n: m for n, m in homes.items()
             if len([x for x in m if x.startswith(library)]) > 1}
    assert not twice, f"public names defined in several modules: {twice}"
