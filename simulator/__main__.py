"""``python -m simulator`` is the ``astrasim-py`` command."""

import os
import sys
from pathlib import Path

# run from a checkout by an interpreter without the package's requirements (e.g. a tool calling
# ``python3 -m simulator`` outside the virtual environment): the checkout's own virtual environment (the README's
# set-up makes .venv) runs it when it has them; otherwise one line saying so, not an import traceback
REQUIREMENTS = {"simpy": "simpy", "numpy": "numpy", "google": "protobuf", "yaml": "pyyaml", "networkx": "networkx"}
REEXEC = "ASTRASIM_PY_FROM_CHECKOUT_VENV"  # set when re-run by the checkout's environment: never twice

try:
    from simulator.cli import main
except ModuleNotFoundError as e:
    top = (e.name or "").split(".")[0]
    if top not in REQUIREMENTS:
        raise
    venv = Path(__file__).absolute().parents[1] / ".venv"
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if python.exists() and not os.environ.get(REEXEC) and Path(sys.prefix).absolute() != venv:
        os.environ[REEXEC] = "1"
        os.execv(str(python), [str(python), "-m", "simulator", *sys.argv[1:]])
    sys.exit(f"astrasim-py: error: {sys.executable} lacks the package {REQUIREMENTS[top]!r} this tool needs: "
             f"install it (pip install .) in the environment you run it from, or activate that environment")

sys.exit(main())
