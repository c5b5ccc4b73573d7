# plugins/module_utils/first_change.py under the name the modules import it by on a node. The type checker reads that file
# itself as the top-level module `first_change` (pyproject.toml: [tool.mypy] mypy_path), so this names no type of its own.
from first_change import *  # noqa: F403
