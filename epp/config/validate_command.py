"""`epp validate FILE...`: check manifests and configuration files offline.

Validates InferenceObjective (llm-d.ai v1 and v1alpha2) and InferencePool
(inference.networking.k8s.io/v1) against the bundled CRDs, as the API server
would with strict field validation, and EndpointPickerConfig files as the EPP
loads them, and refuses what `epp serve` would refuse with the same
flags (an Alpha plugin without `--allow-experimental-plugins`). Every error
is printed as `FILE[DOCUMENT]: FIELD: message`, every file of a folder is
checked on its own (one that cannot be read or parsed does not hide the
others); the exit status is 0 when everything is valid, 2 when a
configuration declares a plugin type epp cannot run (`plugin type 'X' is
not supported by epp: <reason>`), 1 for any other error.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from epp.api.manifests import Manifest, ManifestError, load_file, manifest_files
from epp.api.models import InvalidObjectError, decode
from epp.config.loader import ConfigError, experimental_errors, is_config, parse_config
from epp.serve.flags import PARSERS, Kind
from epp.serve.options import flags

SERVE_FLAGS = ("allow_experimental_plugins",)
"""The `epp serve` flags that change what a configuration may hold."""


class _ServeBool(argparse.Action):
    """A boolean flag of `epp serve` (`--flag`, `--flag=false`) that leaves
    a following FILE to the files, as Go's flag package does."""

    def __call__(self, parser, namespace, value, option_string=None):  # type: ignore[no-untyped-def]
        if value is None:
            setattr(namespace, self.dest, True)
            return
        try:
            setattr(namespace, self.dest, PARSERS[Kind.BOOL](value))
        except argparse.ArgumentTypeError:
            setattr(namespace, self.dest, True)
            namespace.operands = [*getattr(namespace, "operands", []), value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help="manifest files or folders")
    group = parser.add_argument_group("epp serve flags that change what a configuration may hold")
    for name, flag in flags():
        if name in SERVE_FLAGS:
            group.add_argument(
                "--" + name.replace("_", "-"),
                dest=name,
                nargs="?",
                default=False,
                action=_ServeBool,
                metavar="true|false",
                help=flag.help,
            )


def manifest_errors(manifest: Manifest) -> list[str]:
    """Every problem of one document, as `path: message` lines."""
    return document_check(manifest)[0]


def document_check(
    manifest: Manifest, out: TextIO | None = None, allow_experimental_plugins: bool = False
) -> tuple[list[str], bool]:
    """The problems of one document, and whether one is an unsupported
    plugin; a configuration's warnings go to `out`."""
    if is_config(manifest.object):
        try:
            config = parse_config(manifest.object)
        except ConfigError as error:
            return error.errors, error.unsupported
        for warning in config.warnings if out is not None else ():
            print(f"{manifest.where}: warning: {warning}", file=out)
        return ([] if allow_experimental_plugins else experimental_errors(config)), False
    try:
        decode(manifest.object)
    except InvalidObjectError as error:
        return [str(field_error) for field_error in error.errors], False
    return [], False


def validate(paths: list[str], out: TextIO, allow_experimental_plugins: bool = False) -> int:
    """Print every error of every document in `paths`, then a summary line;
    return the exit status (see the module docstring). A file that cannot
    be read or parsed is an error of its own and does not stop the others
    from being checked."""
    errors = documents = 0
    unsupported = False
    for path in paths:
        try:
            files = manifest_files([path])
        except ManifestError as error:
            errors += 1
            print(error, file=out)
            continue
        for file in files:
            try:
                manifests = load_file(file)
            except ManifestError as error:
                errors += 1
                print(error, file=out)
                continue
            for manifest in manifests:
                documents += 1
                found, refused = document_check(manifest, out, allow_experimental_plugins)
                unsupported = unsupported or refused
                for error in found:
                    errors += 1
                    print(f"{manifest.where}: {error}", file=out)
    print(f"{documents} documents checked, {errors} errors", file=out)
    if unsupported:
        return 2
    return 0 if errors == 0 else 1


def run(args: argparse.Namespace) -> int:
    files = [*getattr(args, "operands", []), *args.files]
    if not files:
        print("epp validate: give at least one FILE", file=sys.stderr)
        return 2
    return validate(files, sys.stdout, args.allow_experimental_plugins)
