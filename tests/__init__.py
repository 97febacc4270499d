from . import _typecheck  # noqa: F401  (the type checker pyproject.toml hands to jaxtyping)
