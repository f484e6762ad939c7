"""sparkrig, the control side. Importing it makes the host package files/sparkhost importable as
``sparkhost``: the control side runs the very modules the hosts run (sparkrig/hostpkg.py ships
them), instead of keeping copies."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: deploy.py, tasks/, files/, templates/


def _import_host_package() -> None:
    if "sparkhost" in sys.modules:
        return
    init = REPO / "files" / "sparkhost" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "sparkhost", init, submodule_search_locations=[str(init.parent)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sparkhost"] = module
    spec.loader.exec_module(module)


_import_host_package()
