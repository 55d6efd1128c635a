"""The ``tilearray`` command line (also ``python -m tilearray``): see
:mod:`tilearray.cli.main` for the commands and exit statuses."""

from .main import main
from .options import cli_words  # noqa: F401  (CLI wording, used by tests)

__all__ = ["main"]
