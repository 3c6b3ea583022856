"""The tern module under test: the build's (TERN_PYTHON_BUILD, set by ctest)
or else whatever `import tern` finds (.venv, after scripts/install-python.sh).
A run that collects no test fails (pytest's exit status 5)."""
import os
import sys

build = os.environ.get("TERN_PYTHON_BUILD")
if build:
    sys.path.insert(0, build)
