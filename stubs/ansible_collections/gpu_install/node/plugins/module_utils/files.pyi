# plugins/module_utils/files.py under the name the modules import it by on a node. The type checker reads that file
# itself as the top-level module `files` (pyproject.toml: [tool.mypy] mypy_path), so this names no type of its own.
from files import *  # noqa: F403
