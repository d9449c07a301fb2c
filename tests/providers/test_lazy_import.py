"""litellm is loaded only when a litellm deployment exists: the vLLM gateway stays lean."""

import subprocess
import sys


def test_the_gateway_and_cli_import_without_litellm() -> None:
    code = (
        "import sys, gateway.app, gateway.cli, gateway.serving.hosted; "
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"
