"""mkdocs hooks (mkdocs.yml ``hooks:``).

- ``on_files``: the figures the docs pages show live in ``figures/`` at the repository
  root (where ``cwlens figures`` writes them), not in ``docs/``. A page links them as
  ``../figures/<name>.png``, which also renders on GitHub; this puts every figure into the
  site as ``figures/<name>.png`` and resolves those links, so ``mkdocs build --strict``
  checks them like any other link.
- ``on_page_content``: Sphinx roles in docstrings shown as code.
"""

import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def on_files(files, config):
    for path in sorted(FIGURES.rglob("*.png")):
        rel = path.relative_to(FIGURES).as_posix()
        f = File.generated(config, f"../figures/{rel}", abs_src_path=str(path),
                           inclusion=InclusionLevel.INCLUDED)
        f.dest_uri = f"figures/{rel}"
        files.append(f)
    return files


_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc):<code>(~?)([\w.]+)</code>")


def on_page_content(html, page, config, files):
    """Docstrings cross-reference in Sphinx roles (``:func:`cwlens.stream```), which
    mkdocstrings leaves as text: show them as code (``~a.b.c`` as ``c``)."""
    return _ROLE.sub(lambda m: f"<code>{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}</code>", html)
