"""Compiled templates (mlenv.render.templates) render exactly what jinja2 renders, for every shipped template and
cluster file; a template needing more than the runtime implements is rendered by jinja2 itself; a broken cache
file is compiled again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv import state
from mlenv.backends.kubernetes import render as kubernetes_render
from mlenv.backends.slurm import script as slurm_script
from mlenv.config.discover import cluster_names
from mlenv.core.clusters import load_plan
from mlenv.core.registry import get
from mlenv.render import templates
from mlenv.render.templates import Templates, UnsupportedTemplate

ROOT = Path(__file__).resolve().parents[2]
TEMPLATED = ("openshift", "kubernetes", "slurm")


def _requests(name: str) -> Iterator[str]:
    """Every request text and file the backend of cluster ``name`` renders, in both network modes it allows."""
    plan = load_plan(name)
    for mode in ("rdma", "tcp") if plan.cluster.rdma.enabled else ("tcp",):
        request = get(plan.cluster.backend, state.RECORDS).deploy.prepare(load_plan(name, mode))
        yield request.text
        yield from request.extras.values()
        yield from request.files.values()


def _fresh() -> None:
    kubernetes_render._templates.cache_clear()
    slurm_script._templates.cache_clear()


@pytest.mark.parametrize("name", [n for n in cluster_names() if load_plan(n).cluster.backend in TEMPLATED])
def test_compiled_templates_render_what_jinja2_renders(name: str, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("MLENV_CACHE_DIR", str(tmp_path))
    _fresh()
    compiled = list(_requests(name))
    assert list(tmp_path.glob("templates-*.marshal"))  # the compiled path was taken and kept
    monkeypatch.setattr(Templates, "_load", lambda self: self.jinja2_environment())
    _fresh()
    try:
        assert list(_requests(name)) == compiled
    finally:
        _fresh()


def test_a_template_needing_more_is_rendered_by_jinja2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLENV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "loop.j2").write_text("{% for x in items %}{{ loop.index }}={{ x }} {% endfor %}")
    with pytest.raises(UnsupportedTemplate, match=r"LoopContext"):
        Templates(str(tmp_path), str)._compile(["loop.j2"])
    assert Templates(str(tmp_path), str).render("loop.j2", items=["a", "b"]) == "1=a 2=b "


def test_a_broken_cache_file_is_compiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLENV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "t.j2").write_text("{{ a }}-{{ b|join(',') }}{% if c is none %}!{% endif %}")
    # finalize applies to a filter's output too, as in jinja2
    assert Templates(str(tmp_path), repr).render("t.j2", a="x", b=[1, 2], c=None) == "'x'-'1,2'!"
    (cached,) = (tmp_path / "cache").glob("templates-*.marshal")
    cached.write_bytes(cached.read_bytes()[:-5] + b"broke")
    assert Templates(str(tmp_path), repr).render("t.j2", a="y", b=[], c=1) == "'y'-''"
    assert templates._read(str(cached)) is not None  # written again, whole


def test_an_undefined_value_is_an_error_as_with_strict_undefined(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mlenv.errors import OperationError

    monkeypatch.setenv("MLENV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "t.j2").write_text("{{ d.missing }}")
    with pytest.raises(OperationError, match="'missing', which is undefined"):
        Templates(str(tmp_path), str).render("t.j2", d={})
