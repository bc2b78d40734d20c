"""``benchmarks/soak.py`` for 3 minutes against the default model: mixed traffic (streams,
abandoned streams, n=2, guided JSON, refused requests, probes) with no 5xx and no answer
missing, and the server's and engine's RSS and open descriptors flat within the script's
bounds. The 30-minute run's figures are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_three_minute_soak_stays_flat(tmp_path: Path) -> None:
    result_path = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(SOAK), "--minutes", "3", "--concurrency", "6",
                          "--output-json", str(result_path), "--log", str(tmp_path / "log"),
                          "--", "--max-model-len", "1024"],
                         capture_output=True, text=True, timeout=600)
    print(run.stdout[-3000:])
    result = json.loads(result_path.read_text())
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert result["passed"] and not result["failures"]
    kinds = {key.split()[0] for key in result["statuses"]}
    assert kinds == {"completion", "chat", "n2", "guided", "stream", "abandon", "refused",
                     "tokenize", "probes"}, result["statuses"]
    assert result["requests"] > 200
    assert set(result["growth"]) == {"api", "engine"}
