"""What `epp serve` runs on when given no files: copies of config/samples/
objectives.yaml and pool.yaml (a test keeps them identical), shipped inside
the package so an installed `epp` has them."""

from pathlib import Path

DEFAULTS = Path(__file__).resolve().parent
OBJECTIVES = DEFAULTS / "objectives.yaml"
POOL = DEFAULTS / "pool.yaml"
