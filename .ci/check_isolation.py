"""Fail if a package installed in the machine's own Python but absent from the lock is visible in this one."""

import importlib.metadata
import json
import re
import subprocess
import sys


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


base_python, lock = sys.argv[1], sys.argv[2]
listing = "import importlib.metadata as m, json; print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))"
machine = {normalise(n) for n in json.loads(subprocess.check_output([base_python, "-c", listing], text=True))}
locked = {normalise(line.split("==")[0]) for line in open(lock) if "==" in line and not line.startswith("#")}
here = {normalise(d.metadata["Name"]) for d in importlib.metadata.distributions()}
undeclared = sorted(machine - locked - {"pip", "zoo"})
leaked = sorted(set(undeclared) & here)
site = subprocess.check_output([base_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               text=True).strip()
if sys.prefix == sys.base_prefix or leaked or site in sys.path:
    sys.exit(f"isolation check FAILED: prefix {sys.prefix}, leaked from the machine's Python: {leaked}, "
             f"its site-packages on sys.path: {site in sys.path}")
print(f"isolation check: none of the {len(undeclared)} packages the machine's Python has beyond the lock "
      f"(e.g. {', '.join(undeclared[:3])}) is visible in {sys.prefix}")
