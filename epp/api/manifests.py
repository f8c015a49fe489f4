"""Kubernetes manifests from files and folders, as `kubectl apply -f` reads them.

A file holds one or more YAML documents (`---`); a folder contributes its
`*.yaml`, `*.yml` and `*.json` files in name order (not recursively). Empty
documents are skipped, a `kind: List` is flattened into its items. Every
object remembers its file and document index, for error messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from epp.api.models import InferenceObjective, InferencePool, InvalidObjectError, decode

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(Exception):
    """A file that cannot be read or parsed; the message names it."""


@dataclass(slots=True, frozen=True)
class Manifest:
    source: Path
    index: int
    """The document's position in its file, from 0."""
    object: Any

    @property
    def where(self) -> str:
        return f"{self.source}[{self.index}]"


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files that `paths` name, folders expanded."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(
                sorted(p for p in path.iterdir() if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
            )
        elif path.exists():
            files.append(path)
        else:
            raise ManifestError(f"{path}: no such file or directory")
    return files


def _describe(error: yaml.YAMLError) -> str:
    """A YAML error on one line, with its position when known."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


def parse_documents(text: str, source: Path) -> Iterator[Manifest]:
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: invalid YAML: {_describe(error)}") from None
    for index, document in enumerate(documents):
        if document is None:
            continue
        if isinstance(document, dict) and document.get("kind") == "List":
            for item in document.get("items") or ():
                yield Manifest(source, index, item)
        else:
            yield Manifest(source, index, document)


def load_file(path: Path) -> list[Manifest]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{path}: cannot read: {error}") from None
    return list(parse_documents(text, path))


def load_manifests(paths: Iterable[str | Path]) -> list[Manifest]:
    """Every object of every document of the files and folders in `paths`."""
    return [manifest for path in manifest_files(paths) for manifest in load_file(path)]


def _decoded(manifests: list[Manifest]) -> tuple[list[tuple[Manifest, Any]], list[str]]:
    decoded: list[tuple[Manifest, Any]] = []
    errors: list[str] = []
    for manifest in manifests:
        try:
            decoded.append((manifest, decode(manifest.object)))
        except InvalidObjectError as error:
            errors.extend(f"{manifest.where}: {field_error}" for field_error in error.errors)
    return decoded, errors


def load_objectives(paths: Iterable[str | Path]) -> list[InferenceObjective]:
    """Every InferenceObjective (either version) in `paths`, validated.

    InferencePools in the same files are skipped (a folder one would
    `kubectl apply` often holds the pool too); any other kind, and any invalid
    object, is an error. All errors are raised together, so a caller that
    keeps its last good set loses nothing."""
    decoded, errors = _decoded(load_manifests(paths))
    objectives: list[InferenceObjective] = []
    names: dict[tuple[str, str], str] = {}
    for manifest, obj in decoded:
        if isinstance(obj, InferencePool):
            continue
        key = (obj.namespace, obj.name)
        if key in names:
            errors.append(
                f"{manifest.where}: metadata.name: Duplicate value: {obj.name!r} ({names[key]})"
            )
            continue
        names[key] = manifest.where
        objectives.append(obj)
    if errors:
        raise ManifestError("\n".join(errors))
    return objectives


def load_pool(path: str | Path) -> InferencePool:
    """The one InferencePool in the file at `path`, validated."""
    decoded, errors = _decoded(load_manifests([path]))
    pools = [(manifest, obj) for manifest, obj in decoded if isinstance(obj, InferencePool)]
    if errors:
        raise ManifestError("\n".join(errors))
    if len(pools) != 1:
        raise ManifestError(f"{path}: expected exactly one InferencePool, found {len(pools)}")
    return pools[0][1]
