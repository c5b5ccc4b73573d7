# plugins/module_utils/kube_flags.py under the name the modules import it by on a node. The type checker reads that file
# itself as the top-level module `kube_flags` (pyproject.toml: [tool.mypy] mypy_path), so this names no type of its own.
from kube_flags import *  # noqa: F403
