"""``python -m p3o.config``: print the packaged files the config reads, regenerated from the code.

python -m p3o.config > src/p3o/configs/default.yaml                         # the default preset
python -m p3o.config --objectives > src/p3o/configs/objectives-help.json    # the objectives' --help rows
python -m p3o.config --objective-keys > src/p3o/configs/objectives-keys.json  # their keywords and types
"""

from __future__ import annotations

import json
import sys

from p3o.config.objective import objective_keys, objective_rows
from p3o.config.text import default_preset_text

if sys.argv[1:] == ["--objectives"]:
    print(json.dumps(objective_rows(fresh=True), indent=1, ensure_ascii=False))
elif sys.argv[1:] == ["--objective-keys"]:
    print(json.dumps(objective_keys(fresh=True), indent=1, ensure_ascii=False))
else:
    print(default_preset_text(), end="")
