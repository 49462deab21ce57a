"""The committed stubs are what `make protos` generates from the committed .proto files."""

from pathlib import Path

from services.common.protogen import PROTO_ROOT, generate, proto_files


def test_generated_stubs_are_current(tmp_path):
    generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc wrote nothing"
    stale = [str(rel) for rel in generated
             if not (PROTO_ROOT / rel).exists() or (PROTO_ROOT / rel).read_bytes() != (tmp_path / rel).read_bytes()]
    assert not stale, f"stale or missing stubs (run `make protos`): {stale}"
    assert len(proto_files()) == 5


def test_every_service_has_one_proto_file():
    names = {p.stem for p in proto_files()}
    assert {"llm", "vocoder", "encoder", "gateway", "common"} == names
    assert all(Path(p).read_text().count("package moss.speech.v1;") == 1 for p in proto_files())
