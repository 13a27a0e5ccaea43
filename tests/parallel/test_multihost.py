"""Test a 2-host job: the second host is 127.0.0.2, reached over ssh through an sshd this
test starts on a free port with throwaway keys; horovodrun's --ssh-port/--ssh-identity-file.
Under Gloo and MPI, train.py must train and checkpoint with one rank on each "host".

Needs OpenSSH's sshd and ssh (.ci/run installs openssh-server). Without them the test is
skipped, unless SAMPLE_FC_REQUIRE_SSH=1 (CI), where that is a failure."""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, mpi_available, per_rank_tail
from sample_fc.checkpoint import bank_shard_files
from bench.harness import run_bounded, single_thread_env

SECOND_HOST = "127.0.0.2"     # loopback, but not a local address to horovodrun: it uses ssh
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port():
    with socket.socket() as sock:
        sock.bind((SECOND_HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def second_host(tmp_path_factory):
    """(port, identity file, sshd log) of an sshd on SECOND_HOST; stopped and ~/.ssh restored after."""
    missing = [tool for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")) if not tool or not os.path.exists(tool)]
    if missing or os.geteuid() != 0:
        reason = "OpenSSH server/client missing" if missing else "sshd needs root here"
        if os.environ.get("SAMPLE_FC_REQUIRE_SSH") == "1":
            pytest.fail(f"{reason}; .ci/run installs openssh-server")
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    shutil.copy(folder / "id.pub", folder / "authorized_keys")
    port = _free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress {SECOND_HOST}\nHostKey {folder / 'host_key'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PidFile {folder / 'sshd.pid'}\n")
    os.makedirs("/run/sshd", exist_ok=True)         # sshd's privilege separation directory
    ssh_dir = Path.home() / ".ssh"                  # ssh records the host key here: restore after
    known_hosts = ssh_dir / "known_hosts"
    had_dir, saved = ssh_dir.exists(), known_hosts.read_bytes() if known_hosts.exists() else None
    log = folder / "sshd.log"
    sshd = subprocess.Popen([SSHD, "-D", "-f", str(folder / "sshd_config"), "-E", str(log)])
    try:
        for _ in range(50):
            if log.exists() and "Server listening" in log.read_text():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"sshd did not start: {log.read_text() if log.exists() else 'no log'}")
        yield port, folder / "id", log
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
        if saved is not None:
            known_hosts.write_bytes(saved)
        elif not had_dir:
            shutil.rmtree(ssh_dir, ignore_errors=True)
        elif known_hosts.exists():
            known_hosts.unlink()


@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_two_hosts_over_ssh_train_and_checkpoint(second_host, tmp_path, controller):
    """Test that `horovodrun -np 2 -H localhost:1,127.0.0.2:1` starts the second rank over
    ssh (sshd logs a login), and the job trains, reports world size 2 and writes a complete
    checkpoint with both ranks' bank shards."""
    if controller == "--mpi" and not mpi_available():
        pytest.skip("Horovod's MPI controller needs OpenMPI")
    port, identity, log = second_host
    logins_before = log.read_text().count("Accepted publickey")
    command = [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", f"localhost:1,{SECOND_HOST}:1",
               controller, "--ssh-port", str(port), "--ssh-identity-file", str(identity),
               "--network-interface", "lo", sys.executable, str(REPO / "train.py"),
               "--dataset", "synthetic_1m", "--models-root", str(tmp_path / "out"),
               "--set", "num_classes=100", "--set", "image_size=32", "--set", "batch_size=4",
               "--set", "max_update=3", "--set", "frequent=1"]
    result = run_bounded(command, timeout_s=240, env=single_thread_env(), cwd=str(tmp_path))
    assert not result.timed_out and result.returncode == 0, per_rank_tail(result.output)
    assert "world size 2" in result.output
    assert log.read_text().count("Accepted publickey") > logins_before, log.read_text()
    step = tmp_path / "out" / "step-00000003"
    assert (step / "COMPLETE").is_file()
    assert all(os.path.isfile(bank_shard_files(str(step), r)["weight"]) for r in (0, 1))
