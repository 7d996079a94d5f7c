"""Python runs this at start-up in a process with this folder on PYTHONPATH: it installs the slow-disk test plug-in
(tests/plugins/slow_disk.py) when its variable is set. Test machinery only; the product does not read it."""

import os
import sys

if os.environ.get("LMSTACK_TEST_SLOW_DISK"):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:  # the repository root, where `tests` is found
        sys.path.append(root)
    from tests.plugins.slow_disk import install

    install(os.environ["LMSTACK_TEST_SLOW_DISK"])
