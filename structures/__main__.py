"""``python -m flashlight.structures``: the same as the ``flashlight-fold`` command."""
import sys

from flashlight.structures.cli import main

if __name__ == "__main__":
    sys.exit(main())
