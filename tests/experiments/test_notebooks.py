"""Every notebook under notebooks/ executes on the committed results without a cell raising, and is
committed with its outputs stripped. Parametrised over the glob: a new notebook is picked up as is."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120


def _ids(paths):
    return [p.stem for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks under {ROOT / 'notebooks'}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_committed_without_outputs(path: Path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    dirty = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} carry outputs; strip them "
        f"(jupyter nbconvert --clear-output --inplace {path.relative_to(ROOT)})"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes(path: Path):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    # Run from notebooks/, as Jupyter would; the notebooks resolve results/ themselves.
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}")
