"""Import contracts (pyproject.toml, [tool.importlinter]): layers run one way, no import cycles, the offline
installer is self-contained. Checked with import-linter's ``lint-imports`` of this interpreter's environment;
a broken contract fails the test with import-linter's report, which names each import against the layers.

The second half shows that the checks can fail: the same tool, run on small packages made to break each
kind of contract, reports them broken.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _lint_imports_exe() -> str:
    """The ``lint-imports`` script beside this interpreter (the same venv as tunelab), else the one on PATH."""
    here = Path(sys.executable).parent / "lint-imports"
    found = str(here) if here.exists() else shutil.which("lint-imports")
    if not found:
        pytest.fail("lint-imports not found: install the dev extra (pip install -e '.[dev]'), which has import-linter")
    return found


def lint_imports(cwd: Path, config: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``lint-imports`` in ``cwd`` (on PYTHONPATH, so its packages are found) without the cache."""
    cmd = [_lint_imports_exe(), "--no-cache"] + ([str(config)] if config else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_tunelab_import_contracts_are_kept():
    """Every contract of pyproject.toml holds for the tunelab tree as it is."""
    r = lint_imports(REPO)
    report = r.stdout + r.stderr
    assert r.returncode == 0, f"import contracts broken (see [tool.importlinter] in pyproject.toml):\n{report}"
    assert "0 broken" in report and "BROKEN" not in report, report


def test_tunelab_contract_lists_the_three_contracts():
    """The contracts the test relies on are configured (a config read as empty would pass vacuously)."""
    r = lint_imports(REPO)
    report = r.stdout + r.stderr
    assert "Contracts: 3 kept" in report, report
    for name in ("layers run one way", "no import cycle", "tunelab.offline imports no other tunelab module"):
        assert name in report, report


def _package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def _config(root: Path, text: str) -> Path:
    cfg = root / "contracts.toml"
    cfg.write_text(textwrap.dedent(text))
    return cfg


def _toy_report(tmp_path: Path, files: dict[str, str], contract: str) -> str:
    """Run lint-imports on the package ``files`` (``toypkg``) with one ``contract`` (TOML lines of a
    ``[[tool.importlinter.contracts]]`` table); assert it is reported broken and return the report."""
    _package(tmp_path, files)
    cfg = _config(tmp_path, '[tool.importlinter]\nroot_packages = ["toypkg"]\n[[tool.importlinter.contracts]]\n'
                  + textwrap.dedent(contract))
    r = lint_imports(tmp_path, cfg)
    report = r.stdout + r.stderr
    assert r.returncode != 0 and "BROKEN" in report, report
    return report


def test_an_import_against_the_layers_is_reported_broken(tmp_path):
    """A low layer importing a high one breaks the layers contract, and the report names the import."""
    report = _toy_report(tmp_path, {
        "toypkg/__init__.py": "",
        "toypkg/high.py": "import toypkg.low\n",
        "toypkg/low.py": "import toypkg.high  # against the layers\n",
    }, """
        name = "toy layers"
        type = "layers"
        containers = ["toypkg"]
        layers = ["high", "low"]
        """)
    assert "toypkg.low -> toypkg.high" in report, report


def test_tunelab_with_its_layers_inverted_is_reported_broken(tmp_path):
    """The real tree against the real layer list turned upside down: import-linter reports it broken (the
    contract is not vacuous: tunelab's layers really do import downwards)."""
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in cfg["contracts"] if c["type"] == "layers")["layers"]
    inverted = ", ".join(f'"{x}"' for x in reversed(layers))
    cfg_path = _config(tmp_path, f"""
        [tool.importlinter]
        root_packages = ["tunelab"]
        [[tool.importlinter.contracts]]
        name = "inverted"
        type = "layers"
        containers = ["tunelab"]
        layers = [{inverted}]
        """)
    r = lint_imports(REPO, cfg_path)
    report = r.stdout + r.stderr
    assert r.returncode != 0 and "BROKEN" in report, report
    assert "tunelab.flows" in report and "tunelab.cli" in report, report


def test_an_import_cycle_is_reported_broken(tmp_path):
    """Two sibling modules importing each other break the acyclic_siblings contract."""
    report = _toy_report(tmp_path, {
        "toypkg/__init__.py": "",
        "toypkg/sub/__init__.py": "",
        "toypkg/sub/a.py": "from toypkg.sub import b\n",
        "toypkg/sub/b.py": "def f():\n    from toypkg.sub import a  # a lazy import is a cycle all the same\n",
    }, """
        name = "toy acyclic"
        type = "acyclic_siblings"
        ancestors = ["toypkg"]
        """)
    assert "No cycles are allowed in toypkg.sub" in report and ".b -> .a" in report, report


def test_a_module_without_a_layer_is_reported_broken(tmp_path):
    """With ``exhaustive = true`` a new module that no layer names breaks the contract (it must be placed)."""
    report = _toy_report(tmp_path, {
        "toypkg/__init__.py": "",
        "toypkg/high.py": "",
        "toypkg/low.py": "",
        "toypkg/newcomer.py": "",
    }, """
        name = "toy exhaustive"
        type = "layers"
        containers = ["toypkg"]
        exhaustive = true
        layers = ["high", "low"]
        """)
    assert "toypkg.newcomer" in report, report
