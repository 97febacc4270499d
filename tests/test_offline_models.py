"""Opt-in offline models: chunked GGUFs are assembled and checked; a missing package is a
clear error that names the install command (no model load needed)."""

import hashlib

import pytest

import cwlens
from cwlens.engine.models import gguf_local
from cwlens.engine.models.registry import OfflineGGUF
from cwlens.errors import ModelNotAvailableError


def _spec(tmp_path, sha):
    return OfflineGGUF(module="pkg", filename="m.gguf", pip="pip install pkg",
                       chunks=(("part_a", "data/m.part00"), ("part_b", "data/m.part01")), sha256=sha)


def test_chunks_are_concatenated_and_checked(tmp_path, monkeypatch):
    for name, body in (("part_a", b"GGUF-head-"), ("part_b", b"tail")):
        (tmp_path / name / "data").mkdir(parents=True)
        (tmp_path / name / "data" / f"m.part0{name == 'part_b':d}").write_bytes(body)
    monkeypatch.setattr(gguf_local, "_package_dir", lambda module: tmp_path / module)
    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNotAvailableError, match="sha256"):
        gguf_local.assemble_chunks(_spec(tmp_path, "0" * 64))
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # no partial file left
    good = hashlib.sha256(b"GGUF-head-tail").hexdigest()
    path = gguf_local.assemble_chunks(_spec(tmp_path, good))
    assert path.read_bytes() == b"GGUF-head-tail"


@pytest.mark.parametrize("name, command", [("gemma-3-270m", "setup.sh --gemma"),
                                           ("all-minilm-l6-v2", "setup.sh --minilm"),
                                           ("qwen2.5-coder-0.5b", "setup.sh --qwen"),
                                           ("qwen2.5-coder-1.5b", "setup.sh --qwen15")])
def test_missing_package_names_the_install(name, command, monkeypatch, tmp_path):
    monkeypatch.setattr(gguf_local, "_package_dir", lambda module: None)
    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))
    with pytest.raises(ModelNotAvailableError, match=command.replace(".", r"\.")):
        cwlens.load_model(name, device="cpu")
