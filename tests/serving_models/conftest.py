"""The project's model code (``serving-models/``) is not part of the operator's package: its
pure pieces are imported from the folder. (Its tests with upstream's library and the real
tritonserver are ``serving-models/tests``, also in ``make test``: see its README.)"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "serving-models"
if str(PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(PACKAGE_ROOT))
