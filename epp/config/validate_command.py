"""`epp validate FILE...`: check manifests and configuration files offline.

Validates InferenceObjective (llm-d.ai v1 and v1alpha2) and InferencePool
(inference.networking.k8s.io/v1) against the bundled CRDs, as the API server
would with strict field validation, and EndpointPickerConfig files as the EPP
loads them. Every error is printed as `FILE[DOCUMENT]: FIELD: message`;
the exit status is 0 when everything is valid, 1 otherwise.
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
    if is_config(manifest.object):
        try:
            parse_config(manifest.object)
        except ConfigError as error:
            return error.errors
        return []
    try:
        decode(manifest.object)
    except InvalidObjectError as error:
        return [str(field_error) for field_error in error.errors]
    return []


def validate(paths: list[str], out: TextIO) -> bool:
    """Print every error of every document in `paths`, then a summary line;
    True when there are none. A file that cannot be read or parsed is an
    error of its own and does not stop the others from being checked."""
    errors = documents = 0
    for path in paths:
        try:
            manifests = load_manifests([path])
        except ManifestError as error:
            errors += 1
            print(error, file=out)
            continue
        for manifest in manifests:
            documents += 1
            for error in manifest_errors(manifest):
                errors += 1
                print(f"{manifest.where}: {error}", file=out)
    print(f"{documents} documents checked, {errors} errors", file=out)
    return errors == 0


def run(args: argparse.Namespace) -> int:
    valid = validate(args.files, sys.stdout)
    return 0 if valid else 1
