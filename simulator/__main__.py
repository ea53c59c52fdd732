"""``python -m simulator`` is the ``astrasim-py`` command."""

import sys

# run from a checkout by an interpreter without the package's requirements (e.g. a tool calling
# ``python3 -m simulator`` outside the virtual environment): one line saying so, not an import traceback
REQUIREMENTS = {"simpy": "simpy", "numpy": "numpy", "google": "protobuf", "yaml": "pyyaml", "networkx": "networkx"}

try:
    from simulator.cli import main
except ModuleNotFoundError as e:
    top = (e.name or "").split(".")[0]
    if top not in REQUIREMENTS:
        raise
    sys.exit(f"astrasim-py: error: {sys.executable} lacks the package {REQUIREMENTS[top]!r} this tool needs: "
             f"install it (pip install .) in the environment you run it from, or activate that environment")

sys.exit(main())
