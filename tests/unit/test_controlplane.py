"""The real control plane's launcher without the real binaries: unpacking, checksums, and why it cannot start."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from gputask.testing import controlplane
from gputask.testing.controlplane import BINARIES, TARBALL, ControlPlaneUnavailable, kube_binaries


def fake_release(folder: Path, *, tamper: str | None = None) -> Path:
    """A tarball named as the real one holding a script per binary, and its SHA256SUMS; ``tamper`` names a
    binary whose listed checksum is wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    tarball = folder / TARBALL
    sums = {}
    with tarfile.open(tarball, "w:xz") as archive:
        for name in BINARIES:
            data = f"#!/bin/sh\necho {name}\n".encode()
            info = tarfile.TarInfo(f"kubernetes/bin/{name}")
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
            sums[name] = hashlib.sha256(data).hexdigest() if name != tamper else "0" * 64
    sums[TARBALL] = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (folder / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for name, digest in sums.items()))
    return tarball


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG cache folder; returns where the binaries go in it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gputask" / "kube-v1.28.7"


def test_the_binaries_are_unpacked_once_into_the_cache_after_their_checksums(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tarball is checked and unpacked flat into the cache with executable binaries and a stamp; once
    there, the tarball is no longer needed."""
    tarball = fake_release(tmp_path / "shared" / "kube")
    monkeypatch.setenv("GPUTASK_KUBE_TARBALL", str(tarball))
    assert kube_binaries() == cache
    assert sorted((p.name, p.stat().st_mode & 0o777) for p in cache.iterdir()) == sorted(
        [(".verified", 0o644)] + [(name, 0o755) for name in BINARIES]
    )
    tarball.unlink()
    assert kube_binaries() == cache


def test_a_binary_whose_checksum_does_not_match_is_refused_and_nothing_is_cached(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tampered binary: ControlPlaneUnavailable naming it, and no cache folder left behind."""
    tarball = fake_release(tmp_path / "kube", tamper="kubemark")
    monkeypatch.setenv("GPUTASK_KUBE_TARBALL", str(tarball))
    with pytest.raises(ControlPlaneUnavailable) as raised:
        kube_binaries()
    assert (str(raised.value), sorted(p.name for p in cache.parent.iterdir())) == (
        f"{tarball}: kubemark missing or its SHA256 does not match {tarball.parent / 'SHA256SUMS'}", []
    )


def test_a_tarball_whose_checksum_does_not_match_is_refused(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tarball changed after SHA256SUMS was written: refused before it is unpacked."""
    tarball = fake_release(tmp_path / "kube")
    tarball.write_bytes(tarball.read_bytes() + b"\0")
    monkeypatch.setenv("GPUTASK_KUBE_TARBALL", str(tarball))
    with pytest.raises(ControlPlaneUnavailable) as raised:
        kube_binaries()
    assert str(raised.value) == f"{tarball}: SHA256 does not match {tarball.parent / 'SHA256SUMS'}"


def test_without_a_tarball_the_reason_to_skip_says_where_it_was_looked_for(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tarball and nothing cached: missing_prerequisites says so, and kube_binaries raises."""
    monkeypatch.setenv("GPUTASK_KUBE_TARBALL", str(tmp_path / "absent.tar.xz"))
    assert controlplane.missing_prerequisites() == (
        f"{TARBALL} not found beside the repository (shared/kube/) nor in $GPUTASK_KUBE_TARBALL"
    )
    with pytest.raises(ControlPlaneUnavailable, match="not found"):
        kube_binaries()


def test_without_etcd_the_reason_to_skip_says_how_to_install_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The binaries are there but etcd is not on PATH: the reason names Debian's package."""
    monkeypatch.setenv("GPUTASK_KUBE_TARBALL", str(fake_release(tmp_path / "kube")))
    monkeypatch.setattr(controlplane.shutil, "which", lambda tool: None if tool == "etcd" else f"/usr/bin/{tool}")
    assert controlplane.missing_prerequisites() == "etcd is not on PATH (Debian: apt-get install etcd-server)"
