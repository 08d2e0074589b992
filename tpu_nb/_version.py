"""tpu_nb's version, written here only: the package metadata reads it at build time
(pyproject.toml: dynamic version from this attribute), and `tpu_nb.__version__`,
`tpu-nb --version` and `tpu-nb doctor` print it."""

__version__ = "0.1.0"
