"""mkdocs hook: the figures the docs pages show live in ``figures/`` at the repository root
(where ``cwlens figures`` writes them), not in ``docs/``. A page links them as
``../figures/<name>.png``, which also renders on GitHub; this hook puts every figure into
the site as ``figures/<name>.png`` and resolves those links, so ``mkdocs build --strict``
checks them like any other link."""

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
