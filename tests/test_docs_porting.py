"""docs/porting.md's Python snippets run as written, in one process, in order."""

import os
import re
import subprocess
import sys

from procs import REPO


def test_porting_snippets_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs/porting.md").read_text(), re.S)
    assert blocks
    script = tmp_path / "porting_snippets.py"
    script.write_text("\n".join(blocks) + "\nprint('snippets ok')\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "snippets ok" in result.stdout
