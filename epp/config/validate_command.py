"""`epp validate FILE...`: check manifests and configuration files offline.

Validates InferenceObjective (llm-d.ai v1 and v1alpha2) and InferencePool
(inference.networking.k8s.io/v1) against the bundled CRDs, as the API server
would with strict field validation, and EndpointPickerConfig files as the EPP
loads them. Every error is printed as `FILE[DOCUMENT]: FIELD: message`;
the exit status is 0 when everything is valid, 2 when a configuration
declares a plugin type epp cannot run (`plugin type 'X' is not supported by
epp: <reason>`), 1 for any other error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from epp.api.manifests import Manifest, ManifestError, load_manifests
from epp.api.models import InvalidObjectError, decode
from epp.config.loader import ConfigError, is_config, parse_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifest files or folders")


def manifest_errors(manifest: Manifest) -> list[str]:
    """Every problem of one document, as `path: message` lines."""
    return document_check(manifest)[0]


def document_check(manifest: Manifest, out: TextIO | None = None) -> tuple[list[str], bool]:
    """The problems of one document, and whether one is an unsupported
    plugin; a configuration's warnings go to `out`."""
    if is_config(manifest.object):
        try:
            config = parse_config(manifest.object)
        except ConfigError as error:
            return error.errors, error.unsupported
        for warning in config.warnings if out is not None else ():
            print(f"{manifest.where}: warning: {warning}", file=out)
        return [], False
    try:
        decode(manifest.object)
    except InvalidObjectError as error:
        return [str(field_error) for field_error in error.errors], False
    return [], False


def validate(paths: list[str], out: TextIO) -> int:
    """Print every error of every document in `paths`, then a summary line;
    return the exit status (see the module docstring). A file that cannot
    be read or parsed is an error of its own and does not stop the others
    from being checked."""
    errors = documents = 0
    unsupported = False
    for path in paths:
        try:
            manifests = load_manifests([path])
        except ManifestError as error:
            errors += 1
            print(error, file=out)
            continue
        for manifest in manifests:
            documents += 1
            found, refused = document_check(manifest, out)
            unsupported = unsupported or refused
            for error in found:
                errors += 1
                print(f"{manifest.where}: {error}", file=out)
    print(f"{documents} documents checked, {errors} errors", file=out)
    if unsupported:
        return 2
    return 0 if errors == 0 else 1


def run(args: argparse.Namespace) -> int:
    return validate(args.files, sys.stdout)
