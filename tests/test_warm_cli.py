"""The tests' warm interpreter (``tests/warm_cli.py``) runs a call as a fresh interpreter would, and forks it
whenever the fresh one would start the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import warm_cli
from warm_cli import run


def server_env(**more: str) -> dict[str, str]:
    """The environment the server started in, as a test's own call would carry it: tests that run before these
    may leave variables in this process's environment (their effect on the suite's speed is not what these
    tests check)."""
    return {**warm_cli._SERVER_ENV, **more}

PROBE = "import json, sys\nprint(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'warm': 'jinja2' in sys.modules}))\n"


def test_a_script_gets_the_argv_and_path_a_fresh_interpreter_gives_it(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    warm = json.loads(run([str(script), "--flag", "x y"], via="script", cwd=tmp_path, env=server_env()).stdout)
    fresh = json.loads(subprocess.run([sys.executable, str(script), "--flag", "x y"], capture_output=True,
                                      text=True, cwd=tmp_path, check=True).stdout)
    assert warm["warm"] and not fresh["warm"]  # forked from the server, which has imported jinja2
    assert (warm["argv"], warm["path0"]) == (fresh["argv"], fresh["path0"])


def test_what_the_servers_imports_set_in_the_environment_does_not_make_a_call_fresh(tmp_path):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR; once this process has imported it too, its calls
    carry that value and are still forked. A value of the caller's own is start-up's business: that call runs
    fresh."""
    import torch._dynamo  # noqa: F401

    assert "TORCHINDUCTOR_CACHE_DIR" in os.environ
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    assert json.loads(run([str(script)], via="script",
                          env=server_env(TORCHINDUCTOR_CACHE_DIR=os.environ["TORCHINDUCTOR_CACHE_DIR"])).stdout)["warm"]
    own = {**server_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    assert not json.loads(run([str(script)], via="script", env=own).stdout)["warm"]
